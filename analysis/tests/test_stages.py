"""Stage legs: the job's clock against the sender's, and where each record's time went."""

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import stages, synthetic
from hvbench_analysis.load import load_runs

RNG = np.random.default_rng(7)


def records(n: int, offset_ns: float, drift_ppm: float = 0.0) -> pd.DataFrame:
    """n records 16.7 ms apart whose legs are random (input 0.5–5 ms, job 1–3 ms, output
    0.5–5 ms), stamped by a job whose clock is offset_ns ahead and runs drift_ppm fast."""
    sent = 1e12 + np.arange(n) * 16.7e6
    inp, job, out = (RNG.uniform(a, b, n) for a, b in ((0.5e6, 5e6), (1e6, 3e6), (0.5e6, 5e6)))
    job_in = sent + inp
    skew = offset_ns + (job_in - sent[0]) * drift_ppm * 1e-6
    return pd.DataFrame(
        {
            "sent_ns": sent,
            "job_in_ns": job_in + skew,
            "job_out_ns": job_in + job + skew,
            "received_ns": job_in + job + out,
            "latency_ns": inp + job + out,
            "true_input": inp,
        }
    )


def test_the_run_calibration_means_no_offset():
    relation = stages.clock_relation(records(50, 0), shared=True)
    assert relation == {"method": "one calibration", "known": True, "offset_ns": 0, "bound_ns": 0}


@pytest.mark.parametrize("offset_ns", [-3.7e12, 0.0, 41e9])
def test_causal_bounds_contain_the_true_offset(offset_ns):
    relation = stages.clock_relation(records(1000, offset_ns), shared=False)
    assert relation["known"]
    for end in ("start", "end"):
        found = relation[end]
        assert found["low_ns"] <= offset_ns <= found["high_ns"]
        assert abs(found["offset_ns"] - offset_ns) <= found["bound_ns"]
        assert found["records"] == stages.WINDOW
    # no leg is under 0.5 ms, so the doubt is at least that; the fastest of 200 records
    # come close to it
    assert 0.5e6 <= relation["bound_ns"] < 0.6e6


def test_the_legs_follow_a_drifting_clock_and_add_up_to_the_latency():
    samples = records(5000, 2e9, drift_ppm=20)  # 20 ppm over 83 s: 1.7 ms of drift
    relation = stages.clock_relation(samples, shared=False)
    legs = stages.legs(samples, relation)
    total = legs["input_leg_ns"] + legs["job_ns"] + legs["output_leg_ns"]
    assert np.allclose(total, samples["latency_ns"], atol=1)
    error = (legs["input_leg_ns"] - samples["true_input"]).abs()
    assert error.max() <= relation["bound_ns"] + 0.1e6  # + what drift within a window adds


def test_contradicting_stamps_leave_the_offset_unknown_and_the_legs_empty():
    samples = records(300, 0.0)
    samples.loc[5, "job_in_ns"] = samples.loc[5, "sent_ns"] - 1e9  # reached the job 1 s early
    samples.loc[6, "job_out_ns"] = samples.loc[6, "received_ns"] + 1e9  # left after it came back
    relation = stages.clock_relation(samples, shared=False)
    assert not relation["known"] and "contradict" in relation["reason"]
    legs = stages.legs(samples, relation)
    assert legs["input_leg_ns"].isna().all() and legs["output_leg_ns"].isna().all()
    assert (legs["job_ns"] > 0).all()  # the job's own work needs one clock only


def test_runs_without_job_stamps_have_no_legs():
    samples = records(10, 0.0).drop(columns=["job_in_ns", "job_out_ns"])
    assert stages.clock_relation(samples, shared=False)["known"] is False
    assert stages.legs(samples, None).isna().all().all()


def test_the_breakdown_names_the_leg_that_made_the_tail():
    samples = records(2000, 0.0)
    slow = samples.index[-5:]  # five records wait 40 ms before the job sees them
    for column in ("job_in_ns", "job_out_ns", "received_ns"):
        samples.loc[slow, column] += 40e6
    samples.loc[slow, "latency_ns"] += 40e6
    group = samples.join(stages.legs(samples, stages.clock_relation(samples, shared=True)))
    found = stages.breakdown(group)
    assert found["tail records"] == 3  # at or over the p99.9 of 2000 (rank 1998)
    assert found["tail share input leg (%)"] > 85
    assert 40.5 <= found["input leg max (ms)"] <= 45
    shares = [found[f"tail share {name} (%)"] for name in stages.LEG_NAMES.values()]
    assert sum(shares) == pytest.approx(100)
    with_deadline = stages.breakdown(group, deadline_ms=30)
    assert with_deadline["tail records"] == 5 and with_deadline["tail from (ms)"] == 30
    bands = stages.by_band(group)
    assert list(bands["band"]) == [name for name, _, _ in stages.BANDS]
    assert bands["records"].sum() == len(group)
    top = bands.iloc[-1]
    assert top["input leg"] > 40 and top["job"] < 3.1


def old_breakdown_and_bands(group: pd.DataFrame, deadline_ms=None) -> tuple[dict, pd.DataFrame]:
    """breakdown and by_band as they were, on a copy of the table's rows with their legs."""
    from hvbench_analysis.stats import percentile

    rows = group[[*stages.LEGS, "latency_ns"]].dropna()
    out = {"records": len(rows)}
    for leg in stages.LEGS:
        ms = rows[leg].to_numpy() / 1e6
        name = stages.LEG_NAMES[leg]
        out[f"{name} p50 (ms)"] = float(percentile(ms, 50))
        out[f"{name} p99 (ms)"] = float(percentile(ms, 99))
        out[f"{name} max (ms)"] = float(ms.max())
    latency = rows["latency_ns"].to_numpy(np.float64)
    threshold = stages.tail_threshold_ns(latency, deadline_ms)
    tail = rows[latency >= threshold]
    out["tail from (ms)"] = threshold / 1e6
    out["tail records"] = len(tail)
    total = tail["latency_ns"].sum()
    for leg in stages.LEGS:
        share = 100 * tail[leg].sum() / total if len(tail) else float("nan")
        out[f"tail share {stages.LEG_NAMES[leg]} (%)"] = float(share)
    bands = []
    for name, low, high in stages.BANDS:
        above = latency > percentile(latency, low) if low > 0 else np.ones(len(latency), bool)
        within = above & (latency <= percentile(latency, high))
        if within.any():
            means = {stages.LEG_NAMES[leg]: rows[leg][within].mean() / 1e6 for leg in stages.LEGS}
            bands.append({"band": name, "records": int(within.sum()), **means})
    return out, pd.DataFrame(bands)


@pytest.mark.parametrize("seed", range(6))
def test_the_legs_statistics_are_the_same_numbers_as_from_a_copy_of_the_table(seed):
    """From the columns as arrays: the numbers, to the bit, of the table copy they came from
    before (the report's tables are compared byte for byte), records without legs included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 5000))
    group = pd.DataFrame({leg: rng.lognormal(14, 1, n) for leg in stages.LEGS})
    group["latency_ns"] = rng.integers(1_000_000, 90_000_000, n)
    if seed % 2:
        group.loc[rng.choice(n, n // 10, replace=False), "job_ns"] = np.nan
    for deadline_ms in (None, 40.0):
        old, old_bands = old_breakdown_and_bands(group, deadline_ms)
        new = stages.breakdown(group, deadline_ms)
        assert list(new) == list(old)
        bits = [np.float64(new[k]).tobytes() == np.float64(old[k]).tobytes() for k in old]
        assert all(bits), [k for k, same in zip(old, bits, strict=True) if not same]
    pd.testing.assert_frame_equal(stages.by_band(group), old_bands, check_exact=True)


def test_loaded_runs_carry_the_legs_of_a_run_on_another_clock(tmp_path):
    latency = np.full(600, 10e6)
    synthetic.write_run(tmp_path / "own-clock", latency, job_offset_ns=7 * 10**12)
    synthetic.write_run(tmp_path / "one-clock", latency)
    synthetic.write_run(tmp_path / "before-stamps", latency, job_offset_ns=None)
    runs = load_runs(sorted(tmp_path.iterdir()))
    by_run = runs.samples.groupby("run_id", observed=True)
    legs = by_run[list(stages.LEGS)].median()
    assert legs.loc["one-clock"].tolist() == pytest.approx([4e6, 2e6, 4e6])
    # the synthetic legs never vary, so the causal interval is 4 ms + 4 ms wide: the middle
    assert legs.loc["own-clock"].tolist() == pytest.approx([4e6, 2e6, 4e6], abs=1)
    assert legs.loc["before-stamps"].isna().all()
