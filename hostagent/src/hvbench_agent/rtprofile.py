"""The real-time profile of a host or a real-time guest: applied at boot, read back for every run.

What the real-time KVM guides and tuned's realtime and realtime-virtual-host profiles do to a
machine before they measure, as files under /proc and /sys (docs/rt-profile.md has each
setting and its source):

- everywhere: RT throttling off (kernel.sched_rt_runtime_us -1, so ordinary tasks cannot take
  50 ms of every second from a SCHED_FIFO vCPU thread), transparent huge pages and their
  defragmentation off, KSM off, timer migration off, the NMI watchdog off, the VM statistics
  every 10 s instead of every second;
- with isolated CPUs (a KVM host: the real-time VMs' physical CPUs): interrupts, unbound
  workqueues (writeback among them) and the soft-lockup watchdog kept on the other CPUs, the
  housekeeping ones. The kernel command line (isolcpus, nohz_full, rcu_nocbs, irqaffinity:
  roles/rt_profile) and systemd's CPUAffinity do the rest; both are read back here.

roles/rt_profile writes what the machine's profile is (CONFIG) and runs `hvbench-agent
rt-profile apply` at every boot; `read` is what make check and every run record. An interrupt
the kernel will not move (a per-CPU or kernel-managed one) is recorded as such at apply, in
STATE, and is no failure.

    hvbench-agent rt-profile apply|read
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .sched.xl import cpu_list as xen_cpu_list

CONFIG = Path("/etc/hvbench/rt-profile.json")  # {"isolated": [2, 3], "boot": true}
STATE = Path("/run/hvbench/rt-profile.json")  # what apply could not do, until the next boot
ROOT = Path("/")


@dataclass(frozen=True)
class Knob:
    name: str
    path: str  # under the root
    want: str  # what apply writes
    kind: str = "text"  # text | choice ("always madvise [never]") | cpus (a list) | mask (hex)


def knobs(isolated: list[int], housekeeping: list[int]) -> list[Knob]:
    """The profile's files and values for a machine with these isolated CPUs."""
    found = [
        Knob("rt_throttling", "proc/sys/kernel/sched_rt_runtime_us", "-1"),
        Knob("thp", "sys/kernel/mm/transparent_hugepage/enabled", "never", "choice"),
        Knob("thp_defrag", "sys/kernel/mm/transparent_hugepage/defrag", "never", "choice"),
        Knob("ksm", "sys/kernel/mm/ksm/run", "0"),
        Knob("timer_migration", "proc/sys/kernel/timer_migration", "0"),
        Knob("nmi_watchdog", "proc/sys/kernel/nmi_watchdog", "0"),
        Knob("vm_stat_interval", "proc/sys/vm/stat_interval", "10"),
    ]
    if isolated:
        cpus, mask = cpu_list(housekeeping), cpu_mask(housekeeping)
        found += [
            Knob("watchdog_cpus", "proc/sys/kernel/watchdog_cpumask", cpus, "cpus"),
            Knob("workqueue_cpus", "sys/devices/virtual/workqueue/cpumask", mask, "mask"),
            Knob("writeback_cpus", "sys/bus/workqueue/devices/writeback/cpumask", mask, "mask"),
            Knob("irq_default_cpus", "proc/irq/default_smp_affinity", mask, "mask"),
        ]
    return found


# ---------------------------------------------------------------------------------------------
# CPU sets as the kernel writes them


def parse_cpus(text: str) -> set[int]:
    """The kernel's CPU list ("0-1,4") as a set."""
    return set(xen_cpu_list(text.strip()))


def cpu_list(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_mask(text: str) -> set[int]:
    """ "00000000,00000003" → {0, 1}."""
    value = int(text.strip().replace(",", "") or "0", 16)
    return {bit for bit in range(value.bit_length()) if value >> bit & 1}


def cpu_mask(cpus) -> str:
    return format(sum(1 << c for c in cpus), "x")


def current(knob: Knob, text: str):
    """A knob's value as read, in the form compared with what it should be."""
    if knob.kind == "choice":
        chosen = re.search(r"\[(\w+)\]", text)
        return chosen[1] if chosen else text.strip()
    if knob.kind == "cpus":
        return cpu_list(parse_cpus(text))
    if knob.kind == "mask":
        return cpu_list(parse_mask(text))
    return text.strip()


def wanted(knob: Knob):
    return cpu_list(parse_mask(knob.want)) if knob.kind == "mask" else knob.want


# ---------------------------------------------------------------------------------------------
# the machine's profile


def load_config() -> dict | None:
    """What roles/rt_profile provisioned here, or None (not provisioned with the profile)."""
    try:
        return json.loads(CONFIG.read_text())
    except (OSError, ValueError):
        return None


def online_cpus(root: Path) -> set[int]:
    return parse_cpus(_read(root / "sys/devices/system/cpu/online") or "0")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def apply(config: dict, root: Path = ROOT, state: Path = STATE) -> dict:
    """Write every knob and move every interrupt to the housekeeping CPUs; then read back,
    with what had to change (`changed`: nothing on a machine that has the profile)."""
    isolated = sorted(config.get("isolated") or [])
    housekeeping = sorted(online_cpus(root) - set(isolated))
    changed = []
    for knob in knobs(isolated, housekeeping):
        path = root / knob.path
        text = _read(path)
        if text is not None and current(knob, text) != wanted(knob):
            changed.append(knob.name)
            with contextlib.suppress(OSError):  # read() reports it as not set
                path.write_text(knob.want)
    moved, unmovable = move_irqs(root, housekeeping) if isolated else ([], [])
    changed += [f"irq {irq}" for irq in moved]
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"unmovable_irqs": unmovable}))
    return {**read(config, root, state), "changed": changed}


def move_irqs(root: Path, housekeeping: list[int]) -> tuple[list[int], list[int]]:
    """Every interrupt's affinity set to the housekeeping CPUs: (moved, refused by the kernel)."""
    moved, refused = [], []
    for irq in _irqs(root):
        path = root / "proc/irq" / str(irq) / "smp_affinity_list"
        text = _read(path)
        if text is None or parse_cpus(text) <= set(housekeeping):
            continue
        try:
            path.write_text(cpu_list(housekeeping))
            moved.append(irq)
        except OSError:
            refused.append(irq)
    return moved, refused


def _irqs(root: Path) -> list[int]:
    folder = root / "proc/irq"
    return sorted(int(p.name) for p in folder.glob("[0-9]*")) if folder.is_dir() else []


def irqs_on(root: Path, cpus: set[int], which: str = "smp_affinity_list") -> list[int]:
    """Interrupts whose affinity (or, which="effective_affinity_list", the CPUs the kernel
    delivers them to now) includes any of these CPUs."""
    found = []
    for irq in _irqs(root):
        text = _read(root / "proc/irq" / str(irq) / which)
        if text and text.strip() and parse_cpus(text) & cpus:
            found.append(irq)
    return found


def read(config: dict | None = None, root: Path = ROOT, state: Path = STATE) -> dict:
    """Each setting of the profile: what it should be, what it is, whether they agree."""
    config = load_config() if config is None else config
    if config is None:
        return {"provisioned": False, "ok": None}
    isolated = sorted(config.get("isolated") or [])
    housekeeping = sorted(online_cpus(root) - set(isolated))
    settings = {}
    for knob in knobs(isolated, housekeeping):
        text = _read(root / knob.path)
        have = None if text is None else current(knob, text)
        # a control this kernel does not have (no KSM, no NMI watchdog in a VM) cannot be on
        ok = True if have is None else have == wanted(knob)
        settings[knob.name] = {"want": wanted(knob), "have": have, "ok": ok}
    if isolated:
        settings.update(_isolation(root, config, isolated, housekeeping, state))
    return {
        "provisioned": True,
        "isolated": isolated,
        "housekeeping": housekeeping,
        "boot": bool(config.get("boot")),
        "settings": settings,
        "ok": all(s["ok"] is not False for s in settings.values()),
    }


def _isolation(root: Path, config: dict, isolated, housekeeping, state: Path) -> dict:
    """The interrupts, systemd's CPU affinity and (with boot) the kernel's own isolation."""
    unmovable = set((json.loads(_read(state) or "{}")).get("unmovable_irqs") or [])
    on_isolated = irqs_on(root, set(isolated))
    moved = [irq for irq in on_isolated if irq not in unmovable]
    # an interrupt moves when it next fires: where it went last is recorded, not judged
    delivered = irqs_on(root, set(isolated), "effective_affinity_list")
    init = re.search(r"^Cpus_allowed_list:\s*(\S+)", _read(root / "proc/1/status") or "", re.M)
    init_cpus = cpu_list(parse_cpus(init[1])) if init else None
    found = {
        "irqs": {
            "want": f"none on CPUs {cpu_list(isolated)} but those the kernel keeps",
            "have": {
                "on_isolated": on_isolated,
                "kept_by_kernel": sorted(unmovable),
                "last_delivered_on_isolated": delivered,
            },
            "ok": not moved,
        },
        # recorded, not judged: on Linux 6.1 a change of the root cgroup's cpuset (a KVM
        # deadline setting's partition, made and undone) resets every task's affinity to it
        "systemd_cpus": {"want": cpu_list(housekeeping), "have": init_cpus, "ok": None},
    }
    cmdline = (_read(root / "proc/cmdline") or "").split()
    for name, have in (
        ("isolcpus", _read(root / "sys/devices/system/cpu/isolated")),
        ("nohz_full", _read(root / "sys/devices/system/cpu/nohz_full")),
        (
            "rcu_nocbs",
            next((a.split("=", 1)[1] for a in cmdline if a.startswith("rcu_nocbs=")), ""),
        ),
    ):
        have = cpu_list(parse_cpus(have or "")) if have and have.strip() != "(null)" else ""
        ok = have == cpu_list(isolated) if config.get("boot") else None  # None: not asked for
        found[name] = {"want": cpu_list(isolated) if config.get("boot") else "", "have": have,
                       "ok": ok}  # fmt: skip
    return found
