"""One resolver for every option: command line > environment > ini file > default, and a bad value
is refused naming the source it came from (the flag, the ini name, or the environment variable), so
that the user fixes the right place. The rest of the tests read the resolved values through the
behaviour they drive (fallback, timeouts, seed, gate, reports)."""
from pathlib import Path

import pytest

from pytest_mgpu.settings import Settings, SettingsError, resolve, resolve_timing

# (pytest arguments, environment, ini lines, the words of the usage error)
BAD = [
    (["--mgpu-seed=x"], {}, "", "--mgpu-seed takes an integer, got 'x'"),
    ([], {}, "mgpu_seed = x", "ini mgpu_seed takes an integer, got 'x'"),
    (["--mgpu-max-cpu-ranks=many"], {}, "", "--mgpu-max-cpu-ranks takes an integer, got 'many'"),
    ([], {}, "mgpu_max_cpu_ranks = 2.5", "ini mgpu_max_cpu_ranks takes an integer, got '2.5'"),
    ([], {"PYTEST_MGPU_FALLBACK": "gpu"}, "", "PYTEST_MGPU_FALLBACK must be one of skip, cpu, share, got 'gpu'"),
    ([], {}, "mgpu_fallback = gpu", "ini mgpu_fallback must be one of skip, cpu, share, got 'gpu'"),
    (["--mgpu-fallback=gpu"], {}, "", "*--mgpu-fallback: invalid choice: 'gpu'*"),
    (["--mgpu-timeout=soon"], {}, "", "--mgpu-timeout must be a positive, finite number of seconds, got 'soon'"),
    ([], {}, "mgpu_timeout = soon", "ini mgpu_timeout must be a positive, finite number of seconds, got 'soon'"),
    ([], {"PYTEST_MGPU_ISOLATE": "maybe"}, "", "PYTEST_MGPU_ISOLATE must be true or false (1/0, yes/no, on/off), got 'maybe'"),
    ([], {}, "mgpu_isolate = maybe", "ini mgpu_isolate must be a bool (*maybe*)"),
    (["--mgpu-regression=fast"], {}, "", "--mgpu-regression takes a percentage such as 10 or 10%, got 'fast'"),
    ([], {}, "mgpu_regression = fast", "ini mgpu_regression takes a percentage such as 10 or 10%, got 'fast'"),
    ([], {}, "mgpu_regression = -5", "ini mgpu_regression must be a positive, finite percentage, got '-5'"),
    (["--mgpu-regression=inf"], {}, "", "--mgpu-regression must be a positive, finite percentage, got 'inf'"),
    (["--mgpu-max-cpu-ranks=0"], {}, "", "--mgpu-max-cpu-ranks must be 1 or more, got '0'"),
    ([], {}, "mgpu_gate = loud", "ini mgpu_gate must be one of auto, fail, warn, got 'loud'"),
    (["--mgpu-report=out.txt"], {}, "", "--mgpu-report writes .md, .json or .csv*got *out.txt"),
]


def _source(words: str) -> str:
    """The blamed source, as the test id: "ini mgpu_seed", "--mgpu-seed", "PYTEST_MGPU_FALLBACK"."""
    return words.strip("*").split(":")[0].split(" must")[0].split(" takes")[0].split(" writes")[0]


@pytest.mark.parametrize("args, env, ini, words", BAD, ids=[f"{_source(w)}-{i}" for i, (*_, w) in enumerate(BAD)])
def test_a_bad_value_is_a_usage_error_naming_its_source(pytester, monkeypatch, args, env, ini, words):
    monkeypatch.delenv("PYTEST_MGPU_FALLBACK", raising=False)
    monkeypatch.delenv("PYTEST_MGPU_ISOLATE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{words}*"])


def test_the_command_line_wins_so_a_bad_ini_value_under_it_is_never_read(pytester):
    pytester.makeini("[pytest]\nmgpu_timeout = soon\nmgpu_seed = x\nmgpu_gate = loud\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--mgpu-timeout=5", "--mgpu-seed=3", "--mgpu-gate=warn")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mgpu: fallback=skip, timeout=5s, seed=3"])


def _reader(values):
    return lambda name: values.get(name)


def test_command_line_beats_environment_beats_ini_beats_default():
    ini = _reader({"mgpu_fallback": "cpu", "mgpu_timeout": "7", "mgpu_isolate": True, "mgpu_seed": "4"})
    assert resolve(_reader({}), _reader({}), environ={}) == Settings()
    from_ini = resolve(_reader({}), ini, environ={})
    assert (from_ini.fallback, from_ini.timeout_s, from_ini.isolate, from_ini.seed) == ("cpu", 7.0, True, 4)
    assert from_ini.timeout_source == "ini mgpu_timeout=7"
    from_env = resolve(_reader({}), ini, environ={"PYTEST_MGPU_FALLBACK": "skip", "PYTEST_MGPU_ISOLATE": "off"})
    assert (from_env.fallback, from_env.isolate) == ("skip", False)
    from_cli = resolve(_reader({"mgpu_fallback": "cpu", "mgpu_timeout": "9"}), ini,
                       environ={"PYTEST_MGPU_FALLBACK": "skip"})
    assert (from_cli.fallback, from_cli.timeout_s, from_cli.timeout_source) == ("cpu", 9.0, "--mgpu-timeout=9")


def test_an_empty_value_counts_as_not_given():
    settings = resolve(_reader({"mgpu_seed": ""}), _reader({"mgpu_seed": "5", "mgpu_fallback": " "}),
                       environ={"PYTEST_MGPU_FALLBACK": ""})
    assert (settings.seed, settings.fallback) == (5, "skip")


def test_the_same_bad_value_is_blamed_on_where_it_was_found():
    bad = {"mgpu_regression": "fast"}
    with pytest.raises(SettingsError, match="^ini mgpu_regression takes"):
        resolve_timing(_reader({}), _reader(bad), Path("/root"))
    with pytest.raises(SettingsError, match="^--mgpu-regression takes"):
        resolve_timing(_reader(bad), _reader({}), Path("/root"))


def test_timing_paths_are_relative_to_where_they_were_given():
    ini = _reader({"mgpu_baselines": "from-ini"})
    here, root = Path("/here"), Path("/root")
    assert resolve_timing(_reader({}), _reader({}), root, here).baselines_dir == root / "baselines"
    assert resolve_timing(_reader({}), ini, root, here).baselines_dir == root / "from-ini"
    cli = _reader({"mgpu_baselines": "b", "mgpu_plot": "charts", "mgpu_report": ["r.json"]})
    timing = resolve_timing(cli, ini, root, here)
    assert (timing.baselines_dir, timing.plot_dir, timing.report_paths) == (here / "b", here / "charts",
                                                                             (here / "r.json",))
    assert resolve_timing(_reader({}), _reader({"mgpu_regression": "15%"}), root).threshold == pytest.approx(0.15)
