"""SCHED settings for target xen, checked on the controller before any host is touched, and the
parsing of what xl prints.

Applying them needs a Xen host: playbooks/tests/test_provision_xen.py boots Xen inside a QEMU
guest playing the host and applies every scheduler there. The xl texts below were printed by
that host (Xen 4.17, Debian 12's xl).
"""

import pytest
from hvbench_load import xen_sched
from hvbench_load.xen_sched import XenSetting

REFUSED = [
    ("cfs", {}, "unknown SCHED 'cfs' for target xen; valid: rtds, credit, credit2"),
    ("none", {}, "unknown SCHED 'none' for target xen"),
    ("rtds", {}, "SCHED=rtds needs BUDGET"),
    (
        "rtds",
        {"budget_us": 120000},
        "SCHED=rtds: BUDGET 120000 us > PERIOD 100000 us (the budget must fit in one period)",
    ),
    ("rtds", {"budget_us": 5, "period_us": 100}, "SCHED=rtds: BUDGET and PERIOD must be at least"),
    ("rtds", {"budget_us": 500, "period_us": 9}, "SCHED=rtds: BUDGET and PERIOD must be at least"),
    ("rtds", {"budget_us": 500, "extratime": 2}, "SCHED=rtds: EXTRATIME must be 0 or 1, got 2"),
    ("rtds", {"budget_us": 500, "cap": 50}, "SCHED=rtds has no CAP=50; its parameters are"),
    ("rtds", {"budget_us": 500, "weight": 9}, "SCHED=rtds has no WEIGHT=9"),
    ("credit", {"budget_us": 500}, "SCHED=credit has no BUDGET=500; its parameters are WEIGHT"),
    ("credit2", {"extratime": 1}, "SCHED=credit2 has no EXTRATIME=1"),
    ("credit", {"weight": 0}, "SCHED=credit: WEIGHT 0 outside 1..65535"),
    ("credit2", {"weight": 65536}, "SCHED=credit2: WEIGHT 65536 outside 1..65535"),
    ("credit", {"cap": -1}, "SCHED=credit: CAP -1 is negative"),
    ("credit", {"cap": 1.5}, "SCHED=credit: CAP must be a whole number, got 1.5"),
]


@pytest.mark.parametrize(("name", "kwargs", "message"), REFUSED)
def test_bad_settings_are_refused_with_a_clear_message(name, kwargs, message):
    with pytest.raises(ValueError) as info:
        xen_sched.validate(name, **kwargs)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("rtds", {"budget_us": 77500}, XenSetting("rtds", 77500, 100000, 0)),
        ("rtds", {"budget_us": 10, "period_us": 10, "extratime": 1}, XenSetting("rtds", 10, 10, 1)),
        ("credit", {}, XenSetting("credit", weight=256, cap=0)),
        ("credit", {"cap": 153}, XenSetting("credit", weight=256, cap=153)),
        ("credit2", {"weight": 512, "cap": 50}, XenSetting("credit2", weight=512, cap=50)),
    ],
)
def test_good_settings_are_accepted(name, kwargs, expected):
    assert xen_sched.validate(name, **kwargs) == expected


def test_the_command_line_refuses_before_calling_xl(capsys, monkeypatch):
    def no_xl(*args):
        raise AssertionError(f"xl {args} was called")

    monkeypatch.setattr(xen_sched, "xl", no_xl)
    argv = ["apply", "--domain", "rt", "--sched", "rtds", "--budget", "200000"]
    assert xen_sched.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvbench-xen-sched: SCHED=rtds: BUDGET 200000 us > PERIOD 100000 us")
    assert xen_sched.main(["apply", "--domain", "rt", "--sched", "credit", "--budget", "1"]) == 2


def test_the_command_line_validates_without_a_host(capsys):
    assert xen_sched.main(["validate", "--sched", "credit2", "--cap", "153"]) == 0
    assert '"cap": 153' in capsys.readouterr().out


def test_a_cap_beyond_the_domains_vcpus_is_refused(monkeypatch):
    monkeypatch.setattr(xen_sched, "domain", lambda name: {"id": 3, "vcpus": 1, "pool": "p"})
    with pytest.raises(xen_sched.Refused) as info:
        xen_sched.check("rt", XenSetting("credit", weight=256, cap=153), "p")
    assert "CAP 153 is more than rt's 1 vCPU(s) can use (at most 100" in str(info.value)


def test_a_readback_matches_only_the_exact_setting():
    setting = XenSetting("rtds", 77500, 100000, 0)
    vcpus = [{"vcpu": i, "period_us": 100000, "budget_us": 77500, "extratime": 0} for i in (0, 1)]
    assert xen_sched.matches(setting, {"sched": "rtds", "vcpus": vcpus})
    vcpus[1] = {**vcpus[1], "extratime": 1}
    assert not xen_sched.matches(setting, {"sched": "rtds", "vcpus": vcpus})
    assert not xen_sched.matches(setting, {"sched": "credit", "weight": 256, "cap": 0})
    credit = XenSetting("credit", weight=256, cap=153)
    assert xen_sched.matches(credit, {"sched": "credit", "weight": 256, "cap": 153})
    assert not xen_sched.matches(credit, {"sched": "credit", "weight": 256, "cap": 0})


# printed by the test host (Xen 4.17.5, Debian 12's xl)
VCPU_LIST = """\
Name                                ID  VCPU   CPU State   Time(s) Affinity (Hard / Soft)
hvbench-realtime                     2     0    2   -b-      57.4  2 / all
hvbench-realtime                     2     1    3   -b-      50.3  3 / all
"""


def test_a_move_to_another_pool_keeps_the_vcpus_pinned(monkeypatch):
    # moving a domain between cpupools resets its vCPUs' affinity to all CPUs (Xen's
    # sched_move_domain): the tool reads the pinning first and restores it after the move
    calls = []

    def fake_xl(*args):
        calls.append(args)
        return VCPU_LIST if args[0] == "vcpu-list" else ""

    monkeypatch.setattr(xen_sched, "xl", fake_xl)
    assert xen_sched.hard_affinity("hvbench-realtime") == {0: "2", 1: "3"}
    calls.clear()
    xen_sched.migrate("hvbench-realtime", "hvbench-rt")
    assert calls == [
        ("vcpu-list", "hvbench-realtime"),
        ("cpupool-migrate", "hvbench-realtime", "hvbench-rt"),
        ("vcpu-pin", "hvbench-realtime", "0", "2"),
        ("vcpu-pin", "hvbench-realtime", "1", "3"),
    ]


def test_leaving_an_rtds_pool_with_cpus_is_refused(monkeypatch):
    monkeypatch.setattr(xen_sched, "domain", lambda name: {"id": 2, "vcpus": 2, "pool": "rt"})
    monkeypatch.setattr(
        xen_sched, "pools", lambda: {"rt": {"sched": "rtds", "cpus": [2, 3], "domains": 1}}
    )
    with pytest.raises(xen_sched.Refused) as info:
        xen_sched.check("rt-vm", XenSetting("credit", weight=256, cap=0), "rt")
    assert "Xen 4.17 panics when a CPU leaves an RTDS cpupool" in str(info.value)
    # staying on rtds is fine
    xen_sched.check("rt-vm", XenSetting("rtds", 77500, 100000, 0), "rt")


def test_read_and_reset_take_no_setting(capsys, monkeypatch):
    # the domain's pool decides the scheduler: no SCHED, BUDGET or the like is asked for
    monkeypatch.setattr(xen_sched, "readback", lambda name: {"domain": name, "how": "read"})
    monkeypatch.setattr(xen_sched, "reset", lambda name: {"domain": name, "how": "reset"})
    assert xen_sched.main(["read", "--domain", "rt"]) == 0
    assert '"how": "read"' in capsys.readouterr().out
    assert xen_sched.main(["reset", "--domain", "rt"]) == 0
    assert '"how": "reset"' in capsys.readouterr().out
    assert xen_sched.main(["read"]) == 2
    assert "read needs --domain" in capsys.readouterr().err
