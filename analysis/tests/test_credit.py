"""Xen Credit beside other domains' busy vCPUs (hvbench_analysis.credit) on cases worked out
by hand from credit.c's rules; with Credit2 (hvbench_analysis.credit2), what both must do:
nothing alone, the long-run shares the weights give, never sooner than alone."""

import numpy as np
import pytest
from hvbench_analysis import prediction, simulate
from hvbench_analysis.credit import Neighbour, credit_beside
from hvbench_analysis.credit2 import credit2_beside

MS = 1_000_000


def light_records(n=3_000, seed=7):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.integers(10 * MS, 23 * MS, n))
    return arrivals, rng.integers(MS // 3, 3 * MS // 2, n)


MODELS = [credit_beside, credit2_beside]


@pytest.mark.parametrize("model", MODELS)
def test_alone_on_its_cpu_it_is_no_reservation(model):
    arrivals, demands = light_records()
    done = model(arrivals, demands, neighbours=[])
    assert np.array_equal(done, simulate.unconstrained(arrivals, demands))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("weight", "share"), [(256, 1 / 2), (512, 2 / 3), (128, 1 / 3)])
def test_a_busy_vcpu_beside_another_gets_the_share_its_weight_gives(model, weight, share):
    arrivals = np.arange(3_000, dtype=np.int64) * MS  # 2 ms of work every 1 ms: never idle
    demands = np.full(3_000, 2 * MS)
    done = model(arrivals, demands, weight=weight, neighbours=[256])
    assert demands.sum() / (done[-1] - arrivals[0]) == pytest.approx(share, abs=0.01)


def test_a_woken_vcpu_preempts_a_neighbour_that_has_run_the_rate_limit():
    # The neighbour runs from 0. A record at 0.4 ms wakes ours, BOOSTed: it preempts once the
    # neighbour has run 1 ms, and is done at 1.2. At 5 ms the neighbour has run 3.8 ms since
    # 1.2: at once, done at 5.2; at 5.5 ms it has run 0.3 ms: ours waits until 6.2.
    arrivals = [400_000, 5 * MS, 5_500_000]
    done = credit_beside(arrivals, [200_000] * 3, neighbours=[256], phase=0)
    assert done.tolist() == [1_200_000, 5_200_000, 6_400_000]
    without = credit_beside(arrivals, [200_000] * 3, neighbours=[256], phase=0, ratelimit=0)
    assert without.tolist() == [600_000, 5_200_000, 5_700_000]


def test_a_vcpu_over_its_share_waits_while_the_neighbour_is_under():
    # 100 ms of work at 0 beside a busy neighbour, equal weights (credits in ms of CPU):
    #   1-31 ours (the neighbour held the rate limit to 1 ms); tick 10: ours active; acct 30:
    #     ours alone active, -29 + 30 = 1 UNDER; the neighbour (-1) no tick saw it: inactive
    #   31-61 neighbour (ours at the tail of UNDER); tick 40: active; acct 60: 15 each:
    #     ours 0 + 15 = 15 UNDER, neighbour -30 + 15 = -15 OVER
    #   61-121 ours (the neighbour OVER); acct 90: ours 1 UNDER, neighbour -1 OVER;
    #     acct 120: ours -14 OVER, neighbour 14 UNDER
    #   121-151 neighbour; acct 150: both 0, UNDER; 151: ours ahead of it, 10 ms left: 161
    assert credit_beside([0], [100 * MS], neighbours=[256], phase=0).tolist() == [161 * MS]


@pytest.mark.parametrize("model", MODELS)
def test_beside_busy_neighbours_no_record_is_done_sooner_than_alone(model):
    arrivals, demands = light_records()
    alone = simulate.unconstrained(arrivals, demands)
    for neighbours in ([256], [256, 256], [64]):
        assert (model(arrivals, demands, neighbours=neighbours) >= alone).all()


def test_more_weight_for_the_neighbours_means_a_longer_tail():
    arrivals, demands = light_records(20_000)
    alone = simulate.unconstrained(arrivals, demands)
    tails = [
        (credit_beside(arrivals, demands, weight=512, neighbours=[256]) - alone).max(),
        (credit_beside(arrivals, demands, neighbours=[256, 256]) - alone).max(),
    ]
    assert 0 < tails[0] < tails[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weight": 0}, "a weight of 1 to 65535"),
        ({"neighbours": [70_000]}, "a weight of 1 to 65535"),
        ({"ratelimit": 40 * MS}, "rate limit from 0 to the time slice"),
        ({"tslice": 25_050_000}, "whole ticks of credits"),
        ({"cap": 101}, "a cap of 0 .none. to 100"),
        ({"cap": -1}, "a cap of 0 .none. to 100"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        credit_beside([0], [MS], **kwargs)


@pytest.mark.parametrize(
    ("sched", "extra", "message"),
    [
        ("credit2", {"cap": 50, "vcpus": 2}, "SCHED=credit2 beside busy neighbours: one vCPU$"),
        ("credit", {"beside": [{"budget_us": 1, "period_us": 2}]}, "neighbours are their weights"),
        ("rtds", {"beside": [256]}, "neighbours are budget/period"),
        ("deadline", {}, "beside SCHED=deadline have no model"),
        ("credit", {"vcpus": 2}, "SCHED=credit beside busy neighbours: one vCPU$"),
    ],
)
def test_neighbours_the_simulator_has_no_model_for_are_named(sched, extra, message):
    with pytest.raises(prediction.NotModelled, match=message):
        prediction.server(sched, {"beside": [256], **extra})


def test_the_prediction_takes_the_weights_and_the_pools_settings():
    arrivals, demands = light_records()
    serve = prediction.server("credit", {"beside": [256], "weight": 512, "ratelimit_us": 0})
    expected = credit_beside(arrivals, demands, 512, [256], ratelimit=0)
    assert np.array_equal(serve(arrivals, demands), expected)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_capped_vcpu_alone_is_served_as_the_lone_cap_model_serves_it(seed):
    # simulate.credit_cap was written for a capped domain alone in its pool: the model of the
    # whole CPU must agree with it record for record when there is no neighbour
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.integers(MS, 40 * MS, 300))
    demands = rng.integers(MS // 10, 15 * MS, 300)
    for cap in (10, 35, 80):
        alone = simulate.credit_cap(arrivals, demands, cap, phase=0)
        beside_nobody = credit_beside(arrivals, demands, neighbours=[], cap=cap, phase=0)
        assert np.array_equal(beside_nobody, alone), cap


def test_a_cap_below_the_weights_share_sets_the_share_beside_a_busy_neighbour():
    # 300 ms of work beside an always-busy neighbour of equal weight: half the CPU without a
    # cap (about 600 ms), a quarter with a cap of 25 (parked whenever it is a cap's credits in
    # debt): about 1,200 ms; a cap above the weight's share never gives more than that share
    alone = credit_beside([0], [300 * MS], neighbours=[256], phase=0)[0]
    capped = credit_beside([0], [300 * MS], neighbours=[256], phase=0, cap=25)[0]
    loose = credit_beside([0], [300 * MS], neighbours=[256], phase=0, cap=75)[0]
    assert 500 * MS < alone < 640 * MS
    assert capped == pytest.approx(1_200 * MS, rel=0.05)
    assert loose >= alone


def test_the_prediction_takes_a_credit_cap_beside_neighbours():
    arrivals, demands = light_records()
    serve = prediction.server("credit", {"beside": [256], "cap": 30})
    assert np.array_equal(serve(arrivals, demands), credit_beside(arrivals, demands, cap=30))


def test_a_neighbour_with_periodic_work_preempted_by_a_boosted_record_then_waited_for():
    # the neighbour runs 5 ms of every 25 ms from 0, first as UNDER (not woken). A record of
    # 2 ms at 1 ms wakes ours BOOSTed: the neighbour has run the rate limit, so ours preempts:
    # done at 3 ms. At 25 ms the neighbour wakes BOOSTed; a record at 26 ms is BOOSTed too and
    # waits (an equal priority does not preempt) until the neighbour's work is done at 30 ms,
    # then runs 3 ms: done at 33 ms
    neighbour = Neighbour(256, 5 * MS, 25 * MS)
    assert credit_beside([MS], [2 * MS], neighbours=[neighbour], phase=0).tolist() == [3 * MS]
    late = credit_beside([26 * MS], [3 * MS], neighbours=[neighbour], phase=0)
    assert late.tolist() == [33 * MS]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("work_ms", "period_ms"), [(6, 30), (15, 30), (3, 10)])
def test_a_busy_vcpu_gets_what_a_periodic_neighbour_leaves(model, work_ms, period_ms):
    arrivals = np.arange(3_000, dtype=np.int64) * MS  # 2 ms of work every 1 ms: never idle
    demands = np.full(3_000, 2 * MS)
    neighbour = Neighbour(256, work_ms * MS, period_ms * MS)
    done = model(arrivals, demands, neighbours=[neighbour])
    share = demands.sum() / (done[-1] - arrivals[0])
    assert share == pytest.approx(1 - work_ms / period_ms, abs=0.01)


@pytest.mark.parametrize("model", MODELS)
def test_a_light_periodic_neighbour_costs_less_than_an_always_busy_one(model):
    arrivals, demands = light_records()
    alone = simulate.unconstrained(arrivals, demands)
    light = model(arrivals, demands, neighbours=[Neighbour(256, MS, 30 * MS)])
    busy = model(arrivals, demands, neighbours=[256])
    assert (light >= alone).all()
    assert (light - arrivals).max() < (busy - arrivals).max()


@pytest.mark.parametrize("model", MODELS)
def test_a_neighbours_work_over_its_period_is_refused(model):
    with pytest.raises(ValueError, match="work from 1 ns to its period"):
        model([0], [MS], neighbours=[Neighbour(256, 40 * MS, 30 * MS)])
