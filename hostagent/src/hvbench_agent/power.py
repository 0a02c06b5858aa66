"""Power policy as a run setting: the frequency governor, the deepest idle state allowed and
turbo, on the host that runs the real-time VM (or this machine, on the bare target).

    policy = validate_policy(governor="powersave", max_cstate=1, turbo="off")  # or Refused
    power = host_power()              # LinuxPower (bare, KVM host) or XenPower (dom0)
    power.check(policy)               # Refused if this host has no such control
    before = power.snapshot()         # what to put back
    readback = power.apply(policy)    # set, then read back
    power.restore(before)

- Linux (sysfs): `cpufreq/scaling_governor` of every CPU; `cpuidle/stateN/disable` of every
  state deeper than MAX_CSTATE (N counts the kernel's states: state0 is POLL on most drivers);
  turbo through `intel_pstate/no_turbo` or `cpufreq/boost`.
- Xen (xenpm, in dom0): `set-scaling-governor`, `set-max-cstate` (Xen's C-state number) and
  `enable-turbo-mode` / `disable-turbo-mode`, read back through `get-cpufreq-para` and
  `get-cpuidle-states` (whose first line is the C-state limit). Xen's boot options set the
  same for every boot instead: `cpufreq=xen:<governor>` and `max_cstate=` (docs/energy.md).

Nothing outlives the run: the harness restores the snapshot on its way out.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from .sched.base import Refused

CPU = Path("/sys/devices/system/cpu")
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
TURBO = ("on", "off")
MAX_CSTATE_LIMIT = 15


@dataclass(frozen=True)
class Policy:
    governor: str | None = None
    max_cstate: int | None = None
    turbo: str | None = None

    def given(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def validate_policy(governor=None, max_cstate=None, turbo=None) -> Policy:
    """The policy asked for, or Refused naming the bad value (no host is looked at)."""
    if governor is not None and governor not in GOVERNORS:
        raise Refused(f"GOVERNOR={governor!r}: one of {', '.join(GOVERNORS)}")
    if max_cstate is not None and not 0 <= int(max_cstate) <= MAX_CSTATE_LIMIT:
        raise Refused(f"MAX_CSTATE={max_cstate}: an idle state number, 0..{MAX_CSTATE_LIMIT}")
    if turbo is not None and turbo not in TURBO:
        raise Refused(f"TURBO={turbo!r}: on or off")
    return Policy(governor, None if max_cstate is None else int(max_cstate), turbo)


# ---------------------------------------------------------------------------------------------
# Linux: sysfs


class LinuxPower:
    backend = "linux"

    def __init__(self, root: Path = CPU):
        self.root = root
        self.cpus = sorted(
            (p for p in root.glob("cpu[0-9]*") if p.name[3:].isdigit()),
            key=lambda p: int(p.name[3:]),
        )

    def check(self, policy: Policy) -> None:
        if policy.governor is not None:
            available = self.governors_available()
            if available is None:
                raise Refused(
                    f"GOVERNOR={policy.governor}: this machine has no frequency scaling "
                    f"({self.cpus[0] / 'cpufreq'} is absent: no cpufreq driver, as in most VMs)"
                )
            if policy.governor not in available:
                raise Refused(
                    f"GOVERNOR={policy.governor}: this machine's cpufreq driver offers "
                    f"{', '.join(sorted(available))}"
                )
        if policy.max_cstate is not None:
            states = self.idle_states()
            if not states:
                raise Refused(
                    f"MAX_CSTATE={policy.max_cstate}: this machine has no cpuidle states "
                    f"({self.cpus[0] / 'cpuidle'} is absent or empty)"
                )
            if policy.max_cstate >= len(states):
                deepest = len(states) - 1
                raise Refused(
                    f"MAX_CSTATE={policy.max_cstate}: this machine's deepest idle state is "
                    f"state{deepest} ({states[deepest]}); 0..{deepest}"
                )
        if policy.turbo is not None and self.turbo_file() is None:
            raise Refused(
                f"TURBO={policy.turbo}: this machine has no turbo control "
                "(neither intel_pstate/no_turbo nor cpufreq/boost)"
            )
        if policy.given() and not os.access(self.cpus[0], os.W_OK):
            raise Refused(f"the power policy needs root here ({self.cpus[0]} is not writable)")

    def governors_available(self) -> set[str] | None:
        found = self.cpus[0] / "cpufreq/scaling_available_governors" if self.cpus else None
        return set(found.read_text().split()) if found and found.exists() else None

    def idle_states(self) -> list[str]:
        """cpu0's idle state names, state0 first."""
        states = sorted((self.cpus[0] / "cpuidle").glob("state[0-9]*"), key=state_number)
        return [(s / "name").read_text().strip() for s in states]

    def turbo_file(self) -> tuple[Path, str] | None:
        """The turbo control and the value that means off."""
        for path, off in (("intel_pstate/no_turbo", "1"), ("cpufreq/boost", "0")):
            if (self.root / path).exists():
                return self.root / path, off
        return None

    def snapshot(self) -> dict:
        """Every value apply may change, to restore."""
        return {
            "governor": {c.name: read(c / "cpufreq/scaling_governor") for c in self.cpus},
            "disable": {
                str(s / "disable"): read(s / "disable") for c in self.cpus for s in states_of(c)
            },
            "turbo": read(self.turbo_file()[0]) if self.turbo_file() else None,
        }

    def apply(self, policy: Policy) -> dict:
        self.check(policy)
        if policy.governor is not None:
            for c in self.cpus:
                if (c / "cpufreq/scaling_governor").exists():
                    write(c / "cpufreq/scaling_governor", policy.governor)
        if policy.max_cstate is not None:
            for c in self.cpus:
                for s in states_of(c):
                    write(s / "disable", "1" if state_number(s) > policy.max_cstate else "0")
        if policy.turbo is not None:
            path, off = self.turbo_file()
            write(path, off if policy.turbo == "off" else str(1 - int(off)))
        return self.read()

    def restore(self, snapshot: dict) -> None:
        for c in self.cpus:
            if (value := snapshot.get("governor", {}).get(c.name)) is not None:
                write(c / "cpufreq/scaling_governor", value)
        for path, value in snapshot.get("disable", {}).items():
            if value is not None and Path(path).is_relative_to(self.root):
                write(Path(path), value)
        if snapshot.get("turbo") is not None and self.turbo_file():
            write(self.turbo_file()[0], snapshot["turbo"])

    def read(self) -> dict:
        """The policy as the kernel has it now."""
        governors = {read(c / "cpufreq/scaling_governor") for c in self.cpus} - {None}
        states = []
        for s in states_of(self.cpus[0]) if self.cpus else []:
            n = state_number(s)
            disabled = sum(read(c / f"cpuidle/state{n}/disable") == "1" for c in self.cpus)
            name, latency = read(s / "name"), read(s / "latency")
            states.append({"state": n, "name": name, "latency_us": int(latency or 0),
                           "disabled_on": disabled, "cpus": len(self.cpus)})  # fmt: skip
        enabled = [s["state"] for s in states if s["disabled_on"] == 0]
        turbo = None
        if (found := self.turbo_file()) is not None:
            turbo = "off" if read(found[0]) == found[1] else "on"
        return {
            "backend": self.backend,
            "governor": ", ".join(sorted(governors)) if governors else None,
            "max_cstate": max(enabled) if enabled else None,
            "idle_states": states,
            "idle_driver": read(self.root / "cpuidle/current_driver"),
            "turbo": turbo,
        }


def states_of(cpu: Path) -> list[Path]:
    return sorted((cpu / "cpuidle").glob("state[0-9]*"), key=state_number)


def state_number(path: Path) -> int:
    return int(path.name.removeprefix("state"))


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise Refused(f"cannot write {value} to {path}: {e.strerror}") from None


# ---------------------------------------------------------------------------------------------
# Xen: xenpm in dom0


class XenPower:
    """xenpm exits 0 when Xen refuses (it prints why): its output is what tells."""

    backend = "xen"

    def __init__(self, runner=None):
        self.runner = runner or xenpm

    def cpufreq(self) -> dict | None:
        """cpu0's `xenpm get-cpufreq-para` as fields; None if Xen has no cpufreq there (it
        prints "failed to get cpufreq parameter" or "Xen cpufreq is not enabled!")."""
        ok, text = self.runner("get-cpufreq-para", "0")
        para = parse_cpufreq_para(text) if ok else {}
        return para if "current_governor" in para else None

    def max_cstate(self) -> int | str | None:
        """Xen's C-state limit from `xenpm get-cpuidle-states`: a number, "unlimited", or
        None if xenpm says neither."""
        ok, text = self.runner("get-cpuidle-states", "0")
        return parse_max_cstate(text) if ok else None

    def check(self, policy: Policy) -> None:
        para = self.cpufreq() if policy.governor or policy.turbo else {}
        if (policy.governor or policy.turbo) and para is None:
            asked = f"GOVERNOR={policy.governor}" if policy.governor else f"TURBO={policy.turbo}"
            raise Refused(
                f"{asked}: Xen has no frequency scaling here (`xenpm get-cpufreq-para` finds "
                "no cpufreq: no P-states from the firmware, as under QEMU, or cpufreq=none)"
            )
        available = (para or {}).get("scaling_avail_gov", "").split()
        if policy.governor and policy.governor not in available:
            raise Refused(
                f"GOVERNOR={policy.governor}: Xen's cpufreq offers {', '.join(available)}"
            )
        if policy.turbo and "turbo mode" not in (para or {}):
            raise Refused(f"TURBO={policy.turbo}: Xen reports no turbo mode on this CPU")
        if policy.max_cstate is not None and self.max_cstate() is None:
            raise Refused("MAX_CSTATE: `xenpm get-cpuidle-states` reports no C-state limit")

    def snapshot(self) -> dict:
        return self.read()

    def apply(self, policy: Policy) -> dict:
        self.check(policy)
        if policy.governor is not None:
            self.must("set-scaling-governor", policy.governor)
        if policy.max_cstate is not None:
            self.must("set-max-cstate", str(policy.max_cstate))
        if policy.turbo is not None:
            self.must("enable-turbo-mode" if policy.turbo == "on" else "disable-turbo-mode")
        return self.read()

    def restore(self, snapshot: dict) -> None:
        if snapshot.get("governor"):
            self.must("set-scaling-governor", snapshot["governor"])
        if snapshot.get("max_cstate") is not None:
            self.must("set-max-cstate", str(snapshot["max_cstate"]))
        if snapshot.get("turbo") in TURBO:
            self.must("enable-turbo-mode" if snapshot["turbo"] == "on" else "disable-turbo-mode")

    def must(self, *args: str) -> None:
        ok, text = self.runner(*args)
        if not ok or "failed" in text.lower():
            raise Refused(f"`xenpm {' '.join(args)}` failed: {text.strip()}")

    def read(self) -> dict:
        para = self.cpufreq() or {}
        turbo = para.get("turbo mode")
        return {
            "backend": self.backend,
            "governor": para.get("current_governor"),
            "max_cstate": self.max_cstate(),
            "turbo": "on" if turbo == "enabled" else ("off or n/a" if turbo else None),
            "cpufreq": "present" if para else "absent (`xenpm get-cpufreq-para` finds none)",
        }


def xenpm(*args: str) -> tuple[bool, str]:
    try:
        proc = subprocess.run(["xenpm", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    return proc.returncode == 0, proc.stdout + proc.stderr


def parse_cpufreq_para(text: str) -> dict:
    """`xenpm get-cpufreq-para` lines `name : value` as a dict (names as xenpm prints them)."""
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() and not name.startswith(" "):
            fields[name.strip()] = value.strip()
    return fields


def parse_max_cstate(text: str) -> int | str | None:
    """`Max possible C-state: C1` → 1; `All C-states allowed` → "unlimited"; else None."""
    if "All C-states allowed" in text:
        return "unlimited"
    found = re.search(r"Max possible C-state:\s*C(\d+)", text)
    return int(found.group(1)) if found else None


def host_power() -> LinuxPower | XenPower:
    """xenpm in a Xen dom0, sysfs elsewhere."""
    try:
        xen = "control_d" in Path("/proc/xen/capabilities").read_text()
    except OSError:
        xen = False
    return XenPower() if xen else LinuxPower()
