"""SIGTERM as a request to stop, for the load's processes (broker node, producers, consumer).

The first SIGTERM sets an event the process's loop watches; repeats are ignored from then on,
so a process asked twice still ends by its own shutdown (a cluster's teardown asks every node
at once, then stops each part, asking again one that has not ended yet). A Python handler
alone would not do: CPython puts a handled signal back to its default while the interpreter
exits, and a repeat arriving then killed a node in its last step (exit -15, its JVM already
stopped)."""

from __future__ import annotations

import signal
import threading


def stop_on_sigterm(stop: threading.Event, *also: signal.Signals) -> None:
    """`stop` is set by the first SIGTERM (or one of `also`); later ones are ignored."""

    def asked(*_) -> None:
        for sig in (signal.SIGTERM, *also):
            signal.signal(sig, signal.SIG_IGN)
        stop.set()

    for sig in (signal.SIGTERM, *also):
        signal.signal(sig, asked)
