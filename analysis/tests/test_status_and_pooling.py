"""Runs that did not complete, runs that measured differently, and the quality flags: real run
directories written by synthetic.write_run, read by load_runs and built into a real report."""

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import report
from hvbench_analysis.load import LeftOut, load_runs, run_dirs
from hvbench_analysis.synthetic import write_run
from hvbench_analysis.tables import percentile_table

MS = 1_000_000
BROKER_EXITED = "the broker exited with code 1 while sending"


def runs_per_label(folder) -> dict[str, int]:
    """{configuration label: runs pooled in it} of the runs in `folder`."""
    table = percentile_table(load_runs(run_dirs(folder)).measured)
    return dict(zip(table["configuration"], table["runs"], strict=True))


def csv_table(out, name) -> pd.DataFrame:
    return pd.read_csv(out / "tables" / f"{name}.csv", keep_default_na=False)


@pytest.fixture
def one_failed(tmp_path):
    """Two runs of one configuration: one completed, one that failed while sending."""
    results = tmp_path / "results"
    write_run(results / "ok", np.full(10, 2 * MS))
    write_run(results / "broke", np.full(10, 9 * MS), state="failed", reason=BROKER_EXITED)
    return results


def test_a_failed_run_is_left_out_by_default_and_listed_with_its_reason(one_failed, tmp_path):
    runs = load_runs(run_dirs(one_failed))
    assert runs.runs["run_id"].tolist() == ["ok"]
    assert set(runs.samples["run_id"]) == {"ok"}
    assert runs.left_out == [LeftOut("broke", "bare/none", "failed", "sending", BROKER_EXITED)]
    out = tmp_path / "report"
    assert report.main(["--results", str(one_failed), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Runs left out of the statistics" in page and BROKER_EXITED in page
    left_out = csv_table(out, "runs_left_out")
    assert left_out[["run_id", "state", "reason"]].values.tolist() == [
        ["broke", "failed", BROKER_EXITED]
    ]
    by_config = csv_table(out, "percentiles_by_config")
    assert by_config[["runs", "max_ms", "flags"]].values.tolist() == [[1, 2.0, ""]]


def test_a_failed_run_is_included_and_flagged_when_asked(one_failed, tmp_path):
    runs = load_runs(run_dirs(one_failed), include_failed=True)
    assert runs.left_out == []
    flags = dict(zip(runs.runs["run_id"], runs.runs["flags"], strict=True))
    assert flags == {"broke": "failed", "ok": ""}
    out = tmp_path / "report"
    assert report.main(["--results", str(one_failed), "--out", str(out), "--include-failed"]) == 0
    assert "Runs left out of the statistics" not in (out / "index.html").read_text()
    by_config = csv_table(out, "percentiles_by_config")
    assert by_config[["runs", "max_ms", "flags"]].values.tolist() == [[2, 9.0, "failed"]]


def test_only_failed_runs_make_the_report_point_to_include_failed(tmp_path):
    write_run(tmp_path / "stopped", np.full(5, MS), state="interrupted", reason="SIGINT")
    with pytest.raises(SystemExit, match=r"no completed runs.*stopped: interrupted.*--include"):
        report.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])


def test_runs_that_differ_only_in_warmup_are_two_configurations_named_by_it(tmp_path):
    write_run(tmp_path / "long-warmup", np.full(10, MS), requested={"warmup_s": 10.0})
    write_run(tmp_path / "short-warmup", np.full(10, MS), requested={"warmup_s": 2.0})
    for rep in (1, 2):  # the same warm-up: pooled, and the label stays short
        write_run(tmp_path / f"credit-{rep}", np.full(10, MS), sched="credit", rep=rep)
    assert runs_per_label(tmp_path) == {
        "bare/credit": 2,
        "bare/none warm-up 10 s": 1,
        "bare/none warm-up 2 s": 1,
    }


def test_runs_that_differ_only_in_records_are_two_configurations_named_by_them(tmp_path):
    write_run(tmp_path / "short", np.full(10, MS))
    write_run(tmp_path / "long", np.full(120, MS))
    assert runs_per_label(tmp_path) == {"bare/none 10 records": 1, "bare/none 120 records": 1}


def test_runs_that_send_by_group_are_a_configuration_of_their_own(tmp_path):
    write_run(tmp_path / "six", np.full(10, MS))  # six groups, a record a message: no label
    grouped = {"producers": 1, "messages": "group"}
    write_run(tmp_path / "one-group", np.full(10, MS), requested=grouped)
    write_run(tmp_path / "two-pairs", np.full(10, MS), requested={"clients": 2})
    assert runs_per_label(tmp_path) == {
        "bare/none": 1,
        "bare/none (1 group, by group)": 1,
        "bare/none (6 groups, 2 client pairs)": 1,
    }


def test_flags_beside_each_run_and_each_configuration(tmp_path):
    write_run(tmp_path / "clean", np.full(10, MS))
    write_run(tmp_path / "lossy", np.full(8, MS), missing=2)  # 10 records asked, as the others
    restart = {"part": "broker", "event": "restarted", "exit_code": 137, "at_s": 12.5}
    write_run(tmp_path / "restarted", np.full(10, MS), faults=[restart | {"detail": "OOM"}])
    write_run(tmp_path / "forced", np.full(10, MS), requested={"force": True})
    counts = {"foreign_results": 3, "contradictions": 1, "accounted": False}
    write_run(tmp_path / "odd", np.full(10, MS), sched="credit", counts=counts)
    out = tmp_path / "report"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    runs = csv_table(out, "runs").set_index("run_id")["flags"].to_dict()
    assert runs == {
        "clean": "",
        "lossy": "unaccounted",
        "restarted": "broker restarted",
        "forced": "forced checks",
        "odd": "unaccounted, foreign records, contradictions",
    }
    by_config = csv_table(out, "percentiles_by_config").set_index("configuration")
    assert by_config["flags"].to_dict() == {
        "bare/credit": "unaccounted, foreign records, contradictions",
        "bare/none": "unaccounted, broker restarted",
        "bare/none forced checks": "forced checks",
    }
    assert by_config.loc["bare/none", "runs"] == 3  # unaccounted runs stay in, flagged
    page = (out / "index.html").read_text()
    assert "Faults: broker restarted at 12.5 s (exit 137): OOM." in page
