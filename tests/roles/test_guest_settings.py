"""make provision's first step, the guests role's checks (roles/guests/tasks/validate.yml), on
this machine: bad neighbour settings are refused with the reason, good ones pass. The checks
only read, so no host is needed; the testbed tier runs them on real hosts too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    found = [(g["name"], g["role"], g["index"], g["pool"]) for g in json.loads(out.read_text())]
    assert found == [
        ("m", "messaging", 10, ""),
        ("m2", "messaging", 31, ""),
        ("r", "realtime", 11, "hvbench-rt"),
        ("r2", "realtime", 41, "hvbench-rt"),
        ("r3", "realtime", 42, "hvbench-rt"),
        # placed on the real-time VMs' CPUs (the default), in their pool
        ("hvbench-neighbour-0", "neighbour", 20, "hvbench-rt"),
    ]
