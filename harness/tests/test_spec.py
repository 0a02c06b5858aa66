"""The run request's one table: Make variables, the harness's flags, campaign keys and meta.json
all go through it, and a name it does not have is refused with the closest one."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hvbench_harness import inventory, run, runspec, spec
from hvbench_harness.runspec import RunSpec

REPO = Path(__file__).resolve().parents[2]


def test_make_assignments_become_the_harness_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # HOST=: the one-off inventory under build/
    (tmp_path / "inventory/sample").mkdir(parents=True)
    (tmp_path / "inventory/sample/hosts.yml").write_text("all: {}\n")  # no hosts: bare
    argv = spec.assignments_to_flags(
        ["SCHED=rtds", "BUDGET=77500", "FORCE=1", "FORCE_TSC=0", "RUN_ID=", "--work", "w"]
    )
    assert argv == ["--sched", "rtds", "--budget", "77500", "--force", "--work", "w"]
    request, _ = run.parse_args(["TARGET=xen", "SCHED=credit", "CAP=153", "SEND_MS=50", "HOST=h"])
    assert (request.target, request.sched, request.cap, request.send_ms) == (
        "xen", "credit", 153, 50.0
    )  # fmt: skip
    assert request.hosts == str(inventory.ONE_OFF)  # HOST's one-off inventory
    assert not inventory.ONE_OFF.exists()  # written when the run starts, not when parsed
    request, _ = run.parse_args(["INVENTORY=inventory/sample"])
    assert (request.hosts, request.target) == ("inventory/sample/hosts.yml", "bare")


def test_a_request_is_parsed_once_frozen_with_what_it_implies():
    request = RunSpec.parse({"sched": "deadline", "budget": 20000, "records": "1200",
                             "noise": " 2:cpu", "scale": "cluster"})  # fmt: skip
    assert request.target == "bare" and request.records == 1200 and request.hosts is None
    assert (request.setting.sched, request.setting.budget_us) == ("deadline", 20000)
    assert request.setting.period_us == 100000  # the scheduler's default, derived once
    assert request.noise == "2:cpu" and [str(g) for g in request.noise_groups] == ["2:cpu"]
    assert (request.brokers, request.taskmanagers) == (3, 2)  # a cluster's sizes here
    assert request.policy.given() == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.records = 5
    fields = {f.name: getattr(request, f.name) for f in runspec.TABLE}
    assert RunSpec.parse(fields) == request  # parsing what it parsed changes nothing
    with pytest.raises(spec.SpecError, match="unknown setting setting"):
        RunSpec.parse(fields | {"setting": request.setting})  # derived, never given


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"records": 1.5}, "RECORDS must be of type int"),
        ({"force": 1}, "FORCE must be of type bool"),
        ({"budget": True}, "BUDGET must be of type int"),
        ({"recrods": 5}, "unknown setting recrods (did you mean records?)"),
    ],
)
def test_a_value_of_the_wrong_type_or_name_is_refused_naming_it(values, message):
    with pytest.raises(spec.SpecError, match=re.escape(message)):
        RunSpec.parse(values)


@pytest.mark.parametrize(
    ("word", "message"),
    [
        ("RECORD=100", "unknown setting RECORD (did you mean RECORDS?)"),
        ("BUDGT=5", "unknown setting BUDGT (did you mean BUDGET?)"),
        ("OUT=report", "unknown setting OUT"),
        ("RECORDS=many", "RECORDS must be a whole number, not 'many'"),
        ("SEND_MS=fast", "SEND_MS must be a number, not 'fast'"),
        ("FORCE=maybe", "FORCE is 1 or 0, not 'maybe'"),
    ],
)
def test_a_name_or_value_the_table_does_not_have_is_refused(word, message):
    with pytest.raises(spec.SpecError) as info:
        spec.assignments_to_flags([word])
    assert str(info.value).startswith(message)


def test_the_inputs_build_variables_go_to_make_not_the_harness():
    assert spec.assignments_to_flags(["EPOCHS=1", "SEED=7", "RECORDS=60"]) == ["--records", "60"]


def test_every_field_is_an_option_of_the_harness_with_its_default():
    request, validate_only = run.parse_args([])
    assert not validate_only
    for field in spec.FIELDS + spec.INPUTS + spec.OPTIONS:
        if field.name != "target":  # resolved: bare without an inventory
            assert getattr(request, field.name) == field.default, field.name
        assert field.default is None or isinstance(field.default, field.kind), field.name
    assert len({f.make for f in spec.FIELDS + spec.INPUTS}) == len(spec.FIELDS + spec.INPUTS)


def test_a_request_round_trips_through_meta_json():
    request = RunSpec.parse(
        {"target": "xen", "sched": "rtds", "budget": 77500, "extratime": 1, "records": 1200},
        need_inventory=False,
    )
    requested = request.requested()
    assert requested["budget_us"] == 77500 and requested["producer_period_ms"] == 100.0
    values = spec.from_requested(requested)
    assert RunSpec.parse(values, need_inventory=False) == request
    argv = spec.to_argv(values)
    assert argv[:4] == ["--target", "xen", "--sched", "rtds"] and "--force" not in argv


def test_campaign_keys_are_the_fields_in_lower_case():
    assert "records" in spec.CAMPAIGN_KEYS and "rate" in spec.CAMPAIGN_KEYS
    assert "target" not in spec.CAMPAIGN_KEYS  # a campaign file names it once


def test_make_refuses_an_unknown_variable_before_anything_runs():
    proc = subprocess.run(
        ["make", "-s", "run", "RECORD=100", "SCHED=none"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "unknown variable RECORD (did you mean RECORDS?)" in proc.stderr
    assert proc.stdout == ""


def test_the_table_needs_the_standard_library_alone():
    """The Makefile runs spec with the system python3 before the venv exists: spec and its
    table (hvbench_analysis.fields) import nothing but the standard library (-S: no
    site-packages)."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "harness/src:analysis/src"}
    command = [sys.executable, "-S", "-m", "hvbench_harness.spec", "check-make", "Makefile"]
    proc = subprocess.run([*command, "RECORD"], cwd=REPO, env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (1, "")
    assert proc.stdout.startswith("unknown variable RECORD (did you mean RECORDS?)")


def test_make_help_lists_the_targets_and_the_run_variables():
    out = subprocess.run(
        ["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    for name in ("make run ", "make test-testbed", "make sched", "RECORDS", "EXTRATIME"):
        assert name in out


def test_every_variable_a_target_names_in_its_help_is_known():
    # `## CAMPAIGN=... [RUNS= REFERENCES=]`: each NAME= there must pass make's own check
    text = (REPO / "Makefile").read_text()
    helps = re.findall(r"^[\w -]+:.*?## (.*)$", text, re.M)
    named = {name for line in helps for name in re.findall(r"\b([A-Z][A-Z0-9_]+)=", line)}
    assert {"CAMPAIGN", "RUNS", "REFERENCES", "SLO"} <= named
    assert spec.check_make(str(REPO / "Makefile"), sorted(named)) == ""


def test_the_tables_detector_counts_are_the_networks():
    from hvbench_job import networks

    assert {n: len(networks.network(n).detectors) for n in networks.NAMES} == spec.DETECTORS
    assert spec.rate_per_s(100.0) == 60 and spec.rate_per_s(100.0, "bay") == 3250
    assert spec.send_ms_for(3250, "bay") == 100.0


def test_a_xen_pool_knob_out_of_xens_range_is_refused_before_any_host(capsys):
    from hvbench_harness import run

    refused = ["TARGET=xen", "SCHED=credit", "CAP=153", "TSLICE_US=100", "--validate-only"]
    assert run.main(refused) == 1
    assert "TSLICE_US 100 is not whole milliseconds within 1000..1000000 us" in (
        capsys.readouterr().err
    )
    assert run.main(["TARGET=xen", "SCHED=rtds", "BUDGET=77500", "RATELIMIT_US=0",
                     "--validate-only"]) == 1  # fmt: skip
    assert "SCHED=rtds has no RATELIMIT_US=0" in capsys.readouterr().err


def test_make_refuses_its_variables_from_the_environment():
    """`HOST=x make teardown` would act on a host the command line does not show."""
    env = {**os.environ, "HOST": "x", "RECORDS": "5"}
    proc = subprocess.run(
        ["make", "-s", "teardown"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and proc.stdout == ""
    assert "HOST RECORDS set in the environment: give it on make's command line" in proc.stderr
    given = subprocess.run(
        ["make", "-s", "help", "RECORDS=5"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert given.returncode == 0 and "make provision" in given.stdout
