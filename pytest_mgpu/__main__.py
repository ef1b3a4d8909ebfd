"""python -m pytest_mgpu: what this machine offers for distributed tests, its hardware fingerprints,
and whether a timing baseline exists for them, read with the project's pytest ini (found as pytest
finds it from the current folder: mgpu_fallback, mgpu_baselines) and the environment.

python -m pytest_mgpu compare OLD NEW: judge NEW's timings against OLD's (baseline files or JSON
reports), print the table, exit 1 on a regression. The structure goldens (structure.json) are judged
by pytest itself: see --mgpu-structure in pytest --help."""
import argparse
import json
import sys
from dataclasses import asdict


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "compare":
        from .timing.compare import main as compare

        return compare(argv[1:])
    from .environment import environment_report

    ap = argparse.ArgumentParser(prog="python -m pytest_mgpu", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--baselines", metavar="DIR", default=None,
                    help="timing baselines directory to look for this machine's files in (default: the "
                         "project ini's mgpu_baselines, else <rootdir>/baselines, as pytest would use)")
    args = ap.parse_args(argv)
    report = environment_report(args.baselines)
    print(json.dumps(asdict(report), indent=2) if args.json else report.format())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
