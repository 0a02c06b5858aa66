"""The reservation simulator's speed: 20,000 records at 60 rec/s (the study's run), each
needing about 1 ms of CPU (lognormal), under each server; next to the records' own count.

Goal: one setting's 20,000 records simulated in under 1 s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from common import report, summary, time_calls
from hvbench_analysis import prediction, simulate
from hvbench_analysis.credit import Neighbour, credit_beside
from hvbench_analysis.credit2 import credit2_beside
from hvbench_analysis.edf import Releases, Server, edf

RECORDS = 20_000
MS = 1_000_000
# always-busy servers on the same CPU (edf.py): 40 per 150 ms and 25 per 90 ms
NEIGHBOURS = [Server(40 * MS, 150 * MS, 3 * MS), Server(25 * MS, 90 * MS, 11)]
PERIODIC_NEIGHBOUR = Server(30 * MS, 100 * MS, -1, releases=Releases(5 * MS, 30 * MS))


def main() -> None:
    rng = np.random.default_rng(4)
    arrivals = np.cumsum(rng.exponential(MS * 1000 / 60, RECORDS)).astype(np.int64)
    demands = (rng.lognormal(0, 0.5, RECORDS) * MS).astype(np.int64)
    two_vcpus = vcpu_table(arrivals, demands, rng)
    each = [{"budget_us": 20_000, "period_us": 100_000}]
    servers = {
        "none": lambda: simulate.unconstrained(arrivals, demands),
        "periodic 20/100 ms": lambda: simulate.periodic(arrivals, demands, 20 * MS, 100 * MS),
        "cbs 20/100 ms": lambda: simulate.cbs(arrivals, demands, 20 * MS, 100 * MS),
        "cbs 2/100 ms (overloaded)": lambda: simulate.cbs(arrivals, demands, 2 * MS, 100 * MS),
        "credit cap 5": lambda: simulate.credit_cap(arrivals, demands, 5),
        "credit beside 2 busy vCPUs": lambda: credit_beside(arrivals, demands, 256, [256, 256]),
        "credit2 beside 2 busy vCPUs": lambda: credit2_beside(arrivals, demands, 256, [256, 256]),
        "credit cap 50 beside a neighbour of 5 ms every 30 ms": lambda: credit_beside(
            arrivals, demands, 256, [Neighbour(256, 5_000_000, 30_000_000)], cap=50
        ),
        "credit2 beside a neighbour of 5 ms every 30 ms": lambda: credit2_beside(
            arrivals, demands, 256, [Neighbour(256, 5_000_000, 30_000_000)]
        ),
        "credit2 cap 25 alone": lambda: credit2_beside(arrivals, demands, 256, [], cap=25),
        "credit2 cap 25 beside a busy vCPU": lambda: credit2_beside(
            arrivals, demands, 256, [256], cap=25
        ),
        "edf 20/100 ms with extratime beside 2 busy servers": lambda: edf(
            [Server(20 * MS, 100 * MS, 0, arrivals, demands, extratime=True), *NEIGHBOURS]
        ),
        "edf 20/100 ms beside 2 busy servers": lambda: edf(
            [Server(20 * MS, 100 * MS, 0, arrivals, demands), *NEIGHBOURS]
        ),
        "edf 20/100 ms beside a server with 5 ms every 30 ms": lambda: edf(
            [Server(20 * MS, 100 * MS, 0, arrivals, demands), PERIODIC_NEIGHBOUR]
        ),
        "kvm, 2 vCPUs, cbs 20/100 ms on each (prediction.predicted)": lambda: prediction.predicted(
            two_vcpus, "kvm", "deadline", each
        ),
    }
    rows = {name: summary(time_calls(call, 3, 1)) for name, call in servers.items()}
    slowest_s = max(row["p99_us"] for row in rows.values()) / 1e6
    report(
        "bench_simulate",
        rows,
        [(f"{RECORDS} records under one setting < 1 s", slowest_s < 1.0)],
        {"records": RECORDS, "slowest_s": round(slowest_s, 3)},
    )


def vcpu_table(arrivals: np.ndarray, demands: np.ndarray, rng) -> pd.DataFrame:
    """The records as a testbed's demand table: each one's CPU time split over two vCPUs."""
    first = (demands * rng.uniform(0.3, 0.7, len(demands))).astype(np.int64)
    return pd.DataFrame(
        {"detector": "a", "seq": np.arange(len(arrivals)), "sent_ns": arrivals,
         "latency_ns": demands + 2 * MS, "from_ns": arrivals, "cpu_ns": demands,
         "vcpu_ns:0": first, "vcpu_ns:1": demands - first}
    )  # fmt: skip


if __name__ == "__main__":
    main()
