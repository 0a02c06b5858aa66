"""SCHED_DEADLINE for a process's threads: sched_setattr through ctypes, the kernel's readback,
and its admission test, asked before anything is changed. The linux backend (the job's JVM on
the bare target) and the kvm backend (the real-time VM's vCPU threads) use it.

Kernel behaviour measured on the bare machine (6.18, 2 CPUs) that shapes the code below:

- Deadline admission allows sched_rt_runtime_us/sched_rt_period_us × CPUs *minus* the kernel's
  per-CPU "fair server" reservation (50 ms per 1 s per CPU since Linux 6.12): 36 threads of
  5 ms/100 ms were admitted on 2 CPUs (1.8), not 38 (1.9).
- A SCHED_DEADLINE thread cannot create threads (clone fails with EAGAIN, Java would report
  "unable to create native thread") unless SCHED_FLAG_RESET_ON_FORK is set; with the flag its
  new threads start as SCHED_OTHER. `apply_deadline` sets it by default.
- Switching a *sleeping* SCHED_DEADLINE thread straight back to SCHED_OTHER leaks its admitted
  bandwidth (later admissions fail with EBUSY) until the scheduling domains are rebuilt (a
  cpuset change, CPU hotplug or a reboot). Shrinking it to a zero-bandwidth reservation first
  and then switching does not leak; `restore_other` does that. Threads that exit while
  SCHED_DEADLINE release their bandwidth normally.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from .base import (
    DL_MIN_RUNTIME_NS,
    DL_PERIOD_MAX_DEFAULT_US,
    DL_PERIOD_MAX_SYSCTL,
    Refused,
    Setting,
    read_int,
)

RT_RUNTIME_SYSCTL = "/proc/sys/kernel/sched_rt_runtime_us"
RT_PERIOD_SYSCTL = "/proc/sys/kernel/sched_rt_period_us"
FAIR_SERVER_DEBUGFS = "/sys/kernel/debug/sched/fair_server"
# Default fair server reservation per CPU (Linux >= 6.12), used when debugfs is not mounted.
FAIR_SERVER_DEFAULT_NS = (50_000_000, 1_000_000_000)

CAP_SYS_NICE = 23

SCHED_OTHER = 0
SCHED_DEADLINE = 6
SCHED_FLAG_RESET_ON_FORK = 0x01
POLICY_NAMES = {
    0: "SCHED_OTHER",
    1: "SCHED_FIFO",
    2: "SCHED_RR",
    3: "SCHED_BATCH",
    5: "SCHED_IDLE",
    6: "SCHED_DEADLINE",
    7: "SCHED_EXT",
}

# (sched_setattr, sched_getattr) syscall numbers; glibc has no wrappers for them.
SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}


@dataclass(frozen=True)
class ThreadReadback:
    """One thread's scheduling attributes as sched_getattr reports them."""

    tid: int
    name: str  # comm, at most 15 characters (the kernel truncates thread names)
    policy: str  # e.g. "SCHED_DEADLINE", "SCHED_OTHER"
    runtime_ns: int  # for SCHED_OTHER the kernel reports its time slice here
    deadline_ns: int
    period_ns: int
    nice: int
    priority: int  # SCHED_FIFO/RR priority, 0 for the other policies
    reset_on_fork: bool


# ---------------------------------------------------------------------------------------------
# sched_setattr / sched_getattr


class _SchedAttr(ctypes.Structure):
    # struct sched_attr, include/uapi/linux/sched/types.h (SCHED_ATTR_SIZE_VER1 = 56 bytes)
    _fields_ = (
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    )


_libc = ctypes.CDLL(None, use_errno=True)


def _syscall_numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in SYSCALLS:
        raise Refused(f"sched_setattr syscall number unknown for architecture {machine}")
    return SYSCALLS[machine]


def _setattr(tid: int, attr: _SchedAttr) -> int:
    """sched_setattr(tid, attr, 0); returns 0 or the errno."""
    attr.size = ctypes.sizeof(_SchedAttr)
    nr = _syscall_numbers()[0]
    rc = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(tid), ctypes.byref(attr), ctypes.c_long(0))
    return ctypes.get_errno() if rc != 0 else 0


def sched_getattr(tid: int) -> _SchedAttr:
    """sched_getattr(2) for one thread; raises OSError (ESRCH when the thread is gone)."""
    attr = _SchedAttr()
    nr = _syscall_numbers()[1]
    rc = _libc.syscall(
        ctypes.c_long(nr),
        ctypes.c_long(tid),
        ctypes.byref(attr),
        ctypes.c_long(ctypes.sizeof(_SchedAttr)),
        ctypes.c_long(0),
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_getattr({tid}): {os.strerror(err)}")
    return attr


def _comm(tid: int) -> str:
    # /proc/<tid> works for every thread, not only for thread-group leaders
    try:
        return Path(f"/proc/{tid}/comm").read_text().rstrip("\n")
    except OSError:
        return "?"


def _readback(tid: int) -> ThreadReadback:
    attr = sched_getattr(tid)
    return ThreadReadback(
        tid=tid,
        name=_comm(tid),
        policy=POLICY_NAMES.get(attr.sched_policy, f"policy {attr.sched_policy}"),
        runtime_ns=attr.sched_runtime,
        deadline_ns=attr.sched_deadline,
        period_ns=attr.sched_period,
        nice=attr.sched_nice,
        priority=attr.sched_priority,
        reset_on_fork=bool(attr.sched_flags & SCHED_FLAG_RESET_ON_FORK),
    )


def readback_threads(tids: list[int]) -> list[ThreadReadback]:
    """What the kernel says each thread runs with now (threads that have exited are skipped)."""
    out = []
    for tid in tids:
        try:
            out.append(_readback(tid))
        except OSError:
            continue
    return out


def _explain_setattr_errno(err: int, tid: int, setting: Setting) -> str:
    what = (
        f"SCHED_DEADLINE (BUDGET {setting.budget_us} us / PERIOD {setting.period_us} us) "
        f"on thread {tid} ({_comm(tid)})"
    )
    if err == errno.EBUSY:
        return (
            f"admission control refused {what} (EBUSY): the SCHED_DEADLINE bandwidth of all "
            "threads would exceed sched_rt_runtime_us/sched_rt_period_us × CPUs, less the "
            "kernel's fair-server reservation"
        )
    if err == errno.EPERM:
        return (
            f"not permitted: {what} (EPERM): needs root or CAP_SYS_NICE, and the thread's CPU "
            "affinity must include every CPU of its scheduling domain (a thread pinned to "
            "fewer CPUs needs an exclusive cpuset)"
        )
    if err == errno.EINVAL:
        return f"kernel rejected the parameters for {what} (EINVAL)"
    return f"sched_setattr failed for {what}: {errno.errorcode.get(err, err)} {os.strerror(err)}"


def restore_other(tid: int, nice: int) -> None:
    """Put a SCHED_DEADLINE thread back to SCHED_OTHER without leaking its bandwidth.

    Switching a sleeping deadline thread directly to SCHED_OTHER leaves its admitted
    bandwidth reserved for good on this kernel. Changing it first to the smallest reservation
    (runtime 1024 ns over the longest allowed period, which rounds to zero in the kernel's
    20-bit fixed point) hands the bandwidth back through the ordinary parameter-change path.
    """
    pmax_ns = read_int(DL_PERIOD_MAX_SYSCTL, DL_PERIOD_MAX_DEFAULT_US) * 1000
    _setattr(
        tid,
        _SchedAttr(
            sched_policy=SCHED_DEADLINE,
            sched_runtime=DL_MIN_RUNTIME_NS,
            sched_deadline=pmax_ns,
            sched_period=pmax_ns,
        ),
    )
    _setattr(tid, _SchedAttr(sched_policy=SCHED_OTHER, sched_nice=nice))


def apply_deadline(
    tids: list[int], setting: Setting, reset_on_fork: bool = True
) -> list[ThreadReadback]:
    """Set SCHED_DEADLINE runtime=budget, deadline=period=period on each thread; read back.

    Returns the kernel's view of every thread (values in ns). Threads that exit before they
    are set or read are left out. Raises Refused if the kernel refuses a thread;
    the threads already changed are first put back to SCHED_OTHER with their previous nice.

    reset_on_fork: without it a deadline thread cannot create threads at all (EAGAIN); with it
    the threads it creates start as SCHED_OTHER.
    """
    if setting.sched != "deadline" or setting.budget_us is None or setting.period_us is None:
        raise ValueError(f"apply_deadline needs a SCHED=deadline setting, got {setting}")
    flags = SCHED_FLAG_RESET_ON_FORK if reset_on_fork else 0
    runtime_ns = setting.budget_us * 1000
    period_ns = setting.period_us * 1000

    changed: list[tuple[int, int]] = []  # (tid, nice before) for the rollback
    for tid in tids:
        try:
            nice_before = sched_getattr(tid).sched_nice
        except ProcessLookupError:
            continue  # the thread exited meanwhile; nothing to schedule
        attr = _SchedAttr(
            sched_policy=SCHED_DEADLINE,
            sched_flags=flags,
            sched_runtime=runtime_ns,
            sched_deadline=period_ns,
            sched_period=period_ns,
        )
        err = _setattr(tid, attr)
        if err == errno.ESRCH:
            continue
        if err != 0:
            message = _explain_setattr_errno(err, tid, setting)
            for done_tid, nice in reversed(changed):
                restore_other(done_tid, nice)
            if changed:
                message += f"; restored {len(changed)} thread(s) already changed to SCHED_OTHER"
            raise Refused(message)
        changed.append((tid, nice_before))

    result = []
    for tid, _ in changed:
        try:
            result.append(_readback(tid))
        except ProcessLookupError:
            continue
    return result


def threads_of(pid: int, name_patterns: list[str]) -> list[tuple[int, str]]:
    """(tid, comm) of the threads of pid whose comm matches any regex (re.search), by tid.

    comm is the kernel's copy of the thread name, truncated to 15 characters: a Java thread
    "Source: Kafka Source (1/1)" appears as "Source: Kafka S", so write patterns against the
    first 15 characters. An empty pattern matches every thread.
    """
    regexes = [re.compile(p) for p in name_patterns]
    task_dir = Path(f"/proc/{pid}/task")
    if not task_dir.is_dir():
        raise ProcessLookupError(f"no process {pid}")
    found = []
    for entry in task_dir.iterdir():
        try:
            comm = (entry / "comm").read_text().rstrip("\n")
        except OSError:
            continue  # thread exited while we listed
        if any(r.search(comm) for r in regexes):
            found.append((int(entry.name), comm))
    return sorted(found)


def readback_none(pid: int) -> dict:
    """What the threads of pid run with when nothing is applied: policy and nice counts, cgroup.

    Example: {"pid": 1234, "threads": 57, "policies": {"SCHED_OTHER": 57}, "nice": {0: 57},
    "cpu_cgroup": "/"}.
    """
    policies: dict[str, int] = {}
    nices: dict[int, int] = {}
    count = 0
    for tid, _ in threads_of(pid, [""]):
        try:
            rb = _readback(tid)
        except ProcessLookupError:
            continue
        count += 1
        policies[rb.policy] = policies.get(rb.policy, 0) + 1
        nices[rb.nice] = nices.get(rb.nice, 0) + 1
    return {
        "pid": pid,
        "threads": count,
        "policies": policies,
        "nice": nices,
        "cpu_cgroup": _cpu_cgroup_of(pid),
    }


def _cpu_cgroup_of(pid: int) -> str | None:
    # lines "hierarchy-id:controllers:path"; v1 cpu line names "cpu", v2 line is "0::path"
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if hid == "0":
            v2 = path
    return v2


# ---------------------------------------------------------------------------------------------
# admission: asked before anything is changed


def _has_cap_sys_nice() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    return os.geteuid() == 0


def _to_ratio(period_ns: int, runtime_ns: int) -> int:
    # the kernel's bandwidth unit: runtime/period in 20-bit fixed point (to_ratio, BW_SHIFT)
    return (runtime_ns << 20) // period_ns if period_ns else 0


def _fair_server_bw(ncpus: int) -> int:
    """Bandwidth the kernel reserves for its per-CPU fair servers (Linux >= 6.12)."""
    base = Path(FAIR_SERVER_DEBUGFS)
    if base.is_dir():
        total = 0
        for cpu in base.iterdir():
            runtime = read_int(str(cpu / "runtime"), 0)
            period = read_int(str(cpu / "period"), 0)
            total += _to_ratio(period, runtime)
        return total
    release = re.match(r"(\d+)\.(\d+)", platform.release())
    if release and (int(release[1]), int(release[2])) >= (6, 12):
        return ncpus * _to_ratio(FAIR_SERVER_DEFAULT_NS[1], FAIR_SERVER_DEFAULT_NS[0])
    return 0


def _deadline_bw_in_use() -> int:
    """Sum of the bandwidth of all SCHED_DEADLINE threads now running on the machine."""
    total = 0
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            attr = sched_getattr(int(task.name))
        except OSError:
            continue
        if attr.sched_policy == SCHED_DEADLINE:
            total += _to_ratio(attr.sched_period or attr.sched_deadline, attr.sched_runtime)
    return total


def admission_refusal(
    budget_us: int, period_us: int, threads: str, count: int, cpus: str, ncpus: int, in_use: int
) -> str | None:
    """The kernel's deadline admission test (__dl_overflow) for `count` threads of BUDGET per
    PERIOD in a root domain of `ncpus` CPUs where other deadline threads already hold `in_use`;
    None if admitted, else why not. `threads` and `cpus` name them in the message."""
    rt_runtime = read_int(RT_RUNTIME_SYSCTL, 950_000)
    rt_period = read_int(RT_PERIOD_SYSCTL, 1_000_000)
    if rt_runtime < 0:
        return None  # sched_rt_runtime_us = -1: no admission control
    # bw × capacity, capacity 1024 per CPU
    limit = _to_ratio(rt_period * 1000, rt_runtime * 1000) * ncpus
    fair = _fair_server_bw(ncpus)
    wanted = count * _to_ratio(period_us * 1000, budget_us * 1000)
    if fair + in_use + wanted <= limit:
        return None
    unit = 1 << 20
    return (
        f"admission control would refuse SCHED=deadline: {count} {threads} × "
        f"{budget_us}/{period_us} us = {wanted / unit:.3f} CPUs wanted, "
        f"{in_use / unit:.3f} already used by other deadline threads, "
        f"{fair / unit:.3f} reserved by the kernel's fair servers; limit "
        f"sched_rt_runtime_us/sched_rt_period_us {rt_runtime}/{rt_period} × {ncpus} {cpus} "
        f"= {limit / unit:.3f}"
    )


def check_deadline_permitted(setting: Setting, threads: int) -> None:
    assert setting.budget_us is not None and setting.period_us is not None
    if not _has_cap_sys_nice():
        raise Refused("SCHED=deadline needs root or CAP_SYS_NICE")
    refusal = admission_refusal(
        setting.budget_us,
        setting.period_us,
        "thread(s)",
        threads,
        "CPUs",
        os.cpu_count() or 1,
        _deadline_bw_in_use(),
    )
    if refusal:
        raise Refused(refusal)
