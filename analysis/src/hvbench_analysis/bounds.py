"""The analytical bound: the longest a reservation can leave the VM or threads without CPU,
beside the measured maximum per configuration (docs/results.md, "The analytical bound").

A periodic server with budget B per period P (RTDS with extratime 0, SCHED_DEADLINE, a CPU
quota) can leave what it serves without CPU for up to 2·(P − B): the budget used at the start
of one period and given at the very end of the next. Credit2 and Credit caps act like such a
server whose period is the hypervisor's replenishment or accounting interval (approximate).

    table = bound_table(runs.measured, readbacks_by_run(runs.runs))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from hvbench_analysis.labels import config_label
from hvbench_analysis.stats import percentile
from hvbench_analysis.tables import by_config, scheduler_name

# hostagent/src/hvbench_agent/sched/base.py: the period a budget gets when none is given.
DEFAULT_PERIOD_US = 100_000
# Schedulers whose budget per period is a cap (a periodic server).
BUDGETED = ("deadline", "cfs-quota", "cfs")
# How often the hypervisor gives a capped domain its budget again: Credit2 replenishes every
# CSCHED2_BDGT_REPL_PERIOD (10 ms, xen/common/sched/credit2.c); Credit enforces caps in its
# accounting, every CSCHED_TICKS_PER_ACCT × CSCHED_MSECS_PER_TICK = 30 ms (credit.c).
CAP_PERIOD_US = {"credit2": 10_000, "credit": 30_000}
# "above bound": max − p50 over 1.5 × bound + 5 ms. The bound explains one starvation on top
# of typical latency; the records queued behind it and timer jitter add some, hence the
# margin. Well above it, something other than the budget is at work.
ABOVE_FACTOR = 1.5
ABOVE_SLACK_MS = 5.0
NO_RESERVATION = "no reservation"
READ_BACK, REQUESTED = "read back", "requested"
COLUMNS = [
    *("Configuration", "Scheduler", "Reservation", "Setting", "Bound (ms)", "p50 (ms)"),
    *("Max (ms)", "Max − p50 (ms)", "(Max − p50) / bound", "Flag"),
]


@dataclass(frozen=True)
class Reservation:
    """What a setting reserves, as text, and the longest it can leave its VM or threads
    without CPU (None: no cap, so no bound); basis: read back or requested."""

    text: str
    bound_ms: float | None = None
    basis: str = REQUESTED


def periodic_bound_ms(budget_us: float, period_us: float) -> float:
    """2·(P − B) in ms: budget used at the start of one period, given at the end of the next."""
    return 2 * max(period_us - budget_us, 0) / 1000


def ms_text(us: float) -> str:
    return f"{us / 1000:g} ms"


def budget_text(budget_us: float, period_us: float) -> str:
    """e.g. B 77.5 ms / P 100 ms"""
    return f"B {ms_text(budget_us)} / P {ms_text(period_us)}"


def known(value) -> bool:
    """Set: neither None nor NaN (how a configuration's tags say unset)."""
    return value is not None and not pd.isna(value)


def reservation(sched: str, setting: dict) -> Reservation:
    """The reservation of a scheduler setting (keys as meta.json's: budget_us, period_us,
    extratime, cap, weight; absent or None where unset)."""
    if sched == "rtds":
        return rtds_reservation(setting)
    if sched in BUDGETED:
        return budget_reservation(setting)
    if sched in CAP_PERIOD_US:
        return cap_reservation(sched, setting)
    return Reservation(NO_RESERVATION)


def budget_reservation(setting: dict) -> Reservation:
    budget, period = setting.get("budget_us"), setting.get("period_us")
    if not known(budget):
        return Reservation(NO_RESERVATION)
    if budget < 0:  # a CPU quota of -1 ("max"): no limit
        return Reservation("no quota: no cap")
    period = period if known(period) else DEFAULT_PERIOD_US
    return Reservation(budget_text(budget, period), periodic_bound_ms(budget, period))


def rtds_reservation(setting: dict) -> Reservation:
    """RTDS with extratime 1 runs past its budget when the pool has idle time: no cap. The
    agent's default is extratime 0 (hostagent sched/base.py), so unset reads as 0."""
    budgeted = budget_reservation(setting)
    extratime = setting.get("extratime")
    if budgeted.bound_ms is not None and known(extratime) and extratime:
        return Reservation(f"{budgeted.text}, extratime: no cap")
    return budgeted


def cap_reservation(sched: str, setting: dict) -> Reservation:
    """A Credit or Credit2 cap C (% of one CPU) as a periodic server: B = C % of the period at
    which the hypervisor gives the budget back. Cap 0 (or none) is no cap."""
    cap = setting.get("cap")
    if not known(cap) or cap <= 0:
        return Reservation(uncapped_text(setting))
    period = CAP_PERIOD_US[sched]
    budget = min(cap / 100 * period, period)
    text = f"cap {cap:g} %: {budget_text(budget, period)}, approximate"
    return Reservation(text, periodic_bound_ms(budget, period))


def uncapped_text(setting: dict) -> str:
    """e.g. "cap 0: no cap", "weight 256, no cap"."""
    cap, weight = setting.get("cap"), setting.get("weight")
    if known(cap):
        return f"cap {cap:g}: no cap"
    return f"weight {int(weight)}, no cap" if known(weight) else "no cap"


def worst(reservations: list[Reservation]) -> Reservation:
    """The one with the largest bound (vCPUs or threads that differ: the worst served)."""
    return max(reservations, key=lambda r: (r.bound_ms is not None, r.bound_ms or 0.0))


# ---------------------------------------------------------------------------------------------
# settings read back (meta.json "sched"; the shapes of hostagent/src/hvbench_agent/sched/)


def read_back(target: str, sched: str, sched_meta) -> list[dict] | None:
    """The setting of each vCPU or thread as read back, or None where it cannot be read."""
    readback = sched_meta.get("readback") if isinstance(sched_meta, dict) else None
    reader = READERS.get((target, sched))
    if reader is None or readback is None:
        return None
    try:
        found = reader(readback)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # another shape than this reader knows
    return found or None


def xen_rtds(readback: dict) -> list[dict] | None:
    if readback.get("sched") != "rtds":
        return None
    keys = ("budget_us", "period_us", "extratime")
    return [
        {**{key: vcpu[key] for key in keys}, "vcpu": vcpu.get("vcpu")} for vcpu in readback["vcpus"]
    ]


def xen_cap(readback: dict) -> list[dict]:
    return [{"cap": readback["cap"], "weight": readback.get("weight")}]


def deadline_threads(threads: list[dict]) -> list[dict]:
    """SCHED_DEADLINE threads' runtime and period (ns); other threads have no reservation."""
    return [
        {"budget_us": t["runtime_ns"] / 1000, "period_us": t["period_ns"] / 1000}
        for t in threads
        if t and t.get("policy") == "SCHED_DEADLINE"
    ]


def kvm_deadline(readback: dict) -> list[dict]:
    """Each vCPU thread's SCHED_DEADLINE reservation, with its vCPU's number (`vcpu`)."""
    found = []
    for vcpu in readback["vcpus"]:
        found += [{**r, "vcpu": vcpu.get("vcpu")} for r in deadline_threads([vcpu.get("thread")])]
    return found


def kvm_cfs(readback: dict) -> list[dict]:
    """Each vCPU's cgroup cpu.max, "QUOTA PERIOD" or "max PERIOD"."""
    found = []
    for vcpu in readback["vcpus"]:
        quota, period = str(vcpu["cpu_max"]).split()
        budget = -1 if quota == "max" else int(quota)
        found.append({"budget_us": budget, "period_us": int(period), "vcpu": vcpu.get("vcpu")})
    return found


def bare_quota(readback: dict) -> list[dict]:
    return [{"budget_us": readback["quota_us"], "period_us": readback["period_us"]}]


READERS = {
    ("xen", "rtds"): xen_rtds,
    ("xen", "credit"): xen_cap,
    ("xen", "credit2"): xen_cap,
    ("kvm", "deadline"): kvm_deadline,
    ("kvm", "cfs"): kvm_cfs,
    ("bare", "deadline"): deadline_threads,
    ("bare", "cfs-quota"): bare_quota,
}


def requested_setting(tags: dict) -> dict:
    """The setting as requested, from a configuration's tags (tags.tags_of)."""
    return {
        "budget_us": tags.get("budget"),
        "period_us": tags.get("period"),
        "extratime": tags.get("extratime"),
        "cap": tags.get("cap"),
        "weight": tags.get("weight"),
    }


def run_reservation(tags: dict, sched_meta) -> Reservation:
    """A run's reservation: from the setting read back where it can be read, else as
    requested."""
    sched = str(tags["sched"])
    settings = read_back(str(tags["target"]), sched, sched_meta)
    if settings is None:
        return reservation(sched, requested_setting(tags))
    found = worst([reservation(sched, setting) for setting in settings])
    return replace(found, basis=READ_BACK)


def config_reservation(tags: dict, sched_metas: list) -> Reservation:
    """A configuration's reservation over its runs: the worst, and on what it rests."""
    found = [run_reservation(tags, sched_meta) for sched_meta in sched_metas]
    bases = ", ".join(sorted({r.basis for r in found}))
    return replace(worst(found), basis=bases)


# ---------------------------------------------------------------------------------------------
# the table


def flag(extra_ms: float, found: Reservation) -> str:
    """The flag of a configuration: "above bound" when max − p50 exceeds ABOVE_FACTOR ×
    bound + ABOVE_SLACK_MS; where there is no bound, why ("no reservation", "no bound")."""
    if found.bound_ms is None:
        return NO_RESERVATION if found.text == NO_RESERVATION else "no bound"
    return "above bound" if extra_ms > ABOVE_FACTOR * found.bound_ms + ABOVE_SLACK_MS else ""


def readbacks_by_run(runs: pd.DataFrame) -> dict[str, object]:
    """Each run's meta.json "sched" (the setting read back), by run id (load.Runs.runs)."""
    return dict(zip(runs["run_id"], runs["sched_readback"], strict=True))


def bound_row(tags: dict, group: pd.DataFrame, found: Reservation, several: bool) -> dict:
    ms = group["latency_ns"].to_numpy() / 1e6
    p50, top = float(percentile(ms, 50)), float(ms.max())
    bound = found.bound_ms
    return {
        "Configuration": config_label(tags),
        "Scheduler": scheduler_name(str(tags["sched"]), str(tags["target"]), several),
        "Reservation": found.text,
        "Setting": found.basis,
        "Bound (ms)": np.nan if bound is None else bound,
        "p50 (ms)": p50,
        "Max (ms)": top,
        "Max − p50 (ms)": top - p50,
        "(Max − p50) / bound": (top - p50) / bound if bound else np.nan,
        "Flag": flag(top - p50, found),
    }


def bound_table(measured: pd.DataFrame, readbacks: dict[str, object]) -> pd.DataFrame:
    """Per configuration: its reservation and bound beside the measured p50 and maximum
    (repetitions pooled), and whether the maximum is well above the bound."""
    several = measured["target"].nunique() > 1
    rows = []
    for tags, group in by_config(measured):
        run_ids = group["run_id"].unique()
        found = config_reservation(tags, [readbacks.get(run_id) for run_id in run_ids])
        rows.append(bound_row(tags, group, found, several))
    return pd.DataFrame(rows, columns=COLUMNS)
