"""The results contract: one writer, one reader, and runs written before the schema version still
load (data/v1-bare-cfs-quota is a real run written by the harness before this contract had a
version: 36 records, cfs-quota 80000/100000 us, one malformed record)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import report, results
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.synthetic import write_run

V1_RUN = Path(__file__).parent / "data" / "v1-bare-cfs-quota"


def test_a_written_run_reads_back_with_its_version_and_files(tmp_path):
    folder = write_run(tmp_path / "r", np.full(10, 2_000_000), sched="deadline", budget=5000)
    meta = results.read_meta(folder)
    assert meta["schema"] == results.SCHEMA_VERSION
    assert meta["files"] == {"samples": "samples.csv", "samples_parquet": "samples.parquet"}
    assert json.loads((folder / "meta.json").read_text())["schema"] == results.SCHEMA_VERSION
    samples = results.read_samples(folder)
    assert set(samples.columns) == {*results.SAMPLE_COLUMNS, *results.OPTIONAL_COLUMNS}
    # a run from before the job's stamps has the contract's columns and the send stamp
    assert set(results.read_samples(V1_RUN).columns) == {*results.SAMPLE_COLUMNS, "sent_ns"}
    assert samples["latency_ns"].tolist() == [2_000_000.0] * 10


def test_a_run_from_before_the_version_is_upgraded_when_read():
    raw = json.loads((V1_RUN / "meta.json").read_text())
    assert "schema" not in raw and "extratime" not in raw["requested"]
    meta = results.read_meta(V1_RUN)
    assert meta["schema"] == results.SCHEMA_VERSION
    assert meta["requested"]["budget_us"] == 80000
    assert {k: meta["requested"][k] for k in ("priority", "extratime", "weight", "cap")} == {
        "priority": None,
        "extratime": None,
        "weight": None,
        "cap": None,
    }
    assert meta["requested"]["scale"] == "one" and meta["requested"]["taskmanagers"] is None
    assert (meta["requested"]["network"], meta["requested"]["detectors"]) == ("freeway", 6)
    # before 11 a Xen pool ran with its boot slice and rate limit: not recorded
    assert (meta["requested"]["tslice_us"], meta["requested"]["ratelimit_us"]) == (None, None)


def test_a_run_from_before_the_version_loads_into_the_report(tmp_path):
    folder = tmp_path / "results"
    shutil.copytree(V1_RUN, folder / V1_RUN.name)
    write_run(folder / "new-run", np.full(20, 3_000_000), sched="cfs-quota", budget=80000)
    runs = load_runs(run_dirs(folder))
    assert runs.skipped == []
    old = runs.runs.set_index("run_id").loc[V1_RUN.name]
    assert (old["sched"], old["budget"], old["sent"], old["accounted"]) == (
        "cfs-quota",
        80000,
        36,
        True,
    )
    assert report.main(["--results", str(folder), "--out", str(tmp_path / "report")]) == 0
    assert V1_RUN.name in (tmp_path / "report" / "index.html").read_text()


def test_a_newer_schema_is_refused_by_name(tmp_path):
    folder = write_run(tmp_path / "r", np.full(3, 1_000_000))
    meta = json.loads((folder / "meta.json").read_text())
    meta["schema"] = results.SCHEMA_VERSION + 1
    (folder / "meta.json").write_text(json.dumps(meta))
    newest = results.SCHEMA_VERSION
    with pytest.raises(results.ResultsError, match=rf"this code reads 1\.\.{newest}$"):
        results.read_meta(folder)


def test_samples_without_the_contracts_columns_are_not_written(tmp_path):
    samples = results.read_samples(V1_RUN).drop(columns=["warmup"])
    with pytest.raises(results.ResultsError, match="lack column"):
        results.write_run(tmp_path / "r", {"run_id": "r"}, samples)
    assert not (tmp_path / "r" / "meta.json").exists()


def test_a_version_2_run_is_upgraded_to_a_completed_run_without_faults(tmp_path):
    folder = write_run(tmp_path / "v2", np.full(10, 2_000_000))
    meta = json.loads((folder / "meta.json").read_text())
    meta["schema"] = 2
    del meta["status"], meta["faults"]
    for key in results.COUNT_KEYS_3:
        del meta["counts"][key]
    (folder / "meta.json").write_text(json.dumps(meta))
    upgraded = results.read_meta(folder)
    assert upgraded["status"] == {"state": "completed", "reason": None, "phase": None}
    assert upgraded["faults"] == []
    assert {key: upgraded["counts"][key] for key in results.COUNT_KEYS_3} == {
        "foreign_results": 0,
        "foreign_dead_letters": 0,
        "contradictions": 0,
        "dead_letters_lost": 0,
    }
    runs = load_runs([folder])
    assert (runs.runs.loc[0, "state"], runs.runs.loc[0, "flags"], runs.left_out) == (
        "completed",
        "",
        [],
    )


def test_a_version_7_run_reads_as_a_record_a_message_from_one_client_pair(tmp_path):
    folder = write_run(tmp_path / "v7", np.full(10, 2_000_000))
    meta = json.loads((folder / "meta.json").read_text())
    meta["schema"] = 7
    meta["requested"].pop("messages", None)
    meta["requested"].pop("clients", None)
    (folder / "meta.json").write_text(json.dumps(meta))
    requested = results.read_meta(folder)["requested"]
    assert (requested["messages"], requested["clients"]) == ("record", 1)
    assert load_runs([folder]).runs.loc[0, "load"] == ""


# Runs written by the writer of schema 6 and of schema 11 (synthetic.write_run as each version
# had it): two SCHED=deadline budgets × two repetitions of 240 measured records after 12 warm-up
# (the second repetition missing one record), made by data/make_old_runs.py with each version.
OLD_FOLDERS = [Path(__file__).parent / "data" / f"v{v}-deadline-bare" for v in (6, 11)]


@pytest.mark.parametrize("folder", OLD_FOLDERS, ids=lambda f: f.name)
def test_runs_of_older_schemas_load_upgraded_and_report(folder, tmp_path):
    version = json.loads((next(folder.iterdir()) / "meta.json").read_text())["schema"]
    assert version < results.SCHEMA_VERSION
    runs = load_runs(run_dirs(folder))
    assert runs.skipped == [] and runs.left_out == [] and len(runs.runs) == 4
    for run in runs.runs.itertuples():
        meta = results.read_meta(folder / run.run_id)
        results.check_sections(meta)  # what it has is what this version's writer may write
        assert meta["requested"]["sched"] == "deadline" and meta["status"]["state"] == "completed"
        samples = results.read_samples(folder / run.run_id)
        measured = samples.loc[(samples["copies"] > 0) & ~samples["warmup"], "latency_ns"]
        assert len(measured) == 240 and len(samples) == 252 + (run.rep - 1)  # 12 warm-up, missing
    out = tmp_path / "report"
    assert report.main(["--results", str(folder), "--out", str(out)]) == 0
    table = (out / "tables" / "percentiles_by_config.csv").read_text()
    assert "20000" in table and "50000" in table


def test_nanoseconds_are_written_as_integers_and_a_missing_one_as_an_empty_field(tmp_path):
    synthetic = write_run(tmp_path / "synthetic", np.full(3, 2_000_000))
    meta, samples = results.read_meta(synthetic), pd.read_csv(synthetic / results.SAMPLES)
    samples["received_ns"] = samples["received_ns"].astype(float)
    samples.loc[2, ["received_ns", "latency_ns", "latency_from_intended_ns"]] = float("nan")
    samples["route_cost_s"] = 722.037  # a column that is no count of nanoseconds stays a float
    results.write_run(tmp_path / "r", meta, samples)
    written = pd.read_csv(tmp_path / "r" / results.SAMPLES, dtype=str, keep_default_na=False)
    assert written.loc[0, "received_ns"] == str(int(samples.loc[0, "received_ns"]))
    assert written.loc[2, "received_ns"] == "" and written.loc[2, "latency_ns"] == ""
    assert set(written["route_cost_s"]) == {"722.037"}


def test_samples_written_with_float_nanoseconds_still_read(tmp_path):
    run = shutil.copytree(
        Path(__file__).parent / "data" / "v11-deadline-bare" / "deadline-b20000-r1", tmp_path / "r"
    )
    text = (run / results.SAMPLES).read_text().splitlines()
    floats = [text[0]] + [
        ",".join(v + ".0" if v.isdigit() and len(v) > 9 else v for v in line.split(","))
        for line in text[1:]
    ]
    (run / results.SAMPLES).write_text(
        "\n".join(floats) + "\n"
    )  # as runs before integers wrote them
    assert ".0," in (run / results.SAMPLES).read_text()
    again = results.read_samples(run)
    assert (
        again["received_ns"].tolist()
        == results.read_samples(
            Path(__file__).parent / "data" / "v11-deadline-bare" / "deadline-b20000-r1"
        )["received_ns"].tolist()
    )


def read_csv_only(folder: Path) -> pd.DataFrame:
    without = folder.parent / (folder.name + "-csv")
    shutil.copytree(folder, without)
    (without / results.SAMPLES_PARQUET).unlink()
    return results.read_samples(without)


def test_samples_parquet_reads_as_the_csv_does(tmp_path):
    """The same rows, columns and types from either file, gaps (records that never came back)
    and warm-up included; other tools read the Parquet file as it is."""
    folder = write_run(tmp_path / "r", np.arange(1, 50) * 1_000_003, warmup=4, missing=3)
    from_parquet = results.read_current_parquet(folder)
    assert from_parquet is not None
    pd.testing.assert_frame_equal(from_parquet, read_csv_only(folder))
    pd.testing.assert_frame_equal(results.read_samples(folder), from_parquet)
    whole = pd.read_parquet(folder / results.SAMPLES_PARQUET)
    assert list(whole.columns) == list(pd.read_csv(folder / results.SAMPLES, nrows=0).columns)
    assert whole["received_ns"].isna().sum() == 3 and whole["received_ns"].dtype == "Int64"


def test_a_csv_changed_after_writing_is_read_and_its_parquet_ignored(tmp_path):
    folder = write_run(tmp_path / "r", np.full(10, 2_000_000))
    lines = (folder / results.SAMPLES).read_text().splitlines()
    (folder / results.SAMPLES).write_text("\n".join(lines[:-1]) + "\n")  # a row cut off
    assert results.read_current_parquet(folder) is None
    assert len(results.read_samples(folder)) == 9
    (folder / results.SAMPLES).write_text(lines[0] + "\n" + "x" * 40 + "\n")
    with pytest.raises(results.ResultsError):
        results.read_samples(folder)  # the CSV's fault is seen, not hidden by the Parquet file


def test_a_damaged_parquet_file_falls_back_to_the_csv(tmp_path):
    folder = write_run(tmp_path / "r", np.full(10, 2_000_000))
    (folder / results.SAMPLES_PARQUET).write_bytes(b"PAR1 not really")
    assert len(results.read_samples(folder)) == 10


def test_without_pyarrow_only_the_csv_is_written(tmp_path, monkeypatch):
    real = results.importlib.util.find_spec
    monkeypatch.setattr(
        results.importlib.util, "find_spec", lambda name: None if name == "pyarrow" else real(name)
    )
    folder = write_run(tmp_path / "r", np.full(10, 2_000_000))
    assert results.read_meta(folder)["files"] == {"samples": "samples.csv"}
    assert not (folder / results.SAMPLES_PARQUET).exists()
    assert len(results.read_samples(folder)) == 10
