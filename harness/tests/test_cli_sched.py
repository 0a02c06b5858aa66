"""`make sched` takes NAME=value words as `make run` does and checks the setting before any
host is touched: the playbook gets the checked setting as the agent's options, one value."""

import json
import subprocess
from pathlib import Path

import pytest
from hvbench_agent.sched import validate
from hvbench_harness import cli, playbooks
from hvbench_harness.testbed import setting_options

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kvm_inventory(tmp_path) -> Path:
    """A KVM host that does not exist: nothing may try to reach it."""
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("all:\n  children:\n    kvm_hosts:\n      hosts:\n        h1: {}\n")
    return tmp_path


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["SCHED=cfs", "BUDGET=-5"], "BUDGET must be positive"),
        (["SCHED=cfs", "RECORDS=5"], "make sched takes SCHED, BUDGET, PERIOD"),
        (["SCHED=cfs", "BUDGET=x"], "BUDGET must be a whole number, not 'x'"),
        (["SCHED=rtds", "BUDGET=5000"], "rtds"),  # a Xen scheduler on a KVM host
    ],
)
def test_a_bad_setting_is_refused_before_the_playbook(
    words, message, kvm_inventory, capsys, monkeypatch
):
    def no_playbook(*_args):
        raise AssertionError("the playbook ran")

    monkeypatch.setattr(cli, "ansible_playbook", no_playbook)
    assert cli.main(["sched", "apply", *words, "--inventory", str(kvm_inventory)]) == 1
    assert message in capsys.readouterr().err


def test_the_playbook_gets_the_checked_setting_as_one_value(kvm_inventory, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "ansible_playbook", lambda *args: calls.append(args) or 0)
    words = ["SCHED=cfs", "BUDGET=30000", "PERIOD="]  # PERIOD= is unset, as in Make
    assert cli.main(["sched", "check", *words, "--inventory", str(kvm_inventory)]) == 0
    assert cli.main(["sched", "reset", "--inventory", str(kvm_inventory)]) == 0
    (hosts, playbook, flag, extra), (_, _, _, reset) = calls
    assert (Path(hosts).name, playbook, flag) == ("hosts.yml", "sched.yml", "-e")
    expected = setting_options(validate("kvm", "cfs", budget_us=30000))
    assert json.loads(extra)["sched_options"] == expected
    assert expected[:4] == ["--sched", "cfs", "--budget", "30000"] and "--period" in expected
    assert json.loads(reset) | {"sched_readback_file": ""} == {
        "sched_action": "reset",
        "sched_options": [],
        "sched_readback_file": "",
    }


def test_make_sched_passes_its_words_on_as_they_are():
    proc = subprocess.run(
        ["make", "-n", "-s", "sched", "ACTION=check", "SCHED=cfs", "BUDGET=30000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.replace("\\\n", " ").split("hvbench sched check ")[-1].split()
    assert {"SCHED=cfs", "BUDGET=30000"} <= set(command) and "ACTION=check" not in command


def test_a_playbook_ends_with_its_slowest_tasks_times(monkeypatch):
    seen = {}

    def run(argv, cwd, env):
        seen.update(argv=argv, env=env)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(playbooks.subprocess, "run", run)
    assert cli.ansible_playbook("hosts.yml", "provision.yml") == 0
    assert seen["argv"][-1] == str(playbooks.REPO / "playbooks/provision.yml")
    assert seen["argv"][1:3] == ["-i", "hosts.yml"]
    assert seen["env"]["ANSIBLE_CALLBACKS_ENABLED"] == "ansible.posix.profile_tasks"
    assert seen["env"]["PROFILE_TASKS_SUMMARY_ONLY"] == "true"
