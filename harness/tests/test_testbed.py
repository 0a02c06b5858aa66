"""The pieces that let the harness run parts on other machines: the tether, the machine
abstraction, the served broker, and the kvm and xen targets' refusals. The SSH path itself runs for
real in tests/testbed/test_provision_kvm.py; its shared connections run here against a private
sshd."""

import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from hvbench_agent.sched import validate
from hvbench_harness import run
from hvbench_harness.targets.host_scheduler import HostScheduler
from hvbench_harness.testbed import (
    Machine,
    Testbed,
    TestbedError,
    TestbedHost,
    close_shared,
    inventory_target,
    neighbour_ssh,
    shared_sockets,
    ssh_command,
)

REPO = Path(__file__).resolve().parents[2]
LIBS = REPO / "build" / "kafka" / "libs"


def tethered(*command: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hvbench_agent", "tether", "--", *command],
        stdin=subprocess.PIPE,
        start_new_session=True,
        **kwargs,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_closing_the_tether_ends_the_command_and_its_children(tmp_path):
    pidfile = tmp_path / "pid"
    proc = tethered("sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait")
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert alive(grandchild)
    proc.stdin.close()
    assert proc.wait(10) == 128 + 15  # SIGTERM, as the shell reports it
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_the_tether_passes_the_exit_code_on():
    proc = tethered("sh", "-c", "exit 3")
    assert proc.wait(10) == 3


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(mask >> (sig - 1) & 1)


def test_sigterm_to_the_tether_ends_the_command():
    proc = tethered("sleep", "300")
    deadline = time.monotonic() + 30
    while not catches(proc.pid, signal.SIGTERM):  # the tether's handler is in place
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(10) == 128 + 15


def test_a_local_machine_runs_and_fetches(tmp_path):
    here = Machine("here")
    assert not here.remote
    assert here.run(["echo", "a b"]).stdout == "a b\n"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.csv").write_text("x\n")
    here.fetch(str(tmp_path / "src"), tmp_path / "dst")
    assert (tmp_path / "dst" / "f.csv").read_text() == "x\n"


def test_a_machines_cpus_bind_the_parts_it_starts():
    pinned = Machine("here", cpus="0")
    proc = pinned.start(["grep", "Cpus_allowed_list", "/proc/self/status"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=10)
    assert out.decode().split() == ["Cpus_allowed_list:", "0"]


def test_a_remote_command_is_one_quoted_argument_after_ssh():
    there = Machine("vm", ssh=("ssh", "root@10.0.0.1"), python="/opt/hvbench/venv/bin/python")
    cmd = there.command(["echo", "a b", "$HOME"])
    assert cmd[:2] == ["ssh", "root@10.0.0.1"]
    assert shlex.split(cmd[2]) == ["echo", "a b", "$HOME"]
    sudo = Machine("host", ssh=("ssh", "me@h"), sudo=True)
    assert shlex.split(sudo.command(["hvbench-vcpu-sched", "read"], root=True)[2])[:2] == [
        "sudo",
        "-n",
    ]


@pytest.fixture
def private_sshd(tmp_path):
    """This machine through an sshd of its own: the testbed tier's (tests/testbed/hostvm.py)."""
    spec = importlib.util.spec_from_file_location("hostvm", REPO / "tests/testbed/hostvm.py")
    hostvm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hostvm)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    sshd = hostvm.ControllerSSH(tmp_path / "sshd", key)
    sshd.start()
    yield ("ssh", *sshd.ssh_options(), "-p", str(sshd.port), "root@127.0.0.1")
    sshd.stop()


def test_short_commands_share_one_connection_and_parts_keep_their_own(private_sshd):
    """Machine.run's commands go over one SSH connection (the sshd session that runs them is
    the same process), a part's over a connection of its own; at exit the shared connection
    is ended and its folder removed."""
    there = Machine("here over ssh", ssh=private_sshd)
    session = "ps -o ppid= -p $$"  # the shell's parent: the sshd process of its connection
    first, second = (there.run(["sh", "-c", session]).stdout.strip() for _ in range(2))
    assert first == second
    assert there.run(["cat", "/proc/self/comm"], input="").stdout.strip() == "cat"
    part = there.start(["sh", "-c", session], stdout=subprocess.PIPE)
    assert part.communicate(timeout=60)[0].decode().strip() != first
    assert not any("ControlPath" in arg for arg in there.command(["true"]))
    # an inventory's own ControlMaster=no comes first, and ssh keeps an option's first value
    unshared = Machine("x", ssh=("ssh", "-o", "ControlMaster=no", "root@x"))
    cmd = unshared.command(["true"], shared=True)
    assert cmd.index("ControlMaster=no") < cmd.index("ControlMaster=auto") < cmd.index("root@x")
    folder = shared_sockets()
    try:
        (socket,) = folder.iterdir()
        check = ["ssh", "-o", f"ControlPath={socket}", "-O", "check", "shared"]
        running = subprocess.run(check, capture_output=True, text=True)
        assert running.returncode == 0, running.stderr
        master = int(re.search(r"Master running \(pid=(\d+)\)", running.stderr)[1])
        close_shared(folder)
        assert not folder.exists()
        deadline = time.monotonic() + 60
        while Path(f"/proc/{master}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # polls for the master's exit, which the exit request starts
        assert not Path(f"/proc/{master}").exists()
    finally:
        shared_sockets.cache_clear()


def test_ssh_commands_come_from_ansibles_connection_variables():
    guest = {
        "name": "hvbench-messaging",
        "address": "192.168.123.10",
        "port": 22,
        "user": "root",
        "key": "/k/id_ed25519",
        "ssh_args": '-o StrictHostKeyChecking=no -o ProxyCommand="ssh -W %h:%p -p 2222 root@lab"',
        "private_address": "192.168.123.10",
    }
    cmd = ssh_command(guest)
    assert cmd[-1] == "root@192.168.123.10"
    assert "ProxyCommand=ssh -W %h:%p -p 2222 root@lab" in cmd
    assert cmd[cmd.index("-i") + 1] == "/k/id_ed25519"
    # a silent connection ends after 4 unanswered keepalives, unless the inventory says else
    assert "ServerAliveInterval=2" in cmd and "ServerAliveCountMax=4" in cmd
    slow = ssh_command({**guest, "ssh_args": "-o ServerAliveInterval=30"})
    assert slow.index("ServerAliveInterval=30") < slow.index("ServerAliveInterval=2")
    # a neighbour is loaded on purpose and answers late: its connection bears 30 s
    assert "ServerAliveCountMax=15" in neighbour_ssh(guest)
    host = {**guest, "name": "lab", "address": "lab", "user": "admin", "ssh_args": ""}
    testbed = Testbed.from_json(
        {
            "host": host,
            "messaging_vms": [guest],
            "realtime_vms": [{**guest, "address": "192.168.123.11"}],
            "realtime_domains": ["hvbench-realtime"],
            "install_dir": "/opt/hvbench",
            "work_dir": "/var/lib/hvbench/work",
        }
    )
    assert testbed.messaging_address == "192.168.123.10"
    assert testbed.host.sudo and not testbed.messaging.sudo
    assert testbed.realtime.python == "/opt/hvbench/venv/bin/python"
    assert testbed.realtime.ssh[-1] == "root@192.168.123.11"


@pytest.mark.integration  # a real Kafka broker
def test_a_served_broker_reports_itself_and_stops_when_the_tether_closes(tmp_path):
    proc = tethered(
        sys.executable,
        "-m",
        "hvbench_load.broker",
        "--libs",
        str(LIBS),
        "--work",
        str(tmp_path / "kafka"),
        "--host",
        "127.0.0.1",
        "--topics",
        "input,output,dead-letter",
        stdout=subprocess.PIPE,
    )
    try:
        described = json.loads(proc.stdout.readline())
        topics = AdminClient({"bootstrap.servers": described["bootstrap"]}).list_topics(timeout=10)
        assert {"input", "output", "dead-letter"} <= set(topics.topics)
        assert described["properties"]["listeners"].startswith("PLAINTEXT://127.0.0.1:")
    finally:
        proc.stdin.close()
        assert proc.wait(60) == 0  # the broker's controlled shutdown
    host, port = described["bootstrap"].split(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2)


@pytest.mark.integration  # a real Kafka broker
@pytest.mark.slow  # make test-testbed's slow tier, for make test's budget (docs/testing.md)
def test_a_served_broker_reports_its_restart_and_says_when_it_is_gone_for_good(tmp_path):
    """What a testbed run reads from the messaging VM's broker: one JSON line when a restart
    begins, one per fault."""
    proc = tethered(
        *(sys.executable, "-m", "hvbench_load.broker", "--libs", str(LIBS)),
        *("--work", str(tmp_path / "kafka"), "--host", "127.0.0.1", "--topics", "input"),
        *("--restarts", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        json.loads(proc.stdout.readline())
        config = tmp_path / "kafka" / "server.properties"

        def kill_the_jvm() -> None:
            pids = subprocess.run(
                ["pgrep", "-f", f"kafka.Kafka {config}"], capture_output=True, text=True
            ).stdout.split()
            os.kill(int(pids[0]), 9)

        kill_the_jvm()
        assert json.loads(proc.stdout.readline()) == {"restarting": True}  # said at once
        fault = json.loads(proc.stdout.readline())["fault"]
        assert fault["event"] == "restarted" and fault["exit_code"] == -9
        kill_the_jvm()
        assert proc.wait(60) == 1
        assert "no restart left" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(60)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--sched", "rtds", "--budget", "1000"], "unknown SCHED 'rtds' for target kvm"),
        (["--sched", "cfs", "--budget", "120000"], "> PERIOD"),
        (["--sched", "deadline-quota"], "unknown SCHED"),
        (["--sched", "fifo"], "SCHED=fifo needs PRIORITY"),
        (["--sched", "cfs", "--budget", "50000", "--priority", "5"], "SCHED=cfs has no PRIORITY=5"),
        (["--sched", "none", "--cpu-latency", "0"], "CPU_LATENCY is for the bare target"),
        (["--sched", "none"], "TARGET=kvm needs the testbed"),
    ],
)
def test_bad_kvm_settings_are_refused_before_anything_is_touched(args, expected, tmp_path, capsys):
    inventory = [] if expected.startswith("TARGET=kvm") else ["--inventory", "/nonexistent"]
    code = run.main(
        [
            "--target",
            "kvm",
            *inventory,
            *args,
            "--work",
            str(tmp_path / "w"),
            "--results",
            str(tmp_path / "r"),
        ]
    )
    assert code == 1
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--sched", "cfs", "--budget", "1000"], "unknown SCHED 'cfs' for target xen"),
        (["--sched", "rtds", "--budget", "120000"], "SCHED=rtds: BUDGET 120000 us > PERIOD"),
        (["--sched", "rtds", "--budget", "5000", "--cap", "50"], "SCHED=rtds has no CAP=50"),
        (["--sched", "credit", "--budget", "5000"], "SCHED=credit has no BUDGET=5000"),
        (["--sched", "credit2", "--weight", "0"], "WEIGHT 0 outside 1..65535"),
        (["--sched", "rtds", "--budget", "5000", "--extratime", "2"], "EXTRATIME must be 0 or 1"),
        (["--sched", "credit", "--priority", "5"], "SCHED=credit has no PRIORITY=5"),
        (["--sched", "credit", "--cpu-latency", "0"], "CPU_LATENCY is for the bare target"),
        (["--sched", "credit"], "TARGET=xen needs the testbed"),
    ],
)
def test_bad_xen_settings_are_refused_before_anything_is_touched(args, expected, tmp_path, capsys):
    inventory = [] if expected.startswith("TARGET=xen") else ["--inventory", "/nonexistent"]
    argv = ["--target", "xen", *inventory, *args]
    code = run.main([*argv, "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")])
    assert code == 1
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()


def file_of_testbed(target: str, realtime_vms: int = 1) -> dict:
    """A testbed file as playbooks/testbed.yml writes it, with one messaging VM."""
    names = ["rt", *(f"rt-{i}" for i in range(2, realtime_vms + 1))]
    return {
        "target": target,
        "realtime_domains": names,
        "realtime_pool": "hvbench-rt" if target == "xen" else "",
        "install_dir": "/opt/hvbench",
        "work_dir": "/w",
        "host": {"name": "host", "address": "10.0.0.1"},
        "messaging_vms": [{"name": "m", "address": "10.0.0.2", "private_address": "10.0.0.2"}],
        "realtime_vms": [
            {"name": name, "address": f"10.0.0.{11 + i}", "private_address": f"10.0.0.{11 + i}"}
            for i, name in enumerate(names)
        ],
    }


def test_the_host_tool_gets_the_setting_of_its_target():
    def testbed(target: str) -> Testbed:
        return Testbed.from_json(file_of_testbed(target))

    xen = HostScheduler(testbed("xen")).command(
        "apply", validate("xen", "rtds", budget_us=77500, extratime=1)
    )
    assert xen == [
        *("hvbench-agent", "sched", "apply", "--backend", "xen", "--domain", "rt"),
        *("--pool", "hvbench-rt"),
        *("--sched", "rtds", "--budget", "77500", "--period", "100000", "--extratime", "1"),
    ]
    credit = HostScheduler(testbed("xen")).command("check", validate("xen", "credit", cap=153))
    assert credit[-6:] == ["--sched", "credit", "--weight", "256", "--cap", "153"]
    kvm = HostScheduler(testbed("kvm")).command("apply", validate("kvm", "fifo", priority=9))
    assert kvm == [
        *("hvbench-agent", "sched", "apply", "--backend", "kvm", "--domain", "rt"),
        *("--sched", "fifo", "--priority", "9"),
    ]


def test_the_setting_goes_to_every_real_time_vm_of_a_cluster():
    testbed = Testbed.from_json(file_of_testbed("xen", realtime_vms=3))
    assert testbed.realtime_domains == ("rt", "rt-2", "rt-3")
    assert testbed.realtime.ssh[-1] == "root@10.0.0.11"  # the first: where the job starts
    assert [vm.ssh[-1] for vm in testbed.realtime_vms][1:] == ["root@10.0.0.12", "root@10.0.0.13"]
    scheduler = HostScheduler(testbed)
    read = scheduler.command("read")
    assert read == [
        *("hvbench-agent", "sched", "read", "--backend", "xen"),
        *("--domain", "rt", "--domain", "rt-2", "--domain", "rt-3", "--pool", "hvbench-rt"),
    ]
    assert scheduler.where() == "rt, rt-2, rt-3 in cpupool hvbench-rt"


def file_of_two_hosts(target: str) -> dict:
    """A testbed file of two hosts: the first runs m and rt, the second rt-2 and rt-3."""
    doc = file_of_testbed(target, realtime_vms=3)
    pool = doc["realtime_pool"]
    second = {"name": "lab-2", "address": "10.0.1.1"}
    doc["hosts"] = [
        {"host": doc["host"], "realtime_domains": ["rt"], "messaging_domains": ["m"],
         "realtime_pool": pool, "host_facts": {"hostname": "lab-1"}},
        {"host": second, "realtime_domains": ["rt-2", "rt-3"], "messaging_domains": [],
         "realtime_pool": pool, "host_facts": {"hostname": "lab-2"}},
    ]  # fmt: skip
    return doc


def test_each_host_of_several_gets_the_setting_of_its_own_real_time_vms():
    testbed = Testbed.from_json(file_of_two_hosts("xen"))
    assert [h.machine.ssh[-1] for h in testbed.each_host()] == ["root@10.0.0.1", "root@10.0.1.1"]
    assert testbed.host.ssh[-1] == "root@10.0.0.1"  # the first: neighbours and traces
    scheduler = HostScheduler(testbed)
    second = testbed.each_host()[1]
    assert scheduler.command("read", host=second)[3:] == [
        *("--backend", "xen", "--domain", "rt-2", "--domain", "rt-3", "--pool", "hvbench-rt"),
    ]
    assert scheduler.command("read")[4:] == ["xen", "--domain", "rt", "--pool", "hvbench-rt"]
    assert scheduler.where() == (
        "rt in cpupool hvbench-rt on host (host); rt-2, rt-3 in cpupool hvbench-rt on host (lab-2)"
    )


AGENT = """
import json, sys
name, log, refuse = sys.argv[1:4]
verb, domains = sys.argv[5], [a for i, a in enumerate(sys.argv) if sys.argv[i - 1] == "--domain"]
with open(log, "a") as f:
    f.write(f"{name} {verb} {' '.join(domains)}\\n")
if verb == refuse:
    sys.exit(f"{verb} refused here")
found = [{"domain": d, "sched": "fifo", "host": {"cpus": "0-3"}} for d in domains]
print(json.dumps({"readback": found[0], **({"readbacks": found} if len(found) > 1 else {})}))
"""


def hosts_with_agents(tmp_path: Path, refuse_on_second: str = "") -> tuple[Testbed, Path]:
    """Two local hosts whose agents log each verb and answer with a readback per domain, the
    second refusing one verb: the harness's side of several hosts, without them."""
    (tmp_path / "agent.py").write_text(AGENT)
    log = tmp_path / "agent.log"

    def host(name: str, domains: tuple[str, ...], refuse: str) -> TestbedHost:
        agent = (sys.executable, str(tmp_path / "agent.py"), name, str(log), refuse or "-")
        return TestbedHost(Machine(name, agent_command=agent), domains)

    hosts = (host("a", ("rt",), ""), host("b", ("rt-2", "rt-3"), refuse_on_second))
    testbed = Testbed(
        host=hosts[0].machine, messaging_vms=(), realtime_vms=(), messaging_addresses=(),
        realtime_addresses=(), realtime_domains=("rt", "rt-2", "rt-3"), install_dir="/opt",
        work_dir="/w", hosts=hosts,
    )  # fmt: skip
    return testbed, log


def test_several_hosts_readbacks_name_their_host(tmp_path):
    testbed, log = hosts_with_agents(tmp_path)
    scheduler = HostScheduler(testbed)
    answer = scheduler.apply(validate("kvm", "fifo", priority=9))
    assert answer["readback"] == {"domain": "rt", "sched": "fifo", "host": {"cpus": "0-3"}}
    assert {r["host"]["cpus"] for r in answer["readbacks"]} == {"0-3"}  # the agent's own
    assert [(r["on_host"], r["domain"]) for r in answer["readbacks"]] == [
        ("a", "rt"), ("b", "rt-2"), ("b", "rt-3"),
    ]  # fmt: skip
    assert log.read_text().splitlines() == ["a apply rt", "b apply rt-2 rt-3"]


def test_a_refusal_on_one_host_resets_every_host_and_names_it(tmp_path):
    testbed, log = hosts_with_agents(tmp_path, refuse_on_second="apply")
    with pytest.raises(TestbedError, match=r"^b: apply refused here"):
        HostScheduler(testbed).apply(validate("kvm", "fifo", priority=9))
    assert log.read_text().splitlines() == [
        "a apply rt", "b apply rt-2 rt-3", "a reset rt", "b reset rt-2 rt-3",
    ]  # fmt: skip


def test_make_run_on_kvm_refuses_a_bad_setting_before_asking_ansible():
    proc = subprocess.run(
        [
            "make",
            "-s",
            "run",
            "TARGET=kvm",
            "HOST=nonexistent.invalid",
            "SCHED=cfs",
            "BUDGET=200000",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "BUDGET 200000 us > PERIOD 100000 us" in proc.stderr
    assert "ansible" not in (proc.stdout + proc.stderr).lower()


def inventory(tmp_path: Path, groups: dict) -> str:
    path = tmp_path / "hosts.yml"
    path.write_text(json.dumps({"all": {"children": groups}}))
    return str(path)


def test_the_inventory_implies_the_target(tmp_path):
    host = {"hosts": {"lab-1": {"ansible_host": "192.0.2.10"}}}
    assert inventory_target(str(REPO / "inventory/sample/hosts.yml")) == "bare"
    assert inventory_target(inventory(tmp_path, {"xen_hosts": host})) == "xen"
    assert inventory_target(inventory(tmp_path, {"kvm_hosts": host, "xen_hosts": {}})) == "kvm"
    # a host in a child group of xen_hosts counts
    nested = {"xen_hosts": {"children": {"lab": host}}}
    assert inventory_target(inventory(tmp_path, nested)) == "xen"
    both = inventory(tmp_path, {"kvm_hosts": host, "xen_hosts": {"hosts": {"lab-2": {}}}})
    with pytest.raises(TestbedError, match="hosts in both kvm_hosts and xen_hosts; TARGET="):
        inventory_target(both)
    with pytest.raises(TestbedError, match=r"no inventory at /nonexistent/hosts\.yml"):
        inventory_target("/nonexistent/hosts.yml")


def test_make_run_without_target_follows_the_inventory(tmp_path):
    # the sample inventory lists no host: this machine (bare); a Xen inventory: the xen target,
    # whose settings are then refused as xen's before any host is asked
    def make_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["make", "-s", "run", *args], cwd=REPO, capture_output=True, text=True, timeout=300
        )

    # refused before the inputs are built (no data or model here: none is made)
    inputs = tmp_path / "inputs"
    bare = make_run("SCHED=rtds", "BUDGET=77500", f"DATA_DIR={inputs}/d", f"MODEL_DIR={inputs}/m")
    assert bare.returncode != 0 and "unknown SCHED 'rtds' for target bare" in bare.stderr
    assert not inputs.exists()
    lab = tmp_path / "lab"
    lab.mkdir()
    inventory(lab, {"xen_hosts": {"hosts": {"lab-1": {"ansible_host": "192.0.2.10"}}}})
    xen = make_run(f"INVENTORY={lab}", "SCHED=rtds", "BUDGET=120000")
    assert xen.returncode != 0
    assert "SCHED=rtds: BUDGET 120000 us > PERIOD 100000 us" in xen.stderr, xen.stderr
    assert "PLAY" not in xen.stdout  # no playbook ran
    unknown = make_run("TARGET=vmware")
    assert unknown.returncode != 0 and "unknown TARGET 'vmware'; valid: bare, kvm, xen" in (
        unknown.stderr
    )
    once = make_run("HOST=root@192.0.2.99", "SCHED=rtds", "BUDGET=1000")
    assert once.returncode != 0 and "HOST=root@192.0.2.99: say TARGET=kvm or xen" in once.stderr


def test_a_testbed_run_checks_its_networks_data_where_the_producers_read_it(tmp_path):
    from types import SimpleNamespace

    from hvbench_harness.parts import RunError
    from hvbench_harness.targets.testbed import TestbedTarget

    def check(network: str, data: Path) -> None:
        target = SimpleNamespace(
            paths=SimpleNamespace(data=str(data)),
            messaging=Machine("messaging (here)"),
            request=SimpleNamespace(network=network),
        )
        TestbedTarget.check_data(target)

    generated, real, empty = tmp_path / "generated", tmp_path / "real", tmp_path / "empty"
    for folder in (generated, real, empty):
        folder.mkdir()
    (generated / "generated.json").write_text('{"network": "bay"}')
    (real / "d04_text_station_5min_2024_03_01.txt.gz").write_bytes(b"")
    check("bay", generated)
    check("bay", real)  # real PeMS files say nothing of their network: taken as they are
    with pytest.raises(RunError, match="is for NETWORK=bay, not freeway"):
        check("freeway", generated)
    with pytest.raises(RunError, match=r"no bay data at .*provision the testbed again"):
        check("bay", empty)
