"""The run request's one table: Make variables, the harness's flags, campaign keys and meta.json
all go through it, and a name it does not have is refused with the closest one."""

import subprocess
from pathlib import Path

import pytest
from hvbench_harness import inventory, run, spec

REPO = Path(__file__).resolve().parents[2]


def test_make_assignments_become_the_harness_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # HOST= writes the one-off inventory under build/
    (tmp_path / "inventory/sample").mkdir(parents=True)
    argv = spec.assignments_to_flags(
        ["SCHED=rtds", "BUDGET=77500", "FORCE=1", "FORCE_TSC=0", "RUN_ID=", "--work", "w"]
    )
    assert argv == ["--sched", "rtds", "--budget", "77500", "--force", "--work", "w"]
    args = run.parse_args(["TARGET=xen", "SCHED=credit", "CAP=153", "SEND_MS=50", "HOST=h"])
    assert (args.target, args.sched, args.cap, args.send_ms) == ("xen", "credit", 153, 50.0)
    assert args.inventory == str(inventory.ONE_OFF)  # HOST's one-off inventory
    assert run.parse_args(["INVENTORY=inventory/sample"]).inventory == "inventory/sample/hosts.yml"


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
    args = run.parse_args([])
    for field in spec.FIELDS + spec.INPUTS:
        if field.name != "inventory":  # a directory becomes its hosts.yml
            assert getattr(args, field.name) == field.default, field.name
        assert field.default is None or isinstance(field.default, field.kind), field.name
    assert len({f.make for f in spec.FIELDS + spec.INPUTS}) == len(spec.FIELDS + spec.INPUTS)


def test_a_request_round_trips_through_meta_json():
    request = spec.RunSpec(target="xen", sched="rtds", budget=77500, extratime=1, records=600)
    requested = spec.as_requested(request)
    assert requested["budget_us"] == 77500 and requested["producer_period_ms"] == 100.0
    values = spec.from_requested(requested)
    assert spec.RunSpec(**values) == request
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


def test_make_help_lists_the_targets_and_the_run_variables():
    out = subprocess.run(
        ["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    for name in ("make run ", "make test-testbed", "make sched", "RECORDS", "EXTRATIME"):
        assert name in out


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
