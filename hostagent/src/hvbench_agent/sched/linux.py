"""The linux backend: scheduler settings for a process's threads on this machine (the Flink
job's JVM on the bare target).

SCHED=none|deadline|cfs-quota with BUDGET and PERIOD in microseconds (see base.py):

- none: the JVM runs as started; `readback_none` records what that was (policy, nice, cgroup).
- deadline: SCHED_DEADLINE on chosen JVM threads, runtime=BUDGET, deadline=period=PERIOD
  (`apply_deadline`), set with the sched_setattr syscall through ctypes.
- cfs-quota: the whole JVM in a cpu cgroup limited to BUDGET per PERIOD (`CpuQuota`).

`check_permitted` asks the kernel whether the setting can be applied without changing anything;
the apply functions return what the kernel reports back, so a run records what it actually ran
with. `LinuxScheduler` puts them behind the check/apply/read/reset verbs.

The mechanisms live beside it: deadline.py (sched_setattr, its readback and admission test) and
cgroup.py (the cpu cgroup of cfs-quota); the kvm backend uses them too.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from .base import Refused, Setting
from .cgroup import CpuQuota, check_quota_permitted
from .deadline import (
    apply_deadline,
    check_deadline_permitted,
    readback_none,
    readback_threads,
    threads_of,
)


def check_permitted(setting: Setting, threads: int = 1) -> None:
    """Raise Refused unless the kernel permits `setting`; changes nothing lasting.

    deadline: CAP_SYS_NICE, and the admission arithmetic for `threads` threads (the kernel
    may still refuse a thread whose CPU affinity is restricted; apply_deadline reports that).
    cfs-quota: a cpu cgroup controller (v1 or v2) in which a child group can be created.
    """
    if setting.sched == "deadline":
        check_deadline_permitted(setting, threads)
    elif setting.sched == "cfs-quota":
        check_quota_permitted()


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
