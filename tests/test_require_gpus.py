"""--mgpu-require-gpus: a GPU runner whose GPUs are gone fails the session instead of going green."""
import pytest

from pytest_mgpu import requirement
from pytest_mgpu.devices import Hardware
from pytest_mgpu.requirement import Requirement, unmet

pytestmark = pytest.mark.usefixtures("no_gpus")  # these tests are about runners without GPUs

TESTS = """
import pytest
from pytest_mgpu import world_sizes

def one():
    return 1

@world_sizes(1, 2, 4)
def test_x(dist):
    assert dist.run(one) == [1] * dist.world_size

def test_plain():
    pass
"""


def test_without_the_option_skips_stay_green(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "mgpu_fallback=skip")
    assert result.ret == 0
    result.assert_outcomes(passed=1, skipped=3)
    assert "GPUs required" not in result.stdout.str()


def test_a_runner_without_gpus_fails_naming_the_option_the_gpus_and_the_skips(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "mgpu_fallback=skip", "--mgpu-require-gpus=2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "--mgpu-require-gpus=2 not met: 0 GPU(s) visible" in out
    assert "2 gpuK test(s) with K <= 2 skipped for lack of devices" in out
    assert "test_x[gpu1]" in out and "test_x[gpu2]" in out
    assert "test_x[gpu4]" not in out.split("GPUs required")[1].split("pytest-mgpu ==")[0]


def test_cpu_fallback_does_not_hide_the_missing_gpus(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--mgpu-fallback=cpu", "--mgpu-require-gpus=1")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert "--mgpu-require-gpus=1 not met: 0 GPU(s) visible" in out
    assert "1 gpuK test(s) with K <= 1 ran on emulated CPU ranks instead of GPUs: test_cpu_fallback" in out


def test_environment_and_ini_name_themselves_and_zero_means_no_requirement(pytester, monkeypatch):
    pytester.makepyfile(TESTS)
    pytester.makeini("[pytest]\nmgpu_require_gpus = 1\nmgpu_fallback = skip\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "ini mgpu_require_gpus=1 not met" in result.stdout.str()
    monkeypatch.setenv("PYTEST_MGPU_REQUIRE_GPUS", "0")
    assert pytester.runpytest("-p", "no:cacheprovider").ret == 0
    monkeypatch.setenv("PYTEST_MGPU_REQUIRE_GPUS", "-1")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "PYTEST_MGPU_REQUIRE_GPUS must be 0 or more, got '-1'" in result.stderr.str()


def test_enough_gpus_pass_and_larger_tests_are_not_the_runners_promise(pytester, monkeypatch):
    # two (monkeypatched) GPUs: the gpu2 test gets its lease (it never touches CUDA), gpu4 is skipped
    from pytest_mgpu import session

    monkeypatch.setattr(session, "detect_hardware", lambda: Hardware(("0", "1"), ("H100",) * 2, 2))
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu2
        def test_two():
            pass

        @pytest.mark.gpu4
        def test_four():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "mgpu_fallback=skip", "--mgpu-require-gpus=2")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=1, skipped=1)
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "mgpu_fallback=skip", "--mgpu-require-gpus=4")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "--mgpu-require-gpus=4 not met: 2 GPU(s) visible, 4 required." in result.stdout.str()


def test_unmet_counts_only_tests_within_the_requirement():
    req = Requirement(2, "--mgpu-require-gpus")
    assert unmet(req, 2, {"t[gpu4]": 4}, {}) is None
    assert "1 gpuK test(s) with K <= 2 skipped" in unmet(req, 2, {"t[gpu2]": 2, "t[gpu4]": 4}, {})
    many = {f"t{i}": 1 for i in range(8)}
    assert "... (3 more)" in unmet(req, 0, many, {}, "no driver")


def test_the_reason_is_torchs_own_words(monkeypatch):
    import torch

    def broken():
        raise RuntimeError("Found no NVIDIA driver on your system.\nmore")

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", broken)
    assert requirement.why_no_gpu() == "torch.cuda: Found no NVIDIA driver on your system."
