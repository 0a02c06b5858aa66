"""Several reservations on one CPU under EDF: each a periodic server (budget per period, the
deadline its period's end), the CPU to the server with work, budget and the earliest deadline,
a later deadline preempted as soon as an earlier one has work. This is RTDS on one physical CPU
(xen/common/sched/rt.c: a vCPU's budget given back at each period boundary, the run queue
ordered by deadline, equal deadlines first come first served), and the case where a server's
budget may come anywhere in its period: the analytical bound's 2·(P − B). On a pool of several
CPUs, global EDF: RTDS keeps one run queue for all of its pool's CPUs (`rt_private.runq`), and
each CPU runs the earliest deadline not running elsewhere (`runq_pick`).

With extratime, a server that has spent its budget gets it again at once one priority level
lower (rt.c `burn_budget`: priority_level + 1, cur_budget = budget), and every level-0 server
with budget comes first (`compare_unit_priority`: the lower level, then the earlier deadline);
its period's end puts it back at level 0 (`rt_update_deadline`). So it runs on in the time
the others leave.

A server with records serves them one after another (arrivals and demands in integer ns, as in
simulate.py); a server without records always has work (another VM's busy vCPU). Another VM's
vCPU whose work comes and goes has `releases`: that much work every so often, for as long as
the simulation runs. Built on SimPy's processes and its preemptive resource.

    done = edf([Server(30_000_000, 100_000_000, arrivals=a, demands=c),
                Server(70_000_000, 200_000_000)])   # done[0]: when each record of the first is done
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import simpy

from hvbench_analysis.simulate import check_inputs, check_reservation


@dataclass(frozen=True)
class Releases:
    """`work` ns of CPU released every `every` ns from `start`."""

    work: int
    every: int
    start: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.work <= self.every:
            raise ValueError(f"work from 1 ns to its period (got {self.work} of {self.every})")


@dataclass(frozen=True)
class Server:
    budget: int
    period: int
    phase: int = 0
    arrivals: object = None  # None (and no releases): always busy
    demands: object = None
    extratime: bool = False
    releases: Releases | None = None  # work that comes and goes, instead of records


class Served:
    """One server's state while the simulation runs."""

    def __init__(self, env: simpy.Environment, cpu, server: Server) -> None:
        check_reservation(server.budget, server.period)
        self.env, self.cpu, self.server = env, cpu, server
        self.busy = server.arrivals is None and server.releases is None
        self.records: list[tuple[int, int]] = []
        if server.arrivals is not None:
            self.records = list(zip(*check_inputs(server.arrivals, server.demands), strict=True))
        # [index, demand left] of records that arrived; a release's index is -1
        self.queue: deque[list[int]] = deque()
        self.done = [0] * len(self.records)
        self.finished = env.event()
        self.work = env.event()
        self.start, self.left, self.level = None, 0, 0
        if server.releases is not None:
            env.process(self.release(server.releases))
        elif not self.busy:
            env.process(self.arrive())
        env.process(self.serve())

    def period_at(self, t: int) -> tuple[int, int]:
        s = self.server
        begin = s.phase + (t - s.phase) // s.period * s.period
        if begin != self.start:
            self.start, self.left, self.level = begin, s.budget, 0
        return begin, begin + s.period

    def arrive(self):
        for i, (arrival, demand) in enumerate(self.records):
            yield self.env.timeout(arrival - self.env.now)
            self.queue.append([i, demand])
            if not self.work.triggered:
                self.work.succeed()
        if not self.records:
            self.finished.succeed()

    def release(self, releases: Releases):
        yield self.env.timeout(releases.start - self.env.now)
        while True:
            self.queue.append([-1, releases.work])
            if not self.work.triggered:
                self.work.succeed()
            yield self.env.timeout(releases.every)

    def pending(self) -> int | None:
        """The demand left of the record at the head (None: nothing to do)."""
        if self.busy:
            return self.server.budget
        return self.queue[0][1] if self.queue else None

    def serve(self):
        env = self.env
        while True:
            if self.pending() is None:
                self.work = env.event()
                yield self.work
            _, end = self.period_at(env.now)
            if self.left == 0 and self.server.extratime:  # on, one level lower
                self.left, self.level = self.server.budget, self.level + 1
            if self.left == 0:  # budget spent: the next period's
                yield env.timeout(end - env.now)
                continue
            request = self.cpu.request(priority=(self.level, end), preempt=True)
            try:
                got = yield request | env.timeout(end - env.now)
            except simpy.Interrupt:  # given the CPU and preempted before it could run
                continue
            if request not in got:  # its period ended while it waited: a new deadline
                request.cancel()
                continue
            yield from self.run(request, end)

    def run(self, request, end: int):
        env = self.env
        started = env.now
        with contextlib.suppress(simpy.Interrupt):  # an earlier deadline took the CPU
            yield env.timeout(min(self.left, self.pending(), end - started))
        used = env.now - started
        self.cpu.release(request)
        self.left -= used
        if not self.busy:
            self.queue[0][1] -= used
            if self.queue[0][1] == 0:
                index, _ = self.queue.popleft()
                if index >= 0:  # a record's, not a release's
                    self.done[index] = env.now
                    if index == len(self.records) - 1:
                        self.finished.succeed()


def edf(servers: list[Server], cpus: int = 1) -> list[np.ndarray | None]:
    """When each record of each server is done (None for a server without records: always
    busy, or its releases), once every record is. On several CPUs, global EDF: the `cpus`
    servers with work, budget and the earliest deadlines run, a server on one CPU at a time
    (RTDS's one run queue for its pool's CPUs). Servers that reserve more than the CPUs are
    refused: EDF would starve some of them for ever."""
    if cpus < 1:
        raise ValueError(f"one CPU or more (got {cpus})")
    if sum(Fraction(s.budget, s.period) for s in servers) > cpus:
        shares = " + ".join(f"{s.budget / s.period:.0%}" for s in servers)
        what = "one CPU" if cpus == 1 else f"{cpus} CPUs"
        raise ValueError(f"the reservations add up to more than {what} ({shares})")
    env = simpy.Environment()
    cpu = simpy.PreemptiveResource(env, capacity=cpus)
    served = [Served(env, cpu, s) for s in servers]
    with_records = [s.finished for s in served if s.server.arrivals is not None]
    if with_records:
        env.run(until=simpy.AllOf(env, with_records))
    return [None if s.server.arrivals is None else np.array(s.done, dtype=np.int64)
            for s in served]  # fmt: skip
