"""The parts a run starts (broker, job, consumer, producers, the scheduler setting), torn down
by construction: each is registered with its teardown when it starts, and leaving the `with`
block undoes them in reverse order, on success, error or Ctrl-C alike.

    with Parts(work) as parts:
        job = parts.start("flink job", machine, command, stdout=...)
        parts.on_teardown(scheduler.reset)
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from hvbench_harness.testbed import Machine


class RunError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


class Parts(contextlib.ExitStack):
    """An ExitStack of the run's parts, with the names of those it stopped (for the log)."""

    def __init__(self, work: Path):
        super().__init__()
        self.work = work
        self.stopped: list[str] = []

    def start(self, name: str, machine: Machine, command: list[str], **popen) -> subprocess.Popen:
        """Start a part on a machine; it is stopped when the run ends."""
        proc = machine.start(command, **popen)
        self.callback(self.stop, proc, name)
        return proc

    def on_teardown(self, undo: Callable[[], object]) -> None:
        self.callback(undo)

    def stop(self, proc: subprocess.Popen, name: str, timeout: float = 30.0) -> None:
        if stop_process(proc, timeout):
            self.stopped.append(name)


def ask_to_stop(proc: subprocess.Popen) -> None:
    """SIGTERM to a part here; there, closing its tether does the same (see testbed.Machine)."""
    if proc.stdin is not None:
        if not proc.stdin.closed:
            proc.stdin.close()
    else:
        os.killpg(proc.pid, signal.SIGTERM)


def stop_process(proc: subprocess.Popen | None, timeout: float = 30.0) -> bool:
    """Stop a part that still runs (asked first, killed after timeout); True if it ran."""
    if proc is None or proc.poll() is not None:
        return False
    try:
        ask_to_stop(proc)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    return True


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
