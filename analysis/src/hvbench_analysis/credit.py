"""Xen Credit on one physical CPU: the vCPU that serves the records beside other domains'
always-busy vCPUs, each domain's share of the CPU set by its weight (docs/simulate.md).

As xen/common/sched/credit.c decides it (read at Xen 4.17 and at c447b730; the function names
below are its own), one vCPU per domain:
- priorities BOOST > UNDER > OVER; the run queue is first come, first served within a priority
  (`__runq_insert`), and a preempted or expired vCPU goes to the tail of its priority;
- every accounting (`csched_acct`, each time slice, 30 ms by default) the active vCPUs share
  one slice of credits (10 a ms) in proportion to their weights, the share of one vCPU never
  above one slice's; a vCPU below zero is OVER, else UNDER; one above a slice's credits leaves
  the active set with half of them (it earns nothing until a tick finds it running again);
- running burns 10 credits a ms (`burn_credits`); a tick (every third of a slice,
  `csched_tick`) takes a running vCPU's BOOST away and makes it active; it never preempts;
- a vCPU that wakes UNDER is BOOSTed (`csched_unit_wake`) and preempts the running vCPU only
  if its priority is strictly higher (`__runq_tickle`);
- a decision (`csched_schedule`) keeps a runnable vCPU that has run less than the rate limit
  (1 ms by default) since it was switched in; else the head of the queue runs for a time slice;
- a cap (% of a CPU) limits what an accounting gives the vCPU to ⌈cap · credits per slice /
  100⌉; an accounting that finds its credit below minus that parks it (paused, it runs no more,
  awake or not) until an accounting finds its credit at zero or above; an unparked vCPU is not
  BOOSTed (the flag is cleared after the unpause, Xen 4.13 and later).

Left out: the ordering of domains in the accounting when credits are handed on (it matters
only when a domain cannot use its fair share), the run queue's re-sort (every vCPU of a
priority stays where it was), yield, caps on the neighbours, load balancing over several
CPUs, and the cost of a context switch. Alone on its CPU with a cap, the vCPU is served as
simulate.credit_cap serves it.

    done = credit_beside(arrivals, demands, weight=256, neighbours=[256])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hvbench_analysis.simulate import NS_PER_CREDIT, TICKS_PER_TSLICE, check_inputs

BOOST, UNDER, OVER = 0, -1, -2
DEFAULT_WEIGHT = 256  # CSCHED_DEFAULT_WEIGHT
RATELIMIT_NS = 1_000_000  # sched_ratelimit_us's default


def check_weights(weights) -> None:
    for w in weights:
        if not 1 <= w <= 65535:
            raise ValueError(f"a weight of 1 to 65535 (got {w})")


def replay(make_cpu, arrivals, demands) -> np.ndarray:
    """The records through a CPU model (`make_cpu(first arrival)`: idle_until, serve, t):
    each record's done time, first come first served."""
    a, c = check_inputs(arrivals, demands)
    if not a:
        return np.array([], dtype=np.int64)
    cpu = make_cpu(a[0])
    done = []
    for i, (arrival, demand) in enumerate(zip(a, c, strict=True)):
        if cpu.t < arrival:
            cpu.idle_until(arrival)
        if demand:  # awake on, if the next record with work has arrived
            following = a[i + 1] if i + 1 < len(a) and c[i + 1] else None
            cpu.serve(demand, following)
        done.append(max(cpu.t, arrival))
    return np.array(done, dtype=np.int64)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Neighbour:
    """Another domain's vCPU on the CPU: `work` ns of CPU released every `period` ns from the
    first accounting's start, what it has not run yet waiting for it; work 0: always busy."""

    weight: int
    work: int = 0
    period: int = 0

    def check(self) -> None:
        check_weights([self.weight])
        if self.work and not 0 < self.work <= self.period:
            raise ValueError(f"a neighbour's work from 1 ns to its period (got {self})")


@dataclass
class Vcpu:
    weight: int
    work: float = 0  # ns of CPU it has to run now; math.inf: always busy
    release: Neighbour | None = None  # a neighbour with periodic work: what and how often
    next_release: float = math.inf
    credit: int = 0  # ns of CPU time (a credit is 0.1 ms)
    pri: int = UNDER
    active: bool = False
    cap: int = 0  # ns of credits an accounting gives at most; 0: no cap
    parked: bool = False


def neighbour_vcpu(n: Neighbour, phase: int) -> Vcpu:
    if not n.work:
        return Vcpu(n.weight, work=math.inf)
    return Vcpu(n.weight, work=n.work, release=n, next_release=phase + n.period)


def release_due(periodic: list, t: int, current, wake) -> None:
    """The periodic neighbours' work released by `t` (Credit's vCPUs, Credit2's units); one
    that was asleep, and is not the running one, wakes."""
    for n in periodic:
        while n.next_release <= t:
            asleep = n.work == 0
            n.work += n.release.work
            n.next_release += n.release.period
            if asleep and n is not current:
                wake(n)


def first_release(periodic: list) -> float:
    return min((n.next_release for n in periodic), default=math.inf)


class CreditCpu:
    """One physical CPU under Credit: vcpus[0] serves the records, the others are the
    neighbours (an int: the weight of an always-busy one)."""

    def __init__(self, weight, neighbours, tslice, ratelimit, phase, cap=0) -> None:
        found = [n if isinstance(n, Neighbour) else Neighbour(int(n)) for n in neighbours]
        check_weights([weight])
        for n in found:
            n.check()
        self.tslice, self.tick = tslice, tslice // TICKS_PER_TSLICE
        self.ratelimit = ratelimit
        slice_credits = tslice // NS_PER_CREDIT
        self.ours = Vcpu(weight, cap=ceil_div(cap * slice_credits, 100) * NS_PER_CREDIT)
        self.vcpus = [self.ours] + [neighbour_vcpu(n, phase) for n in found]
        self.periodic = [v for v in self.vcpus if v.release is not None]
        self.queue = list(self.vcpus[1:])  # the runnable vCPUs not running, in order
        self.current: Vcpu | None = None
        self.switched_in = self.slice_end = phase
        self.t = phase
        self.next_tick, self.next_acct = phase + self.tick, phase + tslice
        self.balance = 0  # the active vCPUs' credits after the last accounting
        self.decide()

    def runnable(self, v: Vcpu) -> bool:
        return not v.parked and v.work > 0

    def enqueue(self, v: Vcpu) -> None:
        """At the tail of its priority (`__runq_insert`)."""
        at = next((i for i, q in enumerate(self.queue) if v.pri > q.pri), len(self.queue))
        self.queue.insert(at, v)

    def decide(self) -> None:
        """`csched_schedule`: the rate limit, else the head of the queue for a time slice."""
        cur, now = self.current, self.t
        if cur is not None and self.runnable(cur) and now - self.switched_in < self.ratelimit:
            self.slice_end = self.switched_in + self.ratelimit
            return
        if cur is not None and self.runnable(cur):
            self.enqueue(cur)
        self.current = self.queue.pop(0) if self.queue else None
        if self.current is not cur:
            self.switched_in = now
        self.slice_end = now + self.tslice

    def wake(self, v: Vcpu) -> None:
        """Work for a vCPU asleep: a record for ours, a release for a neighbour
        (`csched_unit_wake`, `__runq_tickle`); parked, it waits for the accounting that
        unparks it."""
        if v.parked:
            return
        if v.pri == UNDER:
            v.pri = BOOST
        self.enqueue(v)
        if self.current is None or v.pri > self.current.pri:
            self.decide()

    def release_due(self) -> None:
        release_due(self.periodic, self.t, self.current, self.wake)

    def next_event(self) -> float:
        """When the next thing happens: the running vCPU's work done, a tick, an accounting,
        the end of a slice, a release."""
        at = min(self.next_tick, self.next_acct, self.slice_end)
        if self.current is not None and self.current.work > 0:
            at = min(at, self.t + self.current.work)
        return min(at, first_release(self.periodic))

    def run_until(self, until: int) -> None:
        """The running vCPU burns its credits up to `until` and works on what it has."""
        ran = until - self.t
        if self.current is not None:
            self.current.credit -= ran
            self.current.work -= ran
        self.t = until

    def on_tick(self) -> None:
        """`csched_tick`: the running vCPU loses its BOOST and becomes active."""
        self.next_tick += self.tick
        if self.current is not None:
            if self.current.pri == BOOST:
                self.current.pri = UNDER
            self.current.active = True

    def on_accounting(self) -> None:
        """`csched_acct` for one CPU: one slice's credits shared by weight."""
        self.next_acct += self.tslice
        active = [v for v in self.vcpus if v.active]
        weights = sum(v.weight for v in active)
        if not weights:
            return
        debt = -min(self.balance, 0)  # a negative balance: more to share, and more a vCPU
        total, left = self.tslice + debt, weights
        for v in active:
            left -= v.weight
            peak = self.tslice + ceil_div(debt * v.weight, weights)
            if v.cap:
                peak = min(peak, v.cap)
            fair = ceil_div(total * v.weight, weights)
            if fair >= peak:  # more than it can take: the rest to the domains after it
                if left:
                    total += ceil_div((fair - peak) * weights, left)
                fair = peak
            self.give(v, fair)
        self.balance = sum(v.credit for v in active)
        if self.current is not None and self.current.parked:
            self.decide()  # paused: the CPU to the queue's head

    def park(self, v: Vcpu) -> None:
        v.parked = True
        if v in self.queue:
            self.queue.remove(v)

    def unpark(self, v: Vcpu) -> None:
        """Runnable again if it has work, at the tail of its priority, not BOOSTed; it preempts
        only a lower priority (`__runq_tickle`)."""
        v.parked = False
        if self.runnable(v) and v is not self.current and v not in self.queue:
            self.enqueue(v)
            if self.current is None or v.pri > self.current.pri:
                self.decide()

    def give(self, v: Vcpu, credit: int) -> None:
        v.credit += credit
        if v.credit < 0:
            if v.cap and v.credit < -v.cap and not v.parked:
                self.park(v)
            v.pri, v.credit = OVER, max(v.credit, -self.tslice)
        else:
            v.pri = UNDER
            if v.parked:
                self.unpark(v)
            if v.credit > self.tslice:
                v.active, v.credit = False, v.credit // 2

    def serve(self, demand: int, next_arrival: int | None) -> None:
        """Run until our record of `demand` is done, the events on the way in time order;
        then our vCPU sleeps, unless the next record has arrived."""
        self.ours.work = demand
        if self.current is not self.ours and self.ours not in self.queue:
            self.wake(self.ours)
        while self.ours.work > 0:
            self.step_to(int(self.next_event()))
        if next_arrival is None or next_arrival > self.t:
            self.decide()  # asleep: the CPU to the queue's head

    def step_to(self, t: int) -> None:
        """Run to `t`, then what falls due there: a neighbour's work done (it blocks), the
        releases, the tick, the accounting and the decision (none once our record is done
        at `t`: they come after it, as the record's end comes first)."""
        self.run_until(t)
        cur = self.current
        if cur is self.ours and cur.work == 0:
            return
        if cur is not None and cur.work == 0:
            self.decide()  # the neighbour ran what it had: it blocks
        self.release_due()
        if t == self.next_tick:
            self.on_tick()
        if t == self.next_acct:
            self.on_accounting()
        if t == self.slice_end:
            self.decide()

    def idle_until(self, t: int) -> None:
        """Our vCPU asleep until `t`: the neighbours run, ticks and accountings go by."""
        while (at := self.next_event()) <= t:
            self.step_to(int(at))
        self.run_until(t)


def credit_beside(
    arrivals,
    demands,
    weight: int = DEFAULT_WEIGHT,
    neighbours=(DEFAULT_WEIGHT,),
    tslice: int = 30_000_000,
    ratelimit: int = RATELIMIT_NS,
    phase: int | None = None,
    cap: int = 0,
) -> np.ndarray:
    """Done times of the records served by a one-vCPU domain of `weight` and `cap` (% of one
    CPU, 0: none) under Credit, on one CPU with one always-busy vCPU of each weight in
    `neighbours` (no cap). `tslice` and `ratelimit` in ns (sched_credit_tslice_ms,
    sched_ratelimit_us); `phase`: when the accounting starts (default: the first arrival)."""
    if not 0 <= cap <= 100:
        raise ValueError(f"a cap of 0 (none) to 100 (% of one CPU) for one vCPU (got {cap})")
    if tslice % (TICKS_PER_TSLICE * NS_PER_CREDIT):
        raise ValueError(f"a time slice of whole ticks of credits (got {tslice} ns)")
    if not 0 <= ratelimit <= tslice:
        raise ValueError(f"a rate limit from 0 to the time slice (got {ratelimit} ns)")
    return replay(
        lambda first: CreditCpu(weight, list(neighbours), tslice, ratelimit,
                                first if phase is None else phase, cap),
        arrivals, demands,
    )  # fmt: skip
