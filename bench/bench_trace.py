"""What TRACE=1 costs the pipeline: runs at 60 rec/s with and without the scheduler trace, the
same setting (SCHED=none), in turns (untraced, traced, untraced, traced), so that a machine
that drifts meanwhile weighs on both alike. The figure is the ratio of the p99s (and p99.9s),
traced over untraced, over the runs pooled per kind.

    python bench/bench_trace.py --model artifacts/forecaster --data data/pems [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import pipeline
from common import OUT


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="artifacts/forecaster")
    p.add_argument("--data", default="data/pems")
    p.add_argument("--seconds", type=float, default=60.0, help="measured per run, at 60 rec/s")
    p.add_argument("--warmup-seconds", type=float, default=30.0)
    p.add_argument("--pairs", type=int, default=2, help="untraced/traced pairs")
    return p.parse_args()


def mean_of(runs: list[dict], key: str) -> float:
    values = [r["latency"][key] for r in runs if r.get("latency")]
    return sum(values) / len(values) if values else float("nan")


def main() -> int:
    args = parse_args()
    records = int(60 * (args.warmup_seconds + args.seconds))
    runs: dict[str, list[dict]] = {"untraced": [], "traced": []}
    for pair in range(args.pairs):
        for kind, extra in (("untraced", ()), ("traced", ("--trace",))):
            run = pipeline(
                args, records, 100.0, args.warmup_seconds, f"bench-{kind}-{pair}", extra=extra
            )
            runs[kind].append(run)
            lat = run["latency"] or {}
            print(
                f"  {kind:>8} {pair}: p50 {lat.get('p50_ms', 0):.2f} ms  p99 "
                f"{lat.get('p99_ms', 0):.2f} ms  p99.9 {lat.get('p99.9_ms', 0):.2f} ms"
            )
    figures = {
        kind: {k: mean_of(rs, k) for k in ("p50_ms", "p99_ms", "p99.9_ms", "max_ms")}
        for kind, rs in runs.items()
    }
    for key in ("p99_ms", "p99.9_ms"):
        figures[f"ratio_{key}"] = figures["traced"][key] / figures["untraced"][key]
        print(
            f"  traced / untraced {key[:-3]}: {figures[f'ratio_{key}']:.2f} "
            f"(mean over {args.pairs} run(s) each)"
        )
    figures["trace_events"] = [r.get("trace", {}).get("lines") for r in runs["traced"]]
    figures["runs"] = runs
    OUT.mkdir(exist_ok=True)
    (OUT / "trace_cost.json").write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
