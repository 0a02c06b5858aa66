"""SCHED settings for target kvm, checked on the controller before any host is touched.

Applying them needs a KVM host with running guests: playbooks/tests/test_provision_kvm.py does
that inside a QEMU guest playing the host.
"""

import subprocess
from pathlib import Path

import pytest
import yaml
from hvbench_load import vcpu_sched

REPO = Path(__file__).resolve().parents[2]

REFUSED = [
    ("rtds", {}, "unknown SCHED 'rtds' for target kvm; valid: none, cfs, deadline, fifo"),
    ("cfs-quota", {"budget_us": 5000}, "unknown SCHED 'cfs-quota' for target kvm"),
    ("none", {"budget_us": 5000}, "BUDGET and PERIOD have no meaning for SCHED=none"),
    ("fifo", {"period_us": 100000, "priority": 10}, "BUDGET and PERIOD have no meaning"),
    ("cfs", {"budget_us": 5000, "priority": 10}, "PRIORITY has no meaning for SCHED=cfs"),
    ("fifo", {}, "SCHED=fifo needs PRIORITY (1..99)"),
    ("fifo", {"priority": 0}, "SCHED=fifo: PRIORITY 0 outside 1..99"),
    ("fifo", {"priority": 100}, "SCHED=fifo: PRIORITY 100 outside 1..99"),
    ("fifo", {"priority": True}, "SCHED=fifo: PRIORITY must be an integer, got True"),
    ("cfs", {}, "SCHED=cfs needs BUDGET"),
    (
        "cfs",
        {"budget_us": 120000},
        "SCHED=cfs: BUDGET 120000 us > PERIOD 100000 us (the budget must fit in one period)",
    ),
    ("cfs", {"budget_us": 999}, "SCHED=cfs: BUDGET 999 us is below the kernel minimum"),
    ("cfs", {"budget_us": 500, "period_us": 999}, "SCHED=cfs: PERIOD 999 us outside"),
    (
        "deadline",
        {"budget_us": 77500, "period_us": 50000},
        "SCHED=deadline: BUDGET 77500 us > PERIOD 50000 us",
    ),
    ("deadline", {"budget_us": 1}, "SCHED=deadline: BUDGET 1 us is below the kernel minimum"),
]


@pytest.mark.parametrize(("name", "kwargs", "message"), REFUSED)
def test_bad_settings_are_refused_with_a_clear_message(name, kwargs, message):
    with pytest.raises(ValueError) as info:
        vcpu_sched.validate(name, **kwargs)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("none", {}, vcpu_sched.KvmSetting("none")),
        ("cfs", {"budget_us": 77500}, vcpu_sched.KvmSetting("cfs", 77500, 100000)),
        ("cfs", {"budget_us": 1000, "period_us": 1000}, vcpu_sched.KvmSetting("cfs", 1000, 1000)),
        ("deadline", {"budget_us": 50000}, vcpu_sched.KvmSetting("deadline", 50000, 100000)),
        ("fifo", {"priority": 99}, vcpu_sched.KvmSetting("fifo", priority=99)),
    ],
)
def test_good_settings_are_accepted(name, kwargs, expected):
    assert vcpu_sched.validate(name, **kwargs) == expected


def test_the_command_line_refuses_before_looking_for_libvirt(capsys):
    # validation comes first, so a bad setting is refused on any machine, libvirt or not
    code = vcpu_sched.main(["apply", "--domain", "x", "--sched", "cfs", "--budget", "200000"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("hvbench-vcpu-sched: SCHED=cfs: BUDGET 200000 us > PERIOD 100000 us")


def test_deadline_admission_is_per_partition(monkeypatch):
    values = {vcpu_sched.sched.RT_RUNTIME_SYSCTL: 950_000, vcpu_sched.sched.RT_PERIOD_SYSCTL: 10**6}
    monkeypatch.setattr(vcpu_sched.sched, "_read_int", lambda path, default: values[path])
    monkeypatch.setattr(vcpu_sched.sched, "_fair_server_bw", lambda ncpus: 0)
    # 2 vCPUs × 0.775 = 1.55 CPUs fit in 2 × 0.95; 1 vCPU × 1.0 does not fit in 0.95
    vcpu_sched._admission(vcpu_sched.KvmSetting("deadline", 77500, 100000), 2, 2)
    with pytest.raises(vcpu_sched.Refused) as info:
        vcpu_sched._admission(vcpu_sched.KvmSetting("deadline", 100000, 100000), 1, 1)
    assert "admission control would refuse SCHED=deadline" in str(info.value)
    assert "1 CPU(s) of the VM = 0.950" in str(info.value)


def test_the_command_line_validates_without_a_host(capsys):
    assert (
        vcpu_sched.main(["validate", "--domain", "-", "--sched", "fifo", "--priority", "10"]) == 0
    )
    assert '"priority": 10' in capsys.readouterr().out


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
