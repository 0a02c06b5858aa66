"""One scheduler setting, one refusal, one table of what each scheduler takes.

A `Setting` is what a run asks of a CPU scheduler; BUDGET and PERIOD are microseconds on every
backend, the unit `xl sched-rtds` uses. `SCHEDULERS` says, per backend, which schedulers exist
and which parameters each takes; `validate` checks a request against it and against the
mechanism's limits, changes nothing and looks at no machine, so the controller refuses a bad
setting before any host is touched. Every backend's `Scheduler` has the same four verbs:

    check(setting)  can this machine apply it? changes nothing; Refused if not
    apply(setting)  apply it; returns what the kernel or hypervisor reports back
    read()          that readback, now
    reset()         undo what apply changed

Backends: linux (threads or a process on this machine: SCHED_DEADLINE, a CPU quota), kvm (a
libvirt guest's vCPU threads), xen (a domain and its cpupool, through xl).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import Protocol

DEFAULT_PERIOD_US = 100_000


class Refused(Exception):
    """A setting that is invalid, or that this machine cannot apply; nothing was left changed."""


@dataclass(frozen=True)
class Setting:
    sched: str
    budget_us: int | None = None
    period_us: int | None = None
    priority: int | None = None  # SCHED_FIFO priority (kvm fifo)
    extratime: int | None = None  # RTDS: 1 lets a vCPU run past its budget when CPUs idle
    weight: int | None = None  # Credit, Credit2
    cap: int | None = None  # Credit, Credit2: percent of one CPU, 0 = no cap
    # Credit's time slice and the Credit/Credit2 rate limit: the real-time pool's, not the
    # domain's (xl sched-credit[2] -s -p POOL); None: what the pool has at boot.
    tslice_us: int | None = None
    ratelimit_us: int | None = None

    def params(self) -> dict[str, int]:
        """The parameters that are set, by field name."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sched"}
        return {name: value for name, value in values.items() if value is not None}

    def describe(self) -> dict:
        """sched and the parameters that are set, as the agent prints it."""
        return {"sched": self.sched, **self.params()}


# Each parameter's name as users write it (Make variables, campaign keys in lower case).
PARAM_NAMES = {
    "budget_us": "BUDGET",
    "period_us": "PERIOD",
    "priority": "PRIORITY",
    "extratime": "EXTRATIME",
    "weight": "WEIGHT",
    "cap": "CAP",
    "tslice_us": "TSLICE_US",
    "ratelimit_us": "RATELIMIT_US",
}
BUDGETED = ("budget_us", "period_us")
WEIGHTED = ("weight", "cap")

# backend → scheduler → the parameters it takes. The one place that says what exists.
SCHEDULERS: dict[str, dict[str, tuple[str, ...]]] = {
    # bare target: the Flink job's threads on this machine
    "linux": {"none": (), "deadline": BUDGETED, "cfs-quota": BUDGETED},
    # the real-time VM's vCPU threads on a KVM host
    "kvm": {"none": (), "cfs": BUDGETED, "deadline": BUDGETED, "fifo": ("priority",)},
    # the real-time VM and its cpupool on a Xen host
    "xen": {
        "rtds": (*BUDGETED, "extratime"),
        "credit": (*WEIGHTED, "tslice_us", "ratelimit_us"),
        "credit2": (*WEIGHTED, "ratelimit_us"),
    },
}
# The target a run names → the backend that applies its setting.
BACKEND_OF_TARGET = {"bare": "linux", "kvm": "kvm", "xen": "xen"}


class Scheduler(Protocol):
    """A backend bound to what it schedules (threads, a guest's vCPUs, a domain)."""

    backend: str

    def check(self, setting: Setting) -> None: ...

    def apply(self, setting: Setting) -> dict: ...

    def read(self) -> dict: ...

    def reset(self) -> None: ...


def suggest(name: str, valid) -> str:
    """' (did you mean X?)' when a valid name is close to `name`, else ''."""
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def validate(backend: str, sched: str, **params: int | None) -> Setting:
    """The setting for SCHED=sched with these parameters (field names of Setting, None = not
    given), defaults filled in and limits checked; Refused otherwise. Pure."""
    if backend not in SCHEDULERS:
        raise Refused(f"unknown scheduler backend {backend!r}; valid: {', '.join(SCHEDULERS)}")
    table = SCHEDULERS[backend]
    target = {"linux": "bare"}.get(backend, backend)
    if sched not in table:
        raise Refused(
            f"unknown SCHED {sched!r} for target {target}; valid: {', '.join(table)}"
            + suggest(sched, table)
        )
    unknown = sorted(set(params) - set(PARAM_NAMES))
    if unknown:
        raise Refused(f"unknown scheduler parameter(s) {', '.join(unknown)}")
    given = {k: v for k, v in params.items() if v is not None}
    takes = table[sched]
    extra = [f"{PARAM_NAMES[k]}={v}" for k, v in given.items() if k not in takes]
    if extra:
        own = ", ".join(PARAM_NAMES[k] for k in takes) if takes else "none"
        raise Refused(f"SCHED={sched} has no {', '.join(extra)}; its parameters: {own}")
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(
                f"SCHED={sched}: {PARAM_NAMES[key]} must be a whole number, got {value!r}"
            )
    setting = Setting(sched, **_with_defaults(sched, takes, given))
    LIMITS[(backend, sched)](setting)
    return setting


def _with_defaults(sched: str, takes: tuple[str, ...], given: dict) -> dict:
    values = dict(given)
    if "budget_us" in takes:
        if "budget_us" not in given:
            raise Refused(f"SCHED={sched} needs BUDGET (microseconds of CPU time per PERIOD)")
        values.setdefault("period_us", DEFAULT_PERIOD_US)
    if "extratime" in takes:
        values.setdefault("extratime", 0)  # Xen's own default is 1: the budget is no limit
    if "weight" in takes:
        values.setdefault("weight", CREDIT_DEFAULT_WEIGHT)
        values.setdefault("cap", 0)
    if "priority" in takes and "priority" not in given:
        low, high = FIFO_PRIORITY_RANGE
        raise Refused(f"SCHED={sched} needs PRIORITY ({low}..{high})")
    return values


# ---------------------------------------------------------------------------------------------
# limits of each mechanism

# SCHED_DEADLINE (kernel/sched/deadline.c, __checkparam_dl): runtime >= 1 << DL_SCALE = 1024
# ns, so 2 us is the smallest whole-microsecond budget; the period must lie within the sysctls
# kernel.sched_deadline_period_{min,max}_us (defaults 100 us and 4194304 us, ~4.2 s).
DL_MIN_RUNTIME_NS = 1024
DL_MIN_BUDGET_US = 2
DL_PERIOD_MIN_SYSCTL = "/proc/sys/kernel/sched_deadline_period_min_us"
DL_PERIOD_MAX_SYSCTL = "/proc/sys/kernel/sched_deadline_period_max_us"
DL_PERIOD_MIN_DEFAULT_US = 100
DL_PERIOD_MAX_DEFAULT_US = 4_194_304
# CFS bandwidth (kernel/sched/core.c, tg_set_cfs_bandwidth): period 1 ms .. 1 s, quota >= 1 ms.
CFS_PERIOD_MIN_US = 1_000
CFS_PERIOD_MAX_US = 1_000_000
CFS_QUOTA_MIN_US = 1_000
# Xen (xen/common/sched/rt.c RTDS_MIN_PERIOD/RTDS_MIN_BUDGET; libxl's weight range).
RTDS_MIN_US = 10
WEIGHT_RANGE = (1, 65535)
# Credit's time slice is whole milliseconds (xen/include/public/sysctl.h
# XEN_SYSCTL_CSCHED_TSLICE_MIN/MAX); the rate limit is 0 (off) or within
# XEN_SYSCTL_SCHED_RATELIMIT_MIN/MAX, and Credit refuses one longer than its slice (credit.c
# csched_sys_cntl).
TSLICE_RANGE_US = (1_000, 1_000_000)
RATELIMIT_RANGE_US = (100, 500_000)
CREDIT_DEFAULT_WEIGHT = 256
FIFO_PRIORITY_RANGE = (1, 99)


def read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


def _positive_budget(s: Setting) -> None:
    for key in BUDGETED:
        if getattr(s, key) <= 0:
            raise Refused(
                f"SCHED={s.sched}: {PARAM_NAMES[key]} must be positive, got {getattr(s, key)} us"
            )
    if s.budget_us > s.period_us:
        raise Refused(
            f"SCHED={s.sched}: BUDGET {s.budget_us} us > PERIOD {s.period_us} us "
            "(the budget must fit in one period)"
        )


def _deadline_limits(s: Setting) -> None:
    _positive_budget(s)
    if s.budget_us < DL_MIN_BUDGET_US:
        raise Refused(
            f"SCHED={s.sched}: BUDGET {s.budget_us} us is below the kernel minimum of "
            f"{DL_MIN_BUDGET_US} us (runtime must be >= {DL_MIN_RUNTIME_NS} ns)"
        )
    low = read_int(DL_PERIOD_MIN_SYSCTL, DL_PERIOD_MIN_DEFAULT_US)
    high = read_int(DL_PERIOD_MAX_SYSCTL, DL_PERIOD_MAX_DEFAULT_US)
    if not low <= s.period_us <= high:
        raise Refused(
            f"SCHED={s.sched}: PERIOD {s.period_us} us outside the kernel range {low}..{high} us "
            "(kernel.sched_deadline_period_min_us/max_us)"
        )


def _cfs_limits(s: Setting) -> None:
    _positive_budget(s)
    if not CFS_PERIOD_MIN_US <= s.period_us <= CFS_PERIOD_MAX_US:
        raise Refused(
            f"SCHED={s.sched}: PERIOD {s.period_us} us outside the kernel range "
            f"{CFS_PERIOD_MIN_US}..{CFS_PERIOD_MAX_US} us (cpu.cfs_period_us, cpu.max)"
        )
    if s.budget_us < CFS_QUOTA_MIN_US:
        raise Refused(
            f"SCHED={s.sched}: BUDGET {s.budget_us} us is below the kernel minimum of "
            f"{CFS_QUOTA_MIN_US} us (cpu.cfs_quota_us, cpu.max)"
        )


def _rtds_limits(s: Setting) -> None:
    if s.budget_us < RTDS_MIN_US or s.period_us < RTDS_MIN_US:
        raise Refused(
            f"SCHED=rtds: BUDGET and PERIOD must be at least {RTDS_MIN_US} us "
            f"(got BUDGET={s.budget_us}, PERIOD={s.period_us})"
        )
    _positive_budget(s)
    if s.extratime not in (0, 1):
        raise Refused(f"SCHED=rtds: EXTRATIME must be 0 or 1, got {s.extratime!r}")


def _credit_limits(s: Setting) -> None:
    low, high = WEIGHT_RANGE
    if not low <= s.weight <= high:
        raise Refused(f"SCHED={s.sched}: WEIGHT {s.weight} outside {low}..{high}")
    if s.cap < 0:
        raise Refused(f"SCHED={s.sched}: CAP {s.cap} is negative (0 means no cap)")
    check_pool_params(s.sched, s.tslice_us, s.ratelimit_us)


def check_pool_params(sched: str, tslice_us: int | None, ratelimit_us: int | None) -> None:
    """Xen's limits on a pool's time slice and rate limit (None: not set)."""
    if tslice_us is not None:
        low, high = TSLICE_RANGE_US
        if tslice_us % 1000 or not low <= tslice_us <= high:
            raise Refused(
                f"SCHED={sched}: TSLICE_US {tslice_us} is not whole milliseconds within "
                f"{low}..{high} us (Xen's Credit takes its time slice in ms, 1..1000)"
            )
    if ratelimit_us is not None and ratelimit_us < 0:
        raise Refused(f"SCHED={sched}: RATELIMIT_US {ratelimit_us} is negative (0: off)")
    if ratelimit_us:
        low, high = RATELIMIT_RANGE_US
        if not low <= ratelimit_us <= high:
            raise Refused(
                f"SCHED={sched}: RATELIMIT_US {ratelimit_us} outside {low}..{high} us "
                "(0 turns the rate limit off)"
            )
    if tslice_us is not None and ratelimit_us is not None and ratelimit_us > tslice_us:
        raise Refused(
            f"SCHED={sched}: RATELIMIT_US {ratelimit_us} is longer than TSLICE_US {tslice_us} "
            "(Xen's Credit refuses a rate limit longer than its time slice)"
        )


def _fifo_limits(s: Setting) -> None:
    low, high = FIFO_PRIORITY_RANGE
    if not low <= s.priority <= high:
        raise Refused(f"SCHED={s.sched}: PRIORITY {s.priority} outside {low}..{high}")


def _nothing(_s: Setting) -> None:
    pass


# (backend, scheduler) → the mechanism's limits; every entry of SCHEDULERS has one.
LIMITS = {
    ("linux", "none"): _nothing,
    ("linux", "deadline"): _deadline_limits,
    ("linux", "cfs-quota"): _cfs_limits,
    ("kvm", "none"): _nothing,
    ("kvm", "cfs"): _cfs_limits,
    ("kvm", "deadline"): _deadline_limits,
    ("kvm", "fifo"): _fifo_limits,
    ("xen", "rtds"): _rtds_limits,
    ("xen", "credit"): _credit_limits,
    ("xen", "credit2"): _credit_limits,
}
