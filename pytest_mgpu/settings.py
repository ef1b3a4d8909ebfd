"""The plugin's settings: every option declared once (its flag, ini name, environment variable and
default), registered with pytest, and resolved in one place: command line > environment > ini
file > default.

A bad value is refused with a SettingsError that names where it came from (``--mgpu-timeout``,
``ini mgpu_timeout``, ``PYTEST_MGPU_FALLBACK``), so that the user fixes the right file. An empty
value (``PYTEST_MGPU_FALLBACK=``, ``mgpu_gate =``, ``--mgpu-seed=``) counts as not given, as an
unset variable does, and the next source decides; the one exception is ``mgpu_isolate =``, which
pytest itself reads as a "bool" ini and refuses (the error still names the ini).

ini options are registered as type "string" (or "bool"), default None: None tells "not in the ini
file" apart from a value, which the order above needs, and pytest's "int"/"float" types only exist
from pytest 8.4 on (this package supports pytest 8), so numbers are parsed here, for every source
alike.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Final, Iterable, Literal, Mapping, Optional, Tuple, cast, get_args

from .devices import FALLBACKS
from .timing.rule import DEFAULT_THRESHOLD

ENV_FALLBACK: Final = "PYTEST_MGPU_FALLBACK"
ENV_ISOLATE: Final = "PYTEST_MGPU_ISOLATE"
ENV_REQUIRE_GPUS: Final = "PYTEST_MGPU_REQUIRE_GPUS"
ENV_AGAINST: Final = "PYTEST_MGPU_AGAINST"
ENV_EXTERNAL: Final = "PYTEST_MGPU_EXTERNAL"
ENV_STRUCTURE: Final = "PYTEST_MGPU_STRUCTURE"
ENV_STRUCTURE_TOLERANCE: Final = "PYTEST_MGPU_STRUCTURE_TOLERANCE"
EXTERNAL_MODES: Final = ("auto", "on", "off")
DEFAULT_TIMEOUT_S: Final = 300.0
DEFAULT_TIMEOUT_SOURCE: Final = f"the default --mgpu-timeout of {DEFAULT_TIMEOUT_S:g}s"
DEFAULT_SEED: Final = 0
DEFAULT_MAX_CPU_RANKS: Final = 8

# What a timing regression does: fail the test, warn, or auto (see TimingSettings.mode_for).
GateMode = Literal["auto", "fail", "warn"]
GATE_MODES: Final[Tuple[GateMode, ...]] = get_args(GateMode)
REPORT_SUFFIXES: Final = ("", ".md", ".json", ".csv")
# Which tests run by whether they time (dist.benchmark): all, only those, or all but those.
BenchmarkSelection = Literal["all", "only", "skip"]
BENCHMARK_SELECTIONS: Final[Tuple[BenchmarkSelection, ...]] = get_args(BenchmarkSelection)
# Whether the structure of simulate() and dist.benchmark calls is judged against its golden: auto
# judges where the project keeps a goldens file, check also lists the calls that have none.
StructureMode = Literal["auto", "check", "off"]
STRUCTURE_MODES: Final[Tuple[StructureMode, ...]] = get_args(StructureMode)

IniType = Literal["string", "bool"]
TRUE: Final = frozenset({"1", "true", "t", "yes", "y", "on"})  # pytest's own reading of a "bool" ini
FALSE: Final = frozenset({"0", "false", "f", "no", "n", "off"})


class SettingsError(ValueError):
    pass


# -- the options ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One option: ``dest`` is also its ini name; ``ini`` None: command line only."""

    dest: str
    flag: str
    help: str
    ini: Optional[IniType] = "string"
    ini_help: str = ""
    env: Optional[str] = None
    cli: Mapping[str, object] = field(default_factory=dict)  # more pytest addoption arguments


FALLBACK = Option(
    "mgpu_fallback", "--mgpu-fallback",
    f"what a gpuN test does with fewer than N GPUs: skip it (default), run it on N gloo CPU ranks "
    f"(cpu), or on N gloo ranks taking turns on the GPUs there are (share; cpu without a GPU). Also "
    f"ini mgpu_fallback, env {ENV_FALLBACK}.",
    ini_help="skip, cpu or share: see --mgpu-fallback", env=ENV_FALLBACK, cli={"choices": FALLBACKS})
TIMEOUT = Option(
    "mgpu_timeout", "--mgpu-timeout",
    "seconds one dist.run may take before its ranks are reported as hung and killed (default 300; "
    "ini mgpu_timeout; per call: dist.run(..., timeout=S)).",
    ini_help="seconds per dist.run call: see --mgpu-timeout", cli={"metavar": "S"})
SEED = Option("mgpu_seed", "--mgpu-seed", "seed of every rank (default 0)", ini_help="seed of every rank",
              cli={"metavar": "N"})
MAX_CPU_RANKS = Option(
    "mgpu_max_cpu_ranks", "--mgpu-max-cpu-ranks",
    "largest world size emulated on CPU; larger tests are skipped (default 8)",
    ini_help="largest world size emulated on CPU", cli={"metavar": "N"})
ISOLATE = Option(
    "mgpu_isolate", "--mgpu-isolate",
    "fresh rank processes for every dist.run instead of warm reused ones (slower; also marker "
    f"mgpu_isolate, ini mgpu_isolate, env {ENV_ISOLATE}=1)",
    ini="bool", ini_help="true: fresh rank processes for every call", env=ENV_ISOLATE,
    cli={"action": "store_const", "const": "1"})
REQUIRE_GPUS = Option(
    "mgpu_require_gpus", "--mgpu-require-gpus",
    "fail the session when fewer than N GPUs are visible, or when a gpuK test with K <= N did not get "
    f"its GPUs (skipped or emulated on CPU): for GPU runners (ini mgpu_require_gpus, env {ENV_REQUIRE_GPUS}; "
    "0: no requirement)",
    ini_help="GPUs this runner must have: see --mgpu-require-gpus", env=ENV_REQUIRE_GPUS, cli={"metavar": "N"})
CORE_OPTIONS: Final = (FALLBACK, TIMEOUT, SEED, MAX_CPU_RANKS, ISOLATE, REQUIRE_GPUS)

BASELINES = Option(
    "mgpu_baselines", "--mgpu-baselines",
    "directory of timing baselines, one JSON file per hardware fingerprint (default: "
    "<rootdir>/baselines; ini mgpu_baselines)",
    ini_help="timing baselines directory: see --mgpu-baselines", cli={"metavar": "DIR"})
SAVE_BASELINES = Option(
    "mgpu_save_baselines", "--mgpu-save-baselines",
    "record both: --mgpu-save-timing and --mgpu-save-structure",
    ini=None, cli={"action": "store_true"})
SAVE_TIMING = Option(
    "mgpu_save_timing", "--mgpu-save-timing",
    "append this run's timings (of tests that passed) to the baseline histories of this machine",
    ini=None, cli={"action": "store_true"})
BENCHMARKS = Option(
    "mgpu_benchmarks", "--mgpu-benchmarks",
    "run only the timing tests (only: tests marked mgpu_benchmark, or calling dist.benchmark in their own "
    "body), or all but them (skip); the others are deselected. Default all",
    ini=None, cli={"choices": BENCHMARK_SELECTIONS})
REGRESSION = Option(
    "mgpu_regression", "--mgpu-regression",
    "effect size a slowdown must exceed to count as a regression (default 10; ini mgpu_regression)",
    ini_help="regression threshold in percent: see --mgpu-regression", cli={"metavar": "PCT"})
GATE = Option(
    "mgpu_gate", "--mgpu-gate",
    "what a regression does: fail the test, warn, or auto (default: fail once the measurement has a "
    "long enough history, GPUs and CPU ranks alike; warn under -n)",
    ini_help="auto, fail or warn: see --mgpu-gate", cli={"choices": GATE_MODES})
REPORT = Option(
    "mgpu_report", "--mgpu-report",
    "write the timing report to PATH: .md, .json or .csv; no extension: Markdown appended "
    "(--mgpu-report=$GITHUB_STEP_SUMMARY); repeatable",
    ini=None, cli={"metavar": "PATH", "action": "append"})
PLOT = Option("mgpu_plot", "--mgpu-plot", "draw PNG charts of the timings into DIR (needs matplotlib)",
              ini=None, cli={"metavar": "DIR"})
AGAINST = Option(
    "mgpu_against", "--mgpu-against",
    "measure every dist.benchmark against git revision REV (e.g. origin/main): working tree and REV take turns in "
    f"two sets of ranks, the head/base ratio judges; not saved to a history (ini mgpu_against, env {ENV_AGAINST})",
    ini_help="git revision to measure every dist.benchmark against: see --mgpu-against", env=ENV_AGAINST,
    cli={"metavar": "REV"})
TIMING_OPTIONS: Final = (BASELINES, SAVE_BASELINES, SAVE_TIMING, BENCHMARKS, REGRESSION, GATE, REPORT, PLOT, AGAINST)

STRUCTURE = Option(
    "mgpu_structure", "--mgpu-structure",
    "judge the structure of simulate(), dist.benchmark, assert_parity and assert_same_training calls (collectives "
    "per step, bytes sent, exact peak memory) against --mgpu-baselines' structure.json: auto (default: where that "
    "file exists), check (also list the calls without a golden) or off (ini mgpu_structure, env "
    f"{ENV_STRUCTURE}); a test opts out with @pytest.mark.mgpu_structure(False)",
    ini_help="auto, check or off: see --mgpu-structure", env=ENV_STRUCTURE, cli={"choices": STRUCTURE_MODES})
SAVE_STRUCTURE = Option(
    "mgpu_save_structure", "--mgpu-save-structure",
    "record the structure goldens of this run's calls (tests that passed) into --mgpu-baselines' structure.json",
    ini=None, cli={"action": "store_true"})
STRUCTURE_TOLERANCE = Option(
    "mgpu_structure_tolerance", "--mgpu-structure-tolerance",
    "how far bytes sent and peak memory may move from the structure golden, in percent (default 0: exact; "
    f"collective counts are always exact; ini mgpu_structure_tolerance, env {ENV_STRUCTURE_TOLERANCE})",
    ini_help="percent bytes and peak memory may move: see --mgpu-structure-tolerance",
    env=ENV_STRUCTURE_TOLERANCE, cli={"metavar": "PCT"})
STRUCTURE_OPTIONS: Final = (STRUCTURE, STRUCTURE_TOLERANCE, SAVE_STRUCTURE)

EXTERNAL = Option(
    "mgpu_external", "--mgpu-external",
    "join the job when pytest runs in ranks started by torchrun or srun: auto (default: when RANK, "
    "WORLD_SIZE, MASTER_ADDR, MASTER_PORT or an srun step's SLURM_PROCID, SLURM_NTASKS are set), on, off. "
    f"Also env {ENV_EXTERNAL}.",
    ini=None, env=ENV_EXTERNAL, cli={"choices": EXTERNAL_MODES})
RANK_LOGS = Option(
    "mgpu_rank_logs", "--mgpu-rank-logs",
    "under torchrun/srun, where ranks other than 0 write their pytest output (default: "
    "<tmp>/pytest-mgpu-<job>/rankN.log); rank 0 reports for all",
    ini=None, cli={"metavar": "DIR"})
EXTERNAL_OPTIONS: Final = (EXTERNAL, RANK_LOGS)
ALL_OPTIONS: Final = CORE_OPTIONS + TIMING_OPTIONS + STRUCTURE_OPTIONS + EXTERNAL_OPTIONS


def add_options(parser, group, options) -> None:
    """Register ``options`` with pytest: the flag in ``group``, the ini name with its type."""
    for opt in options:
        default = False if opt.cli.get("action") == "store_true" else None
        group.addoption(opt.flag, dest=opt.dest, default=default, help=opt.help, **opt.cli)
    for opt in options:
        if opt.ini is not None:
            parser.addini(opt.dest, opt.ini_help, type=opt.ini, default=None)


# -- reading them -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Given:
    """A value and where it came from: "--mgpu-timeout", "PYTEST_MGPU_FALLBACK", "ini mgpu_timeout",
    or "default" (then ``value`` is None)."""

    value: object
    where: str

    @property
    def source(self) -> Literal["command line", "environment", "ini", "default"]:
        if self.where.startswith("--"):
            return "command line"
        if self.where.startswith("ini "):
            return "ini"
        return "default" if self.where == "default" else "environment"


class Sources:
    """Command line, environment and ini file, read in that order."""

    def __init__(self, option: Callable[[str], object], ini: Callable[[str], object],
                 environ: Optional[Mapping[str, str]] = None):
        self.option, self.ini = option, ini
        self.environ = os.environ if environ is None else environ

    def pick(self, opt: Option) -> Given:
        value = self.option(opt.dest)
        if not _empty(value):
            return Given(value, opt.flag)
        if opt.env and not _empty(self.environ.get(opt.env)):
            return Given(self.environ[opt.env], opt.env)
        if opt.ini is not None:
            where = f"ini {opt.dest}"
            try:
                value = self.ini(opt.dest)
            except Exception as exc:  # pytest could not read it as its type: ValueError, UsageError (9.2)
                raise SettingsError(f"{where} must be a {opt.ini} ({exc})") from None
            if not _empty(value):
                return Given(value, where)
        return Given(None, "default")


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def choice(given: Given, choices: Tuple[str, ...], default: str) -> str:
    if given.value is None:
        return default
    value = str(given.value).strip().lower()
    if value not in choices:
        raise SettingsError(f"{given.where} must be one of {', '.join(choices)}, got {value!r}")
    return value


def integer(given: Given, default: int) -> int:
    if given.value is None:
        return default
    try:
        return int(str(given.value).strip())
    except ValueError:
        raise SettingsError(f"{given.where} takes an integer, got {given.value!r}") from None


def at_least_one(given: Given, default: int) -> int:
    """An integer >= 1: 0 or fewer emulated ranks would skip every distributed test in silence."""
    value = integer(given, default)
    if value < 1:
        raise SettingsError(f"{given.where} must be 1 or more, got {given.value!r}")
    return value


def at_least_zero(given: Given, default: int) -> int:
    value = integer(given, default)
    if value < 0:
        raise SettingsError(f"{given.where} must be 0 or more, got {given.value!r}")
    return value


def boolean(given: Given) -> bool:
    if given.value is None:
        return False
    if isinstance(given.value, bool):  # a "bool" ini, already read by pytest
        return given.value
    text = str(given.value).strip().lower()
    if text not in TRUE | FALSE:
        raise SettingsError(f"{given.where} must be true or false (1/0, yes/no, on/off), got {given.value!r}")
    return text in TRUE


def validate_timeout(value: object, where: str, *, text_ok: bool) -> float:
    """A limit in seconds: a positive, finite number, or a SettingsError naming ``where`` it came from
    (as pytest-timeout's ``_validate_timeout(timeout, where)`` does). ``text_ok``: the value comes from
    a command line or an ini file, so "5" is read as 5; from Python code, a string is refused."""
    if isinstance(value, bool) or (isinstance(value, str) and not text_ok):
        raise SettingsError(f"{where} must be a positive, finite number of seconds, got "
                            f"{type(value).__name__} {value!r}")
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SettingsError(f"{where} must be a positive, finite number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise SettingsError(f"{where} must be a positive, finite number of seconds, got {value!r}")
    return seconds


def percentage(given: Given, default: float) -> float:
    """"10" or "10%" as the fraction 0.10."""
    if given.value is None:
        return default
    try:
        fraction = float(str(given.value).strip().rstrip("%")) / 100.0
    except ValueError:
        raise SettingsError(f"{given.where} takes a percentage such as 10 or 10%, got {given.value!r}") from None
    if not (fraction > 0 and math.isfinite(fraction)):
        raise SettingsError(f"{given.where} must be a positive, finite percentage, got {given.value!r}")
    return fraction


# -- the core settings ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    fallback: str = "skip"
    timeout_s: float = DEFAULT_TIMEOUT_S
    timeout_source: str = DEFAULT_TIMEOUT_SOURCE  # named when the limit fires
    seed: int = DEFAULT_SEED
    max_cpu_ranks: int = DEFAULT_MAX_CPU_RANKS
    isolate: bool = False  # fresh rank processes for every call instead of warm ones
    require_gpus: int = 0  # fail the session when the runner lacks these GPUs (0: no requirement)
    require_source: str = "default"  # where require_gpus came from, for the failure message


def resolve(option: Callable[[str], object], ini: Callable[[str], object],
            environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The core settings; command line beats environment beats ini file beats default."""
    src = Sources(option, ini, environ)
    timeout = src.pick(TIMEOUT)
    if timeout.value is None:
        seconds, source = DEFAULT_TIMEOUT_S, DEFAULT_TIMEOUT_SOURCE
    else:
        seconds = validate_timeout(timeout.value, timeout.where, text_ok=True)
        source = f"{timeout.where}={seconds:g}"
    require = src.pick(REQUIRE_GPUS)
    return Settings(
        fallback=choice(src.pick(FALLBACK), FALLBACKS, "skip"),
        timeout_s=seconds,
        timeout_source=source,
        seed=integer(src.pick(SEED), DEFAULT_SEED),
        max_cpu_ranks=at_least_one(src.pick(MAX_CPU_RANKS), DEFAULT_MAX_CPU_RANKS),
        isolate=boolean(src.pick(ISOLATE)),
        require_gpus=at_least_zero(require, 0),
        require_source=require.where,
    )


# -- the timing settings ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TimingSettings:
    baselines_dir: Path
    save: bool = False
    threshold: float = DEFAULT_THRESHOLD  # fraction: 0.10 = 10% slower
    gate: GateMode = "auto"  # auto: fail once a measurement's history is long enough (GPUs and CPU ranks)
    report_paths: Tuple[Path, ...] = ()
    plot_dir: Optional[Path] = None
    against: Optional[str] = None  # git revision of the revision lane (timing.revision)
    benchmarks: BenchmarkSelection = "all"  # --mgpu-benchmarks: which tests run by whether they time
    save_flag: str = SAVE_TIMING.flag  # the flag that asked for saving, named in its errors

    def mode_for(self, shared_cores: bool) -> Literal["fail", "warn"]:
        """What a regression does. ``auto`` fails on GPUs and on emulated CPU ranks alike (the
        history rule holds its false-alarm rate on the shared machine: docs/design/timing-gate.md), except under xdist,
        where tests time each other's load: there it only warns."""
        if self.gate == "auto":
            return "warn" if shared_cores else "fail"
        return "fail" if self.gate == "fail" else "warn"


def resolve_timing(option: Callable[[str], object], ini: Callable[[str], object], rootpath: Path,
                   invocation_dir: Optional[Path] = None) -> TimingSettings:
    """The timing settings (command line beats ini). Paths given on the command line are relative
    to where pytest was started; the baselines directory from the ini file, or by default, to the
    rootdir."""
    src = Sources(option, ini)
    here = Path(invocation_dir) if invocation_dir is not None else Path.cwd()
    baselines = src.pick(BASELINES)
    base = {"command line": here, "ini": rootpath}.get(baselines.source)
    raw_reports = option(REPORT.dest) or []  # one path, or the list the repeatable option appends to
    listed = [raw_reports] if isinstance(raw_reports, str) else cast(Iterable[object], raw_reports)
    reports = tuple(here / str(r) for r in listed)
    for report in reports:
        if report.suffix.lower() not in REPORT_SUFFIXES:
            raise SettingsError(f"{REPORT.flag} writes .md, .json or .csv (by extension; no extension: "
                                f"Markdown appended, as for $GITHUB_STEP_SUMMARY), got {report}")
    plots = src.pick(PLOT).value
    against = src.pick(AGAINST)
    return TimingSettings(
        baselines_dir=base / str(baselines.value) if base is not None else rootpath / "baselines",
        save=bool(option(SAVE_BASELINES.dest) or option(SAVE_TIMING.dest)),
        save_flag=SAVE_TIMING.flag if option(SAVE_TIMING.dest) else SAVE_BASELINES.flag,
        threshold=percentage(src.pick(REGRESSION), DEFAULT_THRESHOLD),
        gate=choice(src.pick(GATE), GATE_MODES, "auto"),  # type: ignore[arg-type]
        report_paths=reports,
        plot_dir=here / str(plots) if plots is not None else None,
        against=str(against.value).strip() if against.value is not None else None,
        benchmarks=choice(src.pick(BENCHMARKS), BENCHMARK_SELECTIONS, "all"),  # type: ignore[arg-type]
    )
