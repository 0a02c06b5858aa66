"""Reservations replayed: when each record would be done under a scheduler's reservation, from
when it arrived and the CPU time it needs.

Record i arrives at `arrivals[i]` and needs `demands[i]` of CPU time from the thread (or vCPU)
that serves the records one after another, in arrival order; both in integer nanoseconds.
`unconstrained`, `periodic` and `cbs` take `queued` too: what a record needs instead when it
arrives while the thread still works on an earlier one (records handled back to back share
one wake-up of the job's threads: docs/simulate.md, "Records behind another"); by default its
demand. A server decides when that thread gets the CPU; each function returns the times the
records are done, so that done − arrival is the time the reservation added to the CPU time, queueing
behind earlier records included. Here the server is alone on its CPU: nothing else competes
for the CPU, as for the bare target's job threads on a quiet machine, or a real-time VM's
vCPU on its own pool. Sources of each model: docs/simulate.md.

- `unconstrained`: the CPU whenever there is work (no reservation; RTDS with extratime on an
  otherwise idle CPU).
- `periodic`: `budget` per period, periods fixed in time from `phase`; used as soon as there is
  work, the rest lost at the period's end. CFS bandwidth control (the quota refilled by the
  period timer) and RTDS without extratime (the budget given back at each period boundary).
- `cbs`: SCHED_DEADLINE's constant bandwidth server: `runtime` per `period`, the deadline
  reset on a wake-up that would overrun the bandwidth, throttled to the deadline when the
  runtime is spent.
- `credit_cap`: Xen Credit's cap on a one-vCPU domain alone in its pool: credits burnt while
  running and given at each accounting; a vCPU too far in debt is parked until an accounting
  brings its credit back to zero.
"""

from __future__ import annotations

import numpy as np


def check_inputs(arrivals, demands) -> tuple[list[int], list[int]]:
    """Arrival times (non-decreasing) and demands (≥ 0) as Python integers (exact)."""
    a = np.asarray(arrivals, dtype=np.int64)
    c = np.asarray(demands, dtype=np.int64)
    if a.shape != c.shape or a.ndim != 1:
        raise ValueError(f"one demand per arrival (got {a.shape} and {c.shape})")
    if len(a) and (np.any(np.diff(a) < 0) or np.any(c < 0)):
        raise ValueError("arrivals must not decrease and demands must not be negative")
    return a.tolist(), c.tolist()


def queued_or_not(arrivals, demands, queued) -> tuple[list[int], list[tuple[int, int]]]:
    """The arrivals, and per record (its demand alone, its demand queued)."""
    a, c = check_inputs(arrivals, demands)
    q = c if queued is None else check_inputs(arrivals, queued)[1]
    return a, list(zip(c, q, strict=True))


def check_reservation(budget: int, period: int) -> None:
    if not 0 < budget <= period:
        raise ValueError(f"a budget from 1 ns to the period (got {budget} of {period} ns)")


def unconstrained(arrivals, demands, queued=None) -> np.ndarray:
    """Done times with the CPU always there: each record after the previous one, FIFO."""
    a, c = queued_or_not(arrivals, demands, queued)
    done, t = [], None
    for arrival, (alone, behind) in zip(a, c, strict=True):
        t = arrival + alone if t is None or arrival >= t else t + behind
        done.append(t)
    return np.array(done, dtype=np.int64)


def periodic(
    arrivals, demands, budget: int, period: int, phase: int = 0, queued=None
) -> np.ndarray:
    """Done times under a periodic server: `budget` ns in each period [phase + kP, phase +
    (k+1)P), used at once while there is work."""
    check_reservation(budget, period)
    a, c = queued_or_not(arrivals, demands, queued)
    done, t, start, left = [], None, None, 0
    for arrival, (alone, behind) in zip(a, c, strict=True):
        t, demand = (arrival, alone) if t is None or arrival >= t else (t, behind)
        while True:
            begin = phase + (t - phase) // period * period  # the period t lies in
            if begin != start:
                start, left = begin, budget
            run = min(demand, left, begin + period - t)
            t, demand, left = t + run, demand - run, left - run
            if demand == 0:
                break
            t = begin + period  # budget spent or period over: the next period's budget
        done.append(t)
    return np.array(done, dtype=np.int64)


def cbs(arrivals, demands, runtime: int, period: int, queued=None) -> np.ndarray:
    """Done times under SCHED_DEADLINE (deadline = period), as kernel/sched/deadline.c does
    it: a thread that wakes at t with runtime q left and deadline d keeps them only if d ≥ t
    and q / (d − t) ≤ runtime / period (update_dl_entity), else it gets a full runtime and the
    deadline t + period. When q is spent it is throttled until d (start_dl_timer), then runs
    on with a full runtime and the deadline d + period, or t + period if that is past
    (replenish_dl_entity)."""
    check_reservation(runtime, period)
    a, c = queued_or_not(arrivals, demands, queued)
    done, t, deadline, left = [], None, None, 0
    for arrival, (alone, behind) in zip(a, c, strict=True):
        demand = behind
        if t is None or t <= arrival:  # the thread was asleep: it wakes now
            t, demand = arrival, alone
            if deadline is None or deadline < t or left * period > (deadline - t) * runtime:
                deadline, left = t + period, runtime
        while True:
            run = min(demand, left)
            t, demand, left = t + run, demand - run, left - run
            if demand == 0:
                break
            t = max(t, deadline)
            deadline = deadline + period if deadline + period >= t else t + period
            left = runtime
        done.append(t)
    return np.array(done, dtype=np.int64)


# Xen Credit (xen/common/sched/credit.c): 10 credits per ms of CPU (CSCHED_CREDITS_PER_MSEC),
# three ticks per time slice (CSCHED_TICKS_PER_TSLICE), an accounting (csched_acct) every
# time slice. Here a credit is counted as the CPU time it buys: 1 credit = 0.1 ms.
NS_PER_CREDIT = 100_000
TICKS_PER_TSLICE = 3


def credit_cap(arrivals, demands, cap: int, tslice: int = 30_000_000, phase: int = 0):
    """Done times of a one-vCPU domain with Credit's `cap` (% of a CPU, 1..100) alone in its
    pool, the accounting every `tslice` from `phase` and the ticks in between. As csched_acct
    does for it: each accounting gives an active vCPU the cap's credits, ⌈cap · credits per
    slice / 100⌉ (the fair share alone would be more); a credit below minus that parks the
    vCPU, which stays parked until an accounting finds its credit at zero or above; the debt
    stops at minus one slice's credits; a credit above one slice's makes the vCPU inactive
    (no more credits) at half of it. A vCPU becomes active when a tick finds it running
    (csched_unit_acct). Running burns credits as it goes (Xen burns them at ticks and context
    switches)."""
    if not 1 <= cap <= 100:
        raise ValueError(f"a cap of 1 to 100 (% of one CPU) for one vCPU (got {cap})")
    if tslice % (TICKS_PER_TSLICE * NS_PER_CREDIT):
        raise ValueError(f"a time slice of whole ticks of credits (got {tslice} ns)")
    a, c = check_inputs(arrivals, demands)
    vcpu = CreditVcpu(cap, tslice, phase)
    done = []
    for arrival, demand in zip(a, c, strict=True):
        vcpu.idle_until(arrival)
        vcpu.run(demand)
        done.append(vcpu.t)
    return np.array(done, dtype=np.int64)


class CreditVcpu:
    """One vCPU under Credit, its credit in ns of CPU; t: where it is in time."""

    def __init__(self, cap: int, tslice: int, phase: int) -> None:
        slice_credits = tslice // NS_PER_CREDIT
        self.grant = (cap * slice_credits + 99) // 100 * NS_PER_CREDIT
        self.tslice, self.tick = tslice, tslice // TICKS_PER_TSLICE
        self.t = None
        self.next_tick = self.next_acct = phase
        self.credit, self.active, self.parked = 0, False, False

    def idle_until(self, when: int) -> None:
        """The vCPU has nothing to run until `when`: the ticks and accountings go by."""
        if self.t is None:
            self.t = when
            self.next_tick += -(-(when - self.next_tick) // self.tick) * self.tick
            self.next_acct += -(-(when - self.next_acct) // self.tslice) * self.tslice
        while min(self.next_tick, self.next_acct) <= when:
            self.t = min(self.next_tick, self.next_acct)
            self.event(running=False)
        self.t = max(self.t, when)

    def run(self, demand: int) -> None:
        while True:
            if self.parked:  # paused until an accounting unparks it
                self.t = self.next_acct
                self.next_tick = self.next_acct  # the ticks in between find nothing running
                self.event(running=False)
                continue
            run = min(demand, min(self.next_tick, self.next_acct) - self.t)
            self.t, demand, self.credit = self.t + run, demand - run, self.credit - run
            if demand == 0:
                return
            self.event(running=True)

    def event(self, running: bool) -> None:
        """The tick and the accounting due at t, the tick first."""
        if self.next_tick == self.t:
            self.active = self.active or running
            self.next_tick += self.tick
        if self.next_acct == self.t:
            self.next_acct += self.tslice
            if self.active:
                self.account()

    def account(self) -> None:
        self.credit += self.grant
        if self.credit < 0:
            self.parked = self.parked or self.credit < -self.grant
            self.credit = max(self.credit, -self.tslice)
        else:
            self.parked = False
            if self.credit > self.tslice:
                self.active, self.credit = False, self.credit // 2
