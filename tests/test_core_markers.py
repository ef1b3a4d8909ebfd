"""Markers, world-size parametrization, selection with -m, and clear errors on bad marker use."""
import pytest

ALLREDUCE = """
import pytest, torch, torch.distributed as tdist
from pytest_mgpu import world_sizes

def ranks():
    return tdist.get_rank()

@world_sizes(1, 2, 4)
def test_sizes(dist):
    assert dist.run(ranks) == list(range(dist.world_size))

@pytest.mark.gpu2
def test_two(dist):
    assert dist.world_size == 2
"""


def test_markers_registered_under_strict_markers(pytester):
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.gpu1
        @pytest.mark.gpu8
        def test_a(): pass
        @pytest.mark.gpu2
        def test_b(): pass
        @pytest.mark.gpu4
        def test_c(): pass
        """
    )
    result = pytester.runpytest("--strict-markers", "--collect-only", "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*3 tests collected*"])
    out = pytester.runpytest("--markers").stdout.str()
    for n in (1, 2, 4, 8):
        assert f"@pytest.mark.gpu{n}:" in out


def test_minus_m_selects_one_world_size(pytester):
    pytester.makepyfile(ALLREDUCE)
    result = pytester.runpytest("-m", "gpu2", "--mgpu-fallback=cpu", "-v")
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["*test_sizes?gpu2? PASSED*", "*test_two PASSED*"])
    assert "gpu4" not in "".join(line for line in result.outlines if "PASSED" in line)


def test_world_sizes_variants_carry_ids_and_run(pytester):
    pytester.makepyfile(ALLREDUCE)
    result = pytester.runpytest("--mgpu-fallback=cpu", "-v", "-k", "test_sizes")
    result.assert_outcomes(passed=3, deselected=1)
    result.stdout.fnmatch_lines(
        ["*test_sizes?gpu1?*PASSED*", "*test_sizes?gpu2?*PASSED*", "*test_sizes?gpu4?*PASSED*"]
    )


def test_conflicting_markers_error_names_both(pytester):
    pytester.makepyfile(
        """
        import pytest
        from pytest_mgpu import world_sizes
        @pytest.mark.gpu2
        @pytest.mark.gpu4
        def test_conflict(dist): pass

        @pytest.mark.gpu2
        class TestClass:
            @world_sizes(4)
            def test_in_class(self, dist): pass
        """
    )
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*conflicting markers gpu2, gpu4*one world size*"])
    assert "Traceback" not in result.stdout.str()
    # once per test, not again as the context of the failure ("During handling of the above...");
    # counted above the short summary, which repeats whole messages when CI=true
    errors = result.stdout.str().split("short test summary info")[0]
    assert errors.count("gpu2, gpu4: a test runs at one world size") == 2
    assert "During handling" not in result.stdout.str()


def test_dist_without_marker_is_a_clear_error(pytester):
    pytester.makepyfile("def test_x(dist): pass")
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*uses the `dist` fixture but has no gpuN marker*gpu2*world_sizes*"])


def test_unknown_world_size_is_a_clear_collection_error(pytester):
    pytester.makepyfile(
        """
        from pytest_mgpu import world_sizes
        @world_sizes(3)
        def test_x(dist): pass
        """
    )
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*world size 3 has no marker*1, 2, 4, 8, 16*"])


@pytest.mark.parametrize("sizes", ["", "2, 2"])
def test_world_sizes_rejects_empty_and_repeats(pytester, sizes):
    pytester.makepyfile(
        f"""
        from pytest_mgpu import world_sizes
        @world_sizes({sizes})
        def test_x(dist): pass
        """
    )
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*world_sizes*"])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # gpu3 is unknown on purpose
def test_an_unknown_gpu_marker_and_minus_m_name_the_known_sizes(pytester):
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.gpu3
        def test_x(dist): pass

        @pytest.mark.gpu3
        def test_not_distributed(): pass  # the project's own use of the name: not ours to judge
        """
    )
    result = pytester.runpytest("--mgpu-fallback=cpu", "-p", "no:warnings")
    result.assert_outcomes(errors=1, passed=1)
    result.stdout.fnmatch_lines(["*test_x: gpu3 is not a world size pytest-mgpu knows; its markers are "
                                 "gpu1, gpu2, gpu4, gpu8, gpu16*"])
    result = pytester.runpytest("-m", "gpu2 or gpu3")  # would deselect everything, silently
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-m 'gpu2 or gpu3': gpu3 is not a world size*gpu16*"])
    pytester.makeini("[pytest]\nmarkers =\n    gpu3: the project's own")
    pytester.runpytest("-m", "gpu3").assert_outcomes(errors=1, passed=1)  # registered: selects


def test_skipped_distributed_tests_are_counted_with_the_option_that_runs_them(pytester):
    pytester.makepyfile(ALLREDUCE)
    result = pytester.runpytest("-m", "gpu2 or gpu4")  # no GPUs here, no fallback
    result.assert_outcomes(skipped=3, deselected=1)
    result.stdout.fnmatch_lines(["*= pytest-mgpu =*", "3 distributed test(s) skipped, needing 2/4 GPU(s): "
                                 "run them on gloo CPU ranks with --mgpu-fallback=cpu"])
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-max-cpu-ranks=2", "-k", "gpu4")
    result.assert_outcomes(skipped=1, deselected=3)
    result.stdout.fnmatch_lines(["1 distributed test(s) skipped, needing 4 GPU(s): emulating them exceeds "
                                 "--mgpu-max-cpu-ranks=2; raise it to run them"])
