"""The kvm backend: what can be checked without a KVM host (the settings themselves are in
test_validate.py).

Applying them needs a KVM host with running guests: tests/testbed/test_provision_kvm.py does
that inside a QEMU guest playing the host.
"""

import subprocess
from pathlib import Path

import pytest
import yaml
from hvbench_agent import cli
from hvbench_agent.sched import Refused, Setting, deadline, kvm

REPO = Path(__file__).resolve().parents[2]


def test_the_command_line_refuses_before_looking_for_libvirt(capsys):
    # validation comes first, so a bad setting is refused on any machine, libvirt or not
    argv = ["sched", "apply", "--backend", "kvm", "--domain", "x", "--sched", "cfs"]
    assert cli.main([*argv, "--budget", "200000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvbench-agent: SCHED=cfs: BUDGET 200000 us > PERIOD 100000 us")


@pytest.mark.parametrize(
    "argv",
    [
        ["sched", "read", "--backend", "kvm", "--domain", "../etc/x"],
        ["sched", "reset", "--backend", "xen", "--domain", "rt", "--pool", "p;reboot"],
        ["domains", "hold", "--backend", "xen", "--state", "paused", "--domain", "a b"],
        ["trace", "--backend", "kvm", "--domain", "rt", "--out", "t", "--clock-of", "$(id)"],
        ["xen", "pool-destroy", "--pool=-rf"],
    ],
)
def test_a_domain_or_pool_that_is_not_a_name_is_refused_before_any_tool_runs(argv, capsys):
    """Names go into xl and virsh command lines as root: the one rule for names (names.py)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "is not a name: letters, digits" in capsys.readouterr().err


def test_deadline_admission_is_per_partition(monkeypatch):
    values = {deadline.RT_RUNTIME_SYSCTL: 950_000, deadline.RT_PERIOD_SYSCTL: 10**6}
    monkeypatch.setattr(deadline, "read_int", lambda path, default: values[path])
    monkeypatch.setattr(deadline, "_fair_server_bw", lambda ncpus: 0)
    # 2 vCPUs × 0.775 = 1.55 CPUs fit in 2 × 0.95; 1 vCPU × 1.0 does not fit in 0.95
    kvm._admission(Setting("deadline", 77500, 100000), 2, 2)
    with pytest.raises(Refused) as info:
        kvm._admission(Setting("deadline", 100000, 100000), 1, 1)
    assert "admission control would refuse SCHED=deadline" in str(info.value)
    assert "1 CPU(s) of the VM = 0.950" in str(info.value)


def test_the_command_line_validates_without_a_host(capsys):
    argv = ["sched", "validate", "--backend", "kvm", "--sched", "fifo", "--priority", "10"]
    assert cli.main(argv) == 0
    assert '"priority": 10' in capsys.readouterr().out


def test_read_and_reset_take_no_setting(capsys):
    argv = ["sched", "read", "--backend", "kvm", "--domain", "x", "--sched", "cfs"]
    assert cli.main(argv) == 2
    assert "read takes no setting" in capsys.readouterr().err


def test_make_vcpu_sched_refuses_a_bad_setting_before_any_connection():
    # HOST names a machine that does not exist: the refusal must come before Ansible runs
    proc = subprocess.run(
        [
            "make",
            "-s",
            "vcpu-sched",
            "HOST=root@hvbench-nonexistent.invalid",
            "SCHED=deadline",
            "BUDGET=120000",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "SCHED=deadline: BUDGET 120000 us > PERIOD 100000 us" in proc.stderr
    assert "PLAY" not in proc.stdout and "UNREACHABLE" not in proc.stdout + proc.stderr
    # HOST's one-off inventory: the host in kvm_hosts (the tool's hypervisor), user and address
    # apart
    doc = yaml.safe_load((REPO / "build/inventory/hosts.yml").read_text())
    host = doc["all"]["children"]["kvm_hosts"]["hosts"]["hvbench-nonexistent.invalid"]
    assert host == {"ansible_host": "hvbench-nonexistent.invalid", "ansible_user": "root"}


def test_a_state_file_of_one_domain_reads_as_a_list_of_domains():
    # written by an agent from before several real-time VMs: reset still undoes it
    old = {"domain": "rt", "sched": "deadline", "changed": [], "pins_before": [[2], [3]],
           "libvirt_before": {"vcpu_period": 100000, "vcpu_quota": -1}}  # fmt: skip
    state = kvm._state(old)
    assert state["domains"] == ["rt"] and state["pins_before"] == {"rt": [[2], [3]]}
    assert state["libvirt_before"] == {"rt": {"vcpu_period": 100000, "vcpu_quota": -1}}
    assert kvm._state(dict(state)) == state
