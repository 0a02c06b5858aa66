"""The run registry (hvbench_harness.runlocks) with real processes: a run held by another
process refuses a second one naming it, unless forced; a run on other machines is no
obstacle; a run whose process ended is stale and ignored; a campaign's own runs (its
children) do not count it; a run refused by another creates nothing."""

import json
import subprocess
import sys
import textwrap

import pytest
from hvbench_harness import campaign, run, runlocks
from hvbench_harness.parts import RunError

HOLDER = textwrap.dedent(
    """
    import sys
    from hvbench_harness import runlocks
    held = runlocks.register(sys.argv[1], sys.argv[2].split(","), kind=sys.argv[3])
    print("held", flush=True)
    sys.stdin.read()  # until the test closes its end
    """
)


@pytest.fixture
def other_run():
    """Start a process that holds a run in the registry; stop it (its lock goes with it)."""
    started = []

    def start(name="run-a", machines=runlocks.THIS_MACHINE, kind="run"):
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, name, machines, kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in started:
        proc.stdin.close()
        proc.wait(30)


def test_a_run_held_by_another_process_refuses_a_second_naming_it(other_run):
    holder = other_run()
    with pytest.raises(RunError) as refused:
        runlocks.register("run-b", [runlocks.THIS_MACHINE])
    message = str(refused.value)
    assert f"run run-a (pid {holder.pid}, started " in message and "CONCURRENT=1" in message
    assert "\n" not in message
    files = runlocks.folder().glob("*.lock")
    assert [json.loads(p.read_text())["id"] for p in files] == ["run-a"]  # run-b left none


def test_a_forced_run_goes_ahead_and_records_the_other(other_run):
    holder = other_run()
    held = runlocks.register("run-c", [runlocks.THIS_MACHINE], forced=True)
    try:
        assert held.record["forced"] is True
        [seen] = held.record["at_start"]
        assert (seen["id"], seen["pid"], seen["kind"]) == ("run-a", holder.pid, "run")
        assert seen["machines"] == [runlocks.THIS_MACHINE] and seen["started_at"]
        holder.stdin.close()
        holder.wait(30)
        assert held.look_again() == []  # gone by the end
        assert held.record["at_end"] == []
    finally:
        held.release()
    assert list(runlocks.folder().glob("*.lock")) == []


def test_a_run_that_came_and_went_while_this_one_sent_is_seen(other_run, monkeypatch):
    """A run that starts after this one and ends before it is in `seen`, once, though it was
    live neither at the start nor at the end."""
    monkeypatch.setattr(runlocks, "LOOK_S", 0.0)
    held = runlocks.register("run-d", [runlocks.THIS_MACHINE])
    try:
        held.glance()
        assert held.record["seen"] == []
        visitor = other_run("run-e")
        held.glance()
        held.glance()
        visitor.stdin.close()
        visitor.wait(30)
        assert held.look_again() == []
        assert [(e["id"], e["pid"]) for e in held.record["seen"]] == [("run-e", visitor.pid)]
    finally:
        held.release()


def test_runs_on_other_machines_do_not_refuse_each_other(other_run):
    other_run(machines="127.0.0.1:2222")  # a testbed host
    with runlocks.hold("run-b", ["127.0.0.1:2223"]) as held:  # another one
        assert held.record["at_start"] == []
    with pytest.raises(RunError, match="run-a"):
        runlocks.register("run-c", ["127.0.0.1:2223", "127.0.0.1:2222"])


def test_a_run_whose_process_ended_is_stale_and_ignored(other_run):
    holder = other_run()
    [file] = runlocks.folder().glob("*.lock")
    holder.kill()  # as a crash: nothing removes its file
    holder.wait(30)
    assert file.exists()
    with runlocks.hold("run-b", [runlocks.THIS_MACHINE]) as held:
        assert held.record["at_start"] == []
    assert not file.exists()


def test_a_campaigns_own_runs_do_not_count_it():
    """The campaign holds the machine in this process; its run is a child process."""
    child = textwrap.dedent(
        """
        from hvbench_harness import runlocks
        with runlocks.hold("p01-r1", [runlocks.THIS_MACHINE]) as held:
            print(len(held.record["at_start"]))
        """
    )
    with runlocks.hold("table4", [runlocks.THIS_MACHINE], kind="campaign"):
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "0\n"), out.stderr


def test_a_testbeds_hosts_are_held_by_address_and_port(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    kvm_hosts:\n      hosts:\n"
        "        lab-1: {ansible_host: 127.0.0.1, ansible_port: 2222}\n"
        "        lab-2: {ansible_host: 127.0.0.1, ansible_port: 2223}\n"
        "        lab-3: {}\n"
    )
    found = runlocks.registered_machines("kvm", str(inventory))
    assert found == ["127.0.0.1:2222", "127.0.0.1:2223", "lab-3:22"]
    assert runlocks.registered_machines("bare", None) == [runlocks.THIS_MACHINE]


def test_a_run_refused_by_another_starts_and_creates_nothing(other_run, tmp_path, capsys):
    other_run("make-run-1")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "manifest.json").write_text("{}")
    (tmp_path / "data").mkdir()
    where = ["--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
    inputs = ["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data")]
    code = run.main(["RUN_ID=second", "CPU_LATENCY=off", *where, *inputs])
    assert code == 1
    err = capsys.readouterr().err
    assert "another run holds this machine: run make-run-1 (pid" in err
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()
    assert [json.loads(p.read_text())["id"] for p in runlocks.folder().glob("*.lock")] == [
        "make-run-1"
    ]


def test_a_campaign_beside_a_run_is_refused_or_forced_with_its_runs(other_run, tmp_path, capsys):
    other_run("make-run-1")
    file = tmp_path / "grid.yml"
    file.write_text("target: bare\nsettings: {records: 60, warmup: 0}\n")
    where = ["--results", str(tmp_path / "r"), "--work", str(tmp_path / "w")]
    assert campaign.main(["run", str(file), *where]) == 1
    assert "make campaign: another run holds this machine: run make-run-1" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()
    # forced, it runs, and passes CONCURRENT on to its runs (each prints its command line)
    inputs = dict.fromkeys(("data", "model", "kafka_libs", "connector_dir"), "x")
    args = campaign.Options(
        inventory=None, concurrent=True, resume=False, results=where[1], work=where[3], **inputs
    )
    argv_printer = (sys.executable, "-c", "import sys; print(sys.argv)")
    campaign.run_campaign(campaign.load(file), args, harness=argv_printer)
    [log] = (tmp_path / "r" / "grid" / "logs").iterdir()
    assert "'--concurrent'" in log.read_text()
