"""hvbench predict: a setting's latencies predicted from one traced run, before measuring it.

    hvbench predict --run results/<traced run> --sched deadline --budget 20000 --period 100000
    hvbench predict --run ... --sched cfs-quota --budgets 5000,10000,20000,40000

The traced run (TRACE=1, unconstrained: SCHED=none is best) is replayed through the setting's
server (hvbench_analysis.prediction has how, docs/simulate.md the models' sources).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from hvbench_agent.sched import BACKEND_OF_TARGET, Refused, validate
from hvbench_analysis import demand, prediction, sched_trace


def reservation(setting, vcpus: int = 1, beside: tuple = (), cpus: int = 1) -> dict:
    """A validated setting's reservation, as hvbench_analysis.prediction takes it."""
    return {"budget_us": setting.budget_us, "period_us": setting.period_us, "cap": setting.cap,
            "extratime": setting.extratime, "tslice_us": setting.tslice_us,
            "ratelimit_us": setting.ratelimit_us, "weight": setting.weight, "vcpus": vcpus,
            "beside": list(beside), "cpus": cpus}  # fmt: skip


def predicted(
    table: pd.DataFrame, target: str, setting, background: float = 0.0, vcpus: int = 1,
    beside: tuple = (), cpus: int = 1,
) -> pd.DataFrame:  # fmt: skip
    """The records' predicted latencies under a validated setting (background: the share of
    a CPU the job's JVM used besides the records, demand.background_share; vcpus: the
    domain's, under a cap; beside: the weights of busy vCPUs of other domains on its CPU;
    cpus: the RTDS pool's CPUs that it and they share)."""
    found = [reservation(setting, vcpus, beside, cpus)]
    return prediction.predicted(table, target, setting.sched, found, background)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvbench predict", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a traced run's folder (TRACE=1)")
    p.add_argument("--sched", required=True)
    p.add_argument("--target", choices=tuple(BACKEND_OF_TARGET), help="default: the run's")
    for name in ("budget", "period", "cap", "weight", "extratime", "tslice-us", "ratelimit-us"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--budgets", help="a grid of budgets (µs, comma-separated): one row each")
    p.add_argument("--vcpus", type=int, default=1, help="the domain's vCPUs, under a cap")
    p.add_argument(
        "--beside", type=neighbours, default=(),
        help="vCPUs of other domains on its CPU: Credit weights (256,512), always busy, or "
        "weight:work/period in µs (256:5000/30000); RTDS budget/period[/extratime] in µs "
        "(30000/100000/1), always busy, or with :work/every in µs (30000/100000:5000/30000)",
    )  # fmt: skip
    p.add_argument(
        "--cpus", type=cpu_count, default=1,
        help="RTDS: the CPUs of the pool that it and its neighbours (--beside) share",
    )  # fmt: skip
    p.add_argument("--deadline-ms", type=float)
    p.add_argument("--out", help="a CSV of every record's predicted latency (one setting)")
    return p.parse_args(argv)


def cpu_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a number of CPUs, 1 or more (not {text!r})")
    return int(text)


def neighbours(text: str) -> tuple:
    """Neighbours: Credit weights (256,512), always busy; a Credit weight with its work every
    period in µs (256:5000/30000); or RTDS budget/period[/extratime] in µs
    (30000/100000,20000/50000/1), always busy, or with its work every so often in µs
    (30000/100000:5000/30000)."""
    found = []
    for item in text.split(","):
        head, colon, rest = item.partition(":")
        words, work = head.split("/"), rest.split("/") if colon else []
        numbers = [*words, *work]
        if not all(w.isdigit() for w in numbers) or len(words) > 3 or len(work) not in (0, 2):
            raise argparse.ArgumentTypeError(
                f"neighbours as weights (256,512), weight:work/period in µs (256:5000/30000) "
                f"or budget/period[/extratime][:work/every] in µs (30000/100000/1), not {item!r}"
            )
        if len(words) == 1:
            found.append(credit_neighbour(int(head), list(map(int, work))))
            continue
        found.append(rtds_neighbour(item, list(map(int, words)), list(map(int, work))))
    return tuple(found)


def rtds_neighbour(item: str, reservation: list[int], work_every: list[int]) -> dict:
    budget, period, *extratime = reservation
    if not 0 < budget <= period or extratime not in ([], [0], [1]):
        raise argparse.ArgumentTypeError(f"a budget from 1 µs to the period (got {item})")
    found = {"budget_us": budget, "period_us": period, "extratime": extratime == [1]}
    if work_every:
        if not 0 < work_every[0] <= work_every[1]:
            raise argparse.ArgumentTypeError(f"work from 1 µs to its period (got {item})")
        found.update(work_us=work_every[0], every_us=work_every[1])
    return found


def credit_neighbour(weight: int, work_period: list[int]) -> int | dict:
    if not 1 <= weight <= 65535:
        raise argparse.ArgumentTypeError(f"a Credit weight is 1 to 65535 (got {weight})")
    if not work_period:
        return weight
    if len(work_period) != 2 or not 0 < work_period[0] <= work_period[1]:
        raise argparse.ArgumentTypeError(
            f"a neighbour's work from 1 µs to its period, weight:work/period (got {weight}:"
            f"{'/'.join(map(str, work_period))})"
        )
    return {"weight": weight, "work_us": work_period[0], "period_us": work_period[1]}


def settings(args: argparse.Namespace, target: str) -> list:
    """The validated setting, or one per budget of the grid; Refused for a bad one."""
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else [args.budget]
    params = {"period_us": args.period, "cap": args.cap, "weight": args.weight,
              "extratime": args.extratime, "tslice_us": args.tslice_us,
              "ratelimit_us": args.ratelimit_us}  # fmt: skip
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
    background = demand.background_share(table, meta) or 0.0
    try:
        chosen = settings(args, target)
        rows = []
        for setting in chosen:
            records = predicted(
                table, target, setting, background, args.vcpus, args.beside, args.cpus
            )
            text = " ".join(f"{k}={v}" for k, v in setting.describe().items())
            stats = prediction.statistics(records["latency_ns"], args.deadline_ms)
            rows.append({"setting": text, **stats})
    except (Refused, ValueError) as e:  # NotModelled is a ValueError
        print(f"hvbench predict: {e}", file=sys.stderr)
        return 1
    print(f"{len(table)} records of {run.name} (lag-1 autocorrelation of their CPU time "
          f"{demand.autocorrelation(table['cpu_ns']):.2f}; the JVM's other work "
          f"{background:.1%} of a CPU); predicted, in ms:")  # fmt: skip
    print(pd.DataFrame(rows).to_string(index=False))
    found = [reservation(chosen[0], args.vcpus, args.beside, args.cpus)]  # as predicted() has it
    served = prediction.served(table, target, args.sched, found)
    print(f"Served by {prediction.servers_text([column for column, _ in served])}.")
    if warning := sched_trace.undated_warning(table.attrs, run.name):
        print(f"warning: {warning}", file=sys.stderr)
    if args.out:
        records.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
