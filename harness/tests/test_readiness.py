"""Readiness checks: the probe on this machine, and the checks' verdicts on facts that differ
from this machine's (a tuned and an untuned host, a Xen host from recorded `xl` output)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hvbench_agent import facts as agent_facts
from hvbench_agent import tuning
from hvbench_harness import readiness

AGENT_SRC = Path(agent_facts.__file__).parents[1]


@pytest.fixture(scope="module")
def here() -> dict:
    return agent_facts.collect_readiness()


def by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["check"]: c for c in checks}


def tuned_host(here: dict) -> dict:
    facts = copy.deepcopy(here)
    facts.update(
        tsc_flags=["constant_tsc", "nonstop_tsc", "tsc"],
        clocksource="tsc",
        governors={"cpu0": "performance", "cpu1": "performance"},
        turbo={"intel_pstate_no_turbo": "1", "cpufreq_boost": None},
        smt={"active": "0", "control": "off"},
        irqbalance="inactive",
        isolated="2-3",
        cmdline="root=/dev/sda1 isolcpus=2-3",
        xen=None,
    )
    facts["idle"] = {
        "driver": "intel_idle",
        "states": [
            {"name": "POLL", "latency_us": 0, "cpus": 2, "disabled_on": 0},
            {"name": "C1", "latency_us": 2, "cpus": 2, "disabled_on": 0},
            {"name": "C6", "latency_us": 170, "cpus": 2, "disabled_on": 2},
        ],
        "cpu_dma_latency_us": 2000000000,
    }
    facts["energy"] = {"available": True, "source": "powercap", "domains": ["package-0"]}
    facts["rt_profile"] = {
        "provisioned": True,
        "isolated": [2, 3],
        "settings": {
            "rt_throttling": {"want": "-1", "have": "-1", "ok": True},
            "thp": {"want": "never", "have": "never", "ok": True},
            "nmi_watchdog": {"want": "0", "have": None, "ok": True},
            "isolcpus": {"want": "", "have": "", "ok": None},  # not asked for
        },
        "ok": True,
    }
    return facts


def test_the_agent_reads_this_machine_with_the_standard_library_alone(here):
    assert here["kernel"] == os.uname().release and "tsc" in here["tsc_flags"]
    assert set(here["governors"]) == {f"cpu{i}" for i in range(os.cpu_count())}
    # as on a bare host: the agent's own source and no site-packages at all (-S)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "hvbench_agent", "facts", "readiness"],
        env={"PYTHONPATH": str(AGENT_SRC)},
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    )
    assert json.loads(proc.stdout)["readiness"]["tsc_flags"] == here["tsc_flags"]


def test_a_tuned_host_passes_every_check(here):
    checks = by_name(readiness.evaluate(tuned_host(here), "host"))
    assert {n: c["status"] for n, c in checks.items()} == {
        "tsc": "pass",
        "clocksource": "pass",
        "governor": "pass",
        "turbo": "pass",
        "cstates": "pass",
        "smt": "pass",
        "irqbalance": "pass",
        "isolated_cpus": "pass",
        "rt_profile": "pass",
        "energy": "pass",
    }
    assert checks["rt_profile"]["found"] == "3 settings; isolated CPUs 2,3"
    assert checks["governor"]["required"] and not checks["smt"]["required"]
    assert checks["energy"]["found"] == "powercap: package-0" and not checks["energy"]["required"]


def test_an_untuned_host_fails_what_provisioning_sets(here):
    facts = tuned_host(here)
    facts["governors"]["cpu1"] = "powersave"
    facts["turbo"]["intel_pstate_no_turbo"] = "0"
    facts["idle"]["states"][2]["disabled_on"] = 1  # C6 still enabled on one CPU
    facts["irqbalance"] = "active"
    facts["tsc_flags"] = ["tsc"]
    facts["rt_profile"]["settings"]["thp"] = {"want": "never", "have": "madvise", "ok": False}
    checks = readiness.evaluate(facts, "host")
    failed = {c["check"] for c in readiness.failed_required(checks)}
    assert failed == {"tsc", "governor", "cstates", "irqbalance", "rt_profile"}
    assert by_name(checks)["rt_profile"]["found"] == "thp 'madvise' (want 'never')"
    # a guest provisioned without the profile (rt_profile_enabled: false): nothing to check
    facts["rt_profile"] = {"provisioned": False, "ok": None}
    guest = by_name(readiness.evaluate(facts, "guest"))
    assert guest["rt_profile"]["status"] == "n/a" and guest["rt_profile"]["required"]
    assert by_name(checks)["turbo"]["status"] == "fail" and not by_name(checks)["turbo"]["required"]
    assert "C6 (170 µs)" in by_name(checks)["cstates"]["found"]
    assert by_name(checks)["governor"]["found"] == "performance, powersave"


def test_the_bare_target_requires_only_the_tsc_and_requirements_can_be_added(here):
    facts = tuned_host(here)
    facts["governors"] = {"cpu0": "schedutil"}
    facts["isolated"] = ""
    checks = readiness.evaluate(facts, "bare")
    assert readiness.failed_required(checks) == []
    stricter = readiness.evaluate(facts, "bare", require={"governor", "isolated_cpus"})
    assert {c["check"] for c in readiness.failed_required(stricter)} == {
        "governor",
        "isolated_cpus",
    }
    with pytest.raises(ValueError, match="unknown check"):
        readiness.parse_require("governor,turbbo")


def test_what_a_machine_does_not_offer_is_not_applicable(here):
    facts = tuned_host(here)
    facts.update(
        governors={"cpu0": None},
        turbo={"intel_pstate_no_turbo": None, "cpufreq_boost": None},
        smt={"active": None, "control": None},
    )
    facts["idle"]["states"] = []
    statuses = {c["check"]: c["status"] for c in readiness.evaluate(facts, "host")}
    assert statuses["governor"] == statuses["turbo"] == statuses["smt"] == "n/a"
    assert statuses["cstates"] == "n/a"


def test_a_verdict_refuses_unless_forced_and_says_what_was_forced(here):
    facts = tuned_host(here)
    facts["tsc_flags"] = ["tsc"]
    facts["irqbalance"] = "active"
    results = {"host": readiness.evaluate(facts, "host")}
    refused = readiness.verdict(results, force=False, force_tsc=False)
    assert refused["refused"] and not refused["forced"]
    message = readiness.refusal(refused)
    assert "host: tsc is tsc" in message and "host: irqbalance is active" in message
    only_tsc = readiness.verdict(results, force=False, force_tsc=True)
    assert only_tsc["refused"]  # irqbalance is not the TSC
    assert [f["check"] for f in only_tsc["failed_required"] if f["forced"]] == ["tsc"]
    forced = readiness.verdict(results, force=True, force_tsc=False)
    assert forced["forced"] and not forced["refused"]
    assert {f["check"] for f in forced["failed_required"]} == {"tsc", "irqbalance"}


# Recorded from a Xen 4.17 host (Debian 12) with the real-time cpupool, columns as xl prints them.
XL = {
    "info": """\
host                   : hvbench-host
xen_major              : 4
xen_minor              : 17
xen_extra              : .5-pre
xen_scheduler          : credit
xen_changeset          : Tue Oct 1 10:00:00 2024 +0200 git:e2cbc2ed
xen_commandline        : placeholder dom0_mem=1536M,max:1536M dom0_max_vcpus=1 dom0_vcpus_pin \
cpufreq=xen:performance max_cstate=1 smap=0 smep=0
""",
    "cpupool-list": """\
Name               CPUs   Sched     Active   Domain count
Pool-0               2    credit       y          2
hvbench-rt           2      rtds       y          1
""",
    "cpupool-list -c": """\
Name               CPU list
Pool-0             0,1
hvbench-rt         2,3
""",
    "vcpu-list Domain-0": """\
Name                                ID  VCPU   CPU State   Time(s) Affinity (Hard / Soft)
Domain-0                             0     0    0   r--     812.1  0 / all
""",
    "list -c": """\
Name                                        ID   Mem VCPUs	State	Time(s)   Cpupool
Domain-0                                     0  1536     1     r-----     812.1   Pool-0
hvbench-messaging                            1   512     1     -b----     101.9   Pool-0
hvbench-realtime                             2   512     2     -b----      98.0   hvbench-rt
""",
}
XL_LIST_L = [
    {"domid": 1, "config": {"c_info": {"name": "hvbench-messaging"}, "b_info": {}}},
    {
        "domid": 2,
        "config": {
            "c_info": {"name": "hvbench-realtime", "pool_name": "hvbench-rt"},
            "b_info": {"tsc_mode": "native"},
        },
    },
]


@pytest.fixture
def fake_xl(tmp_path, monkeypatch):
    """`xl` on PATH printing the recorded output above."""
    outputs = {**XL, "list -l": json.dumps(XL_LIST_L)}
    script = tmp_path / "xl"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nOUT = {outputs!r}\n"
        "key = ' '.join(sys.argv[1:])\n"
        "sys.stdout.write(OUT[key]) if key in OUT else sys.exit(1)\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_xen_facts_are_read_from_xl(fake_xl):
    xen = agent_facts._xen()
    assert xen["version"] == "4.17.5-pre" and xen["changeset"].endswith("git:e2cbc2ed")
    assert xen["cpupools"] == [
        {"name": "Pool-0", "cpus": 2, "sched": "credit", "cpu_list": "0,1"},
        {"name": "hvbench-rt", "cpus": 2, "sched": "rtds", "cpu_list": "2,3"},
    ]
    assert xen["dom0_vcpus"] == [{"vcpu": "0", "cpu": "0", "hard": "0"}]
    assert xen["domains"] == {
        "hvbench-messaging": {"tsc_mode": "default", "pool": "Pool-0"},
        "hvbench-realtime": {"tsc_mode": "native", "pool": "hvbench-rt"},
    }


def test_a_xen_host_is_checked_by_what_xen_runs(here, fake_xl):
    facts = tuned_host(here)
    facts["governors"] = {"cpu0": None}  # dom0 has no cpufreq: Xen has it
    facts["xen"] = agent_facts._xen()
    expect = {"realtime_domains": ["hvbench-realtime"], "realtime_pool": "hvbench-rt"}
    checks = by_name(readiness.evaluate(facts, "host", expect))
    for name in ("governor", "cstates", "xen_dom0_pinned", "xen_rt_pool", "xen_tsc_mode"):
        assert checks[name]["status"] == "pass", checks[name]
    assert checks["governor"]["found"] == "xen:performance"
    assert "hvbench-rt: rtds on 2,3" in checks["xen_rt_pool"]["found"]

    facts["xen"]["commandline"] = "dom0_mem=1536M"
    facts["xen"]["dom0_vcpus"] = [{"vcpu": "0", "cpu": "1", "hard": "all"}]
    facts["xen"]["domains"]["hvbench-realtime"]["pool"] = "Pool-0"
    facts["xen"]["domains"]["hvbench-realtime"]["tsc_mode"] = "always_emulate"
    checks = by_name(readiness.evaluate(facts, "host", expect))
    failed = {n for n, c in checks.items() if c["status"] == "fail"}
    assert failed == {"governor", "cstates", "xen_dom0_pinned", "xen_rt_pool", "xen_tsc_mode"}


def test_make_check_prints_the_checks_of_this_machine(tmp_path):
    out = tmp_path / "checks.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hvbench_harness.readiness", "check", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    doc = json.loads(out.read_text())
    tsc = next(c for c in doc["checks"]["this machine"] if c["check"] == "tsc")
    assert proc.returncode == (1 if doc["failed_required"] else 0)
    assert "this machine" in proc.stdout and "tsc" in proc.stdout and tsc["required"]
    strict = subprocess.run(
        [sys.executable, "-m", "hvbench_harness.readiness", "check", "--require", "nosuch"],
        capture_output=True,
        text=True,
    )
    assert strict.returncode == 1 and "unknown check(s) nosuch" in strict.stderr


def test_enforcing_writes_only_what_differs(tmp_path):
    governor = tmp_path / "scaling_governor"
    governor.write_text("powersave\n")
    assert tuning._write_value(governor, "performance") is True
    assert governor.read_text() == "performance"
    assert tuning._write_value(governor, "performance") is False  # already so: untouched
    assert tuning._write_value(tmp_path / "absent" / "no_turbo", "1") is False


def test_the_run_refusal_names_every_unforced_check():
    doc = {
        "failed_required": [
            {"machine": "m", "check": "tsc", "found": "tsc", "expected": "x", "forced": True},
            {"machine": "m", "check": "smt", "found": "on", "expected": "off", "forced": False},
        ]
    }
    text = readiness.refusal(doc)
    assert "m: smt is on; expected off" in text and "m: tsc" not in text
    assert "FORCE=1" in text and "ENFORCE=1" in text
