"""The power policy: bad values refused on their own; Linux's sysfs controls on a tree laid out
as the kernel lays it out, and for real on this machine's idle states (it has no cpufreq and
no turbo control: those are refused, as they are here); Xen's through xenpm's recorded output
under QEMU (no cpufreq) and on a host with it."""

import os
from pathlib import Path

import pytest
from hvbench_agent import power
from hvbench_agent.sched import Refused

CPU = Path("/sys/devices/system/cpu")


def test_bad_values_are_refused_before_any_host():
    for asked, says in (
        ({"governor": "fast"}, "GOVERNOR='fast': one of performance"),
        ({"max_cstate": -1}, "MAX_CSTATE=-1: an idle state number"),
        ({"max_cstate": 99}, "MAX_CSTATE=99"),
        ({"turbo": "maybe"}, "TURBO='maybe': on or off"),
    ):
        with pytest.raises(Refused, match=says):
            power.validate_policy(**asked)
    assert power.validate_policy("powersave", 1, "off").given() == {
        "governor": "powersave",
        "max_cstate": 1,
        "turbo": "off",
    }
    assert power.validate_policy().given() == {}


def sysfs(root: Path, cpufreq: bool = True, turbo: bool = True) -> Path:
    """Two CPUs with intel_pstate (performance, powersave), intel_idle's four states."""
    for n in (0, 1):
        cpu = root / f"cpu{n}"
        if cpufreq:
            (cpu / "cpufreq").mkdir(parents=True)
            (cpu / "cpufreq/scaling_governor").write_text("powersave\n")
            (cpu / "cpufreq/scaling_available_governors").write_text("performance powersave\n")
        for k, (name, latency) in enumerate((("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170))):
            state = cpu / f"cpuidle/state{k}"
            state.mkdir(parents=True)
            (state / "name").write_text(name + "\n")
            (state / "latency").write_text(f"{latency}\n")
            (state / "disable").write_text("0\n")
    (root / "cpuidle").mkdir()
    (root / "cpuidle/current_driver").write_text("intel_idle\n")
    if turbo:
        (root / "intel_pstate").mkdir()
        (root / "intel_pstate/no_turbo").write_text("0\n")
    return root


def test_linux_policy_applied_read_back_and_restored(tmp_path):
    host = power.LinuxPower(sysfs(tmp_path))
    before = host.snapshot()
    found = host.apply(power.validate_policy("performance", 1, "off"))
    assert found["governor"] == "performance"
    assert found["max_cstate"] == 1
    assert [s["disabled_on"] for s in found["idle_states"]] == [0, 0, 2, 2]
    assert found["turbo"] == "off"
    assert found["idle_driver"] == "intel_idle"
    host.restore(before)
    again = host.read()
    assert (again["governor"], again["max_cstate"], again["turbo"]) == ("powersave", 3, "on")


def test_linux_refuses_what_the_machine_lacks(tmp_path):
    host = power.LinuxPower(sysfs(tmp_path, cpufreq=False, turbo=False))
    for asked, says in (
        ({"governor": "performance"}, "no frequency scaling"),
        ({"turbo": "off"}, "no turbo control"),
        ({"max_cstate": 4}, r"deepest idle state is state3 \(C6\); 0..3"),
    ):
        with pytest.raises(Refused, match=says):
            host.check(power.validate_policy(**asked))
    with pytest.raises(Refused, match="offers performance, powersave"):
        power.LinuxPower(sysfs(tmp_path / "p")).check(power.validate_policy("schedutil"))


@pytest.mark.skipif(
    os.geteuid() != 0 or not (CPU / "cpu0/cpuidle/state1").exists(),
    reason="needs root and two idle states",
)
def test_this_machine_takes_max_cstate_0_and_gives_it_back(idle_states):
    """For real: every state past state0 disabled on every CPU, read back, restored."""
    host = power.host_power()
    before = host.snapshot()
    try:
        found = host.apply(power.validate_policy(max_cstate=0))
        assert found["max_cstate"] == 0
        deeper = [s for s in found["idle_states"] if s["state"] > 0]
        assert deeper and all(s["disabled_on"] == s["cpus"] for s in deeper)
    finally:
        host.restore(before)
    assert host.snapshot() == before
    if not (CPU / "cpu0/cpufreq").exists():
        with pytest.raises(Refused, match="no frequency scaling"):
            host.check(power.validate_policy("performance"))


# xenpm 4.17 (tools/misc/xenpm.c): under QEMU's TCG Xen has no P-states, and xenpm says so
# and exits 0; get-cpuidle-states begins with the C-state limit
XEN_NO_CPUFREQ = "[CPU0] failed to get cpufreq parameter\n"
XEN_CPUFREQ = """\
cpu id               : 0
affected_cpus        : 0
cpuinfo frequency    : max [3000000] min [1200000] cur [2100000]
scaling_driver       : acpi-cpufreq
scaling_avail_gov    : userspace performance powersave ondemand
current_governor     : ondemand
  ondemand specific  :
    sampling_rate    : max [10000000] min [10000] cur [20000]
    up_threshold     : 80
scaling_avail_freq   : 3000000 *2100000 1200000
scaling frequency    : max [3000000] min [1200000] cur [2100000]
turbo mode           : enabled
"""


def cpuidle_states(limit: str) -> str:
    return (
        f"{limit}\n\ncpu id               : 0\ntotal C-states       : 2\n"
        "idle time(ms)        : 123456\nC0                  : transition [                   0]\n"
    )


class FakeXenpm:
    """xenpm's recorded answers, and Xen's state as the set- commands leave it."""

    def __init__(self, cpufreq: bool):
        self.cpufreq, self.governor, self.limit, self.turbo = cpufreq, "ondemand", None, True
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> tuple[bool, str]:
        self.calls.append(args)
        verb = args[0]
        if verb == "get-cpufreq-para":
            if not self.cpufreq:
                return True, XEN_NO_CPUFREQ
            text = XEN_CPUFREQ.replace("governor     : ondemand", f"governor     : {self.governor}")
            return True, text.replace("enabled", "enabled" if self.turbo else "disabled or n/a")
        if verb == "get-cpuidle-states":
            limit = "All C-states allowed" if self.limit is None else self.limit
            return True, cpuidle_states(limit)
        if verb == "set-max-cstate":
            unlimited = args[1] == "unlimited"
            self.limit = None if unlimited else f"Max possible C-state: C{args[1]}"
            return True, f"max C-state set to {'unlimited' if unlimited else 'C' + args[1]}\n"
        if verb == "set-scaling-governor":
            self.governor = args[1]
            return True, ""
        self.turbo = verb == "enable-turbo-mode"
        return True, ""


def test_xen_under_qemu_refuses_the_governor_and_takes_the_cstate_limit():
    xenpm = FakeXenpm(cpufreq=False)
    host = power.XenPower(xenpm)
    with pytest.raises(Refused, match="GOVERNOR=performance: Xen has no frequency scaling"):
        host.check(power.validate_policy("performance"))
    with pytest.raises(Refused, match="TURBO=off: Xen has no frequency scaling"):
        host.check(power.validate_policy(turbo="off"))
    assert not [c for c in xenpm.calls if c[0].startswith(("set", "enable", "disable"))]
    before = host.snapshot()
    assert before["max_cstate"] == "unlimited" and before["governor"] is None
    assert host.apply(power.validate_policy(max_cstate=1))["max_cstate"] == 1
    host.restore(before)
    assert host.read()["max_cstate"] == "unlimited"
    assert ("set-max-cstate", "unlimited") in xenpm.calls


def test_xen_with_cpufreq_applies_and_restores_every_knob():
    xenpm = FakeXenpm(cpufreq=True)
    host = power.XenPower(xenpm)
    before = host.snapshot()
    assert before == {
        "backend": "xen",
        "governor": "ondemand",
        "max_cstate": "unlimited",
        "turbo": "on",
        "cpufreq": "present",
    }
    found = host.apply(power.validate_policy("performance", 1, "off"))
    assert (found["governor"], found["max_cstate"], found["turbo"]) == (
        "performance",
        1,
        "off or n/a",
    )
    with pytest.raises(Refused, match="offers userspace, performance, powersave, ondemand"):
        host.check(power.validate_policy("schedutil"))
    host.restore(before)
    assert host.read() == before


def test_a_xenpm_failure_it_prints_is_refused():
    host = power.XenPower(lambda *args: (True, "[CPU0] failed to set governor name (22 - x)\n"))
    with pytest.raises(Refused, match="failed to set governor"):
        host.must("set-scaling-governor", "performance")
