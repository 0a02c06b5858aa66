"""Every field of the run request (spec.FIELDS) refuses its bad values in --validate-only, as
`make run` checks a request before it builds the inputs (data, model: minutes on a fresh
clone), with one line naming the field and nothing created; every verb's --help works; a run
whose records would all be warm-up is refused with the figures to change."""

from importlib import metadata

import pytest
from hvbench_analysis import results
from hvbench_harness import cli, run, spec

# A bad value of each field, as a Make word takes it (None: the field has none that can be told
# without the machine: paths that make builds). A field added to spec.FIELDS needs one here.
BAD = {
    "target": "bogus",
    "sched": "bogus",
    "budget": "-5",
    "period": "-1",
    "priority": "5",
    "extratime": "2",
    "weight": "0",
    "cap": "-1",
    "tslice_us": "100",
    "ratelimit_us": "-1",
    "network": "bogus",
    "producers": "0",
    "messages": "bogus",
    "clients": "0",
    "records": "0",
    "send_ms": "0",
    "warmup": "-1",
    "ramp": "-1",
    "malformed": "-1",
    "drain": "-1",
    "broker_restarts": "-1",
    "stall_s": "0",
    "cpu_latency": "bogus",
    "require": "bogus",
    "force": "maybe",
    "concurrent": "maybe",
    "force_tsc": "maybe",
    "trace": "maybe",
    "baseline": "maybe",
    "baseline_s": "0",
    "noise": "bogus",
    "noise_cpus": "bogus",
    "scale": "bogus",
    "brokers": "3",  # SCALE=one
    "taskmanagers": "2",  # SCALE=one
    "governor": "bogus",
    "max_cstate": "-1",
    "turbo": "bogus",
    "job_cpus": "bogus",
    "inventory": "/nonexistent",
    "host": "a b",
    "run_id": "../../etc/x",
    "results": None,
    "data": None,
    "model": None,
}


def test_every_field_has_a_bad_value_or_says_it_has_none():
    assert set(BAD) == {f.name for f in spec.FIELDS + spec.INPUTS}


@pytest.mark.parametrize(
    "field", [f for f in spec.FIELDS + spec.INPUTS if BAD.get(f.name)], ids=lambda f: f.make
)
def test_validate_only_refuses_each_fields_bad_value_naming_it(field, tmp_path, capsys):
    where = ["--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
    assert run.main([f"{field.make}={BAD[field.name]}", *where, "--validate-only"]) == 1
    out = capsys.readouterr()
    assert out.out == ""  # no target printed: make run stops here
    [line] = out.err.splitlines()
    assert line.startswith("make run: ") and field.make in line, line
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize(
    "field", [f for f in spec.FIELDS if f.kind in (int, float)], ids=lambda f: f.make
)
def test_a_number_field_refuses_text(field, capsys):
    assert run.main([f"{field.make}=abc", "--validate-only"]) == 1
    assert f"{field.make} must be a" in capsys.readouterr().err


def test_a_good_request_passes_and_prints_its_target(capsys):
    assert run.main(["CPU_LATENCY=50", "NOISE_CPUS=0", "RUN_ID=try-1", "--validate-only"]) == 0
    assert capsys.readouterr().out == "bare\n"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        # 6 detectors every 100 ms: 60 records/s, all 600 within the default 10 s warm-up
        ([], "RECORDS=600 measures nothing: the warm-up (WARMUP=10 s) takes the first 600 "
         "records (6 detectors every 100 ms); give RECORDS=601 or more, or WARMUP=9.98 or less"),
        (["RECORDS=240", "SEND_MS=50", "WARMUP=2"], "the first 240 records (6 detectors "
         "every 50 ms); give RECORDS=241 or more, or WARMUP=1.99 or less"),
        # the ramp sends slower at first: 465 records in the warm-up, not 600
        (["RECORDS=465", "RAMP=5"], "takes the first 465 records (6 detectors every 100 ms); "
         "give RECORDS=466 or more"),
        # messages by group: two groups staggered by 50 ms
        (["MESSAGES=group", "PRODUCERS=2"], "first 600 records (6 detectors every 100 ms); "
         "give RECORDS=601 or more, or WARMUP=9.95 or less"),
        (["NETWORK=bay", "RECORDS=3250"], "the first 32500 records (325 detectors every 100 "
         "ms); give RECORDS=32501 or more, or WARMUP=0.99 or less"),
    ],
)  # fmt: skip
def test_a_run_of_warmup_records_only_is_refused_with_the_figures(words, message, capsys):
    assert run.main(["RECORDS=600", *words, "--validate-only"]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "words",
    [
        ["RECORDS=601"],
        ["RECORDS=600", "WARMUP=9.98"],
        ["RECORDS=241", "SEND_MS=50", "WARMUP=2"],
        ["RECORDS=466", "RAMP=5"],
        ["RECORDS=240", "SEND_MS=50", "WARMUP=1.99"],
        ["RECORDS=1", "WARMUP=0"],
    ],
)
def test_the_figures_the_refusal_gives_measure_something(words, capsys):
    assert run.main([*words, "--validate-only"]) == 0, capsys.readouterr().err


VERBS = [*cli.MODULE_VERBS, *cli.PLAYBOOK_VERBS]


@pytest.mark.parametrize("argv", [[verb, "--help"] for verb in VERBS] + [["campaign", "run", "-h"]])
def test_every_verbs_help_works(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 0
    assert "usage: hvbench" in capsys.readouterr().out


def test_run_help_lists_every_field(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    for field in spec.FIELDS + spec.INPUTS:
        assert field.flag in out and f"{field.make}:" in out, field.name
    assert "% of one CPU" in out  # CAP's help, once a format string for argparse


def test_the_version_is_the_installed_packages_and_the_results_schema(capsys):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    installed = metadata.version("hvbench-harness")
    assert out.startswith(f"hvbench {installed} (results schema {results.SCHEMA_VERSION}")
