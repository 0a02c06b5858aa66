"""The whole slice for real: Kafka broker, the PyFlink job, producers and consumer (short runs)."""

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from driver import REPO, leftover_processes, run_args
from hvbench_analysis import stages
from hvbench_analysis.load import load_runs
from hvbench_harness import readiness, run

pytestmark = pytest.mark.integration

MALFORMED = 8
IDLE_STATE1 = Path("/sys/devices/system/cpu/cpu0/cpuidle/state1/disable")


@pytest.fixture(scope="module")
def plain_run(small_data, small_model, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("run")
    code = run.main(
        run_args(
            tmp_path, small_data[0], small_model, "--run-id", "plain", "--malformed", str(MALFORMED)
        )
    )
    return code, tmp_path, tmp_path / "results" / "plain"


def test_a_run_accounts_for_every_record(plain_run):
    code, _, results = plain_run
    assert code == 0
    meta = json.loads((results / "meta.json").read_text())
    counts = meta["counts"]
    assert counts["sent"] == 360 and counts["received"] == 360
    assert counts["missing"] == 0 and counts["duplicated"] == 0 and counts["accounted"]
    assert counts["warmup"] + counts["measured"] == 360 and counts["warmup"] >= 6
    samples = pd.read_csv(results / "samples.csv")
    assert len(samples) == 360
    assert set(samples.detector) == {
        "el_segundo",
        "wilmington",
        "long_beach",
        "athens",
        "lynwood_gardens",
        "east_rancho_dominguez",
    }
    assert (samples.groupby("detector").seq.max() == 59).all()


def test_malformed_records_reach_the_dead_letter_topic_with_reasons(plain_run):
    _, _, results = plain_run
    meta = json.loads((results / "meta.json").read_text())
    assert meta["counts"]["malformed_sent"] == MALFORMED
    assert meta["counts"]["malformed_dead_lettered"] == MALFORMED
    letters = [json.loads(x) for x in (results / "dead_letters.jsonl").read_text().splitlines()]
    injected = [x for x in letters if "malformed-" in x["record"]]
    reasons = " ".join(x["reason"] for x in injected)
    for reason in ("not JSON", "missing field(s): flows", "must hold 12 values", "NaN"):
        assert reason in reasons
    assert "'speed_mph' must be a number" in reasons  # the ~800 KB one, its reason cut


def test_latencies_are_sane_and_stamped_with_one_clock(plain_run):
    _, _, results = plain_run
    meta = json.loads((results / "meta.json").read_text())
    samples = pd.read_csv(results / "samples.csv")
    assert (samples.latency_ns > 0).all()
    assert (samples.latency_from_intended_ns >= samples.latency_ns).all()
    latency = meta["latency"]
    # no bound on the values (the machines are shared and noisy; bench/ measures them): the
    # statistics are the samples' own, in order
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert latency["max_ms"] == pytest.approx(
        samples.loc[~samples.warmup, "latency_ns"].max() / 1e6
    )
    assert (samples.predict_ns > 0).all() and (samples.route_ns > 0).all()
    assert meta["clock"]["tsc"]["hz"] > 1e8 and meta["clock"]["tsc"]["clocksource"]


def test_the_job_stamps_on_the_runs_clock_and_the_legs_add_up(plain_run):
    """On bare the job adopts the run's calibration: its stamps fall between send and receipt,
    and the legs are exact. The causal estimate made as if the job had a clock of its own
    must contain the true offset, 0."""
    _, _, results = plain_run
    meta = json.loads((results / "meta.json").read_text())
    assert meta["clock"]["job"]["method"] == "one calibration"
    got = pd.read_csv(results / "samples.csv").dropna(subset=["received_ns"])
    assert (got.sent_ns < got.job_in_ns).all() and (got.job_in_ns < got.job_out_ns).all()
    assert (got.job_out_ns < got.received_ns).all()
    estimate = stages.clock_relation(got, shared=False, window=50)
    for end in ("start", "end"):
        assert estimate[end]["low_ns"] <= 0 <= estimate[end]["high_ns"], estimate
    legs = load_runs([results]).samples
    total = legs.input_leg_ns + legs.job_ns + legs.output_leg_ns
    assert (total - legs.latency_ns).abs().max() < 1e3  # ns; the CSV keeps whole ns
    assert (legs.job_ns >= 0).all() and legs.job_ns.median() < legs.latency_ns.median()


def test_meta_records_what_ran(plain_run):
    _, tmp_path, results = plain_run
    meta = json.loads((results / "meta.json").read_text())
    assert meta["requested"]["sched"] == "none"
    assert meta["sched"]["readback"]["threads"] > 10
    # root here: the C-state limit is held and the kernel reports it
    assert meta["cpu_latency"] == {
        "requested": "auto",
        "held": True,
        "not_held_because": None,
        "readback_us": 0,
    }
    steal = meta["steal_while_sending"]
    assert steal["cpu_s"] > 0 and 0 <= steal["steal_pct"] <= 100
    parts = meta["cpu_per_part"]["parts"]
    assert parts["kafka"]["processes"] == 1 and parts["flink job"]["processes"] == 1
    assert parts["kafka"]["cpu_s"] > 0 and parts["flink job"]["cpu_s"] > 0
    assert "flink jobmanager" not in parts  # one JVM runs the job's JobManager and task
    assert meta["kafka"]["version"] == "4.3.1"
    assert meta["clients"]["producer"]["linger.ms"] == 0
    assert meta["clients"]["producer"]["socket.nagle.disable"] is True
    flink = meta["job"]["flink"]
    assert flink["python.execution-mode"] == "thread"
    assert flink["execution.buffer-timeout.interval"] == "0 ms"
    # the local cluster's working files were in the run's work directory, removed with it
    job_tmp = Path(flink["io.tmp.dirs"])
    assert job_tmp.is_relative_to(tmp_path) and not job_tmp.exists()
    assert f"-Djava.io.tmpdir={job_tmp}" in meta["job"]["jvm"]["args"]
    assert meta["job"]["sink_delivery_guarantee"] == "AT_LEAST_ONCE"
    assert meta["job"]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    # both JVMs' compilers and G1's concurrent threads yield to every other thread, read back
    for background in (
        meta["kafka"]["background_threads"],
        meta["job"]["jvm"]["background_threads"],
    ):
        assert background["policy"] == "SCHED_IDLE" and background["not_idle"] == []
        assert {"C1 CompilerThre", "G1 Conc"} <= set(background["threads"])
    assert len(meta["model"]) == 64
    assert meta["host"]["kernel"]["release"] and meta["versions"]["apache-flink"] == "2.3.0"
    assert (results / "logs" / "broker.log").exists()


def test_the_report_reads_a_real_run(plain_run, tmp_path):
    """The results contract holds from both sides: the analysis loads what the harness wrote."""
    from hvbench_analysis import report
    from hvbench_analysis.load import load_runs

    _, _, results = plain_run
    runs = load_runs([results])
    assert not runs.skipped
    row = runs.runs.iloc[0]
    meta = json.loads((results / "meta.json").read_text())
    assert (row["target"], row["sched"], row["hypervisor"]) == ("bare", "none", "none")
    assert row["sent"] == meta["counts"]["sent"] and row["accounted"] and row["problems"] == ""
    assert row["clock"] == "tsc" and row["tsc_hz"] == meta["clock"]["tsc"]["hz"]
    assert len(runs.samples) == meta["counts"]["measured"]
    assert runs.samples["latency_ns"].max() / 1e6 == meta["latency"]["max_ms"]
    out = tmp_path / "report"
    assert report.main(["--results", str(results.parent), "--out", str(out)]) == 0
    assert "Every record accounted for" in (out / "index.html").read_text()


def test_nothing_is_left_running(plain_run):
    _, tmp_path, _ = plain_run
    assert leftover_processes(tmp_path) == []
    assert not (tmp_path / "work" / "plain").exists()


@pytest.mark.parametrize(
    ("sched", "expected"),
    [
        (["--sched", "rtds", "--budget", "1000"], "unknown SCHED 'rtds'"),
        (["--sched", "cfs-quota", "--budget", "120000", "--period", "100000"], "> PERIOD"),
        (["--target", "lxc", "--sched", "rtds"], "unknown TARGET 'lxc'"),
        (["--sched", "none", "--cap", "153"], "SCHED=none has no CAP=153"),
        (["--cpu-latency", "low"], "CPU_LATENCY must be auto, off or microseconds"),
        (["--scale", "clusters"], "unknown SCALE 'clusters' (did you mean cluster?)"),
        (["--scale", "cluster", "--brokers", "10"], "BROKERS is 1..9"),
        (["--taskmanagers", "2"], "TASKMANAGERS: for SCALE=cluster"),
        (["--scale", "cluster", "--taskmanagers", "7"], "TASKMANAGERS 1..6"),
        (["--network", "bays"], "unknown NETWORK 'bays' (did you mean bay?)"),
        (["--messages", "groups"], "unknown MESSAGES 'groups' (did you mean group?)"),
        (["--producers", "7"], "PRODUCERS=7: NETWORK=freeway has 6 detectors"),
        (["--producers", "2", "--clients", "3"], "CLIENTS=3: each client pair needs a producer"),
        # no warm-up: 360 records of the bay's 325 detectors would all be warm-up
        (["--network", "bay", "--warmup-s", "0"], "is for NETWORK=freeway, not bay (make data"),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(
    sched, expected, small_data, small_model, tmp_path, capsys
):
    assert run.main(run_args(tmp_path, small_data[0], small_model, *sched)) == 1
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


# The scheduler settings on the bare target (cfs-quota and deadline, applied and read back)
# are checked on the runs of the campaign test (test_campaign_integration.py).


def test_meta_is_a_bundle_a_run_can_be_repeated_from(plain_run, small_model):
    _, _, results = plain_run
    meta = json.loads((results / "meta.json").read_text())
    assert meta["inputs"]["model"] == str(Path(small_model).resolve())
    assert meta["requested"]["drain_s"] == 15 and meta["requested"]["force"] is False
    assert meta["invocation"]["argv"] and meta["rerun_of"] is None
    assert len(meta["git"]["commit"]) == 40 and isinstance(meta["git"]["dirty"], bool)
    assert isinstance(meta["git"]["changed"], list)
    packages = meta["versions"]["packages"]
    assert packages["apache-flink"] == "2.3.0" and packages["pandas"]
    ready = meta["readiness"]
    assert not ready["failed_required"] and not ready["forced"] and not ready["refused"]
    (tsc,) = [c for c in ready["checks"]["this machine"] if c["check"] == "tsc"]
    assert tsc["required"] and tsc["status"] == "pass"
    assert ready["facts"]["this machine"]["tsc_flags"]
    # this machine was never provisioned with the real-time profile: recorded as such
    assert meta["rt_profile"] == {"this machine": {"provisioned": False, "ok": None}}


def failing_advised_check() -> str:
    """A check that fails on this machine but is not required here (isolated_cpus on a
    machine without isolcpus=): requiring it makes the machine fail its readiness for real."""
    results, _ = readiness.check_here()
    failing = [
        c["check"] for c in results["this machine"] if c["status"] == "fail" and not c["required"]
    ]
    assert failing, "every readiness check passes here: none to require for this test"
    return failing[0]


def test_a_machine_failing_a_required_check_is_refused(small_data, small_model, tmp_path, capsys):
    check = failing_advised_check()
    assert run.main(run_args(tmp_path, small_data[0], small_model, "--require", check)) == 1
    err = capsys.readouterr().err
    assert "not ready to measure on" in err and f"this machine: {check} is" in err
    assert "FORCE=1" in err
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


@pytest.fixture(scope="module")
def forced_run(small_data, small_model, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("forced")
    check = failing_advised_check()
    args = run_args(tmp_path, small_data[0], small_model, "--run-id", "forced")
    args[1] = "120"  # records: the first 60 are the warm-up's (1 s)
    args += ["--sched", "cfs-quota", "--budget", "80000", "--require", check, "--force"]
    if IDLE_STATE1.exists():  # and a power policy: no idle state past POLL while it runs
        args += ["--max-cstate", "0"]
    return run.main(args), tmp_path, check


def test_a_forced_run_records_the_checks_it_failed(forced_run):
    code, tmp_path, check = forced_run
    assert code == 0
    meta = json.loads((tmp_path / "results/forced/meta.json").read_text())
    ready = meta["readiness"]
    assert ready["forced"] and not ready["refused"]
    (failed,) = ready["failed_required"]
    assert failed["check"] == check and failed["machine"] == "this machine" and failed["forced"]
    assert meta["requested"]["require"] == check and meta["counts"]["accounted"]
    energy = meta["energy"]  # this machine has no energy counter: not available, and why
    assert energy["available"] or "powercap: " in energy["reason"]
    assert meta["files"]["energy"] == "energy.csv"
    if IDLE_STATE1.exists():
        assert meta["requested"]["max_cstate"] == 0
        assert meta["power"]["readback"]["this machine"]["max_cstate"] == 0
        assert meta["power"]["at_end"]["this machine"]["max_cstate"] == 0
        assert meta["cpu_latency"]["not_held_because"] == "MAX_CSTATE=0 sets the idle states"
        assert IDLE_STATE1.read_text().strip() == "0"  # put back as it was


def test_make_rerun_repeats_a_run_from_its_bundle(forced_run):
    code, tmp_path, check = forced_run
    assert code == 0
    proc = subprocess.run(
        ["make", "-s", "rerun", "RUN=forced", f"RESULTS={tmp_path / 'results'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "settings requested equal, read back equal, model equal" in proc.stdout
    original = json.loads((tmp_path / "results/forced/meta.json").read_text())
    again = json.loads((tmp_path / "results/forced-rerun1/meta.json").read_text())
    assert again["rerun_of"] == str((tmp_path / "results/forced").resolve())
    for key in ("target", "sched", "budget_us", "period_us", "records", "producer_period_ms",
                "max_cstate"):  # fmt: skip
        assert again["requested"][key] == original["requested"][key]
    assert again["sched"]["readback"]["quota_us"] == 80000
    assert again["readiness"]["forced"] and again["requested"]["require"] == check
    comparison = json.loads((tmp_path / "results/forced-rerun1/rerun.json").read_text())
    assert comparison["settings_equal"] and comparison["readback_equal"]
    assert comparison["packages_changed"] == {}
    assert not (REPO / "work/forced-rerun1").exists()
