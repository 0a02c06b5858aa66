"""A setting's latencies predicted from one traced reference run (docs/simulate.md).

The reference (TRACE=1, no reservation) gives each record's window start at the job, its CPU
time on each job thread and its latency (demand.record_demands). A setting's server replays the
records (simulate.py) and so does no reservation; each record's predicted latency is its
measured one plus what the server adds over none. What the CPU did not decide (the Kafka hops,
the waits) stays as measured, record by record, with its correlations.

A setting is the scheduler's name and its reservations: one dict per thread or vCPU, as
bounds.read_back reads them back (budget_us, period_us, extratime, cap; tslice_us for
Credit; vcpus, the domain's vCPUs under a cap, 1 where not given), or one for all. The server
of each (target, scheduler):
- bare: deadline, one constant bandwidth server per job thread, the threads in series (their
  delays add up); cfs-quota, one periodic server for the job's threads together, its budget
  less the share of each period the JVM's other work takes (`background`, a share of a CPU:
  demand.background_share; the quota holds the whole JVM);
- kvm (the real-time VM's vCPUs): cfs, a periodic server per vCPU; deadline, a constant
  bandwidth server per vCPU; fifo, none (its CPU alone);
- xen: rtds, a periodic server per vCPU (with extratime, alone in its pool: none); credit and
  credit2, the domain's cap, alone in its pool (no cap: none). The job is served one record
  at a time, so on one vCPU at a time: Credit splits a domain's cap over its active vCPUs
  (csched_acct), and with all of them active (the worst case) each gets cap / vcpus;
  Credit2's budget is the domain's, grabbed a share per vCPU at a time
  (credit2.credit2_beside, alone), so a cap of 100 or more never runs out for one vCPU's
  work. Beside other domains' vCPUs on its CPU
  (`beside`): Credit and Credit2, their weights (its own `weight`, its cap, the pool's
  `tslice_us` and `ratelimit_us`: credit.credit_beside, credit2.credit2_beside); RTDS, their
  reservations (edf.edf, extratime included), their deadlines just before ours (at equal
  periods they come first).
A server per vCPU serves what the records asked of that vCPU (demand.VCPU_CPU, from a
testbed's trace of the vCPUs), the vCPUs' delays added as the threads' are (`served`); a trace
without vCPUs has one server for the job's CPU time.

    late = predicted(table, "bare", "deadline", [{"budget_us": 5000, "period_us": 100000}])
    late = predicted(table, "bare", "cfs-quota", [{...}], demand.background_share(table, meta))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from hvbench_analysis import credit, credit2, demand, results, simulate
from hvbench_analysis.stats import percentile
from hvbench_analysis.tags import float_or_none

if TYPE_CHECKING:
    from hvbench_analysis import edf

US = 1_000
QUANTILES = {"p50": 50, "p90": 90, "p99": 99, "p99.9": 99.9, "max": 100}
# The schedulers a reservation is modelled for, by target (the others: NotModelled).
MODELLED = {
    "bare": ("none", "deadline", "cfs-quota"),
    "kvm": ("none", "fifo", "cfs", "deadline"),
    "xen": ("rtds", "credit", "credit2"),
}
Server = Callable[[np.ndarray, np.ndarray], np.ndarray]


class NotModelled(ValueError):
    """A setting the simulator has no model for, with the reason."""


def server(sched: str, reservation: dict) -> Server:
    """The simulator's function for one thread's or vCPU's reservation: (arrivals, demands)
    → done times (ns)."""
    budget, period = reservation.get("budget_us"), reservation.get("period_us")
    cap = reservation.get("cap")
    if (reservation.get("cpus") or 1) > 1 and not (sched == "rtds" and reservation.get("beside")):
        raise NotModelled("several CPUs are modelled for RTDS beside neighbours (--beside)")
    if reservation.get("beside"):
        return beside_neighbours(sched, reservation)
    if sched in ("none", "fifo") or (sched == "rtds" and reservation.get("extratime")):
        return simulate.unconstrained
    if sched in ("cfs-quota", "cfs", "rtds", "deadline"):
        if budget is None or budget < 0:  # cpu.max "max": no quota
            return simulate.unconstrained
        b, p = round(budget * US), round(period * US)
        if sched == "deadline":
            return lambda a, c, q=None: simulate.cbs(a, c, b, p, queued=q)
        return lambda a, c, q=None: simulate.periodic(a, c, b, p, queued=q)
    if sched not in ("credit", "credit2"):
        raise NotModelled(f"SCHED={sched} has no model in the simulator")
    if not cap:
        return simulate.unconstrained
    if sched == "credit":
        each = int(cap / (reservation.get("vcpus") or 1))
        if each >= 100:
            return simulate.unconstrained
        tslice = round((reservation.get("tslice_us") or 30_000) * US)
        return lambda a, c: simulate.credit_cap(a, c, each, tslice)
    if cap >= 100:
        return simulate.unconstrained
    vcpus = reservation.get("vcpus") or 1
    return lambda a, c: credit2.credit2_beside(a, c, neighbours=[], cap=int(cap), vcpus=vcpus)


def beside_neighbours(sched: str, reservation: dict) -> Server:
    """On one CPU beside vCPUs of other domains (`beside`): under Credit and Credit2 their
    weights (always busy) or {weight, work_us, period_us} (that much work every period); under
    RTDS their budget_us, period_us and extratime."""
    if sched == "rtds":
        return rtds_beside(reservation)
    if sched not in ("credit", "credit2"):
        raise NotModelled(f"busy neighbours beside SCHED={sched} have no model")
    if (reservation.get("vcpus") or 1) > 1:
        raise NotModelled(f"SCHED={sched} beside busy neighbours: one vCPU")
    if not all(
        isinstance(n, int) or (isinstance(n, dict) and n.keys() >= PERIODIC_KEYS)
        for n in reservation["beside"]
    ):
        raise NotModelled(
            f"SCHED={sched}'s neighbours are their weights (256,512), or weight:work/period "
            "in µs (256:5000/30000)"
        )
    weight = int(reservation.get("weight") or credit.DEFAULT_WEIGHT)
    beside = [credit_neighbour(n) for n in reservation["beside"]]
    limit = reservation.get("ratelimit_us")
    ratelimit = credit.RATELIMIT_NS if limit is None else round(limit * US)
    cap = int(reservation.get("cap") or 0)
    if sched == "credit2":
        return lambda a, c: credit2.credit2_beside(a, c, weight, beside, ratelimit, cap=cap)
    tslice = round((reservation.get("tslice_us") or 30_000) * US)
    return lambda a, c: credit.credit_beside(
        a, c, weight, beside, tslice, min(ratelimit, tslice), cap=cap
    )


PERIODIC_KEYS = {"weight", "work_us", "period_us"}  # a Credit neighbour with periodic work


def credit_neighbour(n: int | dict) -> int | credit.Neighbour:
    """A weight (always busy), or a neighbour with work_us every period_us."""
    if isinstance(n, int):
        return n
    return credit.Neighbour(int(n["weight"]), round(n["work_us"] * US), round(n["period_us"] * US))


def rtds_beside(reservation: dict) -> Server:
    beside = reservation["beside"]
    if not all(isinstance(n, dict) and "budget_us" in n for n in beside):
        raise NotModelled(
            "RTDS's neighbours are budget/period[/extratime][:work/every] (30000/100000/1)"
        )
    budget, period = round(reservation["budget_us"] * US), round(reservation["period_us"] * US)
    extratime = bool(reservation.get("extratime"))

    def serve(arrivals, demands):
        # imported here: edf's simulation library (simpy) took 60 ms of every report's start
        from hvbench_analysis import edf

        ours = edf.Server(budget, period, 0, arrivals, demands, extratime)
        neighbours = [rtds_neighbour(n, int(arrivals[0])) for n in beside]
        return edf.edf([ours, *neighbours], cpus=reservation.get("cpus") or 1)[0]

    return serve


def rtds_neighbour(n: dict, first: int) -> edf.Server:
    """A neighbour's server, always busy, or with work_us released every every_us from our
    first record on; its deadlines 1 ns before ours, so at equal periods it comes first."""
    from hvbench_analysis import edf  # (rtds_beside says why here)

    budget, period = round(n["budget_us"] * US), round(n["period_us"] * US)
    releases = None
    if n.get("work_us"):
        releases = edf.Releases(round(n["work_us"] * US), round(n["every_us"] * US), first)
    return edf.Server(budget, period, -1, extratime=bool(n.get("extratime")), releases=releases)


def less_background(reservations: list[dict], background: float) -> list[dict]:
    """The quota left to the records once the JVM's other work has taken its share."""
    left = []
    for r in reservations:
        budget, period = r.get("budget_us"), r.get("period_us")
        if budget is None or budget < 0 or not background:
            left.append(r)
            continue
        rest = budget - background * period
        if rest < 1:
            raise NotModelled(
                f"the JVM's other work ({background:.1%} of a CPU) takes the whole quota of "
                f"{budget:g} µs per {period:g} µs"
            )
        left.append({**r, "budget_us": rest})
    return left


def added_delay(
    table: pd.DataFrame,
    target: str,
    sched: str,
    reservations: list[dict],
    background=0.0,
    queued_share: float | None = None,
) -> np.ndarray:
    """Per record, what the setting's servers add over no reservation (ns). queued_share: a
    record that arrives while the job still works on an earlier one needs that share of its
    demand (bare; held_back_share), else all of it."""
    if sched not in MODELLED.get(target, ()):
        raise NotModelled(f"SCHED={sched} on {target} has no model in the simulator")
    if not reservations:
        raise NotModelled(f"SCHED={sched} on {target}: no reservation to simulate")
    if target == "bare" and sched == "cfs-quota":
        reservations = less_background(reservations, background or 0.0)
    arrivals = table["from_ns"].to_numpy(np.int64)
    delay = np.zeros(len(table), dtype=np.int64)
    for column, reservation in served(table, target, sched, reservations):
        if reservation is None:  # a thread or vCPU without a reservation: nothing added
            continue
        serve = server(sched, reservation)
        demands = table[column].to_numpy(np.int64)
        if queued_share is None or target != "bare":
            delay += serve(arrivals, demands) - simulate.unconstrained(arrivals, demands)
            continue
        queued = np.round(demands * queued_share).astype(np.int64)
        delay += serve(arrivals, demands, queued) - simulate.unconstrained(
            arrivals, demands, queued
        )
    return delay


# A VM's schedulers whose reservation is each vCPU's own (Credit's and Credit2's cap are the
# domain's)
PER_VCPU = {("kvm", "deadline"), ("kvm", "cfs"), ("xen", "rtds")}


def served(
    table: pd.DataFrame, target: str, sched: str, reservations: list[dict]
) -> list[tuple[str, dict | None]]:
    """Each demand column the setting serves and the reservation that serves it, their delays
    added (the job's threads, and so its vCPUs, take a record in turn):
    - bare SCHED_DEADLINE: a server per job thread (THREAD_CPU);
    - a VM's vCPU reservations (PER_VCPU) where the trace is of its vCPUs (VCPU_CPU) and no
      neighbour is `beside` it: a server per vCPU, each vCPU's as read back (its `vcpu`; a
      vCPU without one has none), or one setting for every vCPU;
    - else one server for the job's CPU time (cpu_ns).
    Without `vcpu` numbers, reservations are taken in order where there is one per column,
    else the first stands for all (the harness gives each thread or vCPU the same)."""
    columns = ["cpu_ns"]
    alone = not any(r.get("beside") for r in reservations)  # beside neighbours: on one CPU
    vcpus = demand.vcpu_columns(table) if (target, sched) in PER_VCPU and alone else {}
    if target == "bare" and sched == "deadline":  # a table without threads' columns: one
        columns = [c for c in table if c.startswith(demand.THREAD_CPU)] or columns
    elif vcpus:
        columns = list(vcpus.values())
        by_vcpu = {r["vcpu"]: r for r in reservations if r.get("vcpu") is not None}
        if by_vcpu and not by_vcpu.keys() & vcpus.keys():
            raise NotModelled(
                f"the reference's vCPUs ({', '.join(map(str, vcpus))}) are none of those read "
                f"back ({', '.join(map(str, sorted(by_vcpu)))})"
            )
        if by_vcpu:
            return [(column, by_vcpu.get(vcpu)) for vcpu, column in vcpus.items()]
    same = len(reservations) != len(columns)
    return [(column, reservations[0 if same else i]) for i, column in enumerate(columns)]


def servers_text(columns: list[str]) -> str:
    """How the demand columns of `served` are served, in words."""
    vcpus = [c.removeprefix(demand.VCPU_CPU) for c in columns if c.startswith(demand.VCPU_CPU)]
    if vcpus:
        return f"a server per vCPU ({', '.join(vcpus)}), their delays added"
    if columns != ["cpu_ns"]:
        return f"a server per job thread ({len(columns)}), their delays added"
    return "one server for the job's CPU time"


def predicted(
    table: pd.DataFrame,
    target: str,
    sched: str,
    reservations: list[dict],
    background=0.0,
    queued_share: float | None = None,
) -> pd.DataFrame:
    """The reference's records with their predicted latencies, in a run's samples' form."""
    out = table[["detector", "seq", "sent_ns"]].copy()
    late = added_delay(table, target, sched, reservations, background, queued_share)
    out["latency_ns"] = table["latency_ns"].to_numpy(np.int64) + late
    out["received_ns"] = out["sent_ns"] + out["latency_ns"]
    return out


def statistics(latency_ns, deadline_ms: float | None = None) -> dict:
    """p50 … max in ms, and the share over the deadline (%)."""
    ms = np.asarray(latency_ns, dtype=np.float64) / 1e6
    found = percentile(ms, list(QUANTILES.values()))
    row = {name: round(float(v), 3) for name, v in zip(QUANTILES, found, strict=True)}
    if deadline_ms is not None:
        row[f"over {deadline_ms:g} ms (%)"] = round(100 * float(np.mean(ms > deadline_ms)), 3)
    return row


# What a reference must share with a configuration: everything but the scheduler's setting.
WORKLOAD = ("target", "hypervisor", "rate", "network", "load", "scale", "noise", "noise_cpus",
            "job_cpus", "power")  # fmt: skip


def workload(tags) -> tuple:
    return tuple(str(tags[name]) for name in WORKLOAD)


@dataclass(frozen=True)
class Reference:
    """A traced run without a reservation: its demand table and the JVM's other work."""

    run_id: str
    table: pd.DataFrame
    background: float
    queued_share: float | None = None  # held_back_share, where the workload has one
    queued_from: tuple[str, ...] = ()  # the held-back runs it was measured in

    def predicted(self, table: pd.DataFrame, tags: dict, found: list[dict]) -> np.ndarray:
        target, sched = str(tags["target"]), str(tags["sched"])
        late = predicted(table, target, sched, found, self.background, self.queued_share)
        return late["latency_ns"].to_numpy()


SERVER_TAGS = ("extratime", "budget", "period")


def unreserved(tags) -> bool:
    """A run the scheduler did not hold back: no reservation; on Xen (which has no SCHED=none)
    RTDS with extratime on or the whole period as budget, its pool's CPU to itself."""
    sched = str(tags.get("sched"))
    if sched == "none":
        return True
    if sched != "rtds" or str(tags.get("target")) != "xen":
        return False
    extratime, budget, period = (float_or_none(tags.get(k)) for k in SERVER_TAGS)
    return bool(extratime) or (budget is not None and budget == period)


def all_references(runs: pd.DataFrame) -> dict[tuple, list[Reference]]:
    """The traced runs without a reservation (unreserved), by workload, the one with the most
    records first (repetitions of a reference say how far a second one would differ)."""
    found: dict[tuple, list[Reference]] = {}
    held_back: dict[tuple, dict[str, pd.DataFrame]] = {}
    for row in runs.itertuples():
        meta = results.read_meta(Path(row.path))
        table = demand.run_demands(row.path, meta)
        if table is None or table.empty:
            continue
        key = workload(row._asdict())
        if not unreserved(row._asdict()):  # traced under a reservation: what queued records need
            held_back.setdefault(key, {})[row.run_id] = table
            continue
        background = demand.background_share(table, meta) or 0.0
        found.setdefault(key, []).append(Reference(row.run_id, table, background))
    return {key: with_queued_share(refs, held_back.get(key, {})) for key, refs in found.items()}


def with_queued_share(refs: list[Reference], held_back: dict[str, pd.DataFrame]):
    """The references, the one with the most records first, each with the share of its demand
    a queued record needs (held_back_share) where the held-back runs measure one."""
    refs = sorted(refs, key=lambda r: -len(r.table))
    shares = [held_back_share(list(held_back.values()), r.table) for r in refs]
    return [
        replace(r, queued_share=share, queued_from=tuple(sorted(held_back)))
        if share is not None
        else r
        for r, share in zip(refs, shares, strict=True)
    ]


MIN_QUEUED = 100  # records behind another in the held-back runs, to measure what they need


def held_back_share(held_back: list[pd.DataFrame], reference: pd.DataFrame) -> float | None:
    """What a record that arrives while the job still works on an earlier one needs, as a
    share of a record's demand in the reference: the mean CPU time of such records in the
    traced runs with a reservation (demand tables) over the reference's mean; None with fewer
    than MIN_QUEUED of them. Records handled back to back share one wake-up of the threads."""
    queued = [t.loc[t["from_ns"] > t["sent_ns"], "cpu_ns"] for t in held_back]
    cpu = pd.concat(queued) if queued else pd.Series(dtype=float)
    if len(cpu) < MIN_QUEUED or not reference["cpu_ns"].mean():
        return None
    return float(cpu.mean() / reference["cpu_ns"].mean())


def references(runs: pd.DataFrame) -> dict[tuple, Reference]:
    """The reference of each workload: the traced run without a reservation with the most
    records."""
    return {key: refs[0] for key, refs in all_references(runs).items()}
