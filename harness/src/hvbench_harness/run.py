"""`make run`: one experiment, on this machine (TARGET=bare) or on a provisioned KVM or Xen
testbed (TARGET=kvm, TARGET=xen). Without --target, the inventory decides: its hosts in
kvm_hosts or xen_hosts make it kvm or xen; no inventory, or one without hosts, is bare.

Order: check the settings (nothing is started for a bad one) → calibrate the TSC → Kafka →
the Flink job → a readiness probe through the job → the scheduler setting, read back →
consumer → producers → drain → tear down (also on Ctrl-C or error) → account for every record →
results/<run-id>/ → summary.

While it runs, the broker and the job are watched: a part that dies, is stopped or hangs ends
the run at once with the reason (Kafka is first restarted on its data, BROKER_RESTARTS times),
and so do STALL_S seconds without a result while the producers send. A run that started
sending always writes results/<run-id>/, with meta.json `status` completed, failed or
interrupted, the counts so far and every sample received. Exit code: 0 completed with every
record accounted for, 2 completed with records unaccounted for, 1 failed, 130 interrupted.

On a testbed the harness stays here and starts each part over SSH (hvbench_harness.testbed):
Kafka, the producers and the consumer in the messaging VM (its TSC stamps both ends; with
CLIENTS, each client pair in a messaging VM, docs/cluster.md), the job in the real-time VM, and
the scheduler setting for the real-time VM on the host, through the host's agent: its vCPU
threads on KVM, its cpupool and domain on Xen (`hvbench-agent sched`). Their files come back
here at the end.

    python -m hvbench_harness.run --sched deadline --budget 20000 --period 100000
    python -m hvbench_harness.run --target kvm --inventory inventory/lab/hosts.yml \
        --sched cfs --budget 77500
    python -m hvbench_harness.run --inventory inventory/lab/hosts.yml --sched rtds --budget 77500
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from hvbench_agent import tuning
from hvbench_agent.sched import Refused, Setting
from hvbench_analysis.sections import ABSENT, Clock, Power, Requested, Sched, Status
from hvbench_job.session import SessionError
from hvbench_load.broker import BrokerError

import tsc_timer
from hvbench_harness import inventory, spec, targets
from hvbench_harness.finish import finish
from hvbench_harness.parts import (
    Parts,
    RunError,
    log,
)
from hvbench_harness.runlocks import hold, registered_machines
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets import Target
from hvbench_harness.targets.common import CALIBRATION, TOPICS
from hvbench_harness.testbed import TestbedError
from hvbench_harness.watch import drain, enter
from hvbench_harness.workload import start_consumer, start_job, start_producers, wait_job_ready

# Errors that end a run (after its checks): the run's results are written if it was sending.
# A part that could not start (BrokerError, SessionError) ends the run like one that died.
RUN_ENDING = (
    RunError,
    TestbedError,
    Refused,
    tuning.TuningError,
    OSError,
    BrokerError,
    SessionError,
)


def parse_args(argv: list[str] | None = None) -> tuple[RunSpec, bool]:
    """The command line (spec's fields, as options or as Make's NAME=value words) as the run's
    request, and whether only to validate it. SpecError for an unknown NAME, RunError (or the
    scheduler's Refused) for a bad value."""
    words = spec.assignments_to_flags(sys.argv[1:] if argv is None else argv)
    args = vars(arguments().parse_args(words))
    validate_only = args.pop("validate_only")
    return RunSpec.parse(args), validate_only


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvbench run", description=__doc__.split("\n")[0])
    spec.add_arguments(p)
    p.add_argument(
        "--validate-only",
        action="store_true",
        help="check the request, print its target and stop (make run does, before the inputs)",
    )
    return p


def run(request: RunSpec) -> int:
    """One run: checked, then run while it holds its machines in the run registry
    (runlocks: refused if another run holds one, unless CONCURRENT=1)."""
    run_id = request.run_id or default_run_id(request.target, request.setting)
    results, work = under(request.results, run_id), under(request.work, run_id)
    for taken in (results, work):
        if taken.exists():
            raise RunError(f"{taken} exists already; choose another RUN_ID")
    if request.host and request.on_testbed:  # HOST: its one-off inventory (inventory.py)
        inventory.write_one_off(request.host, request.target, request.inventory)
    machines = registered_machines(request.target, request.hosts)
    with hold(run_id, machines, forced=request.concurrent) as held:
        return run_held(request, (run_id, results, work), held)


def under(folder: str, name: str) -> Path:
    """folder/name, which must lie in folder once both are resolved (RunError otherwise)."""
    path = Path(folder) / name
    if Path(folder).resolve() not in path.resolve().parents:
        raise RunError(f"{path} does not lie in {folder}: RUN_ID must be a name")
    return path


def run_held(request: RunSpec, names: tuple, held) -> int:
    """The run's steps, while it holds its machines (`held`, whose record is meta.json
    `concurrent`). Every part it starts is torn down on the way out (Parts)."""
    run_id, results, work = names
    target = targets.choose(request, run_id, work)
    work.mkdir(parents=True, exist_ok=True)
    meta_doc = begin_meta(request, run_id, target)
    meta_doc["concurrent"] = held.record  # the runs seen at the start; at the end: below
    status = meta_doc["status"]
    interrupt = Interrupt()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    parts = Parts(work)
    error = None
    try:
        with parts:
            measure(request, target, parts, meta_doc, held.glance)
        status["state"] = "completed"
    except KeyboardInterrupt:
        mark_interrupted(status)
    except Exception as e:
        if interrupt.taken:  # the interrupt, turned into an error by the C code it landed in
            mark_interrupted(status)
        elif isinstance(e, RUN_ENDING):
            status.update(state="failed", reason=str(e))
            log(f"run failed while {status['phase']}: {str(e).splitlines()[0]}; tearing down")
            error = e
        elif status["phase"] in SENDING_PHASES:  # a defect of ours: what was sent is kept
            status.update(
                state="failed", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()
            )
            log(f"run failed while {status['phase']} ({type(e).__name__}: {e}); tearing down")
        else:
            raise
    finally:
        log("torn down: " + (", ".join(parts.stopped) or "nothing was left running"))
        meta_doc["teardown"] = parts.verify(target.own_processes())  # none may be left
    if status["phase"] not in SENDING_PHASES and status["state"] != "completed":
        if error is not None:
            raise error
        log(f"interrupted before sending: nothing measured (partial files stay in {work})")
        return 130
    held.look_again()  # the other runs live at the end, in meta.json `concurrent`
    return finish(request, target, work, results, meta_doc)


SENDING_PHASES = ("sending", "draining")


def measure(
    request: RunSpec,
    target: Target,
    parts: Parts,
    meta_doc: dict,
    glance: Callable[[], None],
) -> None:
    """Calibrate, start Kafka and the job, apply the setting and read it back, send every
    record and drain (glancing at the other runs on the machine); meta_doc gets what each
    step found."""
    setting = request.setting
    run_id = meta_doc["run_id"]
    log(
        f"run {run_id}: {request.records} records from {spec.DETECTORS[request.network]} detectors "
        f"({request.network}) every {request.send_ms:g} ms, SCHED={setting.sched}"
    )
    calibrate(request, target, parts, meta_doc)
    meta_doc["kafka"] = target.start_broker(parts)
    bootstrap = meta_doc["kafka"]["bootstrap"]
    enter(meta_doc, "starting the Flink job")
    log(f"Kafka {bootstrap} up, topics {', '.join(TOPICS.values())}")
    job = start_job(target, parts, bootstrap)
    ready_s = wait_job_ready(target, parts, bootstrap, job, run_id)
    started = target.job_started(job)
    meta_doc.update(target.job_placement())
    enter(meta_doc, "applying the scheduler setting")
    log(f"Flink job running ({started}), answered the probe in {ready_s:.1f} s")
    parts.on_teardown(lambda: reset_scheduler(target, parts))  # also after a failed apply
    meta_doc["sched"] = Sched.from_json(target.scheduler.apply(setting), "sched").to_json()
    enter(meta_doc, "applying the power policy")
    meta_doc["power"] = apply_power(target, parts)
    enter(meta_doc, "starting the neighbours")
    if (noise := target.start_noise(parts)) is not None:
        meta_doc["noise"] = noise
    if request.baseline:
        enter(meta_doc, "measuring the noise floor")
        meta_doc["baseline"] = target.noise_floor(setting, request.baseline_s)
    send(request, target, parts, meta_doc, (job, bootstrap, glance))


def calibrate(request: RunSpec, target: Target, parts: Parts, meta_doc: dict) -> None:
    """The TSC that stamps both ends (and each client pair's), into meta.json `clock`."""
    calibration, meta_doc["cpu_latency"] = target.calibrate(parts)
    (parts.work / CALIBRATION).write_text(json.dumps(calibration.as_dict()))
    clients = target.calibrate_clients() if request.clients > 1 else ABSENT  # after the file
    meta_doc["clock"] = Clock(tsc=calibration.as_dict(), clients=clients).to_json()
    # each step's phase is entered before the last one's line is logged: a Ctrl-C right after
    # that line is reported in the phase that follows it
    enter(meta_doc, "starting Kafka")
    c = calibration
    log(f"TSC {c.hz / 1e6:.3f} MHz ({c.source}, ±{c.error_ppm:.2f} ppm) in {target.messaging.name}")


def send(request: RunSpec, target: Target, parts: Parts, meta_doc: dict, started: tuple) -> None:
    """The consumers, then the producers; drain; what the setting and the power policy read
    at the end. `started`: the job, Kafka's bootstrap, the glance at the other runs."""
    job, bootstrap, glance = started
    run_id = meta_doc["run_id"]
    enter(meta_doc, "starting the consumer")
    pairs = range(request.clients)
    consumers = [start_consumer(target, parts, bootstrap, k, (job, run_id)) for k in pairs]
    enter(meta_doc, "sending")
    if request.trace:
        target.start_trace(parts)
    parts.on_teardown(target.energy.stop)
    target.energy.start()
    producers = [start_producers(target, parts, bootstrap, run_id, k) for k in pairs]
    steal = drain(request, target, parts, (job, consumers, producers), meta_doc, glance)
    target.energy.stop()
    if request.trace:
        target.stop_trace()
    target.stop_noise()
    if steal is not None:
        meta_doc["steal_while_sending"] = steal
    meta_doc["sched_at_end"] = target.scheduler.read()
    if meta_doc["power"]["readback"] is not None:
        meta_doc["power"]["at_end"] = target.power.read()


def default_run_id(target: str, setting: Setting) -> str:
    """e.g. 20261122T101500Z-xen-rtds-b77500-p100000-e0, ...-xen-credit-w256-c153"""
    short = spec.SHORT_REQUESTED
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{target}-{setting.sched}" + "".join(
        f"-{short[k]}{v}" for k, v in asdict(setting).items() if k in short and v is not None
    )


def begin_meta(request: RunSpec, run_id: str, target: Target) -> dict:
    """What meta.json knows before the run starts: the request, the invocation, the target."""
    requested = {
        **request.requested(),
        "taskmanagers": target.taskmanagers,  # on a testbed, one per real-time VM if unset
        # the setting as validated, with its defaults (PERIOD 100000, EXTRATIME 0, ...): its
        # fields are named as meta.json names them
        **asdict(request.setting),
        "detectors": spec.DETECTORS[request.network],
        "rep": request.rep,
        "campaign": request.campaign,
    }
    return {
        "run_id": run_id,
        "requested": Requested.from_json(requested, "requested", strict=True).to_json(),
        "started_at": datetime.now(UTC).isoformat(),
        "status": Status(state="running", reason=None, phase="calibrating the TSC").to_json(),
        # how the harness was started and what it read: make rerun repeats a run from these
        "invocation": {"argv": sys.argv, "cwd": os.getcwd()},
        **target.describe(),
        "rerun_of": request.rerun_of,
    }


class Interrupt:
    """The run's SIGINT and SIGTERM handler: KeyboardInterrupt wherever the run is, and the
    signal remembered. A C extension the exception lands in can replace it with an error of
    its own (the Kafka client's subscribe turned one into "TypeError: expected list of unicode
    strings"); the run is still an interrupted one."""

    def __init__(self) -> None:
        self.taken: str | None = None

    def __call__(self, signum, _frame) -> None:
        self.taken = signal.Signals(signum).name
        raise KeyboardInterrupt(self.taken)


def mark_interrupted(status: dict) -> None:
    status.update(state="interrupted", reason=f"interrupted while {status['phase']}")
    log(f"run interrupted while {status['phase']}: tearing down")


def apply_power(target: Target, parts: Parts) -> dict:
    """GOVERNOR, MAX_CSTATE, TURBO on the host(s), read back, put back on the way out; with
    none asked, the host's policy as it is."""
    power = target.power
    if not power.policy.given():
        try:
            return Power(requested={}, readback=power.read()).to_json()
        except (RunError, TestbedError) as e:  # e.g. a host's agent from before `power`
            return Power(requested={}, readback=None, error=str(e)).to_json()
    parts.on_teardown(lambda: restore_power(target, parts))  # also after a failed apply
    applied = Power.from_json(power.apply(), "power", strict=True)
    log("power policy: " + ", ".join(f"{k}={v}" for k, v in power.policy.given().items()))
    return applied.to_json()


def restore_power(target: Target, parts: Parts) -> None:
    try:
        target.power.restore()
        parts.stopped.append("power policy restored")
    except (RunError, TestbedError) as e:
        log(f"restoring the power policy failed: {e}")


def reset_scheduler(target: Target, parts: Parts) -> None:
    """Undo the scheduler setting (a quota's cgroup here, a guest's setting on the host)."""
    try:
        target.scheduler.reset()
        parts.stopped.append("scheduler setting reset")
    except (Refused, TestbedError) as e:
        log(f"resetting the scheduler setting failed: {e} (run make sched ACTION=reset)")


def main(argv: list[str] | None = None) -> int:
    # a run takes SIGINT and SIGTERM over (and ignores them while it writes its results):
    # the caller's handlers come back afterwards, for callers in the same process (tests,
    # benchmarks), whose later children would otherwise inherit SIGINT ignored
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        request, validate_only = parse_args(argv)
        if validate_only:
            print(request.target)
            return 0
        return run(request)
    except (*RUN_ENDING, ValueError, tsc_timer.TscUnavailable) as e:
        print(f"make run: {e}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
