"""Reservations side by side on one CPU under EDF (hvbench_analysis.edf): alone, a server is
the simulator's periodic server; beside others, a record can wait 2·(P − B), never more; with
RTDS's extratime a spent budget runs on one level lower."""

import numpy as np
import pytest
from hvbench_analysis import simulate
from hvbench_analysis.edf import Releases, Server, edf

MS = 1_000_000


def sparse_records(rng, count: int, period: int, max_demand: int):
    return np.cumsum(period + rng.integers(0, 3 * period, count)), rng.integers(
        0, max_demand + 1, count
    )


def test_alone_it_is_the_periodic_server():
    rng = np.random.default_rng(6)
    arrivals = np.cumsum(rng.integers(0, 30 * MS, 2000))
    demands = rng.integers(0, 40 * MS, 2000)
    (done,) = edf([Server(20 * MS, 100 * MS, 7 * MS, arrivals, demands)])
    assert np.array_equal(done, simulate.periodic(arrivals, demands, 20 * MS, 100 * MS, 7 * MS))


def test_the_budget_early_in_one_period_and_late_in_the_next_is_the_worst_case():
    """Ours 30 per 100 ms; a busy neighbour 140 per 200 ms whose deadlines fall 1 ns before
    every second one of ours. Ours runs first in [0, 100) and last in [100, 200): a record
    arriving at 30, just as the first budget is spent, waits until 170: 2·(P − B) + demand."""
    budget, period = 30 * MS, 100 * MS
    ours = Server(budget, period, arrivals=[0, 30 * MS], demands=[30 * MS, 20 * MS])
    neighbour = Server(140 * MS, 200 * MS, phase=-1)
    done, _ = edf([ours, neighbour])
    assert done[1] - 30 * MS == 2 * (period - budget) + 20 * MS


def test_beside_busy_neighbours_a_record_waits_longer_but_never_beyond_the_bound():
    rng = np.random.default_rng(7)
    budget, period = 30 * MS, 100 * MS
    arrivals, demands = sparse_records(rng, 400, period, budget)
    neighbours = [Server(40 * MS, 150 * MS, phase=3 * MS), Server(25 * MS, 90 * MS, phase=11)]
    done = edf([Server(budget, period, 5 * MS, arrivals, demands), *neighbours])[0]
    assert np.all(done - arrivals <= 2 * (period - budget) + demands)
    # the neighbours only ever take the CPU away: never sooner than alone, later at times
    alone = simulate.periodic(arrivals, demands, budget, period, 5 * MS)
    assert np.all(done >= alone) and np.any(done > alone)


def test_an_earlier_deadline_preempts_at_once():
    """Ours 50 per 100 ms runs a 40 ms record from 0; at 10 a record of the neighbour's
    (20 per 50 ms: deadline 50) preempts it, runs 10–20, and ours runs on 20–50."""
    ours = Server(50 * MS, 100 * MS, arrivals=[0], demands=[40 * MS])
    neighbour = Server(20 * MS, 50 * MS, arrivals=[10 * MS], demands=[10 * MS])
    done_ours, done_neighbour = edf([ours, neighbour])
    assert (done_ours.tolist(), done_neighbour.tolist()) == ([50 * MS], [20 * MS])


def test_with_extratime_alone_it_is_no_reservation():
    rng = np.random.default_rng(8)
    arrivals = np.cumsum(rng.integers(0, 30 * MS, 2000))
    demands = rng.integers(0, 40 * MS, 2000)
    (done,) = edf([Server(20 * MS, 100 * MS, 7 * MS, arrivals, demands, extratime=True)])
    assert np.array_equal(done, simulate.unconstrained(arrivals, demands))


def test_with_extratime_a_spent_budget_runs_on_in_the_time_the_others_leave():
    """Ours 30 per 100 ms, 60 ms of work at 0; a busy neighbour 50 per 100 ms, its deadlines
    1 ns earlier. The neighbour runs 0–50, ours 50–80 (its budget). With extratime ours runs
    on one level lower until the neighbour's new period 1 ns before 100, which preempts it
    (to 150 − 1 ns), and is done at 160; without, it waits for its own period at 100 and
    behind the neighbour, to 180 − 1 ns."""
    neighbour = Server(50 * MS, 100 * MS, phase=-1)
    for extratime, expected in ((True, 160 * MS), (False, 180 * MS - 1)):
        ours = Server(30 * MS, 100 * MS, arrivals=[0], demands=[60 * MS], extratime=extratime)
        assert edf([ours, neighbour])[0].tolist() == [expected]


def test_a_neighbours_extratime_never_delays_a_server_within_its_budget():
    rng = np.random.default_rng(9)
    arrivals, demands = sparse_records(rng, 300, 100 * MS, 20 * MS)
    ours = Server(30 * MS, 100 * MS, 5 * MS, arrivals, demands)
    without, with_extra = (
        edf([ours, Server(60 * MS, 100 * MS, phase=-1, extratime=e)])[0] for e in (False, True)
    )
    assert np.array_equal(without, with_extra)


def test_reservations_over_one_cpu_are_refused():
    servers = [Server(50 * MS, 100 * MS, arrivals=[0], demands=[MS]), Server(60 * MS, 100 * MS)]
    with pytest.raises(ValueError, match=r"more than one CPU \(50% \+ 60%\)"):
        edf(servers)


def test_a_neighbour_whose_work_comes_and_goes_takes_only_its_work_within_its_budget():
    """Ours 30 per 100 ms; a neighbour 50 per 100 ms (deadlines 1 ns before ours) with 10 ms
    of work every 40 ms from 0. A record of 20 ms at 1 ms waits for the neighbour's 0–10 and
    runs 10–30; one of 10 ms at 41 ms waits for the release at 40 (40–50), runs 50–60; one of
    15 ms at 81 ms waits for 80–90, finds its budget spent, and runs 100–115 in the next
    period (the neighbour's next work comes at 120). Beside an always-busy neighbour the first
    would wait for the neighbour's whole 50 ms."""
    ours = Server(30 * MS, 100 * MS, arrivals=[MS, 41 * MS, 81 * MS],
                  demands=[20 * MS, 10 * MS, 15 * MS])  # fmt: skip
    neighbour = Server(50 * MS, 100 * MS, phase=-1, releases=Releases(10 * MS, 40 * MS, 0))
    done, none = edf([ours, neighbour])
    assert done.tolist() == [30 * MS, 60 * MS, 115 * MS] and none is None
    busy, _ = edf([ours, Server(50 * MS, 100 * MS, phase=-1)])
    assert busy[0] == 70 * MS
    with pytest.raises(ValueError, match="work from 1 ns to its period"):
        Releases(50 * MS, 40 * MS)


def test_on_two_cpus_a_record_runs_beside_a_busy_neighbour_not_after_it():
    """Ours 40 per 100 ms with a 30 ms record at 0; a busy neighbour 60 per 100 ms whose
    deadlines come first. On one CPU the neighbour runs 0–60 and ours 60–90; on a pool of two
    ours runs 0–30 on the other CPU; beside two such neighbours it waits again until 60."""
    ours = Server(40 * MS, 100 * MS, arrivals=[0], demands=[30 * MS])
    busy = Server(60 * MS, 100 * MS, phase=-1)
    assert edf([ours, busy])[0].tolist() == [90 * MS]
    assert edf([ours, busy], cpus=2)[0].tolist() == [30 * MS]
    assert edf([ours, busy, busy], cpus=2)[0].tolist() == [90 * MS]


def test_on_two_cpus_one_busy_neighbour_never_delays_a_server():
    rng = np.random.default_rng(9)
    budget, period = 30 * MS, 100 * MS
    arrivals, demands = sparse_records(rng, 300, period, budget)
    busy = Server(100 * MS, 100 * MS, phase=-1)  # a whole CPU
    done = edf([Server(budget, period, 5 * MS, arrivals, demands), busy], cpus=2)[0]
    assert np.array_equal(done, simulate.periodic(arrivals, demands, budget, period, 5 * MS))


def test_reservations_over_the_pools_cpus_are_refused():
    servers = [Server(90 * MS, 100 * MS, arrivals=[0], demands=[MS]), Server(70 * MS, 100 * MS)]
    assert len(edf(servers, cpus=2)[0]) == 1  # 160 % of two CPUs
    with pytest.raises(ValueError, match=r"more than 2 CPUs \(90% \+ 70% \+ 50%\)"):
        edf([*servers, Server(50 * MS, 100 * MS)], cpus=2)
    with pytest.raises(ValueError, match="one CPU or more"):
        edf(servers, cpus=0)
