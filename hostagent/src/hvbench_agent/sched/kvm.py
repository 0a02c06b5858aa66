"""The kvm backend: scheduler settings for a libvirt guest's vCPUs (target kvm, the real-time VM).

SCHED=none|cfs|deadline|fifo, BUDGET and PERIOD in microseconds as on the other targets:

- none: what libvirt set up (vCPUs pinned one to one, SCHED_OTHER, no CPU quota).
- cfs: CFS bandwidth per vCPU, BUDGET per PERIOD, through libvirt (cputune vcpu_quota and
  vcpu_period, applied live); read back from libvirt and from each vCPU's cgroup cpu.max.
- deadline: SCHED_DEADLINE runtime=BUDGET, deadline=period=PERIOD on every vCPU thread (thread
  ids from QMP query-cpus-fast). The kernel admits a deadline thread only if its CPU affinity
  covers its whole root domain, so plain pinning gives EPERM. The VM's CPUs therefore first
  become an exclusive cpuset partition (cgroup v2 cpuset.cpus.partition=root on the machine
  slice, with all guests' CPUs, and on the VM's scope, with its own), and each vCPU may run on
  any CPU of it: global EDF over the VM's CPUs, as RTDS schedules a cpupool. Admission control
  is per partition: BUDGET/PERIOD × vCPUs must fit in sched_rt_runtime_us/sched_rt_period_us ×
  the VM's CPUs.
- fifo: SCHED_FIFO with PRIORITY on every vCPU thread; pinning is kept.

On the host, as root (`hvbench-agent sched VERB --backend kvm --domain NAME ...`): `check` asks
whether the setting can be applied and changes nothing, `apply` applies it and prints what the
kernel and libvirt report back, `read` prints that readback, `reset` undoes whatever `apply`
changed. What `apply` changed is kept in STATE_FILE, so a reset
restores what was there, also after a failed apply. One exception: the kernel refuses to empty
the cpuset.cpus of a cgroup with tasks below it, so an empty value ("all of the parent's CPUs")
comes back written out as the parent's CPUs, which grants the same. While deadline is applied
the host's own tasks keep only the CPUs no guest is pinned to.

    hvbench-agent sched apply --backend kvm --domain hvbench-realtime --sched cfs --budget 77500

Needs python3-libvirt (Debian's package) on the host; the rest is the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from . import deadline, sysfs
from .base import Refused, Setting, read_int
from .deadline import RT_PERIOD_SYSCTL, RT_RUNTIME_SYSCTL

STATE_FILE = Path("/var/lib/hvbench/vcpu-sched.json")
CGROUP_ROOT = Path("/sys/fs/cgroup")
LIBVIRT_URI = "qemu:///system"
# libvirt's "no limit" for vcpu_quota; the kernel's default CFS period
NO_QUOTA = -1
DEFAULT_CFS_PERIOD_US = 100_000


# ---------------------------------------------------------------------------------------------
# the domain: libvirt, QMP and the cgroups libvirt made for it


def _libvirt():
    try:
        import libvirt
        import libvirt_qemu
    except ImportError as e:
        raise Refused("libvirt-python is missing on this host (Debian: python3-libvirt)") from e
    return libvirt, libvirt_qemu


def open_domain(name: str):
    libvirt, _ = _libvirt()
    try:
        conn = libvirt.open(LIBVIRT_URI)
        dom = conn.lookupByName(name)
    except libvirt.libvirtError as e:
        raise Refused(f"domain {name}: {e}") from e
    if not dom.isActive():
        raise Refused(f"domain {name} is not running")
    return dom


def vcpu_threads(dom) -> list[tuple[int, int]]:
    """(vCPU index, host thread id) of each vCPU, from QMP query-cpus-fast."""
    _, libvirt_qemu = _libvirt()
    reply = json.loads(libvirt_qemu.qemuMonitorCommand(dom, '{"execute":"query-cpus-fast"}', 0))
    return sorted((cpu["cpu-index"], cpu["thread-id"]) for cpu in reply["return"])


def vcpu_pins(dom) -> list[list[int]]:
    """Host CPUs each vCPU may run on, as libvirt holds them (live)."""
    return [[cpu for cpu, ok in enumerate(mask) if ok] for mask in dom.vcpuPinInfo(1)]


def _cgroup_v2_path(tid: int) -> Path:
    for line in Path(f"/proc/{tid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return CGROUP_ROOT / line[3:].lstrip("/")
    raise Refused(f"thread {tid} is in no cgroup v2 hierarchy (the host needs cgroup v2)")


def domain_cgroups(tids: list[int]) -> tuple[Path, Path]:
    """(top-level slice, the VM's scope) of the vCPU threads, e.g. machine.slice and
    machine.slice/machine-qemu\\x2d1\\x2dhvbench\\x2drealtime.scope."""
    paths = [_cgroup_v2_path(tid).relative_to(CGROUP_ROOT) for tid in tids]
    parts = paths[0].parts
    if len(parts) < 3 or any(p.parts[:2] != parts[:2] for p in paths):
        raise Refused(f"unexpected cgroup layout for the vCPU threads: {paths}")
    return CGROUP_ROOT / parts[0], CGROUP_ROOT / parts[0] / parts[1]


def _cpulist(cpus: list[int] | set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _set_cpus(cgroup: Path, cpus: str) -> None:
    # Written directly: neither a systemd daemon-reload nor a libvirtd restart rewrites it
    # (checked on Debian 12). systemctl set-property AllowedCPUs= would, but it cannot give
    # back an empty value either.
    sysfs.write_file(cgroup / "cpuset.cpus", cpus)


def _set_partition(cgroup: Path, value: str) -> None:
    sysfs.write_file(cgroup / "cpuset.cpus.partition", value)
    state = _read(cgroup / "cpuset.cpus.partition")
    if state != value:
        raise Refused(f"{cgroup}: cpuset.cpus.partition is {state!r} after writing {value!r}")


# ---------------------------------------------------------------------------------------------
# readback


def readback(dom) -> dict:
    """What the kernel and libvirt say the domain's vCPUs run with now."""
    libvirt, _ = _libvirt()
    threads = vcpu_threads(dom)
    pins = vcpu_pins(dom)
    vcpus = []
    for index, tid in threads:
        rb = deadline.readback_threads([tid])
        cgroup = _cgroup_v2_path(tid)
        vcpus.append(
            {
                "vcpu": index,
                "tid": tid,
                "pinned_to": pins[index],
                "affinity": sorted(os.sched_getaffinity(tid)),
                "thread": asdict(rb[0]) if rb else None,
                "cgroup": str(cgroup.relative_to(CGROUP_ROOT)),
                "cpu_max": _read(cgroup / "cpu.max"),
            }
        )
    params = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)
    top, scope = domain_cgroups([tid for _, tid in threads])
    return {
        "domain": dom.name(),
        "vcpus": vcpus,
        "libvirt": {k: params.get(k) for k in ("cpu_shares", "vcpu_period", "vcpu_quota")},
        "cpusets": {
            str(cg.relative_to(CGROUP_ROOT)): {
                "cpus": _read(cg / "cpuset.cpus"),
                "effective": _read(cg / "cpuset.cpus.effective"),
                "partition": _read(cg / "cpuset.cpus.partition"),
            }
            for cg in (top, scope)
        },
        "host": {
            "cpus_left_to_the_host": _read(CGROUP_ROOT / "cpuset.cpus.effective"),
            "sched_rt_runtime_us": read_int(RT_RUNTIME_SYSCTL, -2),
            "sched_rt_period_us": read_int(RT_PERIOD_SYSCTL, -2),
            "kernel": os.uname().release,
        },
    }


# ---------------------------------------------------------------------------------------------
# check, apply, reset


def _guest_cpus(dom) -> set[int]:
    """Every host CPU some running domain's vCPU is pinned to."""
    cpus: set[int] = set()
    for other in dom.connect().listAllDomains(1):  # VIR_CONNECT_LIST_DOMAINS_ACTIVE
        for pin in vcpu_pins(other):
            cpus.update(pin)
    return cpus


def _sharing(doms, cpus: set[int]) -> list[str]:
    """The other running domains pinned to any of `cpus` (neighbour VMs placed there)."""
    names = {dom.name() for dom in doms}
    return [
        other.name()
        for other in doms[0].connect().listAllDomains(1)  # VIR_CONNECT_LIST_DOMAINS_ACTIVE
        if other.name() not in names and cpus & set().union(*vcpu_pins(other))
    ]


def _admission(setting: Setting, vcpus: int, partition_cpus: int) -> None:
    """The kernel's deadline admission test for the VM's own root domain (the partition,
    new and so holding no other deadline thread)."""
    assert setting.budget_us is not None and setting.period_us is not None
    refusal = deadline.admission_refusal(
        setting.budget_us,
        setting.period_us,
        "vCPU(s)",
        vcpus,
        "CPU(s) of the VM",
        partition_cpus,
        0,
    )
    if refusal:
        raise Refused(refusal)


def check(doms, setting: Setting) -> None:
    """Refused unless this host can apply `setting` to every domain of doms (the real-time
    VMs). Changes nothing."""
    if os.geteuid() != 0:
        raise Refused("vCPU scheduler settings need root on the host")
    names = [dom.name() for dom in doms]
    if STATE_FILE.exists():
        state = _state(json.loads(STATE_FILE.read_text()))
        if state["domains"] != names:
            raise Refused(
                f"{', '.join(state['domains'])} still has SCHED={state.get('sched')} applied; "
                "reset it first"
            )
    if setting.sched in ("none", "fifo", "cfs"):
        return
    top, _scope = domain_cgroups([tid for _, tid in vcpu_threads(doms[0])])
    if "cpuset" not in _read(top / "cgroup.controllers").split():
        raise Refused(f"SCHED=deadline needs the cgroup v2 cpuset controller in {top}")
    own = {dom.name(): set().union(*vcpu_pins(dom)) for dom in doms}
    every = set().union(*own.values())
    guests = _guest_cpus(doms[0])
    sharing = _sharing(doms, every)
    if sharing:
        raise Refused(
            f"SCHED=deadline makes the real-time VM's CPUs ({_cpulist(every)}) a partition of its "
            f"own, but {', '.join(sharing)} runs on them: place the neighbours elsewhere "
            "(hvbench_neighbours.placement) or shut them down first"
        )
    host_cpus = set(range(os.cpu_count() or 1))
    if not host_cpus - guests:
        raise Refused(
            f"SCHED=deadline makes the guests' CPUs ({_cpulist(guests)}) an exclusive partition, "
            "so the host needs at least one CPU no guest is pinned to"
        )
    for dom in doms:  # each VM's CPUs are a partition (a root domain) of their own
        _admission(setting, len(vcpu_threads(dom)), len(own[dom.name()]))


def _state(state: dict) -> dict:
    """STATE_FILE with the domains it names, also as an agent for one domain wrote it."""
    if "domain" not in state:
        return state
    name = state.pop("domain")
    state["domains"] = [name]
    if isinstance(state.get("pins_before"), list):
        state["pins_before"] = {name: state["pins_before"]}
    if "libvirt_before" in state:
        state["libvirt_before"] = {name: state["libvirt_before"]}
    return state


def _save_state(state: dict) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state, indent=1))


def apply(doms, setting: Setting) -> list[dict]:
    """Apply `setting` to every domain's vCPUs (after undoing an earlier apply); returns each
    domain's readback. On a refusal everything changed so far is undone first."""
    libvirt, _ = _libvirt()
    check(doms, setting)  # before the reset, so that a refusal leaves everything as it was
    reset()
    state: dict = {"domains": [dom.name() for dom in doms], "sched": setting.sched, "changed": []}
    try:
        if setting.sched == "cfs":
            _apply_cfs(doms, setting, state)
        elif setting.sched == "fifo":
            for dom in doms:
                for _, tid in vcpu_threads(dom):
                    _keep_nice(state, tid)
                    os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(setting.priority))
        elif setting.sched == "deadline":
            _apply_deadline(doms, setting, state)
    except (OSError, libvirt.libvirtError, Refused) as e:
        reset()
        if isinstance(e, Refused):
            raise
        names = ", ".join(state["domains"])
        raise Refused(f"SCHED={setting.sched} could not be applied to {names}: {e}") from e
    return [readback(dom) for dom in doms]


def _keep_nice(state: dict, tid: int) -> None:
    """Record a vCPU thread's nice value (reset puts it back) before its policy changes."""
    nice = deadline.sched_getattr(tid).sched_nice
    state["changed"].append({"tid": tid, "tgid": _tgid(tid), "nice": nice})
    _save_state(state)


def _apply_cfs(doms, setting: Setting, state: dict) -> None:
    libvirt, _ = _libvirt()
    state["libvirt_before"] = {}
    for dom in doms:
        before = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)
        state["libvirt_before"][dom.name()] = {k: before[k] for k in ("vcpu_period", "vcpu_quota")}
        _save_state(state)
        dom.setSchedulerParametersFlags(
            {"vcpu_period": setting.period_us, "vcpu_quota": setting.budget_us},
            libvirt.VIR_DOMAIN_AFFECT_LIVE,
        )


def _apply_deadline(doms, setting: Setting, state: dict) -> None:
    threads = {dom.name(): vcpu_threads(dom) for dom in doms}
    top = domain_cgroups([tid for _, tid in threads[doms[0].name()]])[0]
    scopes = {name: domain_cgroups([tid for _, tid in t])[1] for name, t in threads.items()}
    own = {dom.name(): sorted(set().union(*vcpu_pins(dom))) for dom in doms}
    guests = sorted(_guest_cpus(doms[0]))
    state["pins_before"] = {dom.name(): vcpu_pins(dom) for dom in doms}
    _save_state(state)
    # every vCPU may run on all of its VM's CPUs (the partition is its root domain)
    for dom in doms:
        cpumap = tuple(cpu in own[dom.name()] for cpu in range(os.cpu_count() or 1))
        for index, _ in threads[dom.name()]:
            dom.pinVcpuFlags(index, cpumap, 1)  # VIR_DOMAIN_AFFECT_LIVE
    cgroups = [top, *scopes.values()]
    state["cpus_before"] = {str(cg): _read(cg / "cpuset.cpus") for cg in cgroups}
    state["partitions"] = [str(cg) for cg in cgroups]
    _save_state(state)
    _set_cpus(top, _cpulist(guests))
    for name, scope in scopes.items():
        _set_cpus(scope, _cpulist(own[name]))
    for cgroup in cgroups:
        _set_partition(cgroup, "root")
    tids = [tid for found in threads.values() for _, tid in found]
    for tid in tids:
        _keep_nice(state, tid)
    deadline.apply_deadline(tids, setting)


def _tgid(tid: int) -> int | None:
    try:
        for line in Path(f"/proc/{tid}/status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset() -> None:
    """Undo what an earlier `apply` changed, as recorded in STATE_FILE; no-op without it.

    Works also when a domain has stopped since: its threads and scope are gone then, and
    only the machine slice is put back. A thread id is only touched while it still belongs to
    the QEMU process it was recorded with (ids are reused).
    """
    if not STATE_FILE.exists():
        return
    state = _state(json.loads(STATE_FILE.read_text()))
    for thread in state.get("changed", []):
        tid = thread["tid"]
        if _tgid(tid) != thread["tgid"]:
            continue
        with contextlib.suppress(ProcessLookupError):
            if deadline.sched_getattr(tid).sched_policy == deadline.SCHED_DEADLINE:
                deadline.restore_other(tid, thread["nice"])
            else:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, thread["nice"])
    for cgroup in map(Path, reversed(state.get("partitions", []))):
        if _read(cgroup / "cpuset.cpus.partition").startswith("root"):
            _set_partition(cgroup, "member")
    for cgroup, cpus in state.get("cpus_before", {}).items():
        path = Path(cgroup)
        if path.is_dir():
            # the kernel refuses to empty a cpuset with tasks below it, so an empty value (all
            # of the parent's CPUs) comes back as the parent's CPUs written out
            _set_cpus(path, cpus or _read(path.parent / "cpuset.cpus.effective"))
    for name in state["domains"]:
        _reset_domain(name, state)
    STATE_FILE.unlink()


def _reset_domain(name: str, state: dict) -> None:
    """A domain's own vCPU pins and CFS bandwidth as they were (nothing if it has stopped)."""
    libvirt, _ = _libvirt()
    try:
        dom = open_domain(name)
    except Refused:
        return  # stopped or gone
    for index, pin in enumerate(state.get("pins_before", {}).get(name, [])):
        cpumap = tuple(cpu in pin for cpu in range(os.cpu_count() or 1))
        dom.pinVcpuFlags(index, cpumap, 1)
    if name in state.get("libvirt_before", {}):
        before = state["libvirt_before"][name]
        dom.setSchedulerParametersFlags(before, libvirt.VIR_DOMAIN_AFFECT_LIVE)


class KvmScheduler:
    """The kvm backend for the real-time VMs (libvirt domains): one setting on all of their
    vCPUs, applied, read back and undone together (a deadline partition spans them all)."""

    backend = "kvm"

    def __init__(self, domains: list[str]):
        self.domains = domains

    def check(self, setting: Setting) -> None:
        check([open_domain(d) for d in self.domains], setting)

    def apply(self, setting: Setting) -> list[dict]:
        return apply([open_domain(d) for d in self.domains], setting)

    def read(self) -> list[dict]:
        return [readback(open_domain(d)) for d in self.domains]

    def reset(self) -> None:
        reset()
