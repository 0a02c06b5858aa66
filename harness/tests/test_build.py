"""What a verb needs built on this machine is the harness's to ask of make (build.py), once
the request is checked: a bare run's inputs, a Xen host's hypervisor. The Makefile only builds
and calls, with no branch on the target; an installed harness, without the Makefile, builds
nothing."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from hvbench_harness import build, cli
from hvbench_harness.parts import RunError
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets import bare

REPO = Path(__file__).resolve().parents[2]


def test_make_builds_the_goal_with_the_variables_in_the_repository(tmp_path):
    (tmp_path / "Makefile").write_text(
        "MODEL_DIR ?= default\ninputs:\n\t@echo $(MODEL_DIR) > built\nother:\n\t@touch other\n"
    )
    assert build.make(["inputs"], {"MODEL_DIR": "m 1"}, repo=tmp_path) is True
    assert (tmp_path / "built").read_text() == "m 1\n" and not (tmp_path / "other").exists()


def test_without_a_makefile_nothing_is_built(tmp_path, monkeypatch):
    def no_make(*_args, **_kwargs):
        raise AssertionError("make ran")

    monkeypatch.setattr(build.subprocess, "run", no_make)
    assert build.make(["inputs"], {"MODEL_DIR": "m"}, repo=tmp_path) is False


def test_a_failed_build_names_its_goals(tmp_path):
    (tmp_path / "Makefile").write_text("inputs:\n\t@exit 3\n")
    with pytest.raises(build.BuildError, match=r"^make inputs failed \(exit 2\)"):
        build.make(["inputs"], repo=tmp_path)


def test_this_checkout_is_the_repository():
    assert build.REPO == REPO and (REPO / "Makefile").is_file()


@pytest.fixture
def asked(monkeypatch) -> list:
    """The make calls the harness makes, recorded instead of run."""
    calls: list = []
    monkeypatch.setattr(
        build, "make", lambda goals, variables=None, log=None: calls.append((goals, variables))
    )
    return calls


@pytest.mark.parametrize(
    ("settings", "goals"),
    [
        ({}, ["workload-inputs"]),
        ({"baseline": True}, ["workload-inputs", "rt-tools"]),
        ({"noise": "1:cpu"}, ["workload-inputs", "rt-tools"]),
    ],
)
def test_a_bare_run_asks_for_its_inputs_where_make_runs(settings, goals, asked, tmp_path):
    request = RunSpec.parse({**settings, "data": "d", "model": str(tmp_path / "m")})
    bare.build_inputs(request)
    variables = {"DATA_DIR": str(Path("d").resolve()), "MODEL_DIR": str(tmp_path / "m")}
    assert asked == [(goals, {**variables, "NETWORK": "freeway"})]


def test_the_bare_target_builds_before_it_checks_the_machine(tmp_path, monkeypatch):
    def failing(goals, variables=None, log=None):
        raise build.BuildError("make workload-inputs failed (exit 2)")

    monkeypatch.setattr(build, "make", failing)
    request = RunSpec.parse({"data": str(tmp_path / "d"), "model": str(tmp_path / "m")})
    with pytest.raises(RunError, match=r"^make workload-inputs failed"):
        bare.BareTarget(request, "r1")


@pytest.fixture
def played(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setattr(cli, "ansible_playbook", lambda *args: calls.append(args) or 0)
    return calls


def inventory(tmp_path: Path, group: str) -> str:
    """A testbed whose host does not exist: nothing may try to reach it."""
    hosts = f"all:\n  children:\n    {group}:\n      hosts:\n        h1: {{}}\n"
    (tmp_path / "hosts.yml").write_text(hosts)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("group", "xen_build", "hypervisor"),
    [
        ("xen_hosts", "controller", True),
        ("xen_hosts", "host", False),
        ("kvm_hosts", "controller", False),
    ],
)
def test_provision_asks_for_the_xen_hypervisor_only_where_it_is_built_here(
    group, xen_build, hypervisor, asked, played, tmp_path
):
    argv = ["provision", "--inventory", inventory(tmp_path, group), "--xen-build", xen_build]
    assert cli.main([*argv, "--guest-bundle", "b.tar", "--xen-dir", "x"]) == 0
    extra = {
        "GUEST_BUNDLE": str(Path("b.tar").resolve()),
        "XEN_DIR": str(Path("x").resolve()),
        "XEN_SUITE": "",
    }
    goals = ["controller-tools", "agent-wheel", "guest-bundle"]
    assert asked == [(goals + (["xen-hypervisor"] if hypervisor else []), extra)]
    [(_, playbook, _, given)] = played
    prebuilt = json.loads(given).get("xen_host_prebuilt_dir")
    assert playbook == "provision.yml" and prebuilt == (extra["XEN_DIR"] if hypervisor else None)


def test_provision_refuses_a_machine_without_a_testbed_before_building(asked, played, capsys):
    argv = ["provision", "--inventory", str(REPO / "inventory/sample"), "--guest-bundle", "b.tar"]
    assert cli.main(argv) == 1
    assert "TARGET=kvm or xen" in capsys.readouterr().err
    assert asked == [] and played == []


def make_n(*words: str) -> str:
    proc = subprocess.run(
        ["make", "-n", *words], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_makefile_leaves_the_target_to_the_harness():
    run = make_n("run", "TARGET=bare", "SCHED=none")
    assert "hvbench run " in run and "workload-inputs" not in run and "mvn" not in run
    provision = make_n("provision", "TARGET=xen", "HOST=h")
    assert "--target xen --guest-bundle build/guest-bundle.tar --xen-build controller" in provision
    assert "build-xen-hypervisor" not in provision and "scripts/guest-bundle" not in provision
    lines = (REPO / "Makefile").read_text().splitlines()
    assert len(lines) <= 160
    # a target's name, outside comments and make help's texts: only make sched's two aliases
    named = re.compile(r"(?<![\w/-])(bare|kvm|xen)(?![\w/-])")
    code = [line.split("## ")[0] for line in lines if not line.startswith("#")]
    assert [line for line in code if named.search(line)] == [
        "vcpu-sched: TARGET = kvm",
        "xen-sched: TARGET = xen",
    ]


def test_make_help_lists_every_target_a_user_types():
    out = subprocess.run(
        ["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("make ")]
    listed = {name for row in rows for name in row[len("make ") : 28].split()}  # before the text
    verbs = "run campaign campaign-check check rerun account report model advise provision teardown"
    tasks = "sched vcpu-sched xen-sched data train test test-testbed test-two-hosts bench lint"
    builds = "guest-bundle agent-wheel xen-hypervisor clean help"
    assert set(f"{verbs} {tasks} {builds}".split()) <= listed


def test_what_make_prints_can_go_to_a_log_which_a_failure_shows(tmp_path):
    (tmp_path / "Makefile").write_text("ok:\n\t@echo noisy\nbad:\n\t@echo why it failed; exit 3\n")
    log = tmp_path / "logs" / "build.log"
    assert build.make(["ok"], repo=tmp_path, log=log) is True
    assert log.read_text() == "noisy\n"
    with pytest.raises(build.BuildError, match=f"its output is in {log}:\nwhy it failed"):
        build.make(["bad"], repo=tmp_path, log=log)
