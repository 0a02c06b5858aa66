"""Figure files written by worker processes, side by side with the report's other work.

Drawing a figure into PNG, SVG and PDF costs more than computing what it shows, and a report
has several figures per configuration and one per run. `start` hands a figure's writing to a
pool of worker processes (one per CPU this process may use, forked at the first figure) while
the report goes on; `Drawing.png` waits for it and reads its PNG back for the HTML page. The
workers live as long as the report: matplotlib's font and text caches stay warm from one figure
to the next, and the fork is paid once (a process per figure cost a quarter more CPU).
What a worker is given is pickled: a module-level function and its arguments.
The files are the same as when written in-process (no dates in them, SVG ids salted).
HVBENCH_REPORT_WORKERS=1 writes every figure in-process, one after the other.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

# Figures waiting for a worker, per worker. Enough that the report hands on its figures and
# goes on to its tables while they are drawn (at 2, it waited on the workers and computed its
# tables afterwards, one CPU idle); few enough that a campaign's hundreds of figures and their
# data are not all kept at once.
WAITING_PER_WORKER = 16


def workers() -> int:
    asked = os.environ.get("HVBENCH_REPORT_WORKERS", "")
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


class Drawing:
    """One figure's files, being written by a worker (or already written)."""

    def __init__(self, name: str, png_path: Path, future: Future | None = None) -> None:
        self.name, self.png_path, self.future = name, png_path, future

    def png(self) -> bytes:
        """The figure's PNG, once written; RuntimeError naming the figure if writing failed."""
        if self.future is not None:
            try:
                self.future.result()
            except Exception as e:  # the worker's own error, or a worker that died
                raise RuntimeError(f"figure {self.name}: writing it failed: {e!r}") from e
        return self.png_path.read_bytes()


_pool: ProcessPoolExecutor | None = None
_unfinished: set[Future] = set()


def start(write: Callable[..., object], *args, name: str, png_path: Path) -> Drawing:
    """write(*args) (which writes the figure's files) in a worker process; in-process where
    there is one worker or no fork."""
    global _pool
    if workers() <= 1 or not hasattr(os, "fork"):
        write(*args)
        return Drawing(name, png_path)
    if _pool is None:
        # What the report holds so far (its modules, its runs) lives as long as the workers:
        # frozen until finish(), the collector in the parent and in the workers does not walk
        # it again and again (in a report of 10 runs, 0.2 s of each worker's 1.7 s, then 0.1 s)
        gc.freeze()
        context = multiprocessing.get_context("fork")  # the workers inherit matplotlib's set-up
        _pool = ProcessPoolExecutor(workers(), mp_context=context)
    # (pruned here, in the report's thread: a callback would change the set from another)
    _unfinished.difference_update([f for f in _unfinished if f.done()])
    while len(_unfinished) >= WAITING_PER_WORKER * workers():
        done, _ = wait(_unfinished, return_when=FIRST_COMPLETED)
        _unfinished.difference_update(done)
    future = _pool.submit(write, *args)
    _unfinished.add(future)
    return Drawing(name, png_path, future)


def finish() -> None:
    """Wait for every figure still being written and end the workers (a report that stops
    early leaves none behind)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None
        gc.unfreeze()
    _unfinished.clear()
