"""The xen backend without a Xen host: the parsing of what xl prints, pool moves, refusals (the
settings themselves are in test_validate.py).

Applying them needs a Xen host: tests/testbed/test_provision_xen.py boots Xen inside a QEMU
guest playing the host and applies every scheduler there. The xl texts below were printed by
that host (Xen 4.17, Debian 12's xl).
"""

import json

import pytest
from hvbench_agent import cli
from hvbench_agent.sched import Refused, Setting
from hvbench_agent.sched import xen as xen_sched


def test_the_command_line_refuses_before_calling_xl(capsys, monkeypatch):
    def no_xl(*args):
        raise AssertionError(f"xl {args} was called")

    monkeypatch.setattr(xen_sched, "xl", no_xl)
    apply = ["sched", "apply", "--backend", "xen", "--domain", "rt"]
    assert cli.main([*apply, "--sched", "rtds", "--budget", "200000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvbench-agent: SCHED=rtds: BUDGET 200000 us > PERIOD 100000 us")
    assert cli.main([*apply, "--sched", "credit", "--budget", "1"]) == 2


def test_the_command_line_validates_without_a_host(capsys):
    argv = ["sched", "validate", "--backend", "xen", "--sched", "credit2", "--cap", "153"]
    assert cli.main(argv) == 0
    assert '"cap": 153' in capsys.readouterr().out


def test_a_cap_beyond_the_domains_vcpus_is_refused(monkeypatch):
    monkeypatch.setattr(xen_sched, "domain", lambda name: {"id": 3, "vcpus": 1, "pool": "p"})
    with pytest.raises(Refused) as info:
        xen_sched.check("rt", Setting("credit", weight=256, cap=153), "p")
    assert "CAP 153 is more than rt's 1 vCPU(s) can use (at most 100" in str(info.value)


def test_a_readback_matches_only_the_exact_setting():
    setting = Setting("rtds", 77500, 100000, extratime=0)
    vcpus = [{"vcpu": i, "period_us": 100000, "budget_us": 77500, "extratime": 0} for i in (0, 1)]
    assert xen_sched.matches(setting, {"sched": "rtds", "vcpus": vcpus})
    vcpus[1] = {**vcpus[1], "extratime": 1}
    assert not xen_sched.matches(setting, {"sched": "rtds", "vcpus": vcpus})
    assert not xen_sched.matches(setting, {"sched": "credit", "weight": 256, "cap": 0})


def test_a_credit_readback_matches_the_pools_slice_and_rate_limit_too(monkeypatch):
    monkeypatch.setattr(xen_sched, "boot_options", lambda: {"sched_ratelimit_us": "1000"})
    at_boot = {"tslice_us": 30000, "ratelimit_us": 1000, "migration_delay_us": 0}
    credit = Setting("credit", weight=256, cap=153)
    back = {"sched": "credit", "weight": 256, "cap": 153, "pool_params": at_boot}
    assert xen_sched.matches(credit, back)
    assert not xen_sched.matches(credit, {**back, "cap": 0})
    # a run that sets no slice runs with the boot value, never the last run's
    assert not xen_sched.matches(credit, {**back, "pool_params": {**at_boot, "tslice_us": 1000}})
    short = Setting("credit", weight=256, cap=153, tslice_us=1000, ratelimit_us=100)
    assert xen_sched.matches(
        short, {**back, "pool_params": {"tslice_us": 1000, "ratelimit_us": 100}}
    )


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
    with pytest.raises(Refused) as info:
        xen_sched.check("rt-vm", Setting("credit", weight=256, cap=0), "rt")
    assert "Xen 4.17 panics when a CPU leaves an RTDS cpupool" in str(info.value)
    # staying on rtds is fine
    xen_sched.check("rt-vm", Setting("rtds", 77500, 100000, extratime=0), "rt")


def test_read_and_reset_take_no_setting(capsys, monkeypatch):
    # the domain's pool decides the scheduler: no SCHED, BUDGET or the like is asked for
    done = []
    monkeypatch.setattr(xen_sched, "readback", lambda name: {"domain": name, "how": "read"})
    monkeypatch.setattr(xen_sched, "reset", lambda name: done.append(name))
    verb = ["sched", "--backend", "xen"]
    assert cli.main([verb[0], "read", *verb[1:], "--domain", "rt"]) == 0
    assert '"how": "read"' in capsys.readouterr().out
    assert cli.main([verb[0], "reset", *verb[1:], "--domain", "rt"]) == 0
    assert done == ["rt"] and '"how": "read"' in capsys.readouterr().out
    assert cli.main([verb[0], "read", *verb[1:]]) == 2
    assert "read needs --domain" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sched", "expected"),
    [
        ("rtds", ("sched-rtds", "-d", "d", "-v", "all", "-p", "10000", "-b", "4000", "-e", "1")),
        ("credit2", ("sched-credit2", "-d", "d", "-w", "256", "-c", "0")),
    ],
)
def test_reset_gives_the_domain_its_pools_defaults(monkeypatch, sched, expected):
    calls = []
    monkeypatch.setattr(xen_sched, "_pool_sched", lambda name: sched)
    monkeypatch.setattr(xen_sched, "domain", lambda name: {"id": 2, "vcpus": 2, "pool": "rt"})
    monkeypatch.setattr(xen_sched, "boot_options", lambda: {"sched_ratelimit_us": "500"})
    monkeypatch.setattr(xen_sched, "readback", lambda name: {"domain": name})
    monkeypatch.setattr(xen_sched, "xl", lambda *args: calls.append(args) or RTDS_EXTRATIME_ON)
    assert xen_sched.reset("d") == {"domain": "d"}
    assert calls[-1] == expected and ("pause", "d") not in calls
    # the pool's rate limit goes back to what a new pool gets (the boot value)
    pool = [c for c in calls if c[:2] == (f"sched-{sched}", "-s")]
    assert pool == ([("sched-credit2", "-s", "-p", "rt", "-r", "500")] if sched != "rtds" else [])


# `xl sched-credit -s -p POOL` and `xl sched-credit2 -s -p POOL` (tools/xl/xl_sched.c)
CREDIT_POOL = "Cpupool hvbench-rt: tslice=30ms ratelimit=1000us migration-delay=0us\n"
CREDIT2_POOL = "Cpupool hvbench-rt: ratelimit=0us\n"


def test_the_pools_parameters_are_read_in_microseconds():
    assert xen_sched.parse_pool_params(CREDIT_POOL) == {
        "tslice_us": 30000, "ratelimit_us": 1000, "migration_delay_us": 0
    }  # fmt: skip
    assert xen_sched.parse_pool_params(CREDIT2_POOL) == {"ratelimit_us": 0}
    with pytest.raises(Refused, match="no scheduler parameters"):
        xen_sched.parse_pool_params("Cpupool hvbench-rt: [sched params unavailable]\n")


def test_a_new_pools_values_come_from_the_hypervisors_command_line(monkeypatch):
    line = "xen_commandline : dom0_mem=2048M sched=credit2 sched_ratelimit_us=500 timer_slop=10000"
    monkeypatch.setattr(xen_sched, "xl", lambda *args: line)
    assert xen_sched.boot_pool_params("credit") == {"tslice_us": 30000, "ratelimit_us": 500}
    assert xen_sched.boot_pool_params("credit2") == {"ratelimit_us": 500}
    assert xen_sched.boot_pool_params("rtds") == {}
    assert xen_sched.timer_slop() == {"ns": 10000, "from": "the hypervisor's command line"}
    monkeypatch.setattr(xen_sched, "xl", lambda *args: "xen_commandline : sched=credit")
    assert xen_sched.timer_slop() == {"ns": 50000, "from": "Xen's default"}


def test_the_pools_slice_and_rate_limit_are_set_in_one_call(monkeypatch):
    calls = []
    monkeypatch.setattr(xen_sched, "xl", lambda *args: calls.append(args) or "")
    monkeypatch.setattr(xen_sched, "boot_options", lambda: {})
    wanted = xen_sched.wanted_pool_params(
        Setting("credit", 256, 0, tslice_us=1000, ratelimit_us=100)
    )
    xen_sched.set_pool_params("rt", "credit", wanted)
    wanted = xen_sched.wanted_pool_params(Setting("credit2", weight=256, cap=0, ratelimit_us=0))
    xen_sched.set_pool_params("rt", "credit2", wanted)
    assert calls == [
        ("sched-credit", "-s", "-p", "rt", "-t", "1", "-r", "100"),
        ("sched-credit2", "-s", "-p", "rt", "-r", "0"),
    ]


def test_a_rate_limit_longer_than_the_pools_boot_slice_is_refused_before_xl_sets_it(monkeypatch):
    monkeypatch.setattr(xen_sched, "domain", lambda name: {"id": 2, "vcpus": 2, "pool": "rt"})
    monkeypatch.setattr(xen_sched, "pools", lambda: {"rt": {"sched": "credit", "cpus": [1]}})
    monkeypatch.setattr(xen_sched, "boot_options", lambda: {"sched_credit_tslice_ms": "2"})
    with pytest.raises(Refused, match="RATELIMIT_US 5000 is longer than TSLICE_US 2000"):
        xen_sched.check("rt-vm", Setting("credit", weight=256, cap=0, ratelimit_us=5000), "rt")


# `xl sched-rtds -d hvbench-realtime -v all` on the test host (Xen 4.17.5)
RTDS_EXTRATIME_ON = """\
Name                                ID VCPU    Period    Budget  Extratime
hvbench-realtime                     2    0      10000      4000        yes
hvbench-realtime                     2    1      10000      4000        yes
"""
RTDS_EXTRATIME_OFF = RTDS_EXTRATIME_ON.replace("yes", " no").replace("10000", "80000")


@pytest.mark.parametrize("extratime", [0, 1])
def test_extratime_is_switched_on_only_while_the_domain_is_paused(monkeypatch, extratime):
    # Xen < 4.22 breaks when a vCPU without budget gets extratime: the domain is paused
    # past its deadline (2 x the longest period it had), so its budget is refilled first
    calls, slept = [], []
    monkeypatch.setattr(xen_sched, "xl", lambda *args: calls.append(args) or RTDS_EXTRATIME_OFF)
    monkeypatch.setattr(xen_sched.time, "sleep", slept.append)
    xen_sched._set("d", Setting("rtds", 7750, 10000, extratime=extratime))
    setting = ("sched-rtds", "-d", "d", "-v", "all", "-p", "10000", "-b", "7750")
    if extratime:
        assert calls[1:] == [("pause", "d"), (*setting, "-e", "1"), ("unpause", "d")]
        assert slept == [0.16]
    else:
        assert calls[1:] == [(*setting, "-e", "0")] and slept == []


BOOT = {"tslice_us": 30000, "ratelimit_us": 1000}  # Xen's defaults


def test_every_real_time_vm_gets_the_setting_and_is_read_back(capsys, monkeypatch):
    applied, reset = [], []
    monkeypatch.setattr(xen_sched, "check", lambda name, setting, pool: None)
    monkeypatch.setattr(xen_sched, "boot_options", lambda: {})

    def fake_apply(name, setting, pool):
        applied.append((name, pool))
        return {"domain": name, "sched": "credit", "weight": 256, "cap": 0, "pool_params": BOOT}

    monkeypatch.setattr(xen_sched, "apply", fake_apply)
    monkeypatch.setattr(xen_sched, "reset", reset.append)
    args = ["sched", "apply", "--backend", "xen", "--pool", "rt", "--sched", "credit"]
    assert cli.main([*args, "--domain", "rt-1", "--domain", "rt-2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert applied == [("rt-1", "rt"), ("rt-2", "rt")] and reset == []
    assert out["readback"]["domain"] == "rt-1"
    assert [r["domain"] for r in out["readbacks"]] == ["rt-1", "rt-2"]


def test_a_refusal_on_one_real_time_vm_resets_them_all(monkeypatch):
    reset = []
    monkeypatch.setattr(xen_sched, "check", lambda name, setting, pool: None)
    monkeypatch.setattr(xen_sched, "boot_options", lambda: {})

    def fake_apply(name, setting, pool):
        if name == "rt-2":
            raise Refused("xl sched-credit: failed")
        return {"domain": name, "sched": "credit", "weight": 256, "cap": 0, "pool_params": BOOT}

    monkeypatch.setattr(xen_sched, "apply", fake_apply)
    monkeypatch.setattr(xen_sched, "reset", reset.append)
    scheduler = xen_sched.XenScheduler(["rt-1", "rt-2"], "rt")
    with pytest.raises(Refused, match="failed"):
        scheduler.apply(Setting("credit", weight=256, cap=0))
    assert reset == ["rt-1", "rt-2"]
