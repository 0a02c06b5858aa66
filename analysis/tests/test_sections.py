"""meta.json's sections as dataclasses (sections.py): every section of a run, old or new, reads
and writes back as it was; the writer refuses what a section does not name or a value of
another type, the reader names what is wrong; the exported JSON Schema takes what is written."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hvbench_analysis import results, sections, synthetic
from hvbench_analysis.sections import ABSENT, Counts, Requested, SendingStatus, Status

DATA = Path(__file__).parent / "data"
OLD_RUNS = [
    DATA / "v1-bare-cfs-quota",
    *sorted((DATA / "v6-deadline-bare").iterdir()),
    *sorted((DATA / "v11-deadline-bare").iterdir()),
]
MS = 1_000_000


def typed(meta: dict) -> list[tuple[str, type[sections.Section], dict]]:
    """(key, section class, value) of each section of sections.py the run has."""
    found = []
    for key, (kind, _) in results.SECTIONS.items():
        for option in sections.options(kind):
            if issubclass(option, sections.Section) and isinstance(meta.get(key), dict):
                found.append((key, option, meta[key]))
    return found


def fresh_run(folder: Path) -> Path:
    """A synthetic run with every addition: a scheduler trace, a noise floor, energy."""
    run = synthetic.write_run(folder, np.full(20, 2 * MS), sched="deadline", budget=5000,
                              period=10_000, missing=1, requested={"warmup_s": 0.5})  # fmt: skip
    synthetic.add_trace(run, [3], 1 * MS)
    synthetic.add_baseline(run, np.arange(1, 50))
    return synthetic.add_energy(run, 12.5)


@pytest.mark.parametrize("folder", OLD_RUNS, ids=lambda f: f"{f.parent.name}/{f.name}")
def test_every_section_of_an_older_run_reads_and_writes_back_as_read_meta_gives_it(folder):
    meta = results.read_meta(folder)
    found = typed(meta)
    assert {key for key, _, _ in found} >= {"requested", "status", "clock", "sched", "counts"}
    for key, cls, value in found:  # the same text: keys, values and their order
        assert json.dumps(cls.from_json(value, key).to_json()) == json.dumps(value), key
    if folder.name == "v1-bare-cfs-quota":  # a real run of the harness, before the schema
        assert {key for key, _, _ in found} >= {"latency", "latency_from_intended"}
        latency = sections.Latency.from_json(meta["latency"])
        assert (latency.n, latency.p99_9_ms) == (6, meta["latency"]["p99.9_ms"])


def test_every_section_of_a_fresh_run_reads_and_writes_back_to_the_same_text(tmp_path):
    written = json.loads((fresh_run(tmp_path / "r") / results.META).read_text())
    found = typed(written)
    assert {key for key, _, _ in found} == {
        "requested", "status", "clock", "sched", "counts", "energy",
    }  # fmt: skip
    for key, cls, value in found:
        assert json.dumps(cls.from_json(value, key, strict=True).to_json()) == json.dumps(value)
    energy = sections.Energy.from_json(written["energy"])
    assert energy.windows["measured"].from_ == "measured" and energy.marks is ABSENT


def test_a_section_made_here_has_its_fields_order_and_one_read_keeps_its_own():
    zero = ("missing", "duplicated", "foreign_results", "foreign_dead_letters", "contradictions")
    made = Counts(sent=2, received=2, dead_lettered=0, dead_letters_lost=0, accounted=True,
                  **dict.fromkeys(zero, 0))  # fmt: skip
    assert list(made.to_json())[:3] == ["sent", "received", "dead_lettered"]
    read = {"accounted": True, "later": 1, **made.to_json()}
    assert list(Counts.from_json(read).to_json()) == list(read)
    changed = dataclasses.replace(Counts.from_json(read), sent=3).to_json()
    assert list(changed) == list(read) and changed["sent"] == 3


def test_a_failed_status_keeps_the_status_the_sending_left():
    before = SendingStatus(state="failed", reason="the job exited", phase="sending")
    status = Status(state="failed", reason="accounting failed", phase="accounting",
                    traceback="Traceback ...", before=before)  # fmt: skip
    doc = status.to_json()
    assert list(doc) == ["state", "reason", "phase", "traceback", "before"]
    assert doc["before"] == {"state": "failed", "reason": "the job exited", "phase": "sending"}
    assert Status.from_json(doc) == status


HOST = {"backend": "linux", "governor": "performance", "max_cstate": None, "turbo": "on"}
# meta.json `power` as run.apply_power writes it: nothing asked, not readable, a policy applied
POWER = [
    {"requested": {}, "readback": {"this machine": HOST}, "at_end": {"this machine": HOST}},
    {"requested": {}, "readback": None, "error": "host: the agent has no `power`"},
    {"requested": {"governor": "powersave"}, "readback": {"host": HOST},
     "before": {"host": HOST}, "at_end": {"host": HOST}},
]  # fmt: skip
# meta.json `sched` as the agent answers: bare deadline threads, a KVM host's vCPUs
SCHED = [
    {"applied": "deadline", "readback": [{"tid": 100, "policy": "SCHED_DEADLINE"}]},
    {"applied": "cfs on the real-time VM", "readback": {"vcpus": []}, "host": {"cpus": "2-3"},
     "readbacks": [{"vcpus": [], "on_host": "a"}, {"vcpus": [], "on_host": "b"}]},
    {"applied": "none", "readback": None},
]  # fmt: skip


@pytest.mark.parametrize(("cls", "doc"), [*((sections.Power, d) for d in POWER),
                                          *((sections.Sched, d) for d in SCHED)])  # fmt: skip
def test_the_power_and_sched_sections_read_and_write_back_as_the_harness_has_them(cls, doc):
    assert json.dumps(cls.from_json(doc, strict=True).to_json()) == json.dumps(doc)


def test_the_requested_section_is_the_run_requests_table():
    from hvbench_analysis.fields import FIELDS

    named = [k.name for k in sections.keys_of(Requested)]
    assert named == [f.requested for f in FIELDS] + list(sections.ALSO_REQUESTED)
    asked = Requested.from_json({"budget_us": 5000, "warmup_s": 2, "rep": None})
    assert (asked.budget_us, asked.warmup_s, asked.rep, asked.sched) == (5000, 2, None, ABSENT)
    with pytest.raises(results.ResultsError, match=r"requested.budget_us is string, not integer"):
        Requested.from_json({"budget_us": "5000"}, "requested")


def test_the_writer_refuses_a_key_a_section_does_not_name_or_a_value_of_another_type(tmp_path):
    samples = results.read_samples(fresh_run(tmp_path / "r"))
    meta = results.read_meta(tmp_path / "r")
    del meta["schema"], meta["files"]
    counts = meta["counts"]
    for bad, message in (
        ({**counts, "recieved": 3}, r"meta.json counts has no key recieved \(Counts\)"),
        ({**counts, "sent": "20"}, r"meta.json counts.sent is string, not integer"),
        ({**counts, "accounted": 1}, r"meta.json counts.accounted is integer, not boolean"),
        ({k: v for k, v in counts.items() if k != "sent"}, r"meta.json counts has no sent"),
    ):
        with pytest.raises(results.ResultsError, match=message):
            results.write_run(tmp_path / "bad", {**meta, "counts": bad}, samples)
    assert not (tmp_path / "bad").exists()
    window = {**meta["energy"]["windows"]["measured"], "joules": None}
    energy = {**meta["energy"], "windows": {"run": None, "measured": window}}
    with pytest.raises(results.ResultsError, match=r"energy.windows.measured.joules is null"):
        results.write_run(tmp_path / "bad", {**meta, "energy": energy}, samples)
    # the agent's answer may carry keys of its own
    sched = {**meta["sched"], "host": {"cpus": "2-3"}}
    results.write_run(tmp_path / "good", {**meta, "sched": sched}, samples)
    assert results.read_meta(tmp_path / "good")["sched"] == sched


def test_the_reader_keeps_keys_of_other_versions_and_names_a_value_of_another_type(tmp_path):
    folder = synthetic.write_run(tmp_path / "r", np.full(10, 2 * MS))
    meta = json.loads((folder / results.META).read_text())
    meta["counts"]["a_later_count"] = 7
    (folder / results.META).write_text(json.dumps(meta))
    counts = Counts.from_json(results.read_meta(folder)["counts"])
    assert counts.extra == {"a_later_count": 7} and counts.to_json() == meta["counts"]
    meta["status"]["phase"] = 3
    (folder / results.META).write_text(json.dumps(meta))
    with pytest.raises(results.ResultsError, match=r"status.phase is integer, not string or null"):
        results.read_meta(folder)


def test_the_exported_json_schema_takes_what_the_writer_writes(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parents[2] / "docs" / "meta.schema.json").read_text())
    jsonschema.validate(json.loads((fresh_run(tmp_path / "r") / results.META).read_text()), schema)
    bad = results.read_meta(tmp_path / "r") | {"counts": {"sent": 1}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
