"""SCHED=cfs-quota: a cpu cgroup that limits a process (the job's JVM) to BUDGET per PERIOD, on
cgroup v1 or v2, and the check that one can be made here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from pathlib import Path

from .base import Refused, Setting
from .sysfs import read_words, write_file


def check_quota_permitted() -> None:
    """Raise Refused unless a child group with a CPU quota can be made under the cpu controller
    (a probe group is created and removed again)."""
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
            if "cpu" in read_words(Path(root) / "cgroup.subtree_control"):
                if not (probe / "cpu.max").exists():
                    raise Refused(f"SCHED=cfs-quota: child cgroups of {root} lack cpu.max")
            elif not os.access(Path(root) / "cgroup.subtree_control", os.W_OK):
                raise Refused(
                    f"SCHED=cfs-quota: cpu is not enabled in {root}/cgroup.subtree_control "
                    "and it is not writable"
                )
    finally:
        probe.rmdir()


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
        if "cpu" in read_words(Path(mount_point) / "cgroup.controllers"):
            return 2, mount_point
    return None


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

        if self.version == 2 and "cpu" not in read_words(self.parent / "cgroup.subtree_control"):
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
            tasks = len(read_words(self.path / "tasks"))
        else:
            quota_text, period_text = (self.path / "cpu.max").read_text().split()
            quota = -1 if quota_text == "max" else int(quota_text)
            period = int(period_text)
            tasks = len(read_words(self.path / "cgroup.threads"))
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
            for pid in read_words(self.path / "cgroup.procs"):
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
