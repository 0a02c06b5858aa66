"""NOISE, NOISE_CPUS and JOB_CPUS are checked before anything starts: a VM's state on the bare
target, a placement that leaves the loads no CPU, a testbed asked to place its guests, or
SCHED=deadline on pinned threads are refused with the reason."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hvbench_agent.neighbours import parse as neighbours_of
from hvbench_harness import neighbours, run
from hvbench_harness.parts import Parts, RunError, running
from hvbench_harness.runspec import RunSpec
from hvbench_harness.testbed import Machine, Testbed


def request(*words: str) -> RunSpec:
    request, _ = run.parse_args(list(words))
    return request


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["NOISE=3:idle"], "3:idle: a VM's state; on the bare target a neighbour is a process"),
        (["NOISE=2:cpu,1:paused"], "1:paused: a VM's state"),
        (["NOISE=1:cpuu"], r"unknown NOISE state 'cpuu' \(did you mean cpu\?\)"),
        (["JOB_CPUS=1", "SCHED=deadline", "BUDGET=9000"], "SCHED=deadline needs the job's"),
        (["JOB_CPUS=x"], "is not a CPU list"),
        (["TARGET=kvm", "NOISE=1:cpu", "JOB_CPUS=2"], "JOB_CPUS: for the bare target"),
        (["TARGET=xen", "NOISE=1:cpu", "NOISE_CPUS=apart"], "NOISE_CPUS: for the bare target"),
    ],
)
def test_a_placement_or_state_that_cannot_be_is_refused_first(words, message):
    with pytest.raises(RunError, match=message):
        request(*words)  # RunSpec.parse checks the neighbours (neighbours.check_request)


def test_the_bare_loads_go_on_the_jobs_cpus_apart_or_where_asked():
    online = sorted(os.sched_getaffinity(0))
    last, rest = online[-1], online[:-1]

    def noise_cpus(noise: str, job: str | None) -> str | None:
        return neighbours.bare_noise_cpus(neighbours.CpuSets.parse(noise, job))

    assert noise_cpus("job", None) is None  # the job may run anywhere
    assert noise_cpus("job", str(last)) == str(last)
    if rest:
        assert noise_cpus("apart", str(last)) == neighbours.cpu_list(set(rest))
    assert noise_cpus(str(online[0]), None) == str(online[0])
    with pytest.raises(RunError, match="NOISE_CPUS=apart needs JOB_CPUS"):
        noise_cpus("apart", None)
    with pytest.raises(RunError, match="this machine runs on CPUs"):
        noise_cpus("job", "999")
    with pytest.raises(RunError, match="this machine runs on CPUs"):
        noise_cpus("999", None)
    with pytest.raises(RunError, match="NOISE_CPUS is job, apart or a CPU list"):
        noise_cpus("elsewhere", None)


def test_none_is_no_neighbours_and_the_text_is_recorded_normalised():
    assert neighbours.check_request(request("NOISE=none"))[0] == ()
    assert RunSpec.parse({"noise": "none"}).noise is None
    parsed = RunSpec.parse({"noise": " 2:cpu, 1:membw"})
    assert parsed.noise == "2:cpu,1:membw" and len(parsed.noise_groups) == 2


def test_make_run_refuses_before_anything_starts(capsys):
    assert run.main(["NOISE=3:paused", "--validate-only"]) == 1
    assert "a VM's state" in capsys.readouterr().err


def test_each_provisioned_neighbour_gets_a_state_in_order_the_rest_shut_down():
    groups = neighbours.neighbours.parse("1:cpu,1:paused")
    domains = ["n-0", "n-1", "n-2"]
    assert neighbours.assign(groups, domains) == [
        ("n-0", "cpu"),
        ("n-1", "paused"),
        ("n-2", "shutdown"),
    ]
    with pytest.raises(RunError, match="NOISE asks for 4 neighbours; this testbed has 3"):
        neighbours.assign(neighbours.neighbours.parse("4:idle"), domains)


def test_a_workload_copy_goes_to_a_neighbour_that_has_the_workload():
    domains = ["n-0", "n-1", "n-2"]
    groups = neighbours.neighbours.parse("1:cpu,1:workload")
    assert neighbours.assign(groups, domains, with_workload=("n-1",)) == [
        ("n-0", "cpu"),
        ("n-1", "workload"),
        ("n-2", "shutdown"),
    ]
    with pytest.raises(RunError, match="2 workload copies; this testbed has 1 neighbour VMs with"):
        neighbours.assign(neighbours.neighbours.parse("2:workload"), domains, ("n-2",))
    with pytest.raises(RunError, match=r"hvbench_neighbours\.workload: true"):
        neighbours.assign(groups, domains)


def test_the_testbed_file_names_the_neighbours_and_how_to_reach_them():
    from hvbench_harness.testbed import Testbed

    def conn(name: str, address: str) -> dict:
        return {"name": name, "address": address, "private_address": address, "user": "root"}

    doc = {
        "target": "kvm", "host": conn("h", "lab"), "messaging_vms": [conn("m", "10.0.0.10")],
        "realtime_vms": [conn("r", "10.0.0.11")], "realtime_domains": ["r"], "install_dir": "/opt",
        "work_dir": "/w", "neighbours": [conn("hvbench-neighbour-0", "10.0.0.20")],
    }  # fmt: skip
    testbed = Testbed.from_json(doc)
    ((domain, machine),) = testbed.neighbours
    assert domain == "hvbench-neighbour-0" and machine.ssh[-1] == "root@10.0.0.20"
    assert testbed.workload_neighbours == ()
    with_copy = {**doc["neighbours"][0], "workload": True}
    assert Testbed.from_json({**doc, "neighbours": [with_copy]}).workload_neighbours == (
        "hvbench-neighbour-0",
    )
    assert Testbed.from_json({**doc, "neighbours": []}).neighbours == ()


@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="make rt-tools installs stress-ng")
def test_stopped_loads_are_continued_at_their_stop_and_none_is_left(tmp_path):
    """A neighbour stopped with SIGSTOP (stress-ng and its stressors) keeps SIGINT pending:
    its stop continues it first, so it ends by SIGINT and writes its metrics; the run's
    teardown check then finds none of its processes."""
    args = request("NOISE=2:cpu")
    noise = neighbours.LocalNoise(neighbours_of("2:cpu"), None, args, tmp_path)
    noise.start(Parts(tmp_path))
    processes = noise.processes()
    assert len(processes) == 3  # stress-ng and its two stressors
    # A stressor stopped before it has set itself up (its name still stress-ng's own) makes
    # stress-ng's run unsuccessful (exit code 2): a run's loads are stopped while they run.
    deadline = time.monotonic() + 30
    while not all(b"[run]" in Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in processes[1:]):
        assert time.monotonic() < deadline, "the stressors never reached their run"
        time.sleep(0.01)
    for process in processes:
        os.kill(process.pid, signal.SIGSTOP)
    noise.stop()
    (group,) = noise.record["groups"]
    assert group["exit_code"] == 0 and group["metrics"], group
    assert noise.processes() == []
    assert [p.pid for p in processes if running(p.pid)] == []


@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="make rt-tools installs stress-ng")
def test_stressors_left_by_a_killed_stress_ng_are_found_and_ended(tmp_path):
    """A stopped stress-ng killed after its grace leaves its stopped stressors behind (running,
    they would end themselves: stress-ng gives them a signal on their parent's death, so a
    running one may or may not still be there to find). The teardown's check, given the
    neighbours' processes seen at their start, ends them and records it."""
    parts = Parts(tmp_path)  # before the loads: older processes are never the run's
    noise = neighbours.LocalNoise(neighbours_of("1:cpu"), None, request("NOISE=1:cpu"), tmp_path)
    noise.start(parts)
    seen = noise.processes()
    assert len(seen) == 2  # stress-ng and its stressor
    for process in seen:
        os.kill(process.pid, signal.SIGSTOP)
    while not all((now := running(p.pid)) and now.stopped for p in seen):
        time.sleep(0.01)  # a process stops once it next runs: polled until each has
    os.kill(noise.loads()[0].proc.pid, signal.SIGKILL)
    noise.loads()[0].proc.wait()
    done = parts.verify({"a neighbour (stress-ng)": seen})
    assert done["left"] == []
    assert [(e["part"], e["was_stopped"]) for e in done["ended"]] == [
        ("a neighbour (stress-ng)", True)
    ]
    assert [p.pid for p in seen if running(p.pid)] == []


# stress-ng behind a wrapper on the PATH, as a slow machine starts it: a second late (and a
# SIGINT then ends it, as it would a stress-ng that has not set its handler yet), never (stopped
# before it starts), or not at all.
SLOW_STARTS = {
    "slow": f"#!{sys.executable}\nimport os, signal, sys, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\ntime.sleep(1)\n"
    "os.execv({stress_ng!r}, ['stress-ng', *sys.argv[1:]])\n",
    "hangs": "#!/bin/sh\nkill -STOP $$\n",
    "fails": '#!/bin/sh\necho "stress-ng: error: no stressor named cpuu" >&2; exit 1\n',
}


def stress_ng_that_starts(start: str, tmp_path, monkeypatch) -> None:
    wrapper = tmp_path / "bin" / "stress-ng"
    wrapper.parent.mkdir()
    wrapper.write_text(SLOW_STARTS[start].replace("{stress_ng!r}", repr(shutil.which("stress-ng"))))
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")


def neighbour_on_this_machine(
    tmp_path, monkeypatch, start: str, ssh: tuple[str, ...] = ()
) -> neighbours.TestbedNoise:
    """A testbed whose one neighbour is this machine (its commands run here, as they would over
    SSH, or through `ssh`) and whose host's agent holds nothing and reads no domain."""
    stress_ng_that_starts(start, tmp_path, monkeypatch)
    no_domains = ("sh", "-c", "echo '{\"domains\": []}'", "hvbench-agent")
    testbed = Testbed(
        host=Machine("host", agent_command=no_domains), messaging_vms=(), realtime_vms=(),
        messaging_addresses=(), realtime_addresses=(), realtime_domains=(), install_dir="",
        work_dir="", neighbours=(("neighbour-0", Machine("neighbour-0", ssh=ssh)),),
    )  # fmt: skip
    return neighbours.TestbedNoise(testbed, neighbours_of("1:cpu"), tmp_path.name, longest_s=5)


def test_a_neighbours_load_that_starts_slowly_is_running_before_the_run_and_leaves_its_metrics(
    tmp_path, monkeypatch
):
    """stopped at once after start(): start() returned only once the stressor ran, so stress-ng
    wrote its metrics (before, a slow guest's stress-ng was stopped before it started)."""
    noise = neighbour_on_this_machine(tmp_path, monkeypatch, "slow")
    noise.start()
    noise.stop()
    (load,) = noise.record["loads"]
    (cpus,) = load["stressors"].values()
    assert cpus == neighbours.cpu_list(os.sched_getaffinity(0))
    (metrics,) = load["metrics"]
    assert metrics["stressor"] == "cpu" and metrics["bogo-ops"] > 0, load
    assert not list(Path("/tmp").glob(f"hvbench-noise-{tmp_path.name}-*"))  # its files went


# An ssh whose connection is lost once, while the stop's command runs on the far side: the
# command goes on there (as a remote command does when its connection drops) and ssh says what
# OpenSSH says when keepalives go unanswered, with exit 255. Other commands run here.
LOSES_THE_STOP = """#!/bin/sh
for command; do :; done
case "$command" in *"kill -INT"*) if [ ! -e "$0.lost" ]; then
  touch "$0.lost"; setsid sh -c "$command" >/dev/null 2>&1 </dev/null &
  echo "Timeout, server 10.0.0.2 not responding." >&2; exit 255; fi;; esac
exec sh -c "$command"
"""


def test_a_connection_lost_while_stopping_a_neighbours_load_is_recorded_and_the_load_ends(
    tmp_path, monkeypatch
):
    """The stop is sent again over a new connection: the load ends, its metrics are read, and
    the lost connection is in the record (before, its metrics were missing without a word)."""
    ssh = tmp_path / "ssh"
    ssh.write_text(LOSES_THE_STOP)
    ssh.chmod(0o755)
    noise = neighbour_on_this_machine(tmp_path, monkeypatch, "slow", ssh=(str(ssh), "neighbour"))
    noise.start()
    noise.stop()
    (load,) = noise.record["loads"]
    assert load["connections_lost"] == ["exit 255: Timeout, server 10.0.0.2 not responding."]
    (metrics,) = load["metrics"]
    assert metrics["stressor"] == "cpu" and metrics["bogo-ops"] > 0, load
    assert [pid for pid in load["stressors"] if running(int(pid))] == []
    assert not list(Path("/tmp").glob(f"hvbench-noise-{tmp_path.name}-*"))


def test_a_neighbours_load_whose_stop_loses_both_connections_names_both_and_still_ends(
    tmp_path, monkeypatch
):
    ssh = tmp_path / "ssh"
    ssh.write_text(LOSES_THE_STOP.replace('if [ ! -e "$0.lost" ]', "if true"))  # every time
    ssh.chmod(0o755)
    noise = neighbour_on_this_machine(tmp_path, monkeypatch, "slow", ssh=(str(ssh), "neighbour"))
    noise.start()
    noise.stop()
    (load,) = noise.record["loads"]
    lost = "exit 255: Timeout, server 10.0.0.2 not responding."
    assert load["error"] == f"the load could not be stopped or read: {lost}; {lost}"
    assert "metrics" not in load
    deadline = time.monotonic() + 60  # the stop goes on on the far side, where it was sent
    while [pid for pid in load["stressors"] if running(int(pid))] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in load["stressors"] if running(int(pid))] == []
    for left in Path("/tmp").glob(f"hvbench-noise-{tmp_path.name}-*"):  # not read: kept there
        left.unlink()


@pytest.mark.parametrize(
    ("start", "message"),
    [
        ("hangs", r"stress-ng in neighbour-0 hangs before its stressors run \(1 s\)"),
        ("fails", "stress-ng in neighbour-0 ended before its stressors ran: .*no stressor named"),
    ],
)
def test_a_neighbours_load_that_hangs_or_fails_before_it_runs_is_a_run_error(
    tmp_path, monkeypatch, start, message
):
    monkeypatch.setattr(neighbours, "START_PATIENCE_S", 1.0)
    monkeypatch.setattr(neighbours, "STOP_GRACE_S", 1.0)  # for the stopped one, which ignores
    # SIGINT: a background command of sh does, until it sets a handler of its own
    noise = neighbour_on_this_machine(tmp_path, monkeypatch, start)
    with pytest.raises(RunError, match=message):
        noise.start()
    noise.stop()  # as the run's teardown does: the hung one is ended, nothing is left
    assert subprocess.run(["pgrep", "-f", str(tmp_path / "bin")], check=False).returncode == 1
    assert not list(Path("/tmp").glob(f"hvbench-noise-{tmp_path.name}-*"))
