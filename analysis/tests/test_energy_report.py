"""Energy beside latency: the table per configuration, the Pareto front and the section of the
report, from runs whose meta.json carries `energy` as the harness writes it."""

import argparse

import numpy as np
import pytest
from hvbench_analysis import tables
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.report.energy import energy_section
from hvbench_analysis.report.page import OutDirs, Page
from hvbench_analysis.synthetic import add_energy, write_run

MS = 1_000_000
# (power policy, latency scale in ms, joules over the measured window per repetition)
POLICIES = {
    "performance": ({"governor": "performance", "max_cstate": 1}, 1, (300.0, 320.0)),
    "powersave": ({"governor": "powersave"}, 3, (150.0, 170.0)),
    "deep-idle": ({"max_cstate": 6}, 4, (200.0, 220.0)),  # worse than powersave on both
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    for name, (policy, scale, joules) in POLICIES.items():
        for rep, spent in enumerate(joules, start=1):
            latency = np.arange(1, 101) * scale * MS // 10
            run = write_run(results / f"{name}-{rep}", latency, rep=rep, requested=policy)
            add_energy(run, spent)
    add_energy(write_run(results / "no-rapl", np.full(100, 2 * MS)), None)
    return load_runs(run_dirs(results))


def test_the_table_puts_energy_per_record_beside_latency(runs):
    table = tables.energy_table(runs.measured, runs.runs)
    rows = {r["Configuration"]: r for _, r in table.iterrows()}
    assert set(rows) == {
        "bare/none [performance, C-state ≤ 1]",
        "bare/none [powersave]",
        "bare/none [C-state ≤ 6]",
        "bare/none",
    }
    performance = rows["bare/none [performance, C-state ≤ 1]"]
    assert performance["Runs"] == 2
    assert performance["mj_per_record"] == pytest.approx(3100.0)  # 310 J over 100 records
    assert performance["Energy / record (mJ)"].startswith("3100.00 [")
    assert performance["Mean power (W)"].startswith("31.00 [")
    assert performance["p99_ms"] == pytest.approx(9.9)
    assert performance["Energy source"] == "powercap"
    plain = rows["bare/none"]
    assert plain["Energy / record (mJ)"] == "n/a" and np.isnan(plain["mj_per_record"])
    assert plain["Energy source"].startswith("not available: host: powercap: ")


def test_the_pareto_front_keeps_what_nothing_beats_on_both():
    points = [(3.1, 9.9), (1.6, 29.7), (2.1, 39.6), (3.5, 9.0)]
    assert tables.pareto_front(points) == [1, 0, 3]
    assert tables.pareto_front([]) == []


def test_the_report_section_has_the_table_and_the_figure(runs, tmp_path):
    page = Page("test")
    dirs = OutDirs(tmp_path / "figures", tmp_path / "tables", tmp_path / "hdr")
    energy_section(page, runs, argparse.Namespace(seed=0), dirs)
    html = page.render()
    assert "Energy: latency against power" in html
    assert "bare/none [powersave]" in html and "n/a" in html
    assert (tmp_path / "figures" / "latency_vs_energy.svg").stat().st_size > 0
    assert "powersave" in (tmp_path / "tables" / "energy.md").read_text()
