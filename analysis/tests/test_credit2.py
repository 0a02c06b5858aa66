"""Xen Credit2 beside other domains' busy vCPUs (hvbench_analysis.credit2) on cases worked out
by hand from credit2.c's rules (4.17); what it shares with Credit's model: test_credit.py."""

import numpy as np
import pytest
from hvbench_analysis import prediction
from hvbench_analysis.credit2 import credit2_beside
from test_credit import light_records

MS = 1_000_000


def test_woken_within_the_rate_limit_it_waits_for_the_running_vcpus_time_slice():
    # The neighbour runs from 0 with 10 ms of credit and nobody queued: a 10 ms slice. Ours
    # wakes at 0.4 ms, less than the rate limit (less 50 µs) after the neighbour was switched
    # in: no preemption, it waits for the slice's end at 10 ms, and runs its three records.
    arrivals = [400_000, 5 * MS, 5_500_000]
    done = credit2_beside(arrivals, [200_000] * 3, neighbours=[256], start=0)
    assert done.tolist() == [10_200_000, 10_400_000, 10_600_000]
    without = credit2_beside(arrivals, [200_000] * 3, neighbours=[256], start=0, ratelimit=0)
    assert without.tolist() == [600_000, 5_200_000, 5_700_000]


def test_a_woken_vcpu_with_more_credit_preempts_and_the_credits_are_reset_at_zero():
    # 2 ms: the neighbour has run 2 ms (8 left), ours 10: preempts, done 2.2; the neighbour
    # back at 2.2 with an 8 ms slice. 3 ms: it has run 0.8 ms: ours waits to 10.2 (the
    # neighbour at 0, ours 9.8), done 10.4. The neighbour's next slice is the rate limit's
    # 1 ms; at 11.4 it is at -1 ms and alone in the queue: every vCPU gets 10 ms (ours capped
    # at 10.5). 15 ms: it has run 4.6 ms since 10.4 and has 5.4 left: ours preempts, 15.2.
    done = credit2_beside([2 * MS, 3 * MS, 15 * MS], [200_000] * 3, neighbours=[256], start=0)
    assert done.tolist() == [2_200_000, 10_400_000, 15_200_000]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="a weight of 1 to 65535"):
        credit2_beside([0], [MS], weight=0)
    with pytest.raises(ValueError, match="a rate limit from 0 to 500 ms"):
        credit2_beside([0], [MS], ratelimit=-1)


def test_the_prediction_takes_the_weights_and_the_rate_limit():
    arrivals, demands = light_records()
    serve = prediction.server("credit2", {"beside": [256], "weight": 128, "ratelimit_us": 100})
    expected = credit2_beside(arrivals, demands, 128, [256], ratelimit=100_000)
    assert np.array_equal(serve(arrivals, demands), expected)


def capped(arrivals, demands, cap, neighbours=(), **kw):
    """Our domain capped, the cap set (its first replenishment 10 ms later) at 0."""
    return credit2_beside(arrivals, demands, neighbours=list(neighbours), cap=cap, start=0, **kw)


def test_a_capped_vcpu_alone_runs_its_budget_every_10_ms():
    # Cap 30: 3 ms every 10 ms. 5 ms of work from 1 ms: it grabs the 3 ms and runs 1–4, is
    # parked with the pool empty, unparked by the replenishment at 10 and runs 10–12.
    assert capped([1 * MS], [5 * MS], 30).tolist() == [12 * MS]
    # cap 25, 6 ms from 0: 0–2.5, 10–12.5, 20–21
    assert capped([0], [6 * MS], 25).tolist() == [21 * MS]


def test_a_budget_grabbed_before_a_replenishment_runs_on_past_it():
    # Cap 25 (2.5 ms). 5 ms of work from 9.5 ms: it grabs the whole pool, 2.5 ms; the
    # replenishment at 10 fills the pool again (what the vCPU holds is not in it); at 12 its
    # own is spent and it grabs the pool's 2.5: done at 14.5, 4.5 ms run in [10, 20). A
    # periodic server of 2.5 ms every 10 ms would give 0.5 + 2.5 ms, then 2 ms from 20: 22.
    assert capped([9_500_000], [5 * MS], 25).tolist() == [14_500_000]


def test_an_overrun_is_paid_back_from_the_budgets_that_follow():
    # Cap 2: 0.2 ms every 10 ms. A record of 1 ms at 0 grabs the 0.2 ms but a vCPU just
    # switched in runs the rate limit (1 ms): done at 1 ms, 0.8 ms over. Blocked, it takes
    # the overrun from the pool (-0.8) and is parked; the replenishments at 10, 20, 30, 40
    # bring the pool to -0.6, -0.4, -0.2, 0; at 50 to 0.2 ms, and it is unparked. The record
    # of 0.1 ms that came at 5 ms waits until then.
    assert capped([0, 5 * MS], [MS, 100_000], 2).tolist() == [MS, 50_100_000]


def test_a_capped_vcpu_beside_a_busy_neighbour_gets_no_more_than_its_cap():
    # 300 ms of work at 0 beside an always-busy neighbour of the same weight: half the CPU
    # without a cap (about 600 ms); cap 25 holds it to a quarter (about 1,200 ms); a cap
    # above its share only cuts some time slices short (its held budget ends them).
    free = capped([0], [300 * MS], 0, neighbours=[256])[0]
    held = capped([0], [300 * MS], 25, neighbours=[256])[0]
    loose = capped([0], [300 * MS], 80, neighbours=[256])[0]
    assert 590 * MS <= free <= 610 * MS, free
    assert 1_180 * MS <= held <= 1_210 * MS, held
    assert abs(loose - free) <= 5 * MS, (loose, free)


def test_a_cap_over_several_vcpus_is_grabbed_a_share_at_a_time():
    # Cap 50 over two vCPUs, the records served by one: 5 ms every 10 ms, grabbed 2.5 ms at a
    # time. 5 ms from 0: 0–2.5, again 2.5–5 (the pool still has 2.5): done at 5 ms; 8 ms from
    # 0: 0–5, parked, 10–13.
    assert capped([0], [5 * MS], 50, vcpus=2).tolist() == [5 * MS]
    assert capped([0], [8 * MS], 50, vcpus=2).tolist() == [13 * MS]


def test_bad_caps_are_refused():
    with pytest.raises(ValueError, match="a cap of 1 to 100 % of a CPU per vCPU"):
        capped([0], [1], 150)
    with pytest.raises(ValueError, match="a cap of 1 to 100 % of a CPU per vCPU"):
        capped([0], [1], -5)


def test_the_prediction_takes_a_cap_alone_and_beside_neighbours():
    arrivals, demands = light_records()
    beside = prediction.server("credit2", {"beside": [256], "cap": 25})
    expected = credit2_beside(arrivals, demands, 256, [256], cap=25)
    assert np.array_equal(beside(arrivals, demands), expected)
    alone = prediction.server("credit2", {"cap": 25, "vcpus": 2})
    expected = credit2_beside(arrivals, demands, neighbours=[], cap=25, vcpus=2)
    assert np.array_equal(alone(arrivals, demands), expected)
