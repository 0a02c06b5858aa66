"""hvbench predict: a setting's latencies predicted from one traced run, before measuring it.

    hvbench predict --run results/<traced run> --sched deadline --budget 20000 --period 100000
    hvbench predict --run ... --sched cfs-quota --budgets 5000,10000,20000,40000

The traced run (TRACE=1, unconstrained: SCHED=none is best) gives each record's arrival at the
job, its CPU time on each job thread and its latency (hvbench_analysis.demand). The setting's
server replays the records (hvbench_analysis.simulate) and so does no reservation; each record's
predicted latency is its measured one plus what the setting's server adds over none. What the
CPU did not decide (the Kafka hops, the waits) stays as measured, record by record, with its
correlations.

The server of each setting (docs/simulate.md):
- bare: deadline, one constant bandwidth server per job thread (as the harness applies it);
  the threads in series, so their delays add up; cfs-quota, one periodic server for the
  job's threads together (their cgroup's quota);
- kvm (the real-time VM's vCPU): cfs, a periodic server; deadline, one constant bandwidth
  server; fifo, none (its CPU alone);
- xen: rtds, a periodic server (with extratime, alone in its pool: none); credit and credit2,
  the cap of a one-vCPU domain alone in its pool (no cap: none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from hvbench_agent.sched import BACKEND_OF_TARGET, Refused, validate
from hvbench_analysis import demand, simulate

US = 1_000
QUANTILES = {"p50": 50, "p90": 90, "p99": 99, "p99.9": 99.9, "max": 100}


def server(setting):
    """The simulator's function for a validated setting: (arrivals, demands) → done times."""
    sched = setting.sched
    if sched in ("none", "fifo") or (sched == "rtds" and setting.extratime):
        return simulate.unconstrained
    if sched in ("cfs-quota", "cfs", "rtds"):
        budget, period = setting.budget_us * US, setting.period_us * US
        return lambda a, c: simulate.periodic(a, c, budget, period)
    if sched == "deadline":
        budget, period = setting.budget_us * US, setting.period_us * US
        return lambda a, c: simulate.cbs(a, c, budget, period)
    if not setting.cap:
        return simulate.unconstrained
    if setting.cap > 100:
        raise Refused(f"CAP={setting.cap}: a cap over one CPU needs several vCPUs, not modelled")
    if sched == "credit":
        tslice = (setting.tslice_us or 30_000) * US
        return lambda a, c: simulate.credit_cap(a, c, setting.cap, tslice)
    return lambda a, c: simulate.credit2_cap(a, c, setting.cap)


def added_delay(table: pd.DataFrame, target: str, setting) -> np.ndarray:
    """Per record, what the setting's server adds over no reservation (ns)."""
    arrivals = table["from_ns"].to_numpy(np.int64)
    per_thread = target == "bare" and setting.sched == "deadline"
    columns = [c for c in table if c.startswith(demand.THREAD_CPU)] if per_thread else ["cpu_ns"]
    serve = server(setting)
    delay = np.zeros(len(table), dtype=np.int64)
    for column in columns:
        demands = table[column].to_numpy(np.int64)
        delay += serve(arrivals, demands) - simulate.unconstrained(arrivals, demands)
    return delay


def predicted(table: pd.DataFrame, target: str, setting) -> pd.DataFrame:
    """The records with their predicted latencies, in a run's samples' form."""
    out = table[["detector", "seq", "sent_ns"]].copy()
    out["latency_ns"] = table["latency_ns"].to_numpy(np.int64) + added_delay(table, target, setting)
    out["received_ns"] = out["sent_ns"] + out["latency_ns"]
    return out


def statistics(latency_ns: np.ndarray, deadline_ms: float | None) -> dict:
    """p50 … max in ms, and the share over the deadline (%)."""
    ms = np.asarray(latency_ns, dtype=np.float64) / 1e6
    row = {name: round(float(np.percentile(ms, q)), 3) for name, q in QUANTILES.items()}
    if deadline_ms is not None:
        row[f"over {deadline_ms:g} ms (%)"] = round(100 * float(np.mean(ms > deadline_ms)), 3)
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvbench predict", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a traced run's folder (TRACE=1)")
    p.add_argument("--sched", required=True)
    p.add_argument("--target", choices=tuple(BACKEND_OF_TARGET), help="default: the run's")
    for name in ("budget", "period", "cap", "extratime", "tslice-us"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--budgets", help="a grid of budgets (µs, comma-separated): one row each")
    p.add_argument("--deadline-ms", type=float)
    p.add_argument("--out", help="a CSV of every record's predicted latency (one setting)")
    return p.parse_args(argv)


def settings(args: argparse.Namespace, target: str) -> list:
    """The validated setting, or one per budget of the grid; Refused for a bad one."""
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else [args.budget]
    params = {"period_us": args.period, "cap": args.cap, "extratime": args.extratime,
              "tslice_us": args.tslice_us}  # fmt: skip
    backend = BACKEND_OF_TARGET[target]
    found = []
    for budget in budgets:
        given = {k: v for k, v in {**params, "budget_us": budget}.items() if v is not None}
        found.append(validate(backend, args.sched, **given))
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out and args.budgets:
        print("hvbench predict: --out takes one setting, not a grid (--budgets)", file=sys.stderr)
        return 2
    run = Path(args.run)
    try:
        meta = json.loads((run / "meta.json").read_text())
    except (OSError, ValueError) as e:
        print(f"hvbench predict: cannot read {run / 'meta.json'}: {e}", file=sys.stderr)
        return 1
    target = args.target or (meta.get("requested") or {}).get("target", "bare")
    table = demand.run_demands(run, meta)
    if table is None or table.empty:
        print(f"hvbench predict: {run} has no trace to read (make run TRACE=1)", file=sys.stderr)
        return 1
    try:
        chosen = settings(args, target)
        rows = []
        for setting in chosen:
            records = predicted(table, target, setting)
            text = " ".join(f"{k}={v}" for k, v in setting.describe().items())
            rows.append({"setting": text, **statistics(records["latency_ns"], args.deadline_ms)})
    except (Refused, ValueError) as e:
        print(f"hvbench predict: {e}", file=sys.stderr)
        return 1
    print(f"{len(table)} records of {run.name} (lag-1 autocorrelation of their CPU time "
          f"{demand.autocorrelation(table['cpu_ns']):.2f}); predicted, in ms:")  # fmt: skip
    print(pd.DataFrame(rows).to_string(index=False))
    if args.out:
        records.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
