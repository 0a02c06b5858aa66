"""The interference table and figures: runs that differ only in their neighbours are rows of
one comparison, in the second reference study's layout (Mean, Min, Max, SD, % over the
deadline), with intervals over repetitions."""

import argparse
import json

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import tables
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.report.interference import interference_section
from hvbench_analysis.report.page import OutDirs, Page
from hvbench_analysis.synthetic import write_run

MS = 1_000_000
NOISES = {
    "quiet": {"job_cpus": "1"},
    "on-job": {"noise": "1:cpu", "noise_cpus": "job", "job_cpus": "1"},
    "apart": {"noise": "1:cpu", "noise_cpus": "apart", "job_cpus": "1"},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    for name, requested in NOISES.items():
        for rep in (1, 2):
            scale = 30 if name == "on-job" else 2  # ms: the noise on the job's CPU slows it
            latency = np.arange(1, 101) * scale * MS // 10 + rep * MS
            write_run(results / f"{name}-{rep}", latency, rep=rep, requested=requested)
    write_run(results / "old", np.full(10, 5 * MS))  # before schema 5: no neighbours at all
    for rep, rate in ((1, 1900.0), (2, 2100.0)):  # what stress-ng reported, as the harness keeps it
        meta_file = results / f"on-job-{rep}" / "meta.json"
        meta = json.loads(meta_file.read_text())
        metrics = [{"stressor": "cpu", "bogo-ops-per-second-real-time": rate}]
        meta["noise"] = {"groups": [{"group": "1:cpu", "metrics": metrics}]}
        meta_file.write_text(json.dumps(meta))
    return load_runs(run_dirs(results))


@pytest.fixture(scope="module")
def measured(runs):
    return runs.measured


def test_one_row_per_neighbours_with_the_studys_columns(runs, measured):
    work = dict(zip(runs.runs["run_id"], runs.runs["noise_work"], strict=True))
    table = tables.interference_table(measured, deadline_ms=100, noise_work=work)
    rows = {r["Neighbours"]: r for _, r in table.iterrows()}
    assert set(rows) == {
        "none (job on CPU 1)",
        "1:cpu on the job's CPUs (job on CPU 1)",
        "1:cpu on other CPUs (job on CPU 1)",
        "none",
    }
    assert set(table["Configuration"]) == {"bare/none"}
    on_job = rows["1:cpu on the job's CPUs (job on CPU 1)"]
    values = np.concatenate([np.arange(1, 101) * 3 + rep for rep in (1, 2)])  # ms
    assert on_job["Mean (ms)"] == pytest.approx(values.mean())
    assert on_job["Min (ms)"] == pytest.approx(values.min())
    assert on_job["Max (ms)"] == pytest.approx(values.max())
    assert on_job["SD (ms)"] == pytest.approx(values.std(ddof=1))
    assert on_job["% > 100 ms"] == pytest.approx(100 * np.mean(values > 100))
    assert on_job["Runs"] == 2 and on_job["Mean over runs (ms) [95 % CI]"].startswith("153.00 [")
    assert rows["none"]["Runs"] == 1 and rows["none"]["% > 100 ms"] == 0
    assert on_job["Load work (bogo-ops/s)"] == pytest.approx(2000.0)
    assert pd.isna(rows["none"]["Load work (bogo-ops/s)"])
    assert "Copies (records/s)" not in table  # no run had a copy of the workload


def test_the_copies_of_the_workload_show_what_they_received(tmp_path):
    """NOISE=N:workload: the records per second the copies received, summed per run and
    averaged over the runs, as meta.json `noise` keeps them (bare: groups, testbed: loads)."""
    for rep, (key, rates) in enumerate((("groups", [50.0]), ("loads", [40.0, 50.0])), start=1):
        run = tmp_path / f"copies-{rep}"
        write_run(run, np.arange(1, 11) * MS, rep=rep, requested={"noise": f"{rep}:workload"})
        meta = json.loads((run / "meta.json").read_text())
        copies = [{"group": "1:workload", "stressor": "workload", "records_per_s": r}
                  for r in rates]  # fmt: skip
        meta["noise"] = {key: copies}
        (run / "meta.json").write_text(json.dumps(meta))
    runs = load_runs(run_dirs(tmp_path))
    copies = dict(zip(runs.runs["run_id"], runs.runs["copy_work"], strict=True))
    table = tables.interference_table(runs.measured, None, copy_work=copies)
    by_noise = dict(zip(table["Neighbours"], table["Copies (records/s)"], strict=True))
    assert by_noise == {"1:workload": 50.0, "2:workload": 90.0}


def test_the_section_overlays_each_configuration_by_its_neighbours(runs, tmp_path):
    page = Page("t")
    dirs = OutDirs(tmp_path / "figures", tmp_path / "tables", tmp_path / "hdr")
    args = argparse.Namespace(deadline_ms=None, seed=0, xlim_ms=None)
    interference_section(page, runs, args, dirs)
    html = page.render()
    assert "Interference: latency by neighbours" in html and "DEADLINE_MS" in html
    assert (tmp_path / "tables/interference.tex").exists()
    names = sorted(p.name for p in (tmp_path / "figures").glob("*.svg"))
    assert names == ["density_noise_bare_none.svg", "ecdf_noise_bare_none.svg"]


def test_no_section_without_neighbours(tmp_path):
    write_run(tmp_path / "r" / "a", np.full(10, 5 * MS))
    page = Page("t")
    dirs = OutDirs(tmp_path / "f", tmp_path / "t", tmp_path / "h")
    args = argparse.Namespace(deadline_ms=None, seed=0, xlim_ms=None)
    interference_section(page, load_runs(run_dirs(tmp_path / "r")), args, dirs)
    assert "Interference" not in page.render()
