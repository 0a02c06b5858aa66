"""Campaign files, their points and order, the index, failed runs, resume and the rate search.

The runs here are a stand-in harness (FAKE below) that writes a run's meta.json from its
options, so that the campaign's own bookkeeping is tested in seconds; the real pipeline runs
campaigns in test_campaign_integration.py.
"""

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from hvbench_harness import campaign
from hvbench_harness.campaign.runner import last_progress

REPO = Path(__file__).resolve().parents[2]

# A stand-in for `python -m hvbench_harness.run`: p99 = rate / 10 ms; BUDGET=66666 fails the way
# the harness does before sending, BUDGET=77777 while sending (its partial results written);
# FAKE_SLEEP makes a run last, for interrupting it.
FAKE = textwrap.dedent(
    """
    import argparse, json, os, pathlib, signal, sys, time
    p = argparse.ArgumentParser()
    for o in ("--target", "--sched", "--budget", "--period", "--records", "--period-ms",
              "--warmup-s", "--results", "--work", "--run-id", "--rep", "--campaign", "--data",
              "--model", "--kafka-libs", "--connector-dir", "--cap"):
        p.add_argument(o)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    print("fake run", a.run_id, flush=True)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if a.budget == "66666":
        print("make run: the Flink job died during the run:", file=sys.stderr)
        print("  OutOfMemoryError", file=sys.stderr)
        sys.exit(1)
    rate = 6000 / float(a.period_ms or 100)
    out = pathlib.Path(a.results) / a.run_id
    out.mkdir(parents=True)
    counts = {"sent": 1, "received": 1, "dead_lettered": 0, "missing": 0, "duplicated": 0,
              "foreign_results": 0, "foreign_dead_letters": 0, "contradictions": 0,
              "dead_letters_lost": 0, "accounted": True}
    meta = {"run_id": a.run_id, "requested": {"rep": int(a.rep), "campaign": a.campaign},
            "counts": counts, "latency": {"n": 1, "p99_ms": rate / 10}}
    if a.budget == "77777":
        meta["schema"] = 3
        meta["status"] = {"state": "failed", "reason": "Kafka is gone", "phase": "sending"}
        meta["counts"] = {**counts, "received": 0, "missing": 1, "accounted": False}
    (out / "meta.json").write_text(json.dumps(meta))
    sys.exit(1 if a.budget == "77777" else 0)
    """
)


def write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def fake(tmp_path) -> tuple[str, ...]:
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE)
    return (sys.executable, str(script))


def run_args(tmp_path: Path, *extra: str) -> campaign.Options:
    """`python -m hvbench_harness.campaign run` options, as main() would parse them."""
    return campaign.Options(
        results=str(tmp_path / "results"),
        work=str(tmp_path / "work"),
        resume="--resume" in extra,
        inventory=None,
        data="data",
        model="model",
        kafka_libs="libs",
        connector_dir="lib",
    )


def index_of(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "results" / name / "campaign.json").read_text())


def test_the_shipped_campaigns_validate_against_their_targets():
    files = sorted((REPO / "campaigns").glob("*.yml"))
    assert len(files) >= 8
    loaded = {f.stem: campaign.load(f) for f in files}
    table4 = loaded["table4-rtds"]
    assert table4.target == "xen"
    assert [p.settings["budget"] for p in table4.points] == [
        100000,
        80000,
        77500,
        76750,
        76000,
        75000,
    ]
    assert {p.settings["period"] for p in table4.points} == {100000}
    assert [p.settings.get("cap") for p in loaded["table5-credit"].points] == [None, 153]
    extension = loaded["ext-credit2-cap"]
    assert {(p.settings["sched"], p.settings["cap"]) for p in extension.points} == {
        ("credit", None),
        ("credit", 153),
        ("credit2", None),
        ("credit2", 153),
    }
    assert {p.settings["extratime"] for p in loaded["ext-rtds-extratime"].points} == {0, 1}
    assert loaded["baseline-bare"].target == "bare" and loaded["baseline-kvm"].target == "kvm"
    assert loaded["rate-search-bare"].search.method == "binary"
    # and through the command make lint runs
    proc = subprocess.run(
        [sys.executable, "-m", "hvbench_harness.campaign", "validate", *map(str, files)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 point(s) × 5 repetition(s) = 30 runs on xen" in proc.stdout


def test_points_with_neighbours_have_names_a_path_takes(tmp_path):
    c = campaign.load(REPO / "campaigns/interference-bare.yml")
    assert [p.id for p in c.points] == [
        "p01",
        "p02-1cpu-on-job",
        "p03-1cpu-on-apart",
        "p04-1membw-on-job",
        "p05-1membw-on-apart",
        "p06-1workload-on-apart",
    ]
    assert campaign.run_argv(c.points[2])[-4:] == ["--noise", "1:cpu", "--noise-cpus", "apart"]


def test_a_grid_crossed_with_points_names_what_differs(tmp_path):
    c = campaign.load(
        write(
            tmp_path,
            "grid",
            {
                "target": "xen",
                "settings": {"records": 6000},
                "points": [{"sched": "credit"}, {"sched": "credit2"}],
                "grid": {"cap": [None, 153]},
            },
        )
    )
    assert [p.id for p in c.points] == [
        "p01-credit",
        "p02-credit-c153",
        "p03-credit2",
        "p04-credit2-c153",
    ]
    assert campaign.run_argv(c.points[1]) == [
        "--records",
        "6000",
        "--sched",
        "credit",
        "--cap",
        "153",
    ]


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"target": "xen", "settings": {"sched": "rtds", "budget": 120000}}, "BUDGET 120000"),
        ({"target": "kvm", "settings": {"sched": "rtds"}}, "unknown SCHED 'rtds' for target kvm"),
        (
            {"target": "bare", "settings": {"sched": "none", "cap": 153}},
            "SCHED=none has no CAP=153",
        ),
        ({"target": "vmware"}, "target must be one of bare, kvm, xen"),
        ({"target": "bare", "settings": {"budgett": 1}}, "unknown setting(s) budgett"),
        ({"target": "bare", "grid": {"sched": ["none", "none"]}}, "repeats an earlier point"),
        ({"target": "bare", "settings": {"rate": 60, "send_ms": 100}}, "rate or send_ms"),
        ({"target": "bare", "repetitions": 0}, "repetitions must be a whole number ≥ 1"),
        ({"target": "bare", "order": "random"}, "order must be sequential or shuffled"),
        (
            {
                "target": "bare",
                "settings": {"records": 60},
                "search": {"slo_p99_ms": 5, "rates_per_s": [60]},
            },
            "a search sets the rate and records itself",
        ),
        (
            {"target": "bare", "search": {"slo_p99_ms": 5, "rates_per_s": [120, 60]}},
            "ascending",
        ),
    ],
)
def test_a_bad_campaign_is_refused_whole_with_the_reason(tmp_path, doc, message):
    with pytest.raises(campaign.CampaignError) as e:
        campaign.load(write(tmp_path, "bad", doc))
    assert message in str(e.value)


def test_shuffled_order_is_a_seeded_permutation(tmp_path):
    doc = {
        "target": "bare",
        "repetitions": 3,
        "settings": {"warmup": 0},
        "grid": {"records": [60, 120, 180]},
    }
    sequential = campaign.load(write(tmp_path, "seq", doc)).planned()
    assert [(p.id, r) for p, r in sequential[:4]] == [
        ("p01-n60", 1),
        ("p01-n60", 2),
        ("p01-n60", 3),
        ("p02-n120", 1),
    ]
    shuffled = campaign.load(write(tmp_path, "shuf", {**doc, "order": "shuffled", "seed": 3}))
    first, again = shuffled.planned(), shuffled.planned()
    assert [(p.id, r) for p, r in first] == [(p.id, r) for p, r in again]
    assert sorted((p.id, r) for p, r in first) == sorted((p.id, r) for p, r in sequential)
    assert [(p.id, r) for p, r in first] != [(p.id, r) for p, r in sequential]


@pytest.mark.parametrize(
    "method, tried", [("linear", [60, 120, 240, 480]), ("binary", [240, 960, 480])]
)
def test_the_rate_search_finds_the_highest_rate_under_the_slo(method, tried):
    search = campaign.Search(50, [60.0, 120.0, 240.0, 480.0, 960.0, 1920.0], method, 30)
    seen = []

    def passes(rate):  # the SLO holds up to 400/s
        seen.append(rate)
        return rate <= 400

    assert campaign.highest_passing(search, passes) == 240.0
    assert seen == tried


def test_a_failed_run_is_recorded_and_the_campaign_goes_on(tmp_path, fake, capsys):
    path = write(
        tmp_path,
        "fails",
        {
            "target": "bare",
            "repetitions": 2,
            "settings": {"sched": "cfs-quota", "records": 60, "send_ms": 50, "warmup": 0},
            "grid": {"budget": [50000, 66666]},
        },
    )
    code = campaign.run_campaign(campaign.load(path), run_args(tmp_path), harness=fake)
    assert code == 1  # a run failed
    index = index_of(tmp_path, "fails")
    status = {e["run_id"]: e["status"] for e in index["runs"]}
    assert status == {
        "p01-b50000-r1": "done",
        "p01-b50000-r2": "done",
        "p02-b66666-r1": "failed",
        "p02-b66666-r2": "failed",
    }
    failed = next(e for e in index["runs"] if e["run_id"] == "p02-b66666-r1")
    assert failed["reason"].startswith("the Flink job died during the run:")
    assert "OutOfMemoryError" in failed["reason"] and failed["exit_code"] == 1
    done = next(e for e in index["runs"] if e["run_id"] == "p01-b50000-r2")
    assert done["p99_ms"] == pytest.approx(12.0) and done["accounted"] is True
    assert done["rate_per_s"] == pytest.approx(120.0)
    assert (tmp_path / "results/fails/logs/p02-b66666-r1.log").exists()
    assert (tmp_path / "results/fails/campaign.yml").read_text() == path.read_text()
    out = capsys.readouterr().out
    assert "[3/4] p02-b66666-r1: failed" in out and "run(s) left, ETA" in out

    # a second start is refused; RESUME=1 retries the failed runs only
    with pytest.raises(campaign.CampaignError, match="RESUME=1 continues it"):
        campaign.run_campaign(campaign.load(path), run_args(tmp_path), harness=fake)
    before = {e["run_id"]: e["started_at"] for e in index["runs"]}
    time.sleep(1.1)  # started_at has whole seconds
    campaign.run_campaign(campaign.load(path), run_args(tmp_path, "--resume"), harness=fake)
    after = {e["run_id"]: e for e in index_of(tmp_path, "fails")["runs"]}
    assert after["p01-b50000-r1"]["started_at"] == before["p01-b50000-r1"]
    assert after["p02-b66666-r1"]["started_at"] != before["p02-b66666-r1"]
    assert "again (last time failed" in capsys.readouterr().out


def test_a_run_that_failed_while_sending_is_redone_on_resume_and_its_results_kept(tmp_path, fake):
    path = write(
        tmp_path,
        "partial",
        {"target": "bare", "settings": {"sched": "cfs-quota", "budget": 77777}},
    )
    assert campaign.run_campaign(campaign.load(path), run_args(tmp_path), harness=fake) == 1
    [entry] = index_of(tmp_path, "partial")["runs"]
    assert entry["status"] == "failed" and entry["reason"] == "Kafka is gone"
    folder = tmp_path / "results/partial"
    assert (folder / entry["run_id"] / "meta.json").exists()
    campaign.run_campaign(campaign.load(path), run_args(tmp_path, "--resume"), harness=fake)
    kept = folder / "attempts" / f"{entry['run_id']}.1" / "meta.json"
    assert json.loads(kept.read_text())["status"]["state"] == "failed"
    assert (folder / entry["run_id"] / "meta.json").exists()  # the new attempt's
    assert index_of(tmp_path, "partial")["runs"][0]["status"] == "failed"


def test_a_changed_file_is_refused_on_resume(tmp_path, fake):
    doc = {"target": "bare", "settings": {"records": 60, "warmup": 0}}
    path = write(tmp_path, "changes", doc)
    assert campaign.run_campaign(campaign.load(path), run_args(tmp_path), harness=fake) == 0
    write(tmp_path, "changes", {**doc, "repetitions": 2})
    with pytest.raises(campaign.CampaignError, match="changed since the campaign"):
        campaign.run_campaign(campaign.load(path), run_args(tmp_path, "--resume"), harness=fake)


def test_an_interrupted_campaign_resumes_without_rerunning_done_runs(tmp_path, fake):
    path = write(
        tmp_path,
        "stops",
        {
            "target": "bare",
            "repetitions": 3,
            "settings": {"records": 60, "send_ms": 50, "warmup": 0},
        },
    )
    code = f"""
import sys
from hvbench_harness import campaign
c = campaign.load({str(path)!r})
args = campaign.Options(results={str(tmp_path / "results")!r},
    work={str(tmp_path / "work")!r}, resume=False, inventory=None, data='d', model='m',
    kafka_libs='k', connector_dir='c')
sys.exit(campaign.run_campaign(c, args, harness={fake!r}))
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "FAKE_SLEEP": "5"},
        stdout=subprocess.PIPE,
        text=True,
    )
    index_file = tmp_path / "results/stops/campaign.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if index_file.exists():
            statuses = [e["status"] for e in json.loads(index_file.read_text())["runs"]]
            if statuses[:2] == ["done", "running"]:
                break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    statuses = [e["status"] for e in json.loads(index_file.read_text())["runs"]]
    assert statuses == ["done", "interrupted", "pending"]
    assert "RESUME=1 goes on from here" in out
    first_start = json.loads(index_file.read_text())["runs"][0]["started_at"]

    code = campaign.run_campaign(campaign.load(path), run_args(tmp_path, "--resume"), harness=fake)
    runs = json.loads(index_file.read_text())["runs"]
    assert code == 0 and [e["status"] for e in runs] == ["done"] * 3
    assert runs[0]["started_at"] == first_start
    assert sorted(p.name for p in (tmp_path / "results/stops").iterdir()) == [
        "campaign.json",
        "campaign.yml",
        "logs",
        "p01-r1",
        "p01-r2",
        "p01-r3",
    ]


def test_a_stop_that_lands_while_a_run_starts_still_stops_it(tmp_path, fake, monkeypatch):
    # The signal arrives after the index says "running" but before the child exists: the
    # handler has no child to stop, so the runner must stop it once it is started.
    path = write(tmp_path, "race", {"target": "bare", "settings": {"records": 60, "warmup": 0}})
    c = campaign.load(path)
    folder = tmp_path / "results" / c.name
    index = campaign.Index.open(c, folder, resume=False)
    runner = campaign.Runner(c, index, folder, [], tmp_path / "work", harness=fake)
    saved = index.save

    def save_then_signal():
        saved()
        if any(e["status"] == "running" for e in index.doc["runs"]):
            runner.on_signal(signal.SIGINT, None)

    monkeypatch.setattr(index, "save", save_then_signal)
    monkeypatch.setenv("FAKE_SLEEP", "30")
    started = time.monotonic()
    with pytest.raises(campaign.Interrupted):
        runner.run_grid()
    assert time.monotonic() - started < 20  # stopped, not slept out
    assert [e["status"] for e in index.doc["runs"]] == ["interrupted"]
    assert not (folder / index.doc["runs"][0]["run_id"]).exists()


def test_a_search_records_its_trials_and_the_sustainable_rate(tmp_path, fake):
    path = write(
        tmp_path,
        "search",
        {
            "target": "bare",
            "repetitions": 2,
            "settings": {"warmup": 0},
            "grid": {"sched": ["none"]},
            "search": {
                "slo_p99_ms": 30,  # p99 = rate / 10: passes up to 300/s
                "rates_per_s": [60, 120, 240, 480, 960],
                "method": "binary",
                "duration_s": 2,
            },
        },
    )
    assert campaign.run_campaign(campaign.load(path), run_args(tmp_path), harness=fake) == 0
    index = index_of(tmp_path, "search")
    (point,) = index["search"]["points"].values()
    assert point["sustainable_rate_per_s"] == 240.0 and point["finished"]
    assert [(t["rate_per_s"], t["passed"]) for t in point["trials"]] == [
        (240.0, True),
        (480.0, False),
    ]
    assert point["trials"][1]["p99_ms"] == [48.0, 48.0]
    trial = next(e for e in index["runs"] if e["run_id"] == "p01-rate240-r2")
    assert trial["settings"]["records"] == 480 and trial["settings"]["send_ms"] == 25.0
    # resumed, the search replays its trials from the index and runs nothing again
    logs = sorted((tmp_path / "results/search/logs").iterdir())
    index_file = tmp_path / "results/search/campaign.json"
    stamp = index_file.stat().st_mtime_ns
    assert (
        campaign.run_campaign(campaign.load(path), run_args(tmp_path, "--resume"), harness=fake)
        == 0
    )
    assert sorted((tmp_path / "results/search/logs").iterdir()) == logs
    assert index_file.stat().st_mtime_ns > stamp
    assert index_of(tmp_path, "search")["search"]["points"] == index["search"]["points"]


def test_a_rate_is_spread_over_the_points_network(tmp_path):
    doc = {"target": "bare", "points": [{"rate": 60}, {"rate": 650, "network": "bay"}]}
    freeway, bay = campaign.load(write(tmp_path, "networks", doc)).points
    assert freeway.send_ms() == 100.0 and freeway.rate_per_s() == 60
    assert bay.send_ms() == 500.0 and bay.rate_per_s() == 650
    assert bay.expected_send_s() == 62 * 0.5  # 20,000 records: 62 per sensor at most


def test_a_running_runs_last_progress_line_is_shown(tmp_path):
    log_file = tmp_path / "run.log"
    assert last_progress(log_file) is None  # no log yet
    log_file.write_text(
        "[10:00:00] run r: 360 records\n"
        "[10:00:10]   received 59/360 dead-letters 1, latency p50 11.28 p99 65.94 max 65.94 ms "
        "so far, about 5 s left\n"
        "\r  received 120/360 dead-letters 1  (12 s)"  # a terminal's line, rewritten in place
    )
    assert last_progress(log_file) == "received 120/360 dead-letters 1  (12 s)"
    log_file.write_text("[10:00:20]   sent 360  received 360  missing 0\n")
    assert last_progress(log_file) is None  # the summary is no progress line
