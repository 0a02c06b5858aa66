"""One table of what each scheduler of each backend takes, checked before any host is touched.

`validate` is pure: the same answers on a laptop, a KVM host or a Xen host (the deadline period
bounds come from the kernel's sysctls, read where it runs)."""

from pathlib import Path

import pytest
from hvbench_agent.sched import SCHEDULERS, Refused, Setting, validate
from hvbench_agent.sched.base import LIMITS


def _sysctl(name: str, default: int) -> int:
    try:
        return int(Path(f"/proc/sys/kernel/{name}").read_text())
    except OSError:
        return default


DL_MIN = _sysctl("sched_deadline_period_min_us", 100)
DL_MAX = _sysctl("sched_deadline_period_max_us", 4194304)

REFUSED = [
    # (backend, sched, parameters, the message it starts with)
    ("linux", "rtds", {}, "unknown SCHED 'rtds' for target bare; valid: none, deadline, cfs-quota"),
    ("linux", "", {"budget_us": 5000}, "unknown SCHED '' for target bare"),
    ("linux", "dedline", {}, "unknown SCHED 'dedline' for target bare; valid: none, deadline, "
     "cfs-quota (did you mean deadline?)"),
    ("linux", "none", {"budget_us": 5000}, "SCHED=none has no BUDGET=5000; its parameters: none"),
    ("linux", "none", {"period_us": 100000}, "SCHED=none has no PERIOD=100000"),
    ("linux", "deadline", {"period_us": 100000}, "SCHED=deadline needs BUDGET (microseconds"),
    ("linux", "cfs-quota", {}, "SCHED=cfs-quota needs BUDGET"),
    ("linux", "deadline", {"budget_us": "5000"},
     "SCHED=deadline: BUDGET must be a whole number, got '5000'"),
    ("linux", "cfs-quota", {"budget_us": 5000, "period_us": 1.5},
     "SCHED=cfs-quota: PERIOD must be a whole number, got 1.5"),
    ("linux", "deadline", {"budget_us": True}, "SCHED=deadline: BUDGET must be a whole number"),
    ("linux", "deadline", {"budget_us": 0}, "SCHED=deadline: BUDGET must be positive, got 0 us"),
    ("linux", "cfs-quota", {"budget_us": 5000, "period_us": -100000},
     "SCHED=cfs-quota: PERIOD must be positive, got -100000 us"),
    ("linux", "deadline", {"budget_us": 120000},
     "SCHED=deadline: BUDGET 120000 us > PERIOD 100000 us (the budget must fit in one period)"),
    ("linux", "deadline", {"budget_us": 1},
     "SCHED=deadline: BUDGET 1 us is below the kernel minimum of 2 us (runtime must be >= 1024"),
    ("linux", "deadline", {"budget_us": 50, "period_us": DL_MIN - 1},
     f"SCHED=deadline: PERIOD {DL_MIN - 1} us outside the kernel range {DL_MIN}..{DL_MAX} us"),
    ("linux", "deadline", {"budget_us": 5000, "period_us": DL_MAX + 1},
     f"SCHED=deadline: PERIOD {DL_MAX + 1} us outside the kernel range"),
    ("linux", "cfs-quota", {"budget_us": 500, "period_us": 999},
     "SCHED=cfs-quota: PERIOD 999 us outside the kernel range 1000..1000000 us"),
    ("linux", "cfs-quota", {"budget_us": 5000, "period_us": 1000001},
     "SCHED=cfs-quota: PERIOD 1000001 us outside the kernel range 1000..1000000 us"),
    ("linux", "cfs-quota", {"budget_us": 999},
     "SCHED=cfs-quota: BUDGET 999 us is below the kernel minimum of 1000 us"),
    ("linux", "deadline", {"budget_us": 5000, "priority": 5}, "SCHED=deadline has no PRIORITY=5"),
    ("kvm", "rtds", {}, "unknown SCHED 'rtds' for target kvm; valid: none, cfs, deadline, fifo"),
    ("kvm", "cfs-quota", {"budget_us": 5000}, "unknown SCHED 'cfs-quota' for target kvm"),
    ("kvm", "fifo", {"period_us": 100000, "priority": 10},
     "SCHED=fifo has no PERIOD=100000; its parameters: PRIORITY"),
    ("kvm", "cfs", {"budget_us": 5000, "priority": 10}, "SCHED=cfs has no PRIORITY=10"),
    ("kvm", "fifo", {}, "SCHED=fifo needs PRIORITY (1..99)"),
    ("kvm", "fifo", {"priority": 0}, "SCHED=fifo: PRIORITY 0 outside 1..99"),
    ("kvm", "fifo", {"priority": 100}, "SCHED=fifo: PRIORITY 100 outside 1..99"),
    ("kvm", "fifo", {"priority": True}, "SCHED=fifo: PRIORITY must be a whole number, got True"),
    ("kvm", "cfs", {"budget_us": 120000}, "SCHED=cfs: BUDGET 120000 us > PERIOD 100000 us"),
    ("kvm", "cfs", {"budget_us": 999}, "SCHED=cfs: BUDGET 999 us is below the kernel minimum"),
    ("kvm", "deadline", {"budget_us": 77500, "period_us": 50000},
     "SCHED=deadline: BUDGET 77500 us > PERIOD 50000 us"),
    ("kvm", "deadline", {"budget_us": 1}, "SCHED=deadline: BUDGET 1 us is below the kernel"),
    ("xen", "cfs", {}, "unknown SCHED 'cfs' for target xen; valid: rtds, credit, credit2"),
    ("xen", "none", {}, "unknown SCHED 'none' for target xen"),
    ("xen", "rtds", {}, "SCHED=rtds needs BUDGET"),
    ("xen", "rtds", {"budget_us": 120000},
     "SCHED=rtds: BUDGET 120000 us > PERIOD 100000 us (the budget must fit in one period)"),
    ("xen", "rtds", {"budget_us": 5, "period_us": 100}, "SCHED=rtds: BUDGET and PERIOD must be"),
    ("xen", "rtds", {"budget_us": 500, "period_us": 9}, "SCHED=rtds: BUDGET and PERIOD must be"),
    ("xen", "rtds", {"budget_us": 500, "extratime": 2}, "SCHED=rtds: EXTRATIME must be 0 or 1"),
    ("xen", "rtds", {"budget_us": 500, "cap": 50},
     "SCHED=rtds has no CAP=50; its parameters: BUDGET, PERIOD, EXTRATIME"),
    ("xen", "credit", {"budget_us": 500},
     "SCHED=credit has no BUDGET=500; its parameters: WEIGHT, CAP, TSLICE_US, RATELIMIT_US"),
    ("xen", "credit2", {"extratime": 1}, "SCHED=credit2 has no EXTRATIME=1"),
    ("xen", "credit", {"weight": 0}, "SCHED=credit: WEIGHT 0 outside 1..65535"),
    ("xen", "credit2", {"weight": 65536}, "SCHED=credit2: WEIGHT 65536 outside 1..65535"),
    ("xen", "credit", {"cap": -1}, "SCHED=credit: CAP -1 is negative"),
    ("xen", "credit", {"cap": 1.5}, "SCHED=credit: CAP must be a whole number, got 1.5"),
    ("xen", "credit", {"tslice_us": 100},
     "SCHED=credit: TSLICE_US 100 is not whole milliseconds within 1000..1000000 us"),
    ("xen", "credit", {"tslice_us": 2_000_000}, "SCHED=credit: TSLICE_US 2000000 is not whole"),
    ("xen", "credit", {"ratelimit_us": 50}, "SCHED=credit: RATELIMIT_US 50 outside 100..500000"),
    ("xen", "credit2", {"ratelimit_us": -1}, "SCHED=credit2: RATELIMIT_US -1 is negative"),
    ("xen", "credit", {"tslice_us": 1000, "ratelimit_us": 2000},
     "SCHED=credit: RATELIMIT_US 2000 is longer than TSLICE_US 1000"),
    ("xen", "credit2", {"tslice_us": 1000},
     "SCHED=credit2 has no TSLICE_US=1000; its parameters: WEIGHT, CAP, RATELIMIT_US"),
    ("xen", "rtds", {"budget_us": 500, "ratelimit_us": 0}, "SCHED=rtds has no RATELIMIT_US=0"),
    ("bhyve", "none", {}, "unknown scheduler backend 'bhyve'; valid: linux, kvm, xen"),
]  # fmt: skip


@pytest.mark.parametrize(("backend", "name", "params", "message"), REFUSED)
def test_bad_settings_are_refused_with_a_clear_message(backend, name, params, message):
    with pytest.raises(Refused) as info:
        validate(backend, name, **params)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


ACCEPTED = [
    ("linux", "none", {}, Setting("none")),
    ("linux", "deadline", {"budget_us": 5000}, Setting("deadline", 5000, 100000)),
    ("linux", "deadline", {"budget_us": 2, "period_us": DL_MIN}, Setting("deadline", 2, DL_MIN)),
    ("linux", "deadline", {"budget_us": DL_MAX, "period_us": DL_MAX},
     Setting("deadline", DL_MAX, DL_MAX)),
    ("linux", "cfs-quota", {"budget_us": 1000, "period_us": 1000},
     Setting("cfs-quota", 1000, 1000)),
    ("linux", "cfs-quota", {"budget_us": 100000, "period_us": 1000000},
     Setting("cfs-quota", 100000, 1000000)),
    ("kvm", "none", {}, Setting("none")),
    ("kvm", "cfs", {"budget_us": 77500}, Setting("cfs", 77500, 100000)),
    ("kvm", "deadline", {"budget_us": 50000}, Setting("deadline", 50000, 100000)),
    ("kvm", "fifo", {"priority": 99}, Setting("fifo", priority=99)),
    ("xen", "rtds", {"budget_us": 77500}, Setting("rtds", 77500, 100000, extratime=0)),
    ("xen", "rtds", {"budget_us": 10, "period_us": 10, "extratime": 1},
     Setting("rtds", 10, 10, extratime=1)),
    ("xen", "credit", {}, Setting("credit", weight=256, cap=0)),
    ("xen", "credit", {"cap": 153}, Setting("credit", weight=256, cap=153)),
    ("xen", "credit", {"tslice_us": 1000, "ratelimit_us": 100},
     Setting("credit", weight=256, cap=0, tslice_us=1000, ratelimit_us=100)),
    ("xen", "credit2", {"ratelimit_us": 0}, Setting("credit2", weight=256, cap=0, ratelimit_us=0)),
    ("xen", "credit2", {"weight": 512, "cap": 50}, Setting("credit2", weight=512, cap=50)),
    # None means "not given", as an unset Make variable
    ("xen", "credit2", {"weight": None, "budget_us": None}, Setting("credit2", weight=256, cap=0)),
]  # fmt: skip


@pytest.mark.parametrize(("backend", "name", "params", "expected"), ACCEPTED)
def test_good_settings_are_accepted_with_their_defaults(backend, name, params, expected):
    setting = validate(backend, name, **params)
    assert setting == expected
    with pytest.raises(AttributeError):
        setting.budget_us = 1  # frozen


def test_every_scheduler_has_its_limits_and_only_known_parameters():
    assert set(LIMITS) == {(b, s) for b, table in SCHEDULERS.items() for s in table}
    known = set(Setting.__dataclass_fields__) - {"sched"}
    assert all(set(p) <= known for table in SCHEDULERS.values() for p in table.values())


def test_params_are_the_fields_that_are_set():
    assert Setting("rtds", 77500, 100000, extratime=0).params() == {
        "budget_us": 77500,
        "period_us": 100000,
        "extratime": 0,
    }
    assert Setting("none").params() == {}
