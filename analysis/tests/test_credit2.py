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
