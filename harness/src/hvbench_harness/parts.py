"""The parts a run starts (broker, job, consumer, producers, the scheduler setting), torn down
by construction: each is registered with its teardown when it starts, and leaving the `with`
block undoes them in reverse order, on success, error or Ctrl-C alike.

    with Parts(work) as parts:
        job = parts.start("flink job", machine, command, stdout=...)
        parts.on_teardown(scheduler.reset)
    teardown = parts.verify({"the Flink job's JVM": [read_process(pid)]})

A part is stopped with its whole process group: continued first (SIGCONT: a stopped process
keeps SIGTERM pending and would never end), asked to stop (SIGTERM), killed (SIGKILL) after a
grace period. `verify` then looks for any process of the run still there, kills it and says
so: meta.json `teardown` records what teardown had to end and what was left (docs/results.md).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hvbench_harness.testbed import Machine

GRACE_S = 30.0  # a part's time to end after SIGTERM (or its tether closed) before SIGKILL
KILL_WAIT_S = 10.0  # a killed process's time to go (a large JVM frees its memory first)
TICKS = os.sysconf("SC_CLK_TCK")  # /proc's unit of process start times


class RunError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


@dataclass(frozen=True)
class Process:
    """One process as /proc/PID/stat has it."""

    pid: int
    name: str  # the command's name, cut to 15 characters by the kernel
    state: str  # R running, S sleeping, D waiting, T stopped, t traced, Z exited, ...
    group: int  # its process group
    started: int  # clock ticks after boot

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP, SIGTSTP): it runs no code at all. (A traced process,
        t, stops at each system call a tracer looks at, and goes on: not counted.)"""
        return self.state == "T"

    @property
    def exited(self) -> bool:
        """A zombie: it has ended and waits only for its parent to read its status."""
        return self.state in ("Z", "X")


def read_process(pid: int) -> Process | None:
    """The process `pid` now, or None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the name may hold spaces and parentheses: the fields follow its last ")"
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return Process(pid, name, fields[0], int(fields[2]), int(fields[19]))


def running(pid: int) -> Process | None:
    """The process `pid` if it exists and has not exited."""
    found = read_process(pid)
    return None if found is None or found.exited else found


def group_members(group: int) -> list[Process]:
    """Every process of a process group that has not exited."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (p := running(int(entry.name))) and p.group == group:
            found.append(p)
    return found


def stopped_part(parts: dict[str, list[int]]) -> str | None:
    """Why the run cannot go on if one of these processes is stopped: a stopped process holds
    its part's records as a dead one would, but never exits."""
    for name, pids in parts.items():
        for pid in pids:
            found = read_process(pid)
            if found is not None and found.stopped:
                return f"{name} (pid {pid}) is stopped (SIGSTOP?), not running"
    return None


def ticks_now() -> int:
    """Now, in the unit and from the origin of /proc's process start times."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICKS)


class Parts(contextlib.ExitStack):
    """An ExitStack of the run's parts, with what their teardown did: the names of the parts
    it stopped (for the log) and each process it had to end (for meta.json)."""

    def __init__(self, work: Path):
        super().__init__()
        self.work = work
        self.stopped: list[str] = []
        self.ended: list[dict] = []  # each: part, pid, process, signal, was_stopped, when
        # the process groups started here: each part's name and its first process's start
        self.groups: dict[int, tuple[str, int]] = {}
        self.since = ticks_now() - TICKS  # processes older than the run are never its own

    def start(self, name: str, machine: Machine, command: list[str], **popen) -> subprocess.Popen:
        """Start a part on a machine; it is stopped when the run ends."""
        proc = self.launch(name, machine, command, **popen)
        self.callback(self.stop, proc, name)
        return proc

    def launch(self, name: str, machine: Machine, command: list[str], **popen) -> subprocess.Popen:
        """Start a process of a part that stops it itself (the broker's keeper stops and
        restarts its JVM); the teardown's check still finds it if it is left."""
        proc = machine.start(command, **popen)
        first = read_process(proc.pid)  # its own session: the group has its pid
        self.groups[proc.pid] = (name, first.started if first else ticks_now())
        return proc

    def launcher(self, name: str, machine: Machine) -> Callable[..., subprocess.Popen]:
        """launch, for a part that starts its processes itself (KafkaBroker's spawn)."""
        return lambda command, **popen: self.launch(name, machine, command, **popen)

    def on_teardown(self, undo: Callable[[], object]) -> None:
        self.callback(undo)

    def stop(self, proc: subprocess.Popen, name: str, timeout: float = GRACE_S) -> None:
        """A part's teardown: it and its process group ended (stop_process), and recorded."""
        self.record(name, stop_process(proc, timeout))

    def record(self, name: str, ended: list[dict]) -> None:
        """What stopping a part did: each process it ended, with the last signal it took
        (`when`: at the teardown, unless the part says otherwise, e.g. a hung broker)."""
        if not ended:
            return
        self.stopped.append(name)
        for process in ended:
            self.ended.append({"part": name, "when": "teardown", **process})
            if process["was_stopped"] or process["signal"] == "SIGKILL":
                how = "was stopped, continued and" if process["was_stopped"] else "was"
                log(
                    f"teardown: {name}: {process['process']} (pid {process['pid']}) {how} "
                    f"ended by {process['signal']}"
                )

    def verify(self, own: dict[str, list[Process]]) -> dict:
        """After the teardown, no process of the run may be left: every process of the groups
        started here and of `own` (processes seen on the way, by part: the job's JVM, the
        broker's) that still runs is killed and recorded. meta.json `teardown`: what was
        ended, and `left`, what not even SIGKILL ended (must be empty)."""
        found: dict[int, tuple[str, Process]] = {}
        for group, (name, started) in self.groups.items():
            first = read_process(group)
            if first is None or first.started == started:  # else the id is another's now
                found |= {p.pid: (name, p) for p in group_members(group)}
        for name, seen in own.items():
            for p in seen:
                now = running(p.pid)
                if now is not None and now.started == p.started:  # the same, not a reused pid
                    found[p.pid] = (name, now)
        found = {
            pid: (name, p)
            for pid, (name, p) in found.items()
            if p.started >= self.since and pid != os.getpid()
        }
        for name, p in found.values():
            log(f"teardown: {name}: {p.name} (pid {p.pid}) still ran after the teardown; killed")
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            self.ended.append(
                {"part": name, "when": "after teardown", "pid": p.pid, "process": p.name,
                 "signal": "SIGKILL", "was_stopped": p.stopped}
            )  # fmt: skip
        left = wait_gone(list(found), KILL_WAIT_S)
        for p in left:
            log(f"teardown: {p.name} (pid {p.pid}) is LEFT running")
        return {
            "grace_s": GRACE_S,
            "ended": self.ended,
            "left": [{"pid": p.pid, "process": p.name, "state": p.state} for p in left],
        }


def wait_gone(pids: list[int], timeout: float) -> list[Process]:
    """Those of `pids` still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for pid in pids if (p := running(pid)) is not None]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def ask_to_stop(proc: subprocess.Popen) -> None:
    """SIGTERM to a part here (SIGCONT first: a stopped one would keep it pending); there,
    closing its tether does the same (see testbed.Machine)."""
    if proc.stdin is not None:
        if not proc.stdin.closed:
            proc.stdin.close()
    else:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGTERM)


def stop_process(proc: subprocess.Popen | None, timeout: float = GRACE_S) -> list[dict]:
    """Stop a part and every process of its group: continued, asked to stop, killed after
    `timeout`. Each process it ended (pid, process, signal, was_stopped); [] if none ran."""
    if proc is None:
        return []
    if proc.stdin is not None:
        return stop_tethered(proc, timeout)
    return end_group(proc, timeout)


def end_group(proc: subprocess.Popen, timeout: float) -> list[dict]:
    """SIGCONT and SIGTERM to the part's process group, SIGKILL to what is left of it after
    `timeout`; the part's own process is reaped."""
    members = group_members(proc.pid)
    if not members:
        proc.poll()
        return []
    with contextlib.suppress(ProcessLookupError):
        ask_to_stop(proc)
    deadline = time.monotonic() + timeout
    while (left := group_members(proc.pid)) and time.monotonic() < deadline:
        proc.poll()  # reaps the part's own process: an exited one is no member
        time.sleep(0.2)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        wait_gone([p.pid for p in left], KILL_WAIT_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_WAIT_S)
    killed = {p.pid for p in left}
    return [
        {
            "pid": p.pid,
            "process": p.name,
            "signal": "SIGKILL" if p.pid in killed else "SIGTERM",
            "was_stopped": p.stopped,
        }
        for p in members
    ]


def stop_tethered(proc: subprocess.Popen, timeout: float) -> list[dict]:
    """A part on another machine: its tether closed (the far side ends it, see hvbench-agent
    tether), this machine's SSH client killed if it has not ended after `timeout`."""
    if proc.poll() is not None:
        return []
    ask_to_stop(proc)
    how = "tether closed"
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        how = "SIGKILL"
    return [{"pid": proc.pid, "process": "ssh", "signal": how, "was_stopped": False}]


def line_queue(stream) -> queue.Queue:
    """Lines of a child's output, read on a thread so the harness never blocks on them."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for raw in stream:
            lines.put(raw.decode(errors="replace").strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue, timeout: float) -> str | None:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None
