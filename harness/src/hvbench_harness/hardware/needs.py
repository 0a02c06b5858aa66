"""What an inventory asks of each of its hosts: the CPUs it pins, the memory its guests take.

Read from the inventory's variables only (hvbench_guests, hvbench_neighbours, Xen's dom0
settings, in group_vars/ as make provision reads them); no host is contacted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What a KVM host keeps for itself beside the guests: its OS, libvirt and the QEMU processes.
KVM_HOST_RESERVE_MB = 2048
# The releases each hypervisor's provisioning is tested on: roles/guests' default
# guests_tested_releases (a test keeps the two equal); an inventory may set its own.
TESTED_RELEASES = {"kvm": ["Debian 12", "Debian 13"], "xen": ["Debian 12"]}


@dataclass(frozen=True)
class Needs:
    hypervisor: str  # kvm or xen
    pinned: dict[str, frozenset[int]]  # guest name → the host CPUs its vCPUs are pinned to
    realtime: frozenset[str]  # the real-time VMs' names
    guest_memory_mb: dict[str, int]  # guest name → memory (MiB)
    neighbours_mb: int  # the neighbour VMs' memory, all of them
    reserve_mb: int  # the host's own: dom0_mem on Xen, KVM_HOST_RESERVE_MB on KVM
    hardware_virtualization: bool  # KVM, or a Xen guest of type pvh or hvm
    dom0_cpus: frozenset[int] | None = None  # Xen: the CPUs dom0's vCPUs are pinned to
    tested_releases: tuple[str, ...] = ()  # the releases provisioning takes ("Debian 12")

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*self.pinned.values())

    @property
    def memory_mb(self) -> int:
        return sum(self.guest_memory_mb.values()) + self.neighbours_mb + self.reserve_mb

    @property
    def host_own(self) -> str:
        return "dom0" if self.hypervisor == "xen" else "the host"


def of_host(hostvars: dict) -> Needs:
    """A host's needs from its variables (ansible-inventory's hostvars for it)."""
    guests = {role: as_list(hostvars["hvbench_guests"][role]) for role in ("messaging", "realtime")}
    everyone = guests["messaging"] + guests["realtime"]
    neighbours = hostvars.get("hvbench_neighbours") or {}
    hypervisor = hostvars.get("hvbench_hypervisor", "kvm")
    xen_types = {hostvars.get("guests_xen_type", "pv"), neighbours.get("xen_type", "pv")}
    pinned = {g["name"]: frozenset(int(c) for c in g["host_cpus"]) for g in everyone}
    if int(neighbours.get("count", 0)) and isinstance(neighbours.get("placement"), list):
        pinned["the neighbour VMs"] = frozenset(int(c) for c in neighbours["placement"])
    return Needs(
        hypervisor=hypervisor,
        pinned=pinned,
        realtime=frozenset(g["name"] for g in guests["realtime"]),
        guest_memory_mb={g["name"]: int(g["memory_mb"]) for g in everyone},
        neighbours_mb=int(neighbours.get("count", 0)) * int(neighbours.get("memory_mb", 0)),
        reserve_mb=(
            size_mb(hostvars.get("xen_host_dom0_mem", "2048M"))
            if hypervisor == "xen"
            else KVM_HOST_RESERVE_MB
        ),
        hardware_virtualization=hypervisor == "kvm" or bool(xen_types & {"pvh", "hvm"}),
        dom0_cpus=dom0_cpus(hostvars) if hypervisor == "xen" else None,
        tested_releases=tuple(
            (hostvars.get("guests_tested_releases") or TESTED_RELEASES).get(hypervisor, [])
        ),
    )


def dom0_cpus(hostvars: dict) -> frozenset[int] | None:
    """dom0's CPUs: with dom0_vcpus_pin, vCPU i runs on CPU i; else it may run anywhere."""
    if not hostvars.get("xen_host_dom0_vcpus_pin", True):
        return None
    return frozenset(range(int(hostvars.get("xen_host_dom0_max_vcpus", 1))))


def as_list(guest) -> list[dict]:
    """hvbench_guests.messaging / .realtime: one VM, or a list of them (a cluster)."""
    return [guest] if isinstance(guest, dict) else list(guest)


def size_mb(text: str) -> int:
    """A Xen size ("2048M", "4G", "max:2G") in MiB."""
    match = re.search(r"(\d+)\s*([KMGT]?)B?\s*$", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 2048M")
    number, unit = int(match.group(1)), match.group(2).upper() or "K"
    return number * {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[unit] // 1024
