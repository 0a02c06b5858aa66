"""Is this hardware fit for the testbed the inventory describes? One verdict per check.

Each check is pass, warn (the testbed works; a measurement may suffer) or fail (make provision
would fail, or its runs could not be trusted), or n/a (the kernel shows no such thing: a VM),
with what was found, what is expected and the fix. docs/first-testbed.md explains each.
"""

from __future__ import annotations

import re

from hvbench_agent.neighbours import cpu_list, parse_cpus

from hvbench_harness.hardware.machine import Machine
from hvbench_harness.hardware.needs import Needs

PASS, WARN, FAIL, NA = "pass", "warn", "fail", "n/a"


def verdict(name: str, status: str, found: str, expected: str, fix: str = "") -> dict:
    return {"check": name, "status": status, "found": found, "expected": expected, "fix": fix}


def judge(m: Machine, needs: Needs) -> list[dict]:
    return [
        check(m, needs)
        for check in (
            os_release,
            cpu_count,
            memory,
            virtualization,
            nested_paging,
            tsc,
            smt_siblings,
            numa,
            idle_states,
            turbo,
            iommu,
        )
    ]


def os_release(m: Machine, needs: Needs) -> dict:
    """The release as Ansible names it (distribution and major version): make provision
    refuses one it is not tested on (roles/guests: guests_tested_releases)."""
    found = m.os.get("PRETTY_NAME", "no /etc/os-release")
    release = f"{m.os.get('NAME', '').split(' ')[0]} {m.os.get('VERSION_ID', '').split('.')[0]}"
    tested = " or ".join(needs.tested_releases) or "none"
    expected = f"{tested} (tested for {needs.hypervisor})"
    if release in needs.tested_releases:
        return verdict("os", PASS, found, expected)
    return verdict(
        "os",
        FAIL,
        found,
        expected,
        f"install {needs.tested_releases[-1]} on the host"
        if needs.tested_releases
        else "see guests_tested_releases",
    )


def cpu_count(m: Machine, needs: Needs) -> dict:
    count = len(m.cpus)
    wanted = max(needs.cpus) + 1
    found = f"{count} logical CPUs ({m.sockets} socket{'s' * (m.sockets > 1)})"
    expected = f"at least {wanted}: the guests are pinned to host CPUs {cpu_list(needs.cpus)}"
    fix = "pin the guests to CPUs the host has (host_cpus in group_vars/all.yml)"
    return verdict("cpus", PASS if count >= wanted else FAIL, found, expected, fix)


def memory(m: Machine, needs: Needs) -> dict:
    parts = ", ".join(f"{g} {mb}" for g, mb in needs.guest_memory_mb.items())
    neighbours = f", neighbours {needs.neighbours_mb}" if needs.neighbours_mb else ""
    expected = (
        f"at least {needs.memory_mb} MiB: {parts}{neighbours}, {needs.host_own} {needs.reserve_mb}"
    )
    fix = "give the guests less memory (memory_mb in group_vars/all.yml) or the host more"
    ok = m.memory_mb >= needs.memory_mb
    return verdict("memory", PASS if ok else FAIL, f"{m.memory_mb} MiB", expected, fix)


def virtualization(m: Machine, needs: Needs) -> dict:
    found = has(m, "vmx", "VT-x") or has(m, "svm", "AMD-V") or "no VT-x or AMD-V"
    if m.xen is not None:  # dom0's flags hide them; Xen says what it can run
        found = f"Xen: {m.xen.get('virt_caps', 'virt_caps unknown')}"
        ok = "hvm" in m.xen.get("virt_caps", "").split()
    else:
        ok = bool({"vmx", "svm"} & m.flags)
    expected = "VT-x (Intel) or AMD-V" + ("" if needs.hardware_virtualization else ", advised")
    fix = "turn on Intel VT-x / AMD SVM in the firmware's processor settings"
    if ok:
        return verdict("virtualization", PASS, found, expected)
    return verdict(
        "virtualization", FAIL if needs.hardware_virtualization else WARN, found, expected, fix
    )


def nested_paging(m: Machine, needs: Needs) -> dict:
    found = has(m, "ept", "EPT") or has(m, "npt", "NPT") or "no EPT or NPT"
    ok = bool({"ept", "npt"} & m.flags)
    if m.xen is not None:
        ok = "hap" in m.xen.get("virt_caps", "").split()
        found = "Xen: HAP" if ok else "Xen: no HAP (shadow paging)"
    expected = "EPT (Intel) or NPT (AMD): the guests' memory without shadow page tables"
    fix = "turn on EPT / NPT (often part of the VT-x or SVM setting) in the firmware"
    if ok:
        return verdict("nested_paging", PASS, found, expected)
    if needs.hardware_virtualization:
        expected += "; without, hardware-virtualized guests run slower"
    return verdict("nested_paging", WARN, found, expected, fix)


def tsc(m: Machine, needs: Needs) -> dict:
    missing = {"constant_tsc", "nonstop_tsc"} - m.flags
    found = " ".join(sorted({"constant_tsc", "nonstop_tsc"} & m.flags)) or "no invariant TSC"
    expected = "constant_tsc and nonstop_tsc: every record's send and receive are TSC readings"
    fix = "measure on a host with an invariant TSC (every Xeon since Nehalem has one)"
    return verdict("tsc", FAIL if missing else PASS, found, expected, fix)


def smt_siblings(m: Machine, needs: Needs) -> dict:
    """The real-time VMs' CPUs and their SMT siblings: a sibling that runs another guest (or
    the host's own work) shares the core's pipeline and caches with a real-time vCPU."""
    expected = "the real-time VMs' CPUs without a sibling busy with anything else"
    if missing(m, needs):
        return verdict("smt", NA, missing(m, needs), expected)
    realtime = frozenset().union(*(needs.pinned[g] for g in needs.realtime))
    shared = {}
    for cpu in sorted(realtime):
        for sibling in sorted(m.siblings.get(cpu, frozenset()) - realtime):
            owner = sibling_owner(sibling, m, needs)
            if owner:
                shared[cpu] = f"CPU {cpu}'s sibling {sibling} runs {owner}"
    if not shared:
        found = "SMT off" if all(len(s) <= 1 for s in m.siblings.values()) else "siblings idle"
        return verdict("smt", PASS, found, expected)
    fix = (
        "turn SMT off in the firmware, or pin the real-time VM to both siblings of its cores "
        "and nothing else to them"
    )
    return verdict("smt", WARN, "; ".join(shared.values()), expected, fix)


def sibling_owner(cpu: int, m: Machine, needs: Needs) -> str | None:
    """What runs on a CPU: a guest pinned there, dom0 (Xen), the host's own work (KVM: any
    CPU the kernel does not isolate), or nothing (None)."""
    guest = next((g for g, cpus in needs.pinned.items() if cpu in cpus), None)
    if guest:
        return guest
    if needs.dom0_cpus is not None:  # Xen, dom0 pinned: the other CPUs idle in Pool-0
        return "dom0" if cpu in needs.dom0_cpus else None
    if needs.hypervisor == "xen":
        return "dom0 (its vCPUs are not pinned)"
    return None if cpu in isolated(m.cmdline) else "the host's own work (not in isolcpus)"


def isolated(cmdline: str) -> set[int]:
    """The CPUs of isolcpus= ("2-11", or with flags first: "domain,managed_irq,2-11")."""
    match = re.search(r"\bisolcpus=(\S+)", cmdline)
    items = [i for i in match.group(1).split(",") if i[:1].isdigit()] if match else []
    return parse_cpus(",".join(items)) if items else set()


def numa(m: Machine, needs: Needs) -> dict:
    """Each guest on one NUMA node (a real-time VM across two fails), and the real-time VMs'
    memory within their node's."""
    expected = "each guest's CPUs on one NUMA node, its memory within that node's"
    if missing(m, needs):
        return verdict("numa", NA, missing(m, needs), expected)
    if len(m.nodes) <= 1:
        return verdict("numa", PASS, f"{len(m.nodes) or 1} NUMA node", expected)
    placed = {guest: by_node(m, cpus) for guest, cpus in needs.pinned.items()}
    split = {guest: nodes for guest, nodes in placed.items() if len(nodes) > 1}
    problems = [
        f"{guest} spans " + ", ".join(f"node {n}: {cpu_list(c)}" for n, c in nodes.items())
        for guest, nodes in split.items()
    ]
    for guest in sorted(needs.realtime - split.keys()):
        (node,) = placed[guest]
        wanted, has = needs.guest_memory_mb[guest], m.node_memory_mb.get(node, 0)
        if has < wanted:
            problems.append(f"{guest} needs {wanted} MiB, node {node} has {has}")
    if not problems:
        return verdict("numa", PASS, f"{len(m.nodes)} NUMA nodes, each guest on one", expected)
    layout = "; ".join(f"node {n}: CPUs {cpu_list(set(c))}" for n, c in sorted(m.nodes.items()))
    fix = f"pin each guest to CPUs of one node ({layout})"
    status = FAIL if needs.realtime & split.keys() else WARN
    return verdict("numa", status, "; ".join(problems), expected, fix)


def missing(m: Machine, needs: Needs) -> str:
    """'' if the host has every pinned CPU; else which it lacks (the cpus check fails)."""
    lacking = needs.cpus - m.cpus
    return f"no CPU {cpu_list(set(lacking))} on this host (see cpus)" if lacking else ""


def by_node(m: Machine, cpus: frozenset[int]) -> dict:
    """The CPUs by their NUMA node (None: a CPU in no node, one the host lacks)."""
    nodes: dict = {}
    for cpu in sorted(cpus):
        nodes.setdefault(m.node_of(cpu), set()).add(cpu)
    return nodes


def idle_states(m: Machine, needs: Needs) -> dict:
    # which states are too deep is the tuning's check, once provisioned (readiness.DEEP_IDLE_US)
    expected = "the OS sees the idle states, so that provisioning can keep CPUs out of deep ones"
    if m.xen is not None:
        return verdict(
            "idle_states", PASS, "Xen owns them (max_cstate on its command line)", expected
        )
    states = ", ".join(f"{n} ({us} µs)" for n, us in m.idle_states) or "no idle states"
    found = f"{states} (cpuidle driver: {m.idle_driver or 'none'})"
    if m.virtual:
        return verdict("idle_states", NA, found + " (a VM)", expected)
    if m.idle_driver in ("intel_idle", "acpi_idle") and m.idle_states:
        return verdict("idle_states", PASS, found, expected)
    fix = "set the firmware's power profile to OS control (or C-states off: C1E, C6 disabled)"
    return verdict("idle_states", WARN, found, expected, fix)


def turbo(m: Machine, needs: Needs) -> dict:
    expected = "turbo under the OS's control, so that provisioning can turn it off"
    if m.xen is not None:
        return verdict("turbo", PASS, "Xen owns it (cpufreq on its command line)", expected)
    if m.turbo_control:
        return verdict(
            "turbo",
            PASS,
            m.turbo_control.rsplit("/", 2)[-2] + " " + m.turbo_control.rsplit("/", 1)[-1],
            expected,
        )
    found = f"no turbo control ({m.scaling_driver or 'no cpufreq driver'})"
    if m.virtual:
        return verdict("turbo", NA, found + " (a VM)", expected)
    fix = "turn turbo off in the firmware, or give the OS frequency control (HWP/OS DBPM)"
    return verdict("turbo", WARN, found, expected, fix)


def iommu(m: Machine, needs: Needs) -> dict:
    expected = "an IOMMU (VT-d / AMD-Vi): interrupt remapping, and devices passed to guests"
    if m.iommus:
        return verdict("iommu", PASS, ", ".join(m.iommus), expected)
    found = "none visible"
    if m.virtual:
        return verdict("iommu", NA, found + " (a VM)", expected)
    fix = "turn on VT-d / AMD-Vi in the firmware (and intel_iommu=on on the kernel's command line)"
    return verdict("iommu", WARN, found, expected, fix)


def has(m: Machine, flag: str, name: str) -> str:
    return name if flag in m.flags else ""
