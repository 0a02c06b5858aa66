"""The analytical bound: what each scheduler's reservation can leave without CPU, read back or
as requested, and the measured maximum beside it."""

import json
from pathlib import Path

import numpy as np
import pytest
from hvbench_analysis import bounds
from hvbench_analysis.bounds import Reservation
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.synthetic import write_run

MS = 1_000_000
DATA = Path(__file__).parent / "data"


def bound_of(sched: str, **setting) -> float | None:
    return bounds.reservation(sched, setting).bound_ms


@pytest.mark.parametrize("sched", ["rtds", "deadline", "cfs-quota", "cfs"])
def test_a_budget_per_period_can_starve_for_twice_the_period_minus_the_budget(sched):
    found = bounds.reservation(sched, {"budget_us": 77_500, "period_us": 100_000})
    assert found == Reservation("B 77.5 ms / P 100 ms", 45.0)
    assert bound_of(sched, budget_us=30_000, period_us=50_000) == 40.0
    assert bound_of(sched, budget_us=100_000, period_us=100_000) == 0.0
    assert bound_of(sched, budget_us=50_000) == 100.0  # the agent's default period, 100 ms


def test_rtds_with_extratime_has_no_cap_and_no_bound():
    assert bound_of("rtds", budget_us=77_500, period_us=100_000, extratime=0) == 45.0
    # unset, as a configuration's tags say it (NaN): the agent's defaults, extratime 0, 100 ms
    assert bound_of("rtds", budget_us=77_500.0, period_us=np.nan, extratime=np.nan) == 45.0
    found = bounds.reservation("rtds", {"budget_us": 77_500, "period_us": 100_000, "extratime": 1})
    assert found == Reservation("B 77.5 ms / P 100 ms, extratime: no cap", None)


def test_credit2_and_credit_caps_are_approximate_periodic_servers():
    # Credit2 gives a capped domain its budget every 10 ms; Credit enforces caps every 30 ms
    credit2 = bounds.reservation("credit2", {"cap": 50, "weight": 256})
    assert credit2 == Reservation("cap 50 %: B 5 ms / P 10 ms, approximate", 10.0)
    credit = bounds.reservation("credit", {"cap": 25})
    assert credit == Reservation("cap 25 %: B 7.5 ms / P 30 ms, approximate", 45.0)


def test_cap_0_a_weight_alone_and_no_reservation_have_no_bound():
    assert bounds.reservation("credit", {"cap": 0, "weight": 256}) == Reservation("cap 0: no cap")
    assert bounds.reservation("credit2", {"weight": 512}) == Reservation("weight 512, no cap")
    for sched in ("none", "fifo", "default"):
        assert bounds.reservation(sched, {"priority": 50}) == Reservation("no reservation")


def test_each_backends_readback_is_read():
    vcpu = {"policy": "SCHED_DEADLINE", "runtime_ns": 30_000_000, "period_ns": 50_000_000}
    cases = [
        (
            "xen",
            "rtds",
            {"sched": "rtds", "vcpus": [{"budget_us": 40, "period_us": 100, "extratime": 0}]},
            [{"budget_us": 40, "period_us": 100, "extratime": 0}],
        ),
        ("xen", "credit2", {"sched": "credit2", "weight": 256, "cap": 30}, [{"cap": 30}]),
        ("kvm", "cfs", {"vcpus": [{"cpu_max": "50000 100000"}]}, [{"budget_us": 50_000}]),
        ("kvm", "cfs", {"vcpus": [{"cpu_max": "max 100000"}]}, [{"budget_us": -1}]),
        ("kvm", "deadline", {"vcpus": [{"thread": vcpu}]}, [{"budget_us": 30_000}]),
        ("bare", "deadline", [vcpu, {**vcpu, "policy": "SCHED_OTHER"}], [{"budget_us": 30_000}]),
    ]
    for target, sched, readback, expected in cases:
        found = bounds.read_back(target, sched, {"applied": sched, "readback": readback})
        assert len(found) == len(expected), (target, sched)
        for got, want in zip(found, expected, strict=True):
            assert want.items() <= got.items(), (target, sched)
    # a real run's meta.json (bare, CPU quota 80 ms of 100 ms)
    meta = json.loads((DATA / "v1-bare-cfs-quota" / "meta.json").read_text())
    tags = {"target": "bare", "sched": "cfs-quota", "budget": 80_000, "period": 100_000}
    assert bounds.run_reservation(tags, meta["sched"]) == Reservation(
        "B 80 ms / P 100 ms", 40.0, "read back"
    )


def test_each_vcpus_reservation_is_read_back_with_its_number():
    # the simulator serves each vCPU with its own: vCPU 0 is not under SCHED_DEADLINE here
    dl = {"policy": "SCHED_DEADLINE", "runtime_ns": 30_000_000, "period_ns": 50_000_000}
    kvm = {"vcpus": [{"vcpu": 0, "thread": {"policy": "SCHED_OTHER"}, "cpu_max": "max 100000"},
                     {"vcpu": 1, "thread": dl, "cpu_max": "20000 100000"}]}  # fmt: skip
    xen = {"sched": "rtds", "vcpus": [
        {"vcpu": v, "budget_us": 40, "period_us": 100, "extratime": 0} for v in (0, 1)
    ]}  # fmt: skip
    numbers = {
        (target, sched): [r["vcpu"] for r in bounds.read_back(target, sched, {"readback": rb})]
        for target, sched, rb in (("kvm", "deadline", kvm), ("kvm", "cfs", kvm),
                                  ("xen", "rtds", xen))
    }  # fmt: skip
    assert numbers == {("kvm", "deadline"): [1], ("kvm", "cfs"): [0, 1], ("xen", "rtds"): [0, 1]}


def test_the_setting_read_back_is_preferred_over_the_requested():
    tags = {"target": "xen", "sched": "rtds", "budget": 77_500, "period": 100_000}
    vcpus = [
        {"vcpu": 0, "budget_us": 50_000, "period_us": 100_000, "extratime": 0},
        {"vcpu": 1, "budget_us": 90_000, "period_us": 100_000, "extratime": 0},
    ]
    read = bounds.run_reservation(tags, {"readback": {"sched": "rtds", "vcpus": vcpus}})
    assert read == Reservation("B 50 ms / P 100 ms", 100.0, "read back")  # the worst vCPU
    for unreadable in (None, {"readback": None}, {"readback": {"sched": "credit"}}, {"x": 1}):
        requested = bounds.run_reservation(tags, unreadable)
        assert requested == Reservation("B 77.5 ms / P 100 ms", 45.0, "requested")


@pytest.mark.parametrize(
    ("extra_ms", "bound_ms", "text", "expected"),
    [
        (72.0, 45.0, "B 77.5 ms / P 100 ms", ""),  # 1.5 × 45 + 5 = 72.5
        (72.6, 45.0, "B 77.5 ms / P 100 ms", "above bound"),
        (5.0, 0.0, "B 100 ms / P 100 ms", ""),
        (900.0, None, "no reservation", "no reservation"),
        (900.0, None, "cap 0: no cap", "no bound"),
    ],
)
def test_the_flag_marks_maxima_well_above_the_bound(extra_ms, bound_ms, text, expected):
    assert bounds.flag(extra_ms, Reservation(text, bound_ms)) == expected


def test_the_table_puts_each_configurations_maximum_beside_its_bound(tmp_path):
    steady = np.full(100, 10 * MS)
    starved = steady.copy()
    starved[40] = 50 * MS  # 40 ms over the p50, within 1.5 × 45 + 5 ms
    write_run(tmp_path / "rtds", starved, target="xen", sched="rtds", budget=77_500, period=100_000)
    stalled = steady.copy()
    stalled[60] = 500 * MS  # far past a 10 ms bound: something else is at work
    write_run(tmp_path / "cap", stalled, target="xen", sched="credit2", cap=50)
    write_run(tmp_path / "default", steady, target="xen", sched="credit")
    runs = load_runs(run_dirs(tmp_path))
    table = bounds.bound_table(runs.measured, bounds.readbacks_by_run(runs.runs))
    assert list(table.columns) == bounds.COLUMNS
    rows = {row["Scheduler"]: row for row in table.to_dict("records")}
    rtds, cap, credit = rows["RTDS"], rows["Credit2"], rows["Credit"]
    assert (rtds["Reservation"], rtds["Setting"], rtds["Bound (ms)"]) == (
        "B 77.5 ms / P 100 ms",
        "read back",
        45.0,
    )
    assert (rtds["p50 (ms)"], rtds["Max (ms)"], rtds["Max − p50 (ms)"]) == (10.0, 50.0, 40.0)
    assert rtds["(Max − p50) / bound"] == pytest.approx(40 / 45) and rtds["Flag"] == ""
    assert (cap["Bound (ms)"], cap["Max − p50 (ms)"], cap["Flag"]) == (10.0, 490.0, "above bound")
    assert np.isnan(credit["Bound (ms)"]) and credit["Flag"] == "no bound"
    assert credit["Reservation"] == "cap 0: no cap"  # read back: the scheduler's default
