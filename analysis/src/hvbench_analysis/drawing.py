"""Figure files written by child processes, side by side with the report's other work.

Drawing a figure into PNG, SVG and PDF costs more than computing what it shows, and a report
has several figures per configuration and one per run. `start` forks a child that writes a
figure's files while the report goes on, at most WORKERS children at a time (one per CPU this
process may use); `Drawing.png` waits for the child and reads its PNG back for the HTML page.
The files are the same as when written in-process (no dates in them, SVG ids salted).
HVBENCH_REPORT_WORKERS=1 writes every figure in-process, one after the other.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


def workers() -> int:
    asked = os.environ.get("HVBENCH_REPORT_WORKERS", "")
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


class Drawing:
    """One figure's files, written by a child process (or already written)."""

    def __init__(self, name: str, png_path: Path, pid: int | None = None) -> None:
        self.name, self.png_path, self.pid = name, png_path, pid
        self.status = 0 if pid is None else None

    def wait(self) -> None:
        if self.status is None:
            _, status = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
            _running.remove(self)

    def png(self) -> bytes:
        """The figure's PNG, once its child has written it; RuntimeError if the child failed."""
        self.wait()
        if self.status != 0:
            raise RuntimeError(
                f"figure {self.name}: the process writing it exited with {self.status} "
                "(its error is printed above)"
            )
        return self.png_path.read_bytes()


_running: list[Drawing] = []  # children not yet waited for, oldest first


def start(write: Callable[[], None], name: str, png_path: Path) -> Drawing:
    """Run write() (which writes the figure's files) in a child process; in-process where
    there is one worker or no fork."""
    if workers() <= 1 or not hasattr(os, "fork"):
        write()
        return Drawing(name, png_path)
    while len(_running) >= workers():
        _running[0].wait()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: write the files and leave without the parent's exit handlers
        code = 0
        try:
            write()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    drawing = Drawing(name, png_path, pid)
    _running.append(drawing)
    return drawing


def finish() -> None:
    """Wait for every child still writing (a report that stops early leaves none behind)."""
    while _running:
        _running[0].wait()
