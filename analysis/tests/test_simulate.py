"""The reservation simulator (hvbench_analysis.simulate) on cases computed by hand, and its
bounds on random sequences. Times in microseconds written as ns (× US)."""

import numpy as np
import pytest
from hvbench_analysis import simulate

US = 1_000


def us(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64) * US


def sparse_records(rng, count: int, period: int, max_demand: int) -> tuple[np.ndarray, ...]:
    """Records at least one period apart, each needing at most max_demand."""
    gaps = period + rng.integers(0, 3 * period, count)
    return np.cumsum(gaps), rng.integers(0, max_demand + 1, count)


def test_without_a_reservation_records_queue_one_after_another():
    done = simulate.unconstrained(us([0, 1, 10]), us([3, 3, 1]))
    assert done.tolist() == us([3, 6, 11]).tolist()


def test_a_record_that_arrives_while_an_earlier_one_is_served_needs_its_queued_demand():
    """5 each alone, 1 each behind another (one wake-up for both). Without a reservation the
    second arrives at 1 while the first runs until 5; under 3 per 10, periodic or
    SCHED_DEADLINE, the first runs 0–3 and 10–12, the second 12–13, the third 30–33 and 40–42."""
    arrivals, demands, queued = us([0, 1, 30]), us([5, 5, 5]), us([1, 1, 1])
    assert simulate.unconstrained(arrivals, demands, queued).tolist() == us([5, 6, 35]).tolist()
    for serve in (simulate.periodic, simulate.cbs):
        done = serve(arrivals, demands, 3 * US, 10 * US, queued=queued)
        assert done.tolist() == us([12, 13, 42]).tolist(), serve.__name__
        assert serve(arrivals, demands, 3 * US, 10 * US, queued=demands).tolist() == (
            serve(arrivals, demands, 3 * US, 10 * US).tolist()
        )


def test_a_periodic_server_waits_for_the_next_periods_budget():
    # 3 per 10: the first record runs 0–3, waits for 10, runs 10–12; the second queues behind
    done = simulate.periodic(us([0, 1]), us([5, 1]), budget=3 * US, period=10 * US)
    assert done.tolist() == us([12, 13]).tolist()
    # the periods are fixed in time: with phase 5 the next budget comes at 5, not 10
    done = simulate.periodic(us([0]), us([5]), budget=3 * US, period=10 * US, phase=5 * US)
    assert done.tolist() == us([7]).tolist()


def test_a_periodic_servers_budget_does_not_carry_over():
    # 4 per 10: 2 used in the first period, 6 asked at 10: 4 there, 2 in the next period
    done = simulate.periodic(us([0, 10]), us([2, 6]), budget=4 * US, period=10 * US)
    assert done.tolist() == us([2, 22]).tolist()


def test_a_lone_periodic_servers_worst_case_is_reached_and_never_exceeded():
    """Alone on its CPU the server uses its budget as soon as there is work: a record that
    arrives just as the budget is spent waits P − B, the most it can wait (with other servers
    on the CPU the budget may come at any time in its period: 2·(P − B))."""
    budget, period = 30 * US, 100 * US
    done = simulate.periodic(us([0, 30]), us([30, 20]), budget=budget, period=period)
    assert done[1] - 30 * US == (period - budget) + 20 * US
    rng = np.random.default_rng(1)
    arrivals, demands = sparse_records(rng, 5000, period, budget)
    done = simulate.periodic(arrivals, demands, budget=budget, period=period, phase=7 * US)
    assert np.all(done - arrivals <= (period - budget) + demands)


def test_sched_deadline_with_a_runtime_above_each_demand_adds_no_delay():
    rng = np.random.default_rng(2)
    runtime, period = 20 * US, 100 * US
    arrivals, demands = sparse_records(rng, 5000, period, runtime)
    done = simulate.cbs(arrivals, demands, runtime=runtime, period=period)
    assert np.array_equal(done, arrivals + demands)


def test_sched_deadline_throttles_until_the_deadline_and_replenishes():
    # 5 per 10: the first record leaves 1 of runtime; the second, queued, runs 4–5, is
    # throttled until the deadline 10, gets 5 more and ends at 13
    done = simulate.cbs(us([0, 3]), us([4, 4]), runtime=5 * US, period=10 * US)
    assert done.tolist() == us([4, 13]).tolist()


@pytest.mark.parametrize(
    ("wake", "done"),
    [
        (6, 12),  # 1 left for 4 to the deadline: within 5/10, kept: 6–7, throttled to 10, 10–12
        (9, 12),  # 1 left for 1: over 5/10, a new deadline 19 and 5: 9–12
    ],
)
def test_sched_deadlines_wake_up_rule_keeps_or_resets_the_runtime(wake, done):
    times = simulate.cbs(us([0, wake]), us([4, 3]), runtime=5 * US, period=10 * US)
    assert times[1] == done * US


def test_a_full_reservation_is_no_reservation():
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.integers(0, 30 * US, 3000))
    demands = rng.integers(0, 40 * US, 3000)
    free = simulate.unconstrained(arrivals, demands)
    assert np.array_equal(simulate.periodic(arrivals, demands, 10 * US, 10 * US), free)
    assert np.array_equal(simulate.cbs(arrivals, demands, 10 * US, 10 * US), free)


@pytest.mark.parametrize(
    ("arrivals", "demands", "budget", "message"),
    [
        ([0, 1], [1, 1], 0, "a budget from 1 ns to the period"),
        ([0, 1], [1, 1], 11, "a budget from 1 ns to the period"),
        ([5, 1], [1, 1], 5, "arrivals must not decrease"),
        ([0, 1], [1, -1], 5, "demands must not be negative"),
        ([0, 1], [1], 5, "one demand per arrival"),
    ],
)
def test_bad_inputs_are_refused_with_the_reason(arrivals, demands, budget, message):
    for server in (simulate.periodic, simulate.cbs):
        with pytest.raises(ValueError, match=message):
            server(arrivals, demands, budget, 10)


MS = 1_000_000


def test_credits_cap_parks_and_unparks_as_xens_accounting_does():
    """Cap 50 with 30 ms slices: 150 credits (15 ms) per accounting. 100 ms of work from 0:
    a tick finds it running at 10 (active); at 30 its credit is -30 + 15 = -15 ms, not below
    -15: it runs on; at 60 it is -45 + 15 = -30: parked; at 90 -15, still parked; at 120 0:
    unparked, 40 ms left; at 150 -30 + 15 = -15: not parked; done at 160."""
    done = simulate.credit_cap([0], [100 * MS], cap=50)
    assert done.tolist() == [160 * MS]


def test_credits_cap_of_a_whole_cpu_never_parks():
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.integers(0, 40 * MS, 2000))
    demands = rng.integers(0, 60 * MS, 2000)
    free = simulate.unconstrained(arrivals, demands)
    assert np.array_equal(simulate.credit_cap(arrivals, demands, cap=100), free)


def test_credits_cap_leaves_a_light_load_alone_and_holds_a_heavy_one_to_it():
    """Records of 1 ms every 20 ms (5 %) under cap 10 are never parked; 15 ms every 20 ms
    (75 %) under cap 25 get a quarter of the CPU in the long run."""
    light = np.arange(0, 3000 * MS, 20 * MS)
    demands = np.full(len(light), 1 * MS)
    assert np.array_equal(simulate.credit_cap(light, demands, cap=10), light + demands)
    heavy = simulate.credit_cap(light, np.full(len(light), 15 * MS), cap=25)
    busy = 15 * MS * len(light)
    assert busy / (heavy[-1] - light[0]) == pytest.approx(0.25, abs=0.01)


@pytest.mark.parametrize(
    ("cap", "tslice", "message"),
    [(0, 30 * MS, "a cap of 1 to 100"), (101, 30 * MS, "a cap of 1 to 100"),
     (50, 1000, "a time slice of whole ticks")],
)  # fmt: skip
def test_bad_credit_settings_are_refused(cap, tslice, message):
    with pytest.raises(ValueError, match=message):
        simulate.credit_cap([0], [1], cap=cap, tslice=tslice)
