"""make provision's first step, the guests role's checks (roles/guests/tasks/validate.yml), on
this machine: bad neighbour settings are refused with the reason, good ones pass. The checks
only read, so no host is needed; the testbed tier runs them on real hosts too."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from hvbench_harness.testbed import Testbed

REPO = Path(__file__).resolve().parents[2]
GUESTS = {
    "messaging": {"name": "m", "vcpus": 1, "memory_mb": 1024, "host_cpus": [0], "disk_gb": 10},
    "realtime": {"name": "r", "vcpus": 1, "memory_mb": 1024, "host_cpus": [1], "disk_gb": 10},
}


def check(
    tmp_path: Path, neighbours: dict, playbook: str = "validate.yml", **more
) -> subprocess.CompletedProcess:
    settings = {
        "hvbench_hypervisor": "kvm",
        "hvbench_guests": GUESTS,
        "hvbench_neighbours": neighbours,
        "ansible_python_interpreter": sys.executable,
        **more,
    }
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
         "-e", f"@{tmp_path / 'vars.json'}", str(REPO / "tests/roles" / playbook)],
        cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def vm(name: str, cpus: list[int]) -> dict:
    return {"name": name, "vcpus": len(cpus), "memory_mb": 1024, "host_cpus": cpus, "disk_gb": 10}


@pytest.mark.parametrize(
    ("neighbours", "message"),
    [
        ({"count": 1, "workload": True, "memory_mb": 1024}, "with the workload memory_mb ≥ 3072"),
        ({"count": 1, "workload": "yes please"}, "workload true or false (got yes please)"),
        ({"count": 1, "image": "relative/dir"}, "image an absolute directory on the host"),
        ({"count": 1, "image": "/nonexistent"}, "lacks disk.qcow2, vmlinuz, initrd.img"),
        ({"count": 12}, "count 0..9 (got 12)"),
    ],
)
def test_bad_neighbour_settings_are_refused_with_the_reason(tmp_path, neighbours, message):
    proc = check(tmp_path, neighbours)
    out = " ".join((proc.stdout + proc.stderr).split())  # Ansible folds long messages
    assert proc.returncode != 0 and message in out, out[-3000:]


def test_an_image_of_ones_own_and_a_workload_neighbour_pass(tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    for name in ("disk.qcow2", "vmlinuz", "initrd.img"):
        (image / name).write_bytes(b"")
    neighbours = {"count": 2, "workload": True, "memory_mb": 4096, "image": str(image)}
    proc = check(tmp_path, neighbours)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def this_release() -> str:
    """This machine's release as Ansible names it (distribution, major version)."""
    release = platform.freedesktop_os_release()
    return f"{release['NAME'].split()[0]} {release['VERSION_ID'].split('.')[0]}"


def test_a_release_provisioning_is_not_tested_on_is_refused_first(tmp_path):
    tested = {"kvm": ["Debian 13"], "xen": ["Debian 12"]}
    if this_release() in tested["kvm"]:
        tested["kvm"] = ["Debian 12"]
    proc = check(tmp_path, {}, guests_tested_releases=tested)
    out = " ".join((proc.stdout + proc.stderr).split())
    expected = f"this host runs {this_release()}; a kvm host is tested on {tested['kvm'][0]} only"
    assert proc.returncode != 0 and expected in out, out[-3000:]
    assert "add it to guests_tested_releases" in out


def test_an_unknown_on_crash_action_is_refused_on_xen(tmp_path):
    proc = check(tmp_path, {}, hvbench_hypervisor="xen", guests_xen_on_crash="reboot")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-3000:]
    assert "guests_xen_on_crash destroy, restart or preserve (got reboot)" in out, out[-3000:]


@pytest.mark.parametrize(
    ("guests", "message"),
    [
        ({"realtime": [vm("r", [1]), vm("r", [0])]}, "with a name of its own"),
        ({"realtime": [vm("r", [1]), vm("r2", [0])]}, "host CPUs no other uses"),
        (
            {"realtime": [vm(f"r{i}", [1]) for i in range(10)]},
            "a list of 1 to 9 VMs (got 1 and 10)",
        ),
        ({"messaging": []}, "a list of 1 to 9 VMs (got 0 and 1)"),
    ],
)
def test_a_bad_cluster_layout_is_refused_with_the_reason(tmp_path, guests, message):
    proc = check(tmp_path, {}, hvbench_guests={**GUESTS, **guests})
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and message in out, out[-3000:]


def test_the_vms_may_be_given_as_lists(tmp_path):
    guests = {"messaging": [GUESTS["messaging"]], "realtime": [GUESTS["realtime"]]}
    proc = check(tmp_path, {}, hvbench_guests=guests)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_a_clusters_vms_get_their_roles_addresses_and_pool(tmp_path):
    guests = {
        "messaging": [vm("m", [2]), vm("m2", [3])],
        "realtime": [vm("r", [4]), vm("r2", [5]), vm("r3", [6, 7])],
    }
    out = tmp_path / "guests.json"
    more = {"guests_list_file": str(out), "xen_host_rt_pool": "hvbench-rt"}
    proc = check(tmp_path, {"count": 1}, "list.yml", hvbench_guests=guests, **more)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    listed = json.loads(out.read_text())
    found = [(g["name"], g["role"], g["index"], g["pool"]) for g in listed]
    # every guest, the neighbours too, knows its host and its address (the inventory's)
    assert [(g["host"], g["address"]) for g in listed] == [
        ("localhost", f"192.168.123.{g['index']}") for g in listed
    ]
    assert found == [
        ("m", "messaging", 10, ""),
        ("m2", "messaging", 31, ""),
        ("r", "realtime", 11, "hvbench-rt"),
        ("r2", "realtime", 41, "hvbench-rt"),
        ("r3", "realtime", 42, "hvbench-rt"),
        # placed on the real-time VMs' CPUs (the default), in their pool
        ("hvbench-neighbour-0", "neighbour", 20, "hvbench-rt"),
    ]


@pytest.mark.parametrize(
    ("hypervisor", "more", "console", "args"),
    [
        ("kvm", {}, "/var/lib/hvbench/disks/r.console.log",
         "120 900 'virsh -c qemu:///system list' fatal"),
        ("xen", {"guests_xen_on_crash": "restart", "guests_first_sign_s": 60},
         "/var/log/xen/console/guest-r.log", "60 900 'xl list' restarts"),
        ("xen", {"xen_host_console_log": False}, "-", "120 900 'xl list' fatal"),
    ],
)  # fmt: skip
def test_the_boot_watch_gets_each_guests_console_and_address(
    tmp_path, hypervisor, more, console, args
):
    out = tmp_path / "boot.json"
    settings = {"guests_list_file": str(tmp_path / "list.json"), "guests_boot_file": str(out)}
    settings |= {"hvbench_hypervisor": hypervisor, "hvbench_state_dir": "/var/lib/hvbench"}
    proc = check(tmp_path, {}, "list.yml", **settings, **more)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    boot = json.loads(out.read_text())
    assert " ".join(boot["args"].split()) == args
    assert {"name": "r", "console": console, "guest": f"r:192.168.123.11:{console}"} in boot["list"]


# --- several hosts as one testbed (docs/cluster.md) ---


def hosts_inventory(tmp_path: Path, **hosts: dict) -> Path:
    """An inventory of several KVM hosts, all this machine, each with its own variables."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    doc = {"all": {"children": {"kvm_hosts": {"hosts": {
        name: {**local, "hvbench_hypervisor": "kvm", "hvbench_neighbours": {}, **settings}
        for name, settings in hosts.items()
    }}}}}  # fmt: skip
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(doc))
    return path


def play(inventory: Path, playbook: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), *extra,
         str(REPO / "tests/roles" / playbook)],
        cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def host_b(prefix: str = "192.168.124", **more) -> dict:
    guests = {"messaging": [], "realtime": [vm("r-b", [0]), vm("r2-b", [1])]}
    return {"hvbench_guests": guests, "guests_network_prefix": prefix, **more}


HOST_A = {"hvbench_guests": GUESTS, "guests_network_prefix": "192.168.123"}


@pytest.mark.parametrize(
    ("b", "message"),
    [
        (host_b(prefix="192.168.123"), "each its own guests_network_prefix"),
        ({**host_b(), "hvbench_guests": {"messaging": [], "realtime": [vm("r", [0])]}},
         "guests of names of their own (got ['m', 'r', 'r'])"),
        (host_b(hvbench_hypervisor="xen"), "run one hypervisor (got ['kvm', 'xen'])"),
        (host_b(hvbench_neighbours={"count": 1}), "neighbour VMs run on the first host only"),
        ({**host_b(), "hvbench_guests": {"messaging": [], "realtime": []}},
         "needs messaging and realtime"),
    ],
)  # fmt: skip
def test_a_bad_layout_of_several_hosts_is_refused_with_the_reason(tmp_path, b, message):
    proc = play(hosts_inventory(tmp_path, host_a=HOST_A, host_b=b), "validate.yml")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and message in out, out[-3000:]


def test_the_first_of_several_hosts_runs_both_sides(tmp_path):
    first = {**HOST_A, "hvbench_guests": {**GUESTS, "messaging": []}}
    proc = play(hosts_inventory(tmp_path, host_a=first, host_b=host_b()), "validate.yml")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and "a list of 1 to 9 VMs (got 0 and 1)" in out, out[-3000:]


def test_several_hosts_guests_are_each_reached_through_their_host(tmp_path):
    b = host_b(ansible_host="198.51.100.2", ansible_user="lab")
    a = {**HOST_A, "ansible_host": "198.51.100.1", "hvbench_neighbours": {"count": 1}}
    inventory = hosts_inventory(tmp_path, host_a=a, host_b=b)
    assert play(inventory, "validate.yml").returncode == 0
    out = tmp_path / "inventory.out.json"
    key = "hvbench_ssh_public_key_file=/k/id.pub"
    proc = play(inventory, "inventory.yml", "-e", f"guests_inventory_file={out}", "-e", key)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    found = json.loads(out.read_text())
    assert found["groups"]["messaging_vms"] == ["m"]
    assert found["groups"]["realtime_vms"] == ["r", "r-b", "r2-b"]
    guests = found["guests"]
    assert [guests[g]["ansible_host"] for g in ("m", "r", "r-b", "r2-b")] == [
        "192.168.123.10", "192.168.123.11", "192.168.124.11", "192.168.124.41",
    ]  # fmt: skip
    assert guests["r-b"]["hvbench_guest_host"] == "host_b"
    assert found["groups"]["neighbour_vms"] == ["hvbench-neighbour-0"]
    assert guests["hvbench-neighbour-0"]["ansible_host"] == "192.168.123.20"
    assert "lab@198.51.100.2" in guests["r-b"]["ansible_ssh_common_args"]
    assert "\n" not in guests["r-b"]["ansible_ssh_common_args"]  # one shell command
    assert "root@198.51.100.1" in guests["m"]["ansible_ssh_common_args"]


def test_the_testbed_file_of_several_hosts_gives_the_harness_each_hosts_vms(tmp_path):
    a = {**HOST_A, "ansible_host": "198.51.100.1"}
    inventory = hosts_inventory(tmp_path, host_a=a, host_b=host_b(ansible_host="198.51.100.2"))
    out = tmp_path / "testbed.json"
    settings = {"testbed_file": str(out), "hvbench_ssh_public_key_file": "/k/id.pub",
                "hvbench_install_dir": "/opt/hvbench", "hvbench_run_dir": "/w"}  # fmt: skip
    proc = play(inventory, "testbed_file.yml", "-e", json.dumps(settings))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    testbed = Testbed.from_json(json.loads(out.read_text()))
    hosts = testbed.each_host()
    assert [h.machine.ssh[-1] for h in hosts] == ["root@198.51.100.1", "root@198.51.100.2"]
    assert [h.realtime_domains for h in hosts] == [("r",), ("r-b", "r2-b")]
    assert [h.messaging_domains for h in hosts] == [("m",), ()]
    assert all(h.facts["hostname"] for h in hosts)
    assert testbed.realtime_domains == ("r", "r-b", "r2-b")
    assert (testbed.messaging_domain, testbed.host.ssh[-1]) == ("m", "root@198.51.100.1")
    assert testbed.realtime_addresses == ("192.168.123.11", "192.168.124.11", "192.168.124.41")
    assert "root@198.51.100.2" in " ".join(testbed.realtime_vms[1].ssh)  # through its host


@pytest.mark.parametrize(
    "waits",
    [{"guests_first_sign_s": 0}, {"guests_first_sign_s": "2m"}, {"guests_boot_timeout_s": 60}],
)
def test_a_bad_boot_wait_is_refused(tmp_path, waits):
    proc = check(tmp_path, {}, **waits)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-3000:]
    assert "are whole seconds from 1 to 99999, the first not above the second" in out, out[-3000:]
