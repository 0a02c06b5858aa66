"""make provision for real: a QEMU guest plays the bare-metal host (see hostvm.py), the
playbooks provision it over SSH, and libvirt/KVM inside it runs the two guests.

Sizes are the test's: the host VM has 2 vCPUs and 6 GiB under TCG, so each guest gets one
vCPU (pinned to host CPU 0 and 1) and 1–1.5 GiB. Nothing is timed here.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hostvm import HostVM, build_image

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
CACHE = Path(os.environ.get("HVBENCH_TEST_CACHE", "/var/cache/hvbench-test"))
GUESTS = {"hvbench-messaging": ("192.168.123.10", [0]), "hvbench-realtime": ("192.168.123.11", [1])}


def small_testbed_vars(key: Path) -> dict:
    return {
        "hvbench_ssh_public_key_file": str(key.with_suffix(".pub")),
        "guest_image_controller_cache": str(CACHE / "images"),
        "kvm_guests_messaging": {
            "name": "hvbench-messaging",
            "vcpus": 1,
            "memory_mb": 1536,
            "host_cpus": [0],
            "disk_gb": 10,
        },
        "kvm_guests_realtime": {
            "name": "hvbench-realtime",
            "vcpus": 1,
            "memory_mb": 1024,
            "host_cpus": [1],
            "disk_gb": 10,
        },
        # The host VM's emulated CPU under TCG: nested guests keep QEMU's default model.
        "kvm_guests_cpu_mode": "",
    }


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    image = build_image(CACHE)
    work = tmp_path_factory.mktemp("hostvm")
    vm = HostVM(image, work)
    vm.start()
    inventory = work / "inventory"
    inventory.mkdir()
    os.symlink(REPO / "inventory/sample/group_vars", inventory / "group_vars")
    vm.inventory(inventory / "hosts.json", "kvm_hosts")
    extra = work / "test-vars.yml"
    extra.write_text(yaml.safe_dump(small_testbed_vars(vm.key)))
    yield vm, inventory / "hosts.json", extra
    vm.stop()


def playbook(host, name: str, *extra_args: str) -> tuple[int, str, dict]:
    _, inventory, extra = host
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(inventory),
            "-e",
            f"@{extra}",
            *extra_args,
            f"playbooks/{name}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    recap = re.search(r"testhost\s+:\s+(.*)", proc.stdout)
    counts = dict(re.findall(r"(\w+)=(\d+)", recap.group(1))) if recap else {}
    return proc.returncode, proc.stdout + proc.stderr, {k: int(v) for k, v in counts.items()}


def on_host(host, command: str) -> str:
    return host[0].ssh(command).stdout


def test_bad_pinning_is_refused_before_anything_is_touched(host):
    code, out, counts = playbook(
        host,
        "provision.yml",
        "-e",
        '{"kvm_guests_realtime": {"name": "hvbench-realtime", "vcpus": 2, "memory_mb": 1024,'
        ' "host_cpus": [1], "disk_gb": 10}}',
    )
    assert code != 0 and "vCPUs are pinned one to one" in out
    assert counts["changed"] == 0
    assert (
        on_host(
            host, "ls /etc/systemd/system/hvbench-tuning.service /var/lib/hvbench 2>&1 || true"
        ).count("No such file")
        == 2
    )


def test_provision_sets_up_the_host_and_the_guests(host):
    code, out, counts = playbook(host, "provision.yml")
    assert code == 0, out[-3000:]
    assert counts["failed"] == 0 and counts["changed"] > 0
    assert on_host(host, "systemctl is-enabled hvbench-tuning libvirtd").split() == [
        "enabled",
        "enabled",
    ]
    running = on_host(host, "virsh list --state-running --name").split()
    assert sorted(running) == sorted(GUESTS)
    for name, (address, cpus) in GUESTS.items():
        pins = on_host(host, f"virsh vcpupin {name}")
        assert re.search(rf"^\s*0\s+{cpus[0]}\s*$", pins, re.M), pins
        assert address in on_host(host, "virsh net-dumpxml hvbench")
    assert on_host(host, "virsh net-info hvbench | grep -E '^(Active|Autostart)'").split() == [
        "Active:",
        "yes",
        "Autostart:",
        "yes",
    ]


def test_second_provision_changes_nothing(host):
    code, out, counts = playbook(host, "provision.yml")
    assert code == 0, out[-3000:]
    assert counts["changed"] == 0, out[-3000:]


def test_guests_boot_and_take_their_key(host):
    """The guests get their fixed address and let the controller's key in (through the host)."""
    vm = host[0]
    for name, (address, _) in GUESTS.items():
        deadline = time.monotonic() + 600  # nested KVM under TCG boots in minutes
        while True:
            probe = subprocess.run(
                [
                    "ssh",
                    *vm.ssh_options(),
                    "-o",
                    f"ProxyCommand=ssh {' '.join(vm.ssh_options())} -p {vm.port} -W %h:%p "
                    "root@127.0.0.1",
                    f"root@{address}",
                    "hostname; cat /proc/cmdline",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if probe.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(10)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.split()[0] == name
        password = vm.ssh(
            f"ssh -o BatchMode=yes -o StrictHostKeyChecking=no "
            f"-o PubkeyAuthentication=no root@{address} true",
            check=False,
        )
        assert password.returncode != 0  # no password login


def test_teardown_leaves_the_host_clean(host):
    code, out, counts = playbook(host, "teardown.yml")
    assert code == 0 and counts["changed"] > 0, out[-3000:]
    assert on_host(host, "virsh list --all --name").split() == []
    assert "hvbench" not in on_host(host, "virsh net-list --all --name")
    assert "No such file" in on_host(host, "ls /var/lib/hvbench 2>&1 || true")
