import numpy as np
import pytest
from hvbench_analysis import compare, stats
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.synthetic import write_run

MS = 1_000_000


@pytest.mark.parametrize("runs_per_config", [5, 10])
def test_intervals_cover_the_true_mean_at_about_the_nominal_rate(runs_per_config):
    """Per-run statistics of normal runs (the mean and, by symmetry, the median have the true
    mean as expectation): the 95 % interval must cover it in about 95 % of trials."""
    rng = np.random.default_rng(42)
    trials, covered_mean, covered_median = 400, 0, 0
    for _ in range(trials):
        runs = rng.normal(10.0, 2.0, size=(runs_per_config, 200))
        low, high = compare.bootstrap_mean_ci(runs.mean(axis=1), rng)
        covered_mean += low <= 10.0 <= high
        low, high = compare.bootstrap_mean_ci(np.median(runs, axis=1), rng)
        covered_median += low <= 10.0 <= high
    assert 0.90 <= covered_mean / trials <= 0.99
    assert 0.90 <= covered_median / trials <= 0.99


def old_bootstrap_mean_cis(values, rng, level=compare.LEVEL):
    """bootstrap_mean_cis as it was: np.quantile over all 10,000 resampled means."""
    n = len(values)
    picks = rng.integers(0, n, size=(compare.RESAMPLES, n))
    slots = picks + n * np.arange(compare.RESAMPLES)[:, None]
    counts = np.bincount(slots.ravel(), minlength=compare.RESAMPLES * n).reshape(-1, n)
    alpha = compare.expanded_alpha(n, level)
    return np.quantile(counts @ values / n, [alpha, 1 - alpha], axis=0)


@pytest.mark.parametrize("runs", range(2, 9))
def test_intervals_are_the_same_numbers_as_sorting_every_resample(runs):
    """Few runs: the intervals come from the distinct resamples counted; they must be the
    numbers, to the bit, that np.quantile over all 10,000 gave (the report's tables are
    compared byte for byte), with ties, equal runs, a negative zero and a single column."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        values = rng.lognormal(0, 2, (runs, int(rng.integers(1, 40))))
        if seed % 3 == 0:
            values[1] = values[0]  # two runs alike
        if seed % 4 == 0:
            values = np.round(values, 1)  # ties between columns' resamples
        if seed % 5 == 0:
            values[:, 0] = -0.0
        new = compare.bootstrap_mean_cis(values, np.random.default_rng(seed))
        old = old_bootstrap_mean_cis(values, np.random.default_rng(seed))
        assert np.asarray(new).tobytes() == old.tobytes()


def test_counted_quantiles_are_numpys_on_the_repeated_values():
    rng = np.random.default_rng(5)
    levels = [0.0, 1e-9, 0.025, 1 / 3, 0.5, 0.975, 1 - 1e-9, 1.0, 1e-70]
    for _ in range(200):
        distinct = int(rng.integers(1, 30))
        # ties (rounded), not both zeros: numpy may pick either of 0 and −0, equal values
        values = np.round(rng.normal(0, 10, (distinct, 7)), int(rng.integers(0, 3))) + 0.0
        times = rng.integers(1, 50, distinct)
        expected = np.quantile(np.repeat(values, times, axis=0), levels, axis=0)
        assert stats.counted_quantiles(values, times, levels).tobytes() == expected.tobytes()


def test_difference_interval_covers_the_true_difference():
    rng = np.random.default_rng(7)
    trials, covered, excludes_zero = 300, 0, 0
    for _ in range(trials):
        a = rng.normal(12.0, 1.0, 6)
        b = rng.normal(9.0, 1.0, 6)
        low, high = compare.bootstrap_difference_ci(a, b, rng)
        covered += low <= 3.0 <= high
        excludes_zero += low > 0
    assert 0.88 <= covered / trials <= 0.99
    assert excludes_zero / trials > 0.9  # a 3-SD difference is seen from six runs a side


def test_ks_detects_a_shift_and_not_an_identical_distribution():
    rng = np.random.default_rng(3)
    base = rng.lognormal(np.log(5e6), 0.3, 20_000)
    same = rng.lognormal(np.log(5e6), 0.3, 20_000)
    shifted = rng.lognormal(np.log(5e6), 0.3, 20_000) + 0.3e6  # +0.3 ms
    d_same, p_same = compare.ks_test(base, same)
    d_shift, p_shift = compare.ks_test(base, shifted)
    assert p_same > 0.05 and d_same < 0.02
    assert p_shift < 1e-6 and d_shift > 0.05
    assert compare.ks_test(base, base) == (0.0, 1.0)


def test_repetitions_and_reference_comparison_from_runs(tmp_path):
    rng = np.random.default_rng(5)
    for rep in range(1, 4):
        write_run(
            tmp_path / f"ref-{rep}", rng.normal(10, 1, 2000).clip(1) * MS, sched="credit", rep=rep
        )
        write_run(
            tmp_path / f"rt-{rep}",
            rng.normal(6, 1, 2000).clip(1) * MS,
            sched="rtds",
            budget=50000,
            period=100000,
            rep=rep,
        )
    write_run(tmp_path / "single", rng.normal(8, 1, 2000).clip(1) * MS, sched="credit2")
    runs = load_runs(run_dirs(tmp_path))
    per_run = compare.per_run(runs.measured)
    assert len(per_run) == 7
    reps = compare.repetitions(per_run)
    assert sorted(reps["sched"]) == ["credit", "rtds"]  # the single run has no interval
    rtds = reps[reps["sched"] == "rtds"].iloc[0]
    assert rtds["runs"] == 3
    assert rtds["p50_ms_ci_low"] <= rtds["p50_ms"] <= rtds["p50_ms_ci_high"]
    against = compare.against_reference(runs.measured, per_run, {"sched": "credit"})
    assert sorted(against["sched"]) == ["credit2", "rtds"]
    rt = against[against["sched"] == "rtds"].iloc[0]
    assert rt["mean_ms_diff"] == pytest.approx(-4.0, abs=0.2)
    assert rt["mean_ms_diff_ci_low"] < -3.5 and rt["mean_ms_diff_ci_high"] > -4.5
    assert rt["ks_p"] < 1e-9
    single = against[against["sched"] == "credit2"].iloc[0]
    assert np.isnan(single["mean_ms_diff_ci_low"])  # one run: no interval, still a KS test
    assert single["ks_d"] > 0.5
    with pytest.raises(ValueError, match="no run matches"):
        compare.against_reference(runs.measured, per_run, {"sched": "fifo"})


def test_selectors():
    assert compare.parse_selector("sched=rtds,budget=77500") == {"sched": "rtds", "budget": "77500"}
    assert compare.parse_selector("run-7") == {"run_id": "run-7"}
