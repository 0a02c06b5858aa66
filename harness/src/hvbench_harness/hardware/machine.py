"""A snapshot (snapshot.py's files) as the facts the hardware checks read."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hvbench_agent.neighbours import parse_cpus

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"
# The CPU flags the checks read: virtualization, its nested paging, the TSC's invariance.
FLAGS = {"vmx", "svm", "ept", "npt", "constant_tsc", "nonstop_tsc", "hypervisor"}


@dataclass(frozen=True)
class Machine:
    """What a host is, as its kernel (or, on a Xen dom0, `xl info`) sees it."""

    name: str  # vendor and product, or "unknown machine"
    os: dict[str, str]  # /etc/os-release: ID, VERSION_ID, PRETTY_NAME
    memory_mb: int
    flags: frozenset[str]  # /proc/cpuinfo flags, and its "vmx flags" line's
    cpus: frozenset[int]  # online logical CPUs
    package: dict[int, int]  # CPU → socket
    siblings: dict[int, frozenset[int]]  # CPU → its SMT siblings, itself included
    nodes: dict[int, frozenset[int]]  # NUMA node → its CPUs
    node_memory_mb: dict[int, int]
    smt: str | None  # smt/control: on, off, forceoff, notsupported, notimplemented
    idle_driver: str | None
    idle_states: tuple[tuple[str, int], ...]  # (name, exit latency µs) of cpu0's states
    turbo_control: str | None  # the file that turns turbo off, if the kernel offers one
    scaling_driver: str | None
    iommus: tuple[str, ...]
    cmdline: str
    xen: dict[str, str] | None = None  # `xl info` on a Xen dom0
    virtual: bool = field(default=False)  # the kernel runs in a VM (the "hypervisor" flag)

    @property
    def sockets(self) -> int:
        return len(set(self.package.values())) or 1

    def node_of(self, cpu: int) -> int | None:
        return next((n for n, cpus in self.nodes.items() if cpu in cpus), None)


def parse(files: dict[str, str]) -> Machine:
    flags = cpu_flags(files.get("proc/cpuinfo", ""))
    xen = key_values(files["xl-info"]) if "xl-info" in files else None
    topology = xen_topology(files["xl-info"]) if xen else linux_topology(files)
    return Machine(
        name=machine_name(files),
        os=os_release(files.get("etc/os-release", "")),
        memory_mb=memory_mb(files, xen),
        flags=flags,
        **topology,
        smt=value(files, f"{CPU}/smt/control"),
        idle_driver=value(files, f"{CPU}/cpuidle/current_driver"),
        idle_states=idle_states(files),
        turbo_control=next(
            (p for p in (f"{CPU}/intel_pstate/no_turbo", f"{CPU}/cpufreq/boost") if p in files),
            None,
        ),
        scaling_driver=value(files, f"{CPU}/cpu0/cpufreq/scaling_driver"),
        iommus=tuple(filter(None, files.get("sys/class/iommu/", "").split("\n"))),
        cmdline=files.get("proc/cmdline", "").strip(),
        xen=xen,
        virtual="hypervisor" in flags,
    )


def linux_topology(files: dict[str, str]) -> dict:
    return {
        "cpus": frozenset(parse_cpus(files[f"{CPU}/online"].strip())),
        "package": numbered(files, f"{CPU}/cpuN/topology/physical_package_id", int),
        "siblings": numbered(files, f"{CPU}/cpuN/topology/thread_siblings_list", cpu_set),
        "nodes": numbered(files, f"{NODE}/nodeN/cpulist", cpu_set),
        "node_memory_mb": numbered(files, f"{NODE}/nodeN/meminfo", node_memory_mb),
    }


def xen_topology(xl_info: str) -> dict:
    """The machine's CPUs from `xl info -n` (dom0's kernel sees only its own vCPUs): its tables
    "cpu: core socket node" and "node: memsize memfree distances" (MiB)."""
    cpus = {int(r[0]): tuple(map(int, r[1:4])) for r in xl_table(xl_info, "cpu:")}
    nodes: dict[int, set[int]] = {}
    for cpu, (_, _, node) in cpus.items():
        nodes.setdefault(node, set()).add(cpu)
    return {
        "cpus": frozenset(cpus),
        "package": {cpu: socket for cpu, (_, socket, _) in cpus.items()},
        "siblings": {
            cpu: frozenset(c for c, t in cpus.items() if t[:2] == (core, socket))
            for cpu, (core, socket, _) in cpus.items()
        },
        "nodes": {n: frozenset(c) for n, c in nodes.items()},
        "node_memory_mb": {int(r[0]): int(r[1]) for r in xl_table(xl_info, "node:")},
    }


def xl_table(text: str, header: str) -> list[list[str]]:
    """The rows ("N: a b c") under the line of `xl info -n` that starts with header."""
    rows: list[list[str]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith(header):
            for row in lines:
                match = re.fullmatch(r"\s*(\d+):\s+(.*)", row)
                if not match:
                    break
                rows.append([match.group(1), *match.group(2).split()])
    return rows


def cpu_set(text: str) -> frozenset[int]:
    return frozenset(parse_cpus(text)) if text else frozenset()


def value(files: dict[str, str], path: str) -> str | None:
    text = files.get(path)
    return text.strip() if text is not None else None


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first CPU's flags; newer kernels list VT-x's features (ept, vpid) on a line of their
    own, "vmx flags"."""
    found: set[str] = set()
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, _, rest = line.partition(":")
        if key.strip() in ("flags", "vmx flags"):
            found.update(rest.split())
    return frozenset(found & FLAGS)


def key_values(text: str) -> dict[str, str]:
    pairs = (line.partition(":") for line in text.splitlines())
    return {k.strip(): v.strip() for k, sep, v in pairs if sep}


def kb_field(meminfo: str, name: str) -> int:
    match = re.search(rf"\b{name}:\s+(\d+) kB", meminfo)
    return int(match.group(1)) if match else 0


def node_memory_mb(meminfo: str) -> int:
    return kb_field(meminfo, "MemTotal") // 1024


def memory_mb(files: dict[str, str], xen: dict[str, str] | None) -> int:
    """The machine's memory: `xl info`'s total_memory (MiB) on a Xen dom0, whose own
    MemTotal is dom0_mem only."""
    if xen and xen.get("total_memory", "").isdigit():
        return int(xen["total_memory"])
    return kb_field(files.get("proc/meminfo", ""), "MemTotal") // 1024


def numbered(files: dict[str, str], pattern: str, convert=str.strip) -> dict[int, object]:
    """The files whose path is `pattern` with its "N" a number (cpuN, nodeN, stateN), by that
    number, their text converted."""
    regex = re.escape(pattern).replace("N", r"(\d+)", 1)
    found = {}
    for path, text in files.items():
        match = re.fullmatch(regex, path)
        if match:
            found[int(match.group(1))] = convert(text.strip())
    return found


def idle_states(files: dict[str, str]) -> tuple[tuple[str, int], ...]:
    names = numbered(files, f"{CPU}/cpu0/cpuidle/stateN/name")
    latency = numbered(files, f"{CPU}/cpu0/cpuidle/stateN/latency")
    return tuple(
        (names[i], int(latency[i]) if latency.get(i, "").isdigit() else 0) for i in sorted(names)
    )


def machine_name(files: dict[str, str]) -> str:
    parts = [value(files, f"sys/class/dmi/id/{k}") for k in ("sys_vendor", "product_name")]
    return " ".join(p for p in parts if p) or "unknown machine"


def os_release(text: str) -> dict[str, str]:
    pairs = (line.partition("=") for line in text.splitlines())
    return {k: v.strip().strip('"') for k, sep, v in pairs if sep}
