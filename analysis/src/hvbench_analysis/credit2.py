"""Xen Credit2 on one physical CPU: the vCPU that serves the records beside other domains'
always-busy vCPUs, each domain's share of the CPU set by its weight (docs/simulate.md).

As xen/common/sched/credit2.c decides it in Xen 4.17 (read at c447b730, whose one change to
this since, the descheduled vCPU counted in the time slice, is in 4.21), one vCPU per domain,
one run queue, no cap:
- every vCPU starts with 10 ms of credit (CSCHED2_CREDIT_INIT); running burns credit at
  max weight / own weight ns a ns (`burn_credits`, `t2c_update`), never below −10 ms;
- the run queue is ordered by credit, the highest first, first come first served among equal;
  a decision (`csched2_schedule`, `runq_candidate`) keeps a runnable vCPU that has run less
  than the rate limit (1 ms) since it was switched in, else takes the queue's head only if it
  has strictly more credit;
- when the vCPU chosen, and the queue's head, have no credit left (≤ 0), every vCPU gets
  10 ms more (`reset_credit`; 20 ms if the chosen one was at −10 ms), never above 10.5 ms;
- the vCPU chosen runs until its credit would fall to the head's (`csched2_runtime`), at least
  0.5 ms (or what it has left of the rate limit) and at most 10 ms;
- a vCPU keeps its credit while asleep; woken, it preempts the running vCPU only if it has
  strictly more credit and the running one has run more than the rate limit less 50 µs
  (`runq_tickle`, `tickle_score`); else it waits for the running vCPU's time slice to end.

Left out: caps (simulate.credit2_cap, alone), several CPUs and run queues, load balancing,
and the cost of a context switch.

    done = credit2_beside(arrivals, demands, weight=256, neighbours=[256])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hvbench_analysis.credit import (
    RATELIMIT_NS,
    Neighbour,
    check_weights,
    first_release,
    release_due,
    replay,
)

CREDIT_INIT = 10_000_000  # CSCHED2_CREDIT_INIT, ns
CREDIT_MIN = -CREDIT_INIT
CARRYOVER_MAX = 500_000  # CSCHED2_CARRYOVER_MAX
MIN_TIMER, MAX_TIMER = 500_000, CREDIT_INIT
TICKLE_TOLERANCE = 50_000  # CSCHED2_RATELIMIT_TICKLE_TOLERANCE


@dataclass
class Unit:
    weight: int
    work: float = 0  # ns of CPU it has to run now; math.inf: always busy
    release: Neighbour | None = None  # a neighbour with periodic work: what and how often
    next_release: float = math.inf
    credit: int = CREDIT_INIT
    residual: int = 0


def neighbour_unit(n: Neighbour, start: int) -> Unit:
    if not n.work:
        return Unit(n.weight, work=math.inf)
    return Unit(n.weight, work=n.work, release=n, next_release=start + n.period)


class Credit2Cpu:
    """One run queue on one CPU: units[0] serves the records, the others are the neighbours
    (an int: the weight of an always-busy one)."""

    def __init__(self, weight: int, neighbours: list, ratelimit: int, start: int) -> None:
        found = [n if isinstance(n, Neighbour) else Neighbour(int(n)) for n in neighbours]
        check_weights([weight])
        for n in found:
            n.check()
        self.ratelimit = ratelimit
        self.ours = Unit(weight)
        self.units = [self.ours] + [neighbour_unit(n, start) for n in found]
        self.max_weight = max(u.weight for u in self.units)
        self.periodic = [u for u in self.units if u.release is not None]
        self.queue: list[Unit] = []
        for unit in self.units[1:]:
            self.enqueue(unit)
        self.current: Unit | None = None
        self.t = self.switched_in = start
        self.timer: int | None = None
        self.decide()

    def runnable(self, u: Unit) -> bool:
        return u.work > 0

    def enqueue(self, u: Unit) -> None:
        """After every unit with as much credit (`runq_insert`)."""
        at = next((i for i, q in enumerate(self.queue) if u.credit > q.credit), len(self.queue))
        self.queue.insert(at, u)

    def run_until(self, until: int) -> None:
        ran, self.t = until - self.t, until
        if self.current is None or ran <= 0:
            return
        value = ran * self.max_weight + self.current.residual
        self.current.residual = value % self.current.weight
        self.current.credit = max(self.current.credit - value // self.current.weight, CREDIT_MIN)
        self.current.work -= ran

    def decide(self) -> None:
        """`csched2_schedule`: choose, reset the credits if need be, and set the time slice."""
        cur, now = self.current, self.t
        if cur is not None and self.runnable(cur) and now - self.switched_in < self.ratelimit:
            chosen = cur
        else:
            chosen = cur if cur is not None and self.runnable(cur) else None
            if self.queue and (chosen is None or self.queue[0].credit > chosen.credit):
                chosen = self.queue.pop(0)
        if chosen is not None:
            head = self.queue[0].credit if self.queue else chosen.credit
            if max(chosen.credit, head) <= 0:
                self.reset(2 * CREDIT_INIT if chosen.credit == CREDIT_MIN else CREDIT_INIT)
        if cur is not None and chosen is not cur and self.runnable(cur):
            self.enqueue(cur)  # put back once switched out (`csched2_context_saved`)
        if chosen is not cur:
            self.switched_in = now
        self.current = chosen
        self.timer = None if chosen is None else now + self.time_slice(chosen)

    def reset(self, amount: int) -> None:
        for u in self.units:
            u.credit = min(u.credit + amount, CREDIT_INIT + CARRYOVER_MAX)

    def time_slice(self, chosen: Unit) -> int:
        """`csched2_runtime` (4.17): until its credit falls to the head's, in its time."""
        least = max(MIN_TIMER, self.switched_in + self.ratelimit - self.t)
        head = self.queue[0].credit if self.queue else 0
        left = chosen.credit - head if head > 0 else chosen.credit
        time = max(left, 0) * chosen.weight // self.max_weight
        return min(max(time, least), MAX_TIMER)

    def wake(self, u: Unit) -> None:
        """Work for a unit asleep: a record for ours, a release for a neighbour
        (`csched2_unit_wake`, `runq_tickle`)."""
        self.enqueue(u)
        cur = self.current
        if cur is None:
            self.decide()
            return
        preemptable = self.t - self.switched_in > self.ratelimit - TICKLE_TOLERANCE
        if preemptable and u.credit > cur.credit:
            self.decide()

    def next_event(self) -> float:
        """The running unit's work done, its time slice's end, or a release."""
        at = math.inf if self.timer is None else self.timer
        if self.current is not None and self.current.work > 0:
            at = min(at, self.t + self.current.work)
        return min(at, first_release(self.periodic))

    def step_to(self, t: int) -> None:
        """Run to `t`, then what falls due there: a neighbour's work done (it blocks), the
        releases and the time slice's end (none once our record is done at `t`)."""
        self.run_until(t)
        cur = self.current
        if cur is self.ours and cur.work == 0:
            return
        if (cur is not None and cur.work == 0) or t == self.timer:
            self.decide()
        release_due(self.periodic, self.t, self.current, self.wake)

    def serve(self, demand: int, next_arrival: int | None) -> None:
        """Run until our record of `demand` is done; then our vCPU sleeps, unless the next
        record has arrived."""
        self.ours.work = demand
        if self.current is not self.ours and self.ours not in self.queue:
            self.wake(self.ours)
        while self.ours.work > 0:
            self.step_to(int(self.next_event()))
        if next_arrival is None or next_arrival > self.t:
            self.decide()  # asleep: the CPU to the queue's head

    def idle_until(self, t: int) -> None:
        """Our vCPU asleep until `t`: the neighbours run their time slices and work."""
        while (at := self.next_event()) <= t:
            self.step_to(int(at))
        self.run_until(t)


def credit2_beside(
    arrivals,
    demands,
    weight: int = 256,
    neighbours=(256,),
    ratelimit: int = RATELIMIT_NS,
    start: int | None = None,
) -> np.ndarray:
    """Done times of the records served by a one-vCPU domain of `weight` under Credit2, on one
    CPU with its `neighbours` (no cap): a weight, always busy, or a credit.Neighbour with
    periodic work. `ratelimit` in ns
    (sched_ratelimit_us); `start`: when the neighbours start running (default: the first
    arrival)."""
    if not 0 <= ratelimit <= 500_000_000:
        raise ValueError(f"a rate limit from 0 to 500 ms (got {ratelimit} ns)")
    return replay(
        lambda first: Credit2Cpu(weight, list(neighbours), ratelimit,
                                 first if start is None else start),
        arrivals, demands,
    )  # fmt: skip
