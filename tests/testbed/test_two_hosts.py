"""Two hosts as one KVM testbed, for real: two QEMU guests play the bare-metal hosts (see
hostvm.py), joined by a link of their own (10.99.0.1 and .2), and one `make provision` makes
them one testbed. Host A runs a messaging VM and a real-time VM on 192.168.123.0/24, host B a
real-time VM on 192.168.124.0/24. This machine plays the workload's machines (as in
test_provision_kvm.py); the nested VMs get the scheduler setting.

It checks what one host cannot show: the guests of one host reach the other's with their own
addresses (hvbench-guest-peers) and the rest through NAT, `make sched` and `make run` apply the
setting on both hosts and read it back from each, and the teardown removes the routes.

Not in `make test-testbed`: two TCG hosts with nested guests take about 17 minutes here, which
CI's time does not have. `make test-two-hosts` runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hostvm import (
    KVM_HOST_LINUX_ARGS,
    ControllerSSH,
    HostVM,
    agent_wheel,
    build_image,
    free_port,
    run_playbook,
)
from test_provision_kvm import CACHE, guest_bundle, small_testbed_vars, workload_dirs_of

pytestmark = [pytest.mark.testbed, pytest.mark.two_hosts, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]


def vm(name: str, cpu: int, memory_mb: int) -> dict:
    return {"name": name, "vcpus": 1, "memory_mb": memory_mb, "host_cpus": [cpu], "disk_gb": 10}


# host name: (its address on the link, its guests' network, its guests, its vCPUs)
HOSTS = {
    "host_a": ("10.99.0.1", "192.168.123", {
        "messaging": [vm("msg-a", 1, 768)], "realtime": [vm("rt-a", 2, 512)]}, 3),
    "host_b": ("10.99.0.2", "192.168.124", {
        "messaging": [], "realtime": [vm("rt-b", 1, 512)]}, 2),
}  # fmt: skip
# each guest's address: .10 the first messaging VM, .11 the first real-time VM
ADDRESS = {"msg-a": "192.168.123.10", "rt-a": "192.168.123.11", "rt-b": "192.168.124.11"}
HOST_OF = {"msg-a": "host_a", "rt-a": "host_a", "rt-b": "host_b"}


def inventory(path: Path, vms: dict[str, HostVM], controller: ControllerSSH) -> Path:
    """Both hosts in kvm_hosts, each with its link address, guest network and guests; this
    machine as the messaging and real-time machines."""
    hosts = {}
    for name, (address, prefix, guests, _) in HOSTS.items():
        entry = json.loads(vms[name].inventory(path / f"{name}.json", "kvm_hosts").read_text())
        hosts[name] = {
            **entry["kvm_hosts"]["hosts"]["testhost"],
            "hvbench_host_address": address,
            "guests_network_prefix": prefix,
            "hvbench_guests": guests,
            "hvbench_neighbours": {"count": 0},
            "rt_profile_boot": False,  # the real-time profile's run-time part (as on KVM's)
        }
    install_dir, run_dir = workload_dirs_of(path / "hosts.yml")
    dirs = {"hvbench_install_dir": str(install_dir), "hvbench_run_dir": str(run_dir)}
    for host in hosts.values():
        host.update(dirs)
    # this machine plays the guests and keeps its own kernel settings (as in the KVM module)
    here = controller.inventory_host(
        hvbench_private_address="127.0.0.1", rt_profile_enabled=False, **dirs
    )
    doc = {
        "kvm_hosts": {"hosts": hosts},
        "messaging_vms": {"hosts": {"controller": here}},
        "realtime_vms": {"hosts": {"controller": here}},
    }
    (path / "hosts.yml").write_text(json.dumps(doc))
    return path / "hosts.yml"


@pytest.fixture(scope="module")
def testbed(tmp_path_factory, small_model, small_data):
    """Both host VMs booted, linked and provisioned in one `make provision` (one playbook run)."""
    agent_wheel()
    image = build_image(CACHE, linux_args=KVM_HOST_LINUX_ARGS)
    work = tmp_path_factory.mktemp("two-hosts")
    bundle = guest_bundle(work, small_model, small_data[0])
    ports = (free_port(), free_port())
    vms: dict[str, HostVM] = {}
    controller = None
    try:
        for i, (name, (address, _, _, cpus)) in enumerate(HOSTS.items()):
            link = (ports[i], ports[1 - i])
            vms[name] = HostVM(image, work / name, cpus=cpus, memory_mb=3072, link=link)
            vms[name].start()
            vms[name].hold_static_keys()
            vms[name].hold_tracepoints(others_offline=True)
            vms[name].link_address(address)
        folder = work / "inventory"
        folder.mkdir()
        os.symlink(REPO / "inventory/sample/group_vars", folder / "group_vars")
        controller = ControllerSSH(work / "controller", vms["host_a"].key)
        controller.start()
        hosts = inventory(folder, vms, controller)
        extra = work / "test-vars.yml"
        extra.write_text(yaml.safe_dump(small_testbed_vars(vms["host_a"].key, bundle)))
        code, out, _ = run_playbook(vms["host_a"], hosts, extra, "provision.yml")
        assert code == 0, out[-8000:] + "\n--- host B ---\n" + vms["host_b"].console_tail()
        yield vms, hosts, extra
    finally:
        if controller is not None:
            controller.stop()
        for one in vms.values():
            one.stop()


def in_guest(vms: dict[str, HostVM], guest: str, command: str) -> str:
    """A command in a nested guest, reached over SSH through its own host."""
    host = vms[HOST_OF[guest]]
    jump = f"ssh {' '.join(host.ssh_options())} -p {host.port} -W %h:%p root@127.0.0.1"
    proc = subprocess.run(
        ["ssh", *host.ssh_options(), "-o", f"ProxyCommand={jump}", f"root@{ADDRESS[guest]}",
         command],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


# a TCP server on port 5000 that writes its first client's address to /tmp/seen, then ends
SERVE = (
    "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
    "s.bind(('0.0.0.0',5000)); s.listen(); s.settimeout(120); c,a=s.accept();"
    "open('/tmp/seen','w').write(a[0])"
)


def seen_by(vms, server: str, client: str, address: str, run_on_host: bool = False) -> str:
    """The source address a server (a guest, or a host VM) sees for a client guest that
    connects to it at address."""

    def on_server(command: str) -> str:
        if run_on_host:
            return vms[server].ssh(command).stdout
        return in_guest(vms, server, command)

    on_server(f'rm -f /tmp/seen; (timeout 150 python3 -c "{SERVE}" </dev/null >/dev/null 2>&1 &)')
    connect = f"import socket,time; time.sleep(3); socket.create_connection(('{address}',5000),30)"
    in_guest(vms, client, f'python3 -c "{connect}"')
    return on_server(
        "for i in $(seq 30); do test -s /tmp/seen && break; sleep 1; done; cat /tmp/seen"
    )


def test_each_hosts_guests_reach_the_others_with_their_own_addresses(testbed):
    vms, _, _ = testbed
    for name in HOSTS:
        state = vms[name].ssh("systemctl is-active hvbench-guest-peers").stdout.strip()
        assert state == "active", name
        network = vms[name].ssh("virsh -c qemu:///system net-dumpxml hvbench").stdout
        assert "<forward mode='open'/>" in network, network
    assert seen_by(vms, "rt-b", "msg-a", ADDRESS["rt-b"]) == ADDRESS["msg-a"]
    assert seen_by(vms, "msg-a", "rt-b", ADDRESS["msg-a"]) == ADDRESS["rt-b"]
    # anything else, here host B itself on the link, through host A's NAT
    assert seen_by(vms, "host_b", "msg-a", "10.99.0.2", run_on_host=True) == "10.99.0.1"


def make(hosts: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["make", "-s", *args, f"INVENTORY={hosts.parent}"],
        cwd=REPO, env={**os.environ, "ANSIBLE_TIMEOUT": "60"}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc


def test_make_sched_sets_each_hosts_real_time_vm_and_keeps_each_answer(testbed):
    _, hosts, _ = testbed
    readback = REPO / "build/sched.json"
    for args, cpu_max in ((["SCHED=cfs", "BUDGET=30000"], "30000 100000"),
                          (["ACTION=reset"], "max 100000")):  # fmt: skip
        readback.unlink(missing_ok=True)
        make(hosts, "vcpu-sched", *args)
        found = json.loads(readback.read_text())["hosts"]
        assert {h: a["readback"]["domain"] for h, a in found.items()} == {
            "host_a": "rt-a", "host_b": "rt-b",
        }  # fmt: skip
        for answer in found.values():
            (vcpu,) = answer["readback"]["vcpus"]
            assert vcpu["cpu_max"] == cpu_max
    readback.unlink()


def test_make_run_reads_the_setting_back_from_every_host(testbed, tmp_path):
    _, hosts, _ = testbed
    results, run_id = tmp_path / "results", f"two-hosts-{tmp_path.parent.name}"
    settings = ["SCHED=cfs", "BUDGET=50000", "DRAIN=60", "FORCE_TSC=1", "RECORDS=60"]
    settings += ["SEND_MS=500", "WARMUP=2", f"RUN_ID={run_id}", f"RESULTS={results}"]
    make(hosts, "run", "TARGET=kvm", *settings)
    meta = json.loads((results / run_id / "meta.json").read_text())
    assert meta["counts"]["accounted"] and meta["counts"]["received"] == 60
    for when in ("sched", "sched_at_end"):
        readbacks = meta[when]["readbacks"]
        assert [(r["on_host"], r["domain"]) for r in readbacks] == [
            ("host (host_a)", "rt-a"), ("host (host_b)", "rt-b"),
        ]  # fmt: skip
        assert {r["vcpus"][0]["cpu_max"] for r in readbacks} == {"50000 100000"}
    assert "on host (host_b)" in meta["placement"]["scheduler setting"]
    assert {g["on_host"] for g in meta["guests"]} == {"host (host_a)", "host (host_b)"}
    assert set(meta["host"]["hosts"]) == {"host (host_a)", "host (host_b)"}
    assert {"host (host_a)", "host (host_b)"} <= set(meta["readiness"]["checks"])


def test_teardown_removes_the_routes_on_every_host(testbed):
    vms, hosts, extra = testbed
    code, out, _ = run_playbook(vms["host_a"], hosts, extra, "teardown.yml")
    assert code == 0, out[-6000:]
    for name, other in (("host_a", "192.168.124"), ("host_b", "192.168.123")):
        unit = vms[name].ssh("ls /etc/systemd/system/hvbench-guest-peers.service 2>&1 || true")
        assert "No such file" in unit.stdout
        assert other not in vms[name].ssh("ip route").stdout  # the route to the other's guests
