"""The linux backend: scheduler settings for a process's threads on this machine (the Flink
job's JVM on the bare target), and the kernel mechanisms the kvm backend uses too.

SCHED=none|deadline|cfs-quota with BUDGET and PERIOD in microseconds (see base.py):

- none: the JVM runs as started; `readback_none` records what that was (policy, nice, cgroup).
- deadline: SCHED_DEADLINE on chosen JVM threads, runtime=BUDGET, deadline=period=PERIOD
  (`apply_deadline`), set with the sched_setattr syscall through ctypes.
- cfs-quota: the whole JVM in a cpu cgroup limited to BUDGET per PERIOD (`CpuQuota`).

`check_permitted` asks the kernel whether the setting can be applied without changing anything;
the apply functions return what the kernel reports back, so a run records what it actually ran
with. `LinuxScheduler` puts them behind the check/apply/read/reset verbs.

Kernel behaviour measured on the bare machine (6.18, 2 CPUs, cgroup v1 cpu controller) that
shapes the code below:

- Deadline admission allows sched_rt_runtime_us/sched_rt_period_us × CPUs *minus* the kernel's
  per-CPU "fair server" reservation (50 ms per 1 s per CPU since Linux 6.12): 36 threads of
  5 ms/100 ms were admitted on 2 CPUs (1.8), not 38 (1.9).
- A SCHED_DEADLINE thread cannot create threads (clone fails with EAGAIN, Java would report
  "unable to create native thread") unless SCHED_FLAG_RESET_ON_FORK is set; with the flag its
  new threads start as SCHED_OTHER. `apply_deadline` sets it by default.
- Switching a *sleeping* SCHED_DEADLINE thread straight back to SCHED_OTHER leaks its admitted
  bandwidth (later admissions fail with EBUSY) until the scheduling domains are rebuilt (a
  cpuset change, CPU hotplug or a reboot). Shrinking it to a zero-bandwidth reservation first
  and then switching does not leak; `_restore_other` does that. Threads that exit while
  SCHED_DEADLINE release their bandwidth normally.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import re
import time
from dataclasses import asdict, dataclass
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
# permission checks


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


def _check_deadline_permitted(setting: Setting, threads: int) -> None:
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


def check_permitted(setting: Setting, threads: int = 1) -> None:
    """Raise Refused unless the kernel permits `setting`; changes nothing lasting.

    deadline: CAP_SYS_NICE, and the admission arithmetic for `threads` threads (the kernel
    may still refuse a thread whose CPU affinity is restricted; apply_deadline reports that).
    cfs-quota: a cpu cgroup controller (v1 or v2) in which a child group can be created
    (a probe group is created and removed again).
    """
    if setting.sched == "none":
        return
    if setting.sched == "deadline":
        _check_deadline_permitted(setting, threads)
        return
    controller = find_cpu_controller()
    if controller is None:
        raise Refused(
            "SCHED=cfs-quota: no cpu cgroup controller is mounted "
            "(neither a v1 'cgroup' mount with option cpu nor cgroup2 offering 'cpu')"
        )
    version, root = controller
    probe = Path(root) / f"hvbench-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as e:
        raise Refused(f"SCHED=cfs-quota: cannot create a cgroup under {root}: {e}") from e
    try:
        if version == 1:
            if not (probe / "cpu.cfs_quota_us").exists():
                raise Refused(
                    f"SCHED=cfs-quota: {root} has no cpu.cfs_quota_us "
                    "(kernel built without CONFIG_CFS_BANDWIDTH?)"
                )
        else:
            if "cpu" in _read_words(Path(root) / "cgroup.subtree_control"):
                if not (probe / "cpu.max").exists():
                    raise Refused(f"SCHED=cfs-quota: child cgroups of {root} lack cpu.max")
            elif not os.access(Path(root) / "cgroup.subtree_control", os.W_OK):
                raise Refused(
                    f"SCHED=cfs-quota: cpu is not enabled in {root}/cgroup.subtree_control "
                    "and it is not writable"
                )
    finally:
        probe.rmdir()


# ---------------------------------------------------------------------------------------------
# cfs-quota: a cpu cgroup for the JVM


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _unescape_mount_path(path: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (\040 etc.)
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), path)


def find_cpu_controller(mountinfo: str | None = None) -> tuple[int, str] | None:
    """(cgroup version, mount point) of the cpu controller, from /proc/self/mountinfo.

    A v1 mount (type "cgroup" with super option "cpu") wins: a controller bound to v1 is
    missing from cgroup2. Otherwise a cgroup2 mount whose cgroup.controllers lists "cpu".
    `mountinfo` lets a test pass the text of the file; by default it is read.
    """
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    v2_mounts = []
    for line in mountinfo.splitlines():
        # "id parent maj:min root mountpoint options [optional fields] - fstype source superopts"
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        mount_point = _unescape_mount_path(left.split()[4])
        fields = right.split()
        fstype = fields[0]
        super_options = fields[2].split(",") if len(fields) > 2 else []
        if fstype == "cgroup" and "cpu" in super_options:
            return 1, mount_point
        if fstype == "cgroup2":
            v2_mounts.append(mount_point)
    for mount_point in v2_mounts:
        if "cpu" in _read_words(Path(mount_point) / "cgroup.controllers"):
            return 2, mount_point
    return None


def write_file(path: Path, value: str) -> None:
    # unbuffered, so that the kernel's refusal raises here (a buffered write to a cgroup file
    # fails only at close, which an unclosed file object would swallow)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _parse_cpu_stat(text: str) -> dict[str, int]:
    return {key: int(value) for key, value in (line.split() for line in text.splitlines())}


class CpuQuota:
    """A cpu cgroup "hvbench-<run_id>" at the root of the cpu controller, limited to BUDGET
    per PERIOD; `add` moves a process (all its threads) in, `close` moves everything back to
    the root and removes the group. Use as a context manager; close() is safe to repeat.

    On cgroup v1 with RT group scheduling (as on the bare machine) the group gets no
    realtime budget, so a process with SCHED_FIFO/RR threads cannot be added (EINVAL).
    On cgroup v2, "+cpu" is written to the root's cgroup.subtree_control if it is missing
    (needed once per boot for child groups to get cpu.max; it stays enabled).
    """

    def __init__(self, setting: Setting, run_id: str):
        if setting.sched != "cfs-quota" or setting.budget_us is None or setting.period_us is None:
            raise ValueError(f"CpuQuota needs a SCHED=cfs-quota setting, got {setting}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", run_id):
            raise ValueError(f"run_id {run_id!r} must be letters, digits, '_', '.', '-'")
        controller = find_cpu_controller()
        if controller is None:
            raise Refused("SCHED=cfs-quota: no cpu cgroup controller is mounted")
        self.version, root = controller
        self.setting = setting
        self.parent = Path(root)
        self.path = self.parent / f"hvbench-{run_id}"
        self._closed = False

        if self.version == 2 and "cpu" not in _read_words(self.parent / "cgroup.subtree_control"):
            write_file(self.parent / "cgroup.subtree_control", "+cpu")
        try:
            self.path.mkdir()
        except FileExistsError:
            self._closed = True  # not ours: never remove it
            raise Refused(
                f"cgroup {self.path} already exists (left from an earlier run?); "
                f"move its tasks out and rmdir it"
            ) from None
        try:
            if self.version == 1:
                # a new group has quota -1 (unlimited), so any period is accepted first; the
                # quota is then checked against that period
                write_file(self.path / "cpu.cfs_period_us", str(setting.period_us))
                write_file(self.path / "cpu.cfs_quota_us", str(setting.budget_us))
            else:
                write_file(self.path / "cpu.max", f"{setting.budget_us} {setting.period_us}")
        except OSError as e:
            self.close()
            raise Refused(f"cannot set the CPU quota in {self.path}: {e}") from e

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, pid: int) -> None:
        """Move process pid with all its threads into the group (threads it creates later
        start there too)."""
        try:
            write_file(self.path / "cgroup.procs", str(pid))
        except ProcessLookupError:
            raise  # no such process: the caller's mistake, not a refusal by the kernel
        except OSError as e:
            hint = ""
            if e.errno == errno.EINVAL and self.version == 1:
                hint = " (a SCHED_FIFO/RR thread cannot join a group without an RT budget)"
            raise Refused(f"cannot move process {pid} into {self.path}: {e}{hint}") from e

    def readback(self) -> dict:
        """Quota and period as the kernel holds them, the number of threads in the group,
        and cpu.stat as the kernel names it (v1: nr_periods, nr_throttled, throttled_time in
        ns; v2: nr_periods, nr_throttled, throttled_usec, usage_usec, ...)."""
        if self.version == 1:
            quota = int((self.path / "cpu.cfs_quota_us").read_text())
            period = int((self.path / "cpu.cfs_period_us").read_text())
            tasks = len(_read_words(self.path / "tasks"))
        else:
            quota_text, period_text = (self.path / "cpu.max").read_text().split()
            quota = -1 if quota_text == "max" else int(quota_text)
            period = int(period_text)
            tasks = len(_read_words(self.path / "cgroup.threads"))
        return {
            "version": self.version,
            "path": str(self.path),
            "quota_us": quota,
            "period_us": period,
            "tasks": tasks,
            "cpu_stat": _parse_cpu_stat((self.path / "cpu.stat").read_text()),
        }

    def close(self) -> None:
        """Move remaining processes back to the root cgroup and remove the group."""
        if self._closed:
            return
        self._closed = True
        if not self.path.exists():
            return
        # a process can still be joining or exiting: retry for up to ~1 s
        for _ in range(50):
            for pid in _read_words(self.path / "cgroup.procs"):
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    write_file(self.parent / "cgroup.procs", pid)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
            time.sleep(0.02)
        raise Refused(f"could not remove cgroup {self.path}: still busy")


# ---------------------------------------------------------------------------------------------
# the backend


class LinuxScheduler:
    """The linux backend for the job's JVMs (one, or one per TaskManager): SCHED=none reads
    their threads, deadline applies to their threads whose names match `thread_patterns`,
    cfs-quota puts the whole processes in a cpu cgroup named after the run. `bind(*pids)` names
    the processes once they run; `check` works before that, for `expected_threads` threads."""

    backend = "linux"

    def __init__(self, run_id: str, thread_patterns: tuple[str, ...], expected_threads: int):
        self.run_id = run_id
        self.thread_patterns = list(thread_patterns)
        self.expected_threads = expected_threads
        self.pids: list[int] = []
        self.setting: Setting | None = None
        self.quota: CpuQuota | None = None

    def bind(self, *pids: int) -> None:
        self.pids = list(pids)

    def check(self, setting: Setting) -> None:
        check_permitted(setting, threads=self.expected_threads)

    def apply(self, setting: Setting) -> dict:
        assert self.pids, "bind(pid) first"
        self.setting = setting
        if setting.sched == "none":
            return {"applied": "none", "readback": self._readback_none()}
        if setting.sched == "cfs-quota":
            self.quota = CpuQuota(setting, self.run_id)
            for pid in self.pids:
                self.quota.add(pid)
            return {
                "applied": "cfs-quota on every thread of the job's JVM",
                "readback": self.quota.readback(),
            }
        tids = self._threads()
        if not tids:
            raise Refused(f"no threads matching {self.thread_patterns} in processes {self.pids}")
        check_permitted(setting, threads=len(tids))
        return {
            "applied": "SCHED_DEADLINE on the job's record-handling threads",
            "thread_patterns": self.thread_patterns,
            "processes": self.pids,
            "readback": [asdict(r) for r in apply_deadline(tids, setting)],
        }

    def read(self) -> dict | list | None:
        """The readback now; None once a process is gone."""
        if not self.pids or not all(Path(f"/proc/{pid}").exists() for pid in self.pids):
            return None
        if self.quota is not None:
            return self.quota.readback()
        if self.setting is not None and self.setting.sched == "deadline":
            return [asdict(r) for r in readback_threads(self._threads())]
        return self._readback_none()

    def _readback_none(self) -> dict | list[dict]:
        """One process's readback as it always was; with several, one per process."""
        found = [{"pid": pid, **readback_none(pid)} for pid in self.pids]
        return readback_none(self.pids[0]) if len(self.pids) == 1 else found

    def reset(self) -> None:
        """The quota's cgroup goes; deadline threads end with their process."""
        if self.quota is not None:
            self.quota.close()

    def _threads(self) -> list[int]:
        return [tid for pid in self.pids for tid, _ in threads_of(pid, self.thread_patterns)]
