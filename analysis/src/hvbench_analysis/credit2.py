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

A cap on our domain (`cap`, % of a CPU), as the same file's budget code does it, with the
records served by one of its `vcpus` (the others idle):
- the domain's budget, cap % of the 10 ms replenishment period (`tot_budget`), is a pool; the
  vCPU grabs its share of it (`budget_quota`: the budget over the vCPUs, at least 0.5 ms) when
  it is chosen to run, or when it has used what it grabbed (`unit_grab_budget`); its time
  slice is at most what it holds
  (`csched2_runtime`), and no less than the 0.5 ms minimum, so it may overrun;
- a vCPU that finds the pool empty (its overrun taken from it first) is parked: not runnable,
  out of the queue, whatever work it has (`park_unit`); switched out, it gives back what it
  holds (`unit_return_budget`);
- every 10 ms from when the cap was set (`start`) the pool gets the budget again, never above
  it (`replenish_domain_budget`), and a parked vCPU is unparked: queued and tickled if it has
  work. What a running vCPU holds is not in the pool, so a grab just before a replenishment
  lets it run up to its quota more than the budget in the period that follows.

Left out: several CPUs and run queues, load balancing, a cap on a neighbour, and the cost of a
context switch.

    done = credit2_beside(arrivals, demands, weight=256, neighbours=[256], cap=25)
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
BUDGET_PERIOD = 10_000_000  # CSCHED2_BDGT_REPL_PERIOD: 10 ms unless credit2_cap_period_ms says
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


@dataclass
class Budget:
    """A capped domain's budget (one vCPU): the pool, what its vCPU holds, and when the pool is
    next replenished."""

    total: int  # tot_budget
    quota: int  # budget_quota: what the vCPU grabs at most
    next_replenish: int
    pool: int = 0
    held: int = 0  # the vCPU's own budget; below 0 once it overran
    parked: bool = False

    @classmethod
    def of_cap(cls, cap: int, vcpus: int, start: int) -> Budget:
        if not 1 <= vcpus <= 128 or not 1 <= cap <= 100 * vcpus:
            raise ValueError(
                f"a cap of 1 to 100 % of a CPU per vCPU, 1 to 128 vCPUs (got {cap} %, {vcpus})"
            )
        total = BUDGET_PERIOD * cap // 100  # csched2_dom_cntl
        quota = max(total // vcpus, MIN_TIMER)
        return cls(total, quota, start + BUDGET_PERIOD, pool=total)

    def grab(self) -> bool:
        """`unit_grab_budget`: True with budget held, False parked."""
        if self.held > 0:
            return True
        self.pool += self.held
        self.held = min(self.quota, self.pool) if self.pool > 0 else 0
        self.pool -= self.held
        self.parked = self.held == 0
        return not self.parked

    def give_back(self) -> None:
        """`unit_return_budget`, when the vCPU is switched out."""
        if self.held > 0:
            self.pool, self.held = self.pool + self.held, 0

    def replenish(self, t: int) -> bool:
        """`replenish_domain_budget` at `t`: True if a parked vCPU is unparked."""
        while self.next_replenish <= t:
            self.next_replenish += BUDGET_PERIOD
            self.pool += self.total
        if self.pool <= 0:
            return False
        self.pool = min(self.pool, self.total)
        unparked, self.parked = self.parked, False
        return unparked


def neighbour_unit(n: Neighbour, start: int) -> Unit:
    if not n.work:
        return Unit(n.weight, work=math.inf)
    return Unit(n.weight, work=n.work, release=n, next_release=start + n.period)


class Credit2Cpu:
    """One run queue on one CPU: units[0] serves the records, the others are the neighbours
    (an int: the weight of an always-busy one); `cap`: ours, 0 for none."""

    def __init__(
        self, weight: int, neighbours: list, ratelimit: int, start: int, cap: int = 0, vcpus=1
    ) -> None:
        found = [n if isinstance(n, Neighbour) else Neighbour(int(n)) for n in neighbours]
        check_weights([weight])
        for n in found:
            n.check()
        self.ratelimit = ratelimit
        self.budget = Budget.of_cap(cap, vcpus, start) if cap else None
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
        return u.work > 0 and not (u is self.ours and self.budget and self.budget.parked)

    def enqueue(self, u: Unit) -> None:
        """After every unit with as much credit (`runq_insert`)."""
        queue, credit = self.queue, u.credit
        at = 0
        while at < len(queue) and queue[at].credit >= credit:
            at += 1
        queue.insert(at, u)

    def run_until(self, until: int) -> None:
        cur, ran, self.t = self.current, until - self.t, until
        if cur is None or ran <= 0:
            return
        if cur is self.ours and self.budget:
            self.budget.held -= ran
        value = ran * self.max_weight + cur.residual
        cur.residual = value % cur.weight
        credit = cur.credit - value // cur.weight
        cur.credit = credit if credit > CREDIT_MIN else CREDIT_MIN
        cur.work -= ran

    def decide(self) -> None:
        """`csched2_schedule`: choose, reset the credits if need be, and set the time slice."""
        cur, now = self.current, self.t
        if cur is self.ours and self.budget and self.budget.held <= 0:
            self.budget.grab()  # what it overran is taken from the pool; none left: parked
        still = cur is not None and self.runnable(cur)
        if still and now - self.switched_in < self.ratelimit:
            chosen = cur
        else:
            chosen = self.candidate(cur if still else None)
        if chosen is not None:
            head = self.queue[0].credit if self.queue else chosen.credit
            if chosen.credit <= 0 and head <= 0:
                self.reset(2 * CREDIT_INIT if chosen.credit == CREDIT_MIN else CREDIT_INIT)
        if still and chosen is not cur:
            self.enqueue(cur)  # put back once switched out (`csched2_context_saved`)
        if cur is self.ours and chosen is not cur and self.budget:
            self.budget.give_back()
        if chosen is not cur:
            self.switched_in = now
        self.current = chosen
        self.timer = None if chosen is None else now + self.time_slice(chosen)

    def candidate(self, chosen: Unit | None) -> Unit | None:
        """`runq_candidate`: the first queued unit with more credit than `chosen` (the
        runnable current one, or none) that may run: ours only if it can grab budget, else
        it is parked and out of the queue."""
        queue = self.queue
        while queue and (chosen is None or queue[0].credit > chosen.credit):
            u = queue.pop(0)
            if u is self.ours and self.budget and not self.budget.grab():
                continue
            return u
        return chosen

    def reset(self, amount: int) -> None:
        for u in self.units:
            u.credit = min(u.credit + amount, CREDIT_INIT + CARRYOVER_MAX)

    def time_slice(self, chosen: Unit) -> int:
        """`csched2_runtime` (4.17): until its credit falls to the head's, in its time, no
        longer than what a capped vCPU holds; at least 0.5 ms and what is left of the rate
        limit, else at most 10 ms."""
        least = self.switched_in + self.ratelimit - self.t
        if least < MIN_TIMER:
            least = MIN_TIMER
        head = self.queue[0].credit if self.queue else 0
        left = chosen.credit - head if head > 0 else chosen.credit
        time = left * chosen.weight // self.max_weight if left > 0 else 0
        if chosen is self.ours and self.budget and self.budget.held < time:
            time = self.budget.held
        if time < least:  # the rate limit's rest wins over the 10 ms maximum, as in Xen
            return least
        return MAX_TIMER if time > MAX_TIMER else time

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
        cur = self.current
        if cur is not None and 0 < cur.work < at - self.t:
            at = self.t + cur.work
        if self.budget and self.budget.next_replenish < at:
            at = self.budget.next_replenish
        return min(at, first_release(self.periodic)) if self.periodic else at

    def step_to(self, t: int) -> None:
        """Run to `t`, then what falls due there: a neighbour's work done (it blocks), the
        releases and the time slice's end (none once our record is done at `t`)."""
        self.run_until(t)
        cur = self.current
        if cur is self.ours and cur.work == 0:
            return
        if self.budget and self.budget.next_replenish <= t:
            self.replenish(t)
        if (cur is not None and cur.work == 0) or t == self.timer:
            self.decide()
        if self.periodic:
            release_due(self.periodic, self.t, self.current, self.wake)

    def replenish(self, t: int) -> None:
        """Our domain's budget given again; unparked with work, our vCPU is queued and
        tickles (`unpark_parked_units`)."""
        if self.budget.replenish(t) and self.ours.work > 0:
            self.wake(self.ours)

    def serve(self, demand: int, next_arrival: int | None) -> None:
        """Run until our record of `demand` is done; then our vCPU sleeps, unless the next
        record has arrived."""
        self.ours.work = demand
        asleep = self.current is not self.ours and self.ours not in self.queue
        if asleep and self.runnable(self.ours):  # parked, it waits for the replenishment
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
    cap: int = 0,
    vcpus: int = 1,
) -> np.ndarray:
    """Done times of the records served by a one-vCPU domain of `weight` under Credit2, on one
    CPU with its `neighbours` (none: alone): a weight, always busy, or a credit.Neighbour with
    periodic work. `ratelimit` in ns (sched_ratelimit_us); `cap` in % of a CPU (0: none) for
    the domain's `vcpus`; `start`: when the neighbours start running and the cap was set
    (default: the first arrival)."""
    if not 0 <= ratelimit <= 500_000_000:
        raise ValueError(f"a rate limit from 0 to 500 ms (got {ratelimit} ns)")
    return replay(
        lambda first: Credit2Cpu(weight, list(neighbours), ratelimit,
                                 first if start is None else start, cap, vcpus),
        arrivals, demands,
    )  # fmt: skip
