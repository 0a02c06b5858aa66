"""Calibrate the TSC of this machine and write the calibration as JSON, for processes that
`adopt` it (the producers and the consumer of a run on another machine).

    python -m tsc_timer --out calibration.json [--force]
"""

from __future__ import annotations

import argparse
import json
import sys

import tsc_timer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tsc_timer", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--force", action="store_true", help="accept a TSC without constant/nonstop")
    args = p.parse_args(argv)
    try:
        calibration = tsc_timer.calibrate(force=args.force)
    except tsc_timer.TscUnavailable as e:
        print(f"tsc_timer: {e}", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        json.dump(calibration.as_dict(), f)
    print(json.dumps(calibration.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
