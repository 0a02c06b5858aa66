"""Every run the report leaves out is named with the reason, in its output and on the page:
a run that failed, a run whose records were all warm-up (no measured sample), a run that
cannot be read. Real run directories (synthetic.write_run), a real report."""

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import report
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.synthetic import write_run

MS = 1_000_000
ALL_WARMUP = "no measured samples: all 60 records received fell in WARMUP=1 s"  # synthetic: 1 s


def results_with_every_kind(folder):
    write_run(folder / "ok", np.full(10, 2 * MS))
    write_run(folder / "short", np.array([], dtype=np.int64), warmup=60)  # RECORDS=60
    write_run(folder / "broke", np.full(10, 9 * MS), state="failed", reason="the job exited")
    (folder / "torn").mkdir()
    (folder / "torn" / "meta.json").write_text("{")
    return folder


def test_a_run_with_only_warmup_records_is_left_out_with_its_reason(tmp_path):
    results = results_with_every_kind(tmp_path / "results")
    runs = load_runs(run_dirs(results), include_warmup=True)
    assert runs.runs["run_id"].tolist() == ["ok"]
    reasons = {r.run_id: (r.state, r.reason) for r in runs.left_out}
    assert reasons == {
        "short": ("completed", ALL_WARMUP),
        "broke": ("failed", "the job exited"),
    }
    assert [name for name, _ in runs.skipped] == ["torn"]
    # with the failed runs included, the warm-up-only run is still left out
    included = load_runs(run_dirs(results), include_failed=True)
    assert sorted(included.runs["run_id"]) == ["broke", "ok"]
    assert [r.run_id for r in included.left_out] == ["short"]


def test_the_report_names_every_run_it_leaves_out_and_why(tmp_path, capsys):
    results = results_with_every_kind(tmp_path / "results")
    out = tmp_path / "report"
    assert report.main(["--results", str(results), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"left out short (completed): {ALL_WARMUP}" in err
    assert "left out broke (failed): the job exited" in err
    assert "skipped torn: " in err
    table = pd.read_csv(out / "tables" / "runs_left_out.csv", keep_default_na=False)
    assert sorted(table[["run_id", "state"]].values.tolist()) == [
        ["broke", "failed"],
        ["short", "completed"],
        ["torn", "unreadable"],
    ]
    page = (out / "index.html").read_text()
    assert "Runs left out of the statistics" in page
    assert ALL_WARMUP in page and "the job exited" in page and "torn" in page


def test_only_warmup_runs_make_the_report_say_so(tmp_path):
    write_run(tmp_path / "short", np.array([], dtype=np.int64), warmup=60)
    with pytest.raises(SystemExit) as refused:
        report.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "no completed runs with measured samples" in str(refused.value)
    assert "short: completed, " + ALL_WARMUP in str(refused.value)
    assert not (tmp_path / "out").exists()
