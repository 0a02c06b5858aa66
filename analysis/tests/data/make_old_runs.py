"""Runs written by an older version's own writer, for test_results.py: two SCHED=deadline
budgets × two repetitions of 240 measured records, deterministic. Run with that version's
sources first on the path:

    git archive 09aa600~1 analysis | tar -x -C /tmp/v6
    PYTHONPATH=/tmp/v6/analysis/src python make_old_runs.py v6-deadline-bare    # schema 6
    git archive 62899f7~1 analysis | tar -x -C /tmp/v11                          # schema 11
"""

import sys
from pathlib import Path

import numpy as np
from hvbench_analysis import results, synthetic

out = Path(sys.argv[1])
rng = np.random.default_rng(7)
for budget in (20_000, 50_000):
    for rep in (1, 2):
        latency = (rng.gamma(4.0, 400_000.0 * 20_000 / budget, 240)).astype(np.int64)
        synthetic.write_run(
            out / f"deadline-b{budget}-r{rep}",
            latency,
            sched="deadline",
            budget=budget,
            period=100_000,
            rep=rep,
            campaign="old",
            warmup=12,
            missing=rep - 1,
        )
print(results.SCHEMA_VERSION)
