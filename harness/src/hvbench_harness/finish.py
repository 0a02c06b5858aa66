"""After the sending: the raw files saved, the facts collected, every record accounted for,
results/<run-id>/ written and the summary printed; a run whose results could not be made is
written as failed with its raw files (make account makes them again)."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path

from hvbench_analysis import results as results_contract
from hvbench_analysis.sections import Energy, SendingStatus, Status
from hvbench_load.consumer import CONSUMER_CONFIG
from hvbench_load.producers import PRODUCER_CONFIG

from hvbench_harness import accounting, meta, rawfiles
from hvbench_harness.accounting import pair_file
from hvbench_harness.parts import (
    RunError,
    log,
)
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets import Target
from hvbench_harness.testbed import TestbedError

# The parts' own logs, kept in results/<run-id>/logs/ (with Flink's).
RUN_LOGS = ("job.out", "producers.out", "consumer.err", "broker.err", "kafka/broker.log")
PAIR_LOGS = ("producers.out", "consumer.err")  # each client pair's (accounting.pair_file)
EXIT_CODES = {"failed": 1, "interrupted": 130}
# What finish() does after the sending, in order: a run whose results could not be made is
# written as failed in one of these steps (its status.phase), with its raw files.
FINISHING = ("saving the raw files", "collecting the run's facts", "accounting", "summarizing")
WRITING = "writing the results"


def finish(request: RunSpec, target: Target, work: Path, results: Path, meta_doc: dict) -> int:
    """Account for every record, write results/<run-id>/ and print the summary; also for a
    run that failed or was interrupted while sending (its status says so). meta_doc is saved
    beside the raw files first (rawfiles.save): whatever fails after that, results/<run-id>/
    is written as failed with the raw files (finish_failed), or, where it cannot be written
    (a full disk), `work` stays and the error says how to account it again."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what was measured is written first
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step, accounted = FINISHING[0], None
    try:
        how = accounting_how(request, target)
        rawfiles.save(work, meta_doc, how)
        step = FINISHING[1]
        gather(request, target, work, meta_doc)
        saved = rawfiles.save(work, meta_doc, how)
        step = FINISHING[2]
        accounted = rawfiles.account(work, saved)
        step = FINISHING[3]
        summary = summary_lines(results, accounted.counts, accounted.meta)
    except Exception as e:
        return finish_failed(request, work, results, meta_doc, (step, e), accounted)
    try:
        logs = run_logs(work, request.clients)
        rawfiles.write(results, accounted.meta, accounted.samples, work, logs, keep_raw=False)
    except OSError as e:
        raise RunError(not_written(results, work, e)) from None
    except Exception as e:
        return finish_failed(request, work, results, meta_doc, (WRITING, e), accounted)
    shutil.rmtree(work, ignore_errors=True)
    print("\n".join(summary))
    return exit_code(accounted.meta, accounted.counts)


def exit_code(meta_doc: dict, counts: accounting.Counts) -> int:
    """0 completed with every record accounted for, 2 completed with some not, 1 failed,
    130 interrupted."""
    return EXIT_CODES.get(meta_doc["status"]["state"], 0 if counts.accounted else 2)


def accounting_how(request: RunSpec, target: Target) -> dict:
    """What accounting needs beyond the raw files and meta.json (rawfiles.account)."""
    return {
        "warmup_ns": round(request.warmup * 1e9),
        "pairs": request.clients,
        "job_clock": job_clock_unknown(target),
        "job_shares_clock": target.job_shares_clock,
    }


def gather(request: RunSpec, target: Target, work: Path, meta_doc: dict) -> None:
    """What the target knows of the run that the raw files do not, into meta_doc: the end,
    the faults, the machines' facts, the energy, the trace, the settings; the energy samples
    and the trace go into `work` as files."""
    facts = collect_facts(target)
    meta_doc.update(
        {
            "ended_at": datetime.now(UTC).isoformat(),
            "faults": target.faults(),
            "warmup_excluded_s": request.warmup,
            "clients": {"producer": PRODUCER_CONFIG, "consumer": CONSUMER_CONFIG},
            "job": read_json(work / "job-settings.json"),
            "model": facts.get("model"),
            "host": facts.get("host"),
            "versions": facts.get("versions"),
            "git": meta.collect_git(),
        }
    )
    energy = target.energy.summary({})  # the records per window come with the counts
    meta_doc["energy"] = Energy.from_json(energy, "energy", strict=True).to_json()
    (work / results_contract.ENERGY).write_text(target.energy.samples_csv())
    meta_doc.setdefault("clock", {})["stamps"] = stamps_text(request.clients, facts)
    keep_trace(target, work, meta_doc)


def run_logs(work: Path, pairs: int) -> list[Path]:
    """The parts' own logs in `work`, for results/<run-id>/logs/."""
    names = RUN_LOGS + tuple(pair_file(n, k) for k in range(1, pairs) for n in PAIR_LOGS)
    logs = [work / name for name in names if (work / name).exists()]
    logs += sorted((work / "flink-log").glob("*.log")) + sorted(work.glob("noise-*.log"))
    logs += sorted(work.glob("workload-*.log")) + sorted(work.glob("kafka/node-*/broker-*.log"))
    return logs


def finish_failed(
    request: RunSpec,
    work: Path,
    results: Path,
    meta_doc: dict,
    failure: tuple[str, Exception],
    accounted: rawfiles.Accounted | None,
) -> int:
    """results/<run-id>/ of a run whose results could not be made: status failed, in the
    step that failed, with the reason and the traceback; the counts and samples only if
    accounting made them (never invented); the raw files as they are in raw/. Exit code 1."""
    step, error = failure
    trace = "".join(traceback.format_exception(error))
    doc = accounted.meta if accounted is not None else dict(meta_doc)
    if accounted is None:
        doc.update(counts=None, latency=None, latency_from_intended=None)
    before = SendingStatus.from_json(meta_doc["status"], "status")
    doc["status"] = Status(
        state="failed",
        reason=finishing_reason(step, error, before),
        phase=step,
        traceback=trace,
        before=before,
    ).to_json()
    log(f"{step} failed: {type(error).__name__}: {error}; the raw files go into the results")
    print(trace, file=sys.stderr, end="")
    samples = accounted.samples if accounted is not None and step != WRITING else None
    try:
        rawfiles.write(results, doc, samples, work, run_logs(work, request.clients), keep_raw=True)
    except Exception as e:  # a full disk (OSError), or what failed before fails again
        raise RunError(not_written(results, work, e)) from None
    shutil.rmtree(work, ignore_errors=True)
    raw = results / results_contract.RAW
    print(f"\nresults: {results}/\n  RUN FAILED: {doc['status']['reason']}")
    print(f"  the raw files are in {raw}/; account them again: {rawfiles.again(raw)}")
    return EXIT_CODES["failed"]


def finishing_reason(step: str, error: Exception, before: SendingStatus) -> str:
    """status.reason of a run whose results could not be made, with how the run had ended."""
    ended = f"the run had {before.state}"
    if before.state != "completed":
        first = str(before.reason or "").splitlines()[:1]
        ended += f" while {before.phase}" + (f" ({first[0]})" if first else "")
    first = str(error).splitlines()[:1]
    return f"{step} failed: {type(error).__name__}{': ' + first[0] if first else ''} ({ended})"


def not_written(results: Path, work: Path, error: Exception) -> str:
    """Why results/<run-id>/ is not there, where the raw files are and how to account them."""
    return (
        f"writing {results}/ failed: {error}; nothing was left there. The run's raw files are "
        f"in {work}/: account them again with {rawfiles.again(work, results.parent)}"
    )


def stamps_text(pairs: int, facts: dict) -> str:
    """meta.json `clock.stamps`: which clock each latency's two stamps are on."""
    if pairs == 1:
        return "TSC ns, one calibration shared by producers and consumer " + facts.get(
            "stamps_where", ""
        )
    return (
        f"TSC ns; {pairs} client pairs, each pair's producers and consumer on one machine and "
        "one calibration (clock.clients): a latency is two stamps of one clock, never two "
        "machines' (samples.csv `client`)"
    )


def keep_trace(target: Target, work: Path, meta_doc: dict) -> Path | None:
    """The scheduler trace (TRACE=1) as a file for the results, and its summary in meta_doc;
    also what a failed or interrupted run recorded until it stopped."""
    found = target.trace_result()
    if found is None:
        return None
    text, summary = found
    path = work / results_contract.SCHED_TRACE
    path.write_text(text)
    meta_doc["trace"] = summary
    return path


def collect_facts(target: Target) -> dict:
    """The target's facts; what went wrong instead, if a machine no longer answers."""
    try:
        return target.facts()
    except (TestbedError, OSError, ValueError) as e:
        return {"error": f"facts not collected: {e}"}


def read_json(path: Path) -> dict | None:
    """A part's JSON file; None if absent, what is wrong with it if it cannot be read (a part
    stopped while writing it)."""
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError) as e:
        return {"error": f"{path.name} cannot be read: {e}"}


def summary_lines(results: Path, counts: accounting.Counts, meta_doc: dict) -> list[str]:
    """The summary a run ends with (made before the results are written: a failure in it is
    the run's, with the raw files kept)."""
    status, latency = meta_doc["status"], meta_doc["latency"]
    lines = [f"\nresults: {results}/"]
    if status["state"] != "completed":
        lines.append(f"  RUN {status['state'].upper()}: {status['reason'].splitlines()[0]}")
        lines.append("  (what it measured until then is written, marked as such)")
    lines.append(
        f"  sent {counts.sent}  received {counts.received}  missing {counts.missing}  "
        f"undelivered {counts.undelivered}  duplicated {counts.duplicated}  "
        f"dead-lettered (injected) {counts.malformed_dead_lettered}/{counts.malformed_sent}"
    )
    if latency.get("n"):
        lines.append(
            f"  latency over {latency['n']} records (warm-up excluded {counts.warmup}): "
            f"p50 {latency['p50_ms']:.2f} ms  p99 {latency['p99_ms']:.2f} ms  "
            f"p99.9 {latency['p99.9_ms']:.2f} ms  max {latency['max_ms']:.2f} ms"
        )
    lines += steal_lines(meta_doc.get("steal_while_sending"))
    lines += energy_lines(meta_doc.get("energy") or {})
    for fault in meta_doc.get("faults", []):
        lines.append(f"  fault: {fault['part']} {fault['event']}: {fault['detail']}")
    if counts.foreign():
        lines.append(f"  {counts.foreign()}")
    if counts.accounted:
        lines.append("  every record accounted for")
    else:
        lines.append("  UNACCOUNTED RECORDS: " + "; ".join(counts.problems()))
    return lines


def energy_lines(energy: dict) -> list[str]:
    measured = (energy.get("windows") or {}).get("measured")
    if not energy.get("available"):
        return [f"  energy: not available ({energy.get('reason')})"]
    if not measured:
        return []
    per_record = measured["joules_per_record"]
    return [
        f"  energy over the measured window: {measured['joules']:.1f} J in "
        f"{measured['seconds']:.1f} s, {measured['mean_w']:.1f} W"
        + (f", {per_record * 1000:.2f} mJ per record" if per_record else "")
    ]


def steal_lines(steal: dict | None) -> list[str]:
    """One figure for this machine, or one per machine of a testbed."""
    per_machine = {"": steal} if steal and "steal_s" in steal else (steal or {})
    return [
        f"  the hypervisor took {figure['steal_pct']:.2f} % of CPU time"
        + (f" from {name}" if name else "")
        + " while sending (steal)"
        for name, figure in per_machine.items()
        if figure["steal_s"] > 0
    ]


def job_clock_unknown(target: Target) -> dict | None:
    """meta.json `clock.job` where the job's stamps cannot be related to the run's clock,
    else None (the samples tell how: stages.clock_relation). TaskManagers on several machines
    stamp on as many clocks, whose offsets the records cannot tell apart: the stage legs are
    then left unknown (the latencies themselves are unaffected)."""
    if target.job_clocks > 1 and not target.job_shares_clock:
        reason = (
            f"the job's TaskManagers run on {target.job_clocks} machines, each stamping on "
            "its own clock"
        )
        return {"method": "none", "known": False, "reason": reason}
    if (machines := len({m.ssh for m in target.client_machines()})) > 1:
        reason = f"the client pairs stamp on {machines} machines' clocks"
        return {"method": "none", "known": False, "reason": reason}
    return None
