"""``python -m pytest_mgpu``: what this machine offers for distributed tests, its hardware
fingerprints, and whether a timing baseline exists for them."""
import argparse
import json
from dataclasses import asdict

from .environment import environment_report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pytest_mgpu", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--baselines", metavar="DIR", default="baselines",
                    help="timing baselines directory to look for this machine's files in (default: ./baselines)")
    args = ap.parse_args(argv)
    report = environment_report(args.baselines)
    print(json.dumps(asdict(report), indent=2) if args.json else report.format())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
