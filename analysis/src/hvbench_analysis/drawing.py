"""Figure files (and the other files a report writes from its data alone, its HdrHistogram
logs) written by worker processes, side by side with the report's other work.

Drawing a figure into SVG and PDF costs more than computing what it shows, and a report has
several figures per configuration and one per run. `start` hands a figure's writing to a pool
of worker processes (one per CPU this process may use, forked by `begin` as the report starts,
or at the first figure) while the report goes on; `Drawing.read` waits for it and reads its SVG
back for the HTML page. The
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


class WriteFailed(RuntimeError):
    """A file a worker (or the report itself) was writing could not be written."""


class Drawing:
    """One figure's files (or another file), being written by a worker (or already written):
    `path` is the one the page shows, `formats` the suffixes of all of them."""

    def __init__(
        self, name: str, path: Path, future: Future | None = None, formats: tuple[str, ...] = ()
    ) -> None:
        self.name, self.path, self.future = name, path, future
        self.formats = formats or (path.suffix.lstrip("."),)

    def wait(self) -> None:
        """Once written; WriteFailed with its name if writing failed."""
        if self.future is not None:
            try:
                self.future.result()
            except Exception as e:  # the worker's own error, or a worker that died
                raise WriteFailed(f"{self.name}: writing it failed: {e!r}") from e

    def read(self) -> bytes:
        """The file the page shows, once written (wait's error if writing failed)."""
        self.wait()
        return self.path.read_bytes()


_pool: ProcessPoolExecutor | None = None
_unfinished: set[Future] = set()


def begin(warm_up: Callable[[], object] | None = None) -> None:
    """Fork the workers now (start does at the first figure otherwise), each running warm_up
    first: they import and load what drawing needs while the report reads its runs, and they
    are forked from a process that does not hold the samples yet. Nothing where there is one
    worker or no fork."""
    global _pool
    if _pool is not None or workers() <= 1 or not hasattr(os, "fork"):
        return
    gc.freeze()  # (start says why)
    context = multiprocessing.get_context("fork")  # the workers inherit matplotlib's set-up
    _pool = ProcessPoolExecutor(workers(), mp_context=context, initializer=warm_up)
    _pool.submit(int)  # forked at the first task (all of them, with fork)


def start(
    write: Callable[..., object], *args, name: str, path: Path, formats: tuple[str, ...] = ()
) -> Drawing:
    """write(*args) (which writes the figure's files: `path`, and the same name with each of
    `formats`) in a worker process; in-process where there is one worker or no fork."""
    if workers() <= 1 or not hasattr(os, "fork"):
        write(*args)
        return Drawing(name, path, formats=formats)
    begin()
    assert _pool is not None
    # What the report holds so far (its modules, its runs) lives as long as the workers:
    # frozen until finish(), the collector does not walk it again and again (in a report of
    # 10 runs, 0.2 s of each worker's 1.7 s, then 0.1 s)
    gc.freeze()
    # (pruned here, in the report's thread: a callback would change the set from another)
    _unfinished.difference_update([f for f in _unfinished if f.done()])
    while len(_unfinished) >= WAITING_PER_WORKER * workers():
        done, _ = wait(_unfinished, return_when=FIRST_COMPLETED)
        _unfinished.difference_update(done)
    future = _pool.submit(write, *args)
    _unfinished.add(future)
    return Drawing(name, path, future, formats)


def finish() -> None:
    """Wait for every figure still being written and end the workers (a report that stops
    early leaves none behind)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None
        gc.unfreeze()
    _unfinished.clear()
