"""A small campaign end to end on the bare target with the real pipeline (Kafka, the PyFlink
job, producers, consumer): two scheduler settings (cfs-quota and deadline, each applied to the
job and read back), two repetitions each, interrupted during its third run, resumed through
`make campaign ... RESUME=1`, then reported through `make report`."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # several real runs: the slow tier

REPO = Path(__file__).resolve().parents[2]
NAME = "itest-small"
POINTS = [
    {"sched": "cfs-quota", "budget": 80000, "period": 100000},
    {"sched": "deadline", "budget": 30000, "period": 100000},
]


def leftover_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "pytest" not in line]


@pytest.fixture(scope="module")
def campaign_run(small_data, small_model, tmp_path_factory):
    """The campaign started, interrupted in its third run, and resumed to the end."""
    tmp = tmp_path_factory.mktemp("campaign")
    file = tmp / f"{NAME}.yml"
    file.write_text(
        yaml.safe_dump(
            {
                "description": "two points, two repetitions",
                "target": "bare",
                "repetitions": 2,
                "order": "sequential",
                "settings": {"records": 120, "send_ms": 50, "warmup": 0.2, "drain": 10},
                "points": POINTS,
            }
        )
    )
    results, data, model = tmp / "results", str(small_data[0]), str(small_model)
    common = [f"--data={data}", f"--model={model}", f"--results={results}"]
    libs = [
        f"--kafka-libs={REPO / 'build/kafka/libs'}",
        f"--connector-dir={REPO / 'build/flink/lib'}",
    ]
    log = open(tmp / "first.log", "w")  # noqa: SIM115 — the child's until it ends
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hvbench_harness.campaign",
            "run",
            str(file),
            *common,
            *libs,
            f"--work={tmp / 'work'}",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    index_file = results / NAME / "campaign.json"
    third_log = results / NAME / "logs" / "p02-deadline-b30000-r1.log"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and first.poll() is None:
        # interrupt once the third run has its job up (mid-run: there is something to tear down)
        if third_log.exists() and "Flink job running" in third_log.read_text():
            break
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    first.wait(300)
    log.close()
    interrupted = {
        "code": first.returncode,
        "index": json.loads(index_file.read_text()),
        "output": (tmp / "first.log").read_text(),
        "leftovers": leftover_processes(str(tmp / "work")),
    }
    resumed = subprocess.run(
        [
            "make",
            "-s",
            "campaign",
            f"CAMPAIGN={file}",
            "RESUME=1",
            f"RESULTS={results}",
            f"DATA_DIR={data}",
            f"MODEL_DIR={model}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    shutil.rmtree(REPO / "work" / NAME, ignore_errors=True)  # make campaign's work folder
    return interrupted, resumed, json.loads(index_file.read_text()), file, results / NAME


def test_an_interrupted_campaign_stops_cleanly(campaign_run):
    interrupted, _, _, _, _ = campaign_run
    assert interrupted["code"] == 130, interrupted["output"][-3000:]
    statuses = [e["status"] for e in interrupted["index"]["runs"]]
    assert statuses == ["done", "done", "interrupted", "pending"]
    assert "RESUME=1 goes on from here" in interrupted["output"]
    assert interrupted["leftovers"] == []


def test_resume_runs_only_what_was_not_done(campaign_run):
    interrupted, resumed, index, _, folder = campaign_run
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-3000:]
    runs = index["runs"]
    assert [e["status"] for e in runs] == ["done"] * 4
    for before, after in zip(interrupted["index"]["runs"][:2], runs[:2], strict=True):
        assert after["started_at"] == before["started_at"]  # not run again
    assert "again (last time interrupted" in resumed.stdout
    assert "4 of 4 run(s) done" in resumed.stdout
    for entry in runs:
        meta = json.loads((folder / entry["run_id"] / "meta.json").read_text())
        assert meta["requested"]["campaign"] == NAME
        assert meta["requested"]["rep"] == entry["rep"]
        assert meta["counts"]["sent"] == 120 and meta["counts"]["accounted"]
        assert entry["accounted"] and entry["p99_ms"] == meta["latency"]["p99_ms"]
    by_point = {}
    for entry in runs:
        by_point.setdefault(entry["point"], []).append(entry["rep"])
    assert by_point == {
        "p01-cfs-quota-b80000": [1, 2],
        "p02-deadline-b30000": [1, 2],
    }


def test_each_runs_scheduler_setting_was_applied_and_read_back(campaign_run):
    _, _, _, _, folder = campaign_run
    quota = json.loads((folder / "p01-cfs-quota-b80000-r2/meta.json").read_text())
    readback = quota["sched"]["readback"]
    assert readback["quota_us"] == 80000 and readback["period_us"] == 100000
    assert readback["tasks"] > 10
    assert quota["sched_at_end"]["cpu_stat"]["nr_periods"] > 0
    deadline = json.loads((folder / "p02-deadline-b30000-r2/meta.json").read_text())
    readback = deadline["sched"]["readback"]
    assert {"Source: kafka-i", "Source Data Fet", "kafka-producer-"} <= {
        r["name"] for r in readback
    }
    for thread in readback:
        assert thread["policy"] == "SCHED_DEADLINE"
        assert (thread["runtime_ns"], thread["period_ns"]) == (30_000_000, 100_000_000)


def test_the_campaign_report_has_its_tables_and_intervals(campaign_run, tmp_path):
    _, _, _, file, folder = campaign_run
    proc = subprocess.run(
        ["make", "-s", "report", f"CAMPAIGN={file}", f"RESULTS={folder.parent}", f"OUT={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / NAME
    page = (out / "index.html").read_text()
    assert "4 run(s)" in page and "Campaign" in page and NAME in page
    table4 = (out / "tables/max_budget_period.md").read_text()
    assert "Mean max (ms) [95 % CI]" in table4
    rows = [r for r in table4.splitlines() if "| 80000 " in r or "| 30000 " in r]
    assert len(rows) == 2 and all("| 2 |" in r.replace("  ", " ") for r in rows)
    reps = (out / "tables/repetitions.csv").read_text()
    assert reps.count("\n") == 3  # header and two configurations of two runs
    assert (out / "figures/ecdf_bands_all.svg").stat().st_size > 0
