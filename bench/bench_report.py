"""Time of `make report` (the whole report: load, tables, figures, HdrHistogram logs, HTML).

1. 10 runs × 20,000 samples (goal ≤ 2 s);
2. 1 run × 1,000,000 samples (goal ≤ 3 s);
3. a campaign the size of Table 4's: 6 budgets × 5 repetitions × 20,000 samples, with the
   intervals across repetitions and their ECDF bands (goal ≤ 15 s).

Runs are synthetic, written in the results layout first (not timed). Each figure is the best of
three, in a fresh process so imports are counted once as they are for `make report`.

    python bench/bench_report.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from hvbench_analysis.synthetic import write_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT

# label, runs, samples per run, repetitions of each configuration, goal in seconds
CASES = (
    ("10 runs x 20,000", 10, 20_000, 1, 2.0),
    ("1 run x 1,000,000", 1, 1_000_000, 1, 3.0),
    ("campaign: 6 configurations x 5 repetitions x 20,000", 30, 20_000, 5, 15.0),
)


def make_runs(folder: Path, runs: int, samples: int, reps: int = 1) -> None:
    rng = np.random.default_rng(1)
    if reps > 1:  # Table 4's layout: RTDS budgets, each run `reps` times
        for i in range(runs):
            budget, rep = 100_000 - 5_000 * (i // reps), i % reps + 1
            write_run(
                folder / f"b{budget}-r{rep}",
                rng.lognormal(np.log(5e6), 0.5, samples),
                target="xen",
                sched="rtds",
                budget=budget,
                period=100_000,
                rep=rep,
                warmup=600,
            )
        return
    for i in range(runs):
        sched, extra = (
            ("rtds", {"budget": 50_000 + 5_000 * i, "period": 100_000})
            if i % 2
            else ("credit", {"cap": 10 * (i + 1)})
        )
        write_run(
            folder / f"run-{i:02d}",
            rng.lognormal(np.log(5e6), 0.5, samples),
            target="xen",
            sched=sched,
            warmup=600,
            **extra,
        )


def timed_report(results: Path, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hvbench_analysis.report",
            "--results",
            str(results),
            "--out",
            str(out),
            "--deadline-ms",
            "20",
            "--xlim-ms",
            "50",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> int:
    figures = {}
    print("report")
    for label, runs, samples, reps, goal in CASES:
        folder = Path(tempfile.mkdtemp(prefix="hvbench-bench-report-"))
        try:
            make_runs(folder / "results", runs, samples, reps)
            seconds = min(timed_report(folder / "results", folder / "out") for _ in range(3))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        met = seconds <= goal
        figures[label] = {"seconds": round(seconds, 2), "goal_s": goal, "met": met}
        print(
            f"  {label}: {seconds:.2f} s ({seconds / goal:.2f} of the {goal:g} s goal): "
            f"{'met' if met else 'MISSED'}"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
