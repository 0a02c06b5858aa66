"""While a run sends and drains: the broker, the job and the clients watched (a part that
dies, is stopped or hangs ends the run at once with the reason), a stall noticed (no result
for STALL_S seconds while the producers send), the consumers' progress relayed."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hvbench_agent import tuning
from hvbench_load.producers import RAMP_START, SENDING

from hvbench_harness import spec
from hvbench_harness.accounting import pair_file
from hvbench_harness.cpu import PartCpu
from hvbench_harness.parts import (
    Parts,
    RunError,
    log,
    next_line,
    stop_process,
    stopped_part,
    tail,
)
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets import Target
from hvbench_harness.testbed import Machine


def watch(target: Target, job: subprocess.Popen, clients: dict | None = None) -> None:
    """RunError at once if the job or the broker is gone or hung (the broker after its
    restarts), or one of the `clients` (producers, consumers here) is stopped."""
    reason = target.part_gone(job) or stopped_part(clients or {})
    if reason:
        raise noticed(reason)


def noticed(reason: str) -> RunError:
    """The fault that ends the run, logged when it is noticed (before the teardown)."""
    log(f"noticed: {reason.splitlines()[0]}")
    return RunError(reason)


# After a broker restart the clients reconnect before results come again: librdkafka's
# reconnect backoff grows up to 10 s (reconnect.backoff.max.ms), the stall clock waits as long.
RECONNECT_S = 10.0
STALL_GAPS = 4  # a stall lasts at least this many of the longest gaps between two sends


class Stall:
    """No result (nor dead letter) for `limit_s` seconds while the producers send: the job,
    or Kafka between it and the consumers, makes no progress. A slow job still makes some."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s, self.results, self.quiet_since = limit_s, 0, time.monotonic()

    def progress(self, progress: dict, now: float) -> None:
        """The consumers' progress (relay): results and dead letters so far."""
        results = sum(got + letters for got, _, letters in progress.values())
        if results > self.results:
            self.results, self.quiet_since = results, now

    def hold(self, until: float) -> None:
        """No result can come before `until` (sending starts, Kafka restarts)."""
        self.quiet_since = max(self.quiet_since, until)

    def check(self, now: float, progress: dict) -> str | None:
        if now - self.quiet_since <= self.limit_s:
            return None
        totals = [sum(figures) for figures in zip(*progress.values(), strict=True)]
        got, due, letters = totals or [0, "?", 0]  # no progress line yet: none received
        return (
            f"no result for {now - self.quiet_since:.0f} s while the producers were sending "
            f"(received {got} of {due}, dead letters {letters}): the Flink job, or Kafka "
            f"between it and the consumer, makes no progress (STALL_S={self.limit_s:g})"
        )


def stall_limit(request: RunSpec, target: Target) -> float:
    """STALL_S, else the target's; never under STALL_GAPS of the longest gap between two
    sends (a detector's send period; at the start of a ramp, the slower rate's)."""
    gap_s = request.send_ms / 1000 / (RAMP_START if request.ramp > 0 else 1)
    return max(request.stall_s or target.stall_s, STALL_GAPS * gap_s)


def drain(
    request: RunSpec,
    target: Target,
    parts: Parts,
    procs,
    meta_doc: dict,
    glance: Callable[[], None],
) -> dict | None:
    """Relay the consumers' progress until each has its pair's records, or until DRAIN seconds
    after the producers finished, watching the parts (watch) and, while the producers send,
    the results' progress (Stall) and the other runs on the machine (glance); the steal time
    while the producers sent (None if the consumers were first)."""
    job, consumers, producers = procs
    machines = target.machines()
    started = time.monotonic()
    cpu_at_start = {m.name: cpu_times(m) for m in machines}
    pids = target.part_pids(job, {"producers": producers, "consumer": [c for c, _ in consumers]})
    usage, sending = PartCpu(pids), False
    progress = Progress(spec.rate_per_s(request.send_ms, request.network))
    drain_deadline, steal, warmed_up = None, None, 0.0
    stall = Stall(stall_limit(request, target))
    meta_doc["watch"] = {"stall_s": stall.limit_s}
    while any(c.poll() is None for c, _ in consumers):
        time.sleep(0.2)
        relay(consumers, progress, started)
        stall.progress(progress.pairs, time.monotonic())
        if not sending and SENDING in (parts.work / "producers.out").read_text(errors="replace"):
            usage, sending = PartCpu(pids), True  # from here: loading the data is not sending
            target.energy.mark("sending")
            warmed_up = time.monotonic() + request.warmup
            stall.hold(time.monotonic())
        if sending and drain_deadline is None and time.monotonic() >= warmed_up:
            target.energy.mark("measured")
        usage.sample()  # before the poll below reaps the producers
        if all(p.poll() is not None for p in producers) and drain_deadline is None:
            enter(meta_doc, "draining")
            target.energy.mark("sent")
            drain_deadline = time.monotonic() + request.drain
            steal = target.steal(
                {m.name: tuning.steal_between(cpu_at_start[m.name], cpu_times(m)) for m in machines}
            )
        watch(target, job, client_pids(target, consumers, producers))
        glance()
        if target.broker_restarting():
            stall.hold(time.monotonic() + RECONNECT_S)
        if (
            sending
            and drain_deadline is None
            and (why := stall.check(time.monotonic(), progress.pairs))
        ):
            raise noticed(why)
        if drain_deadline is not None and time.monotonic() > drain_deadline:
            for consumer, _ in consumers:
                stop_process(consumer, 60)
    relay(consumers, progress, started)
    drained(request, target, (parts, consumers, producers), usage, meta_doc, drain_deadline)
    return steal


def drained(request, target, clients: tuple, usage, meta_doc: dict, deadline) -> None:
    """Once the consumers ended: the producers' end awaited if they were not seen to end
    (`deadline` None), the parts' CPU recorded, the clients' exits checked."""
    parts, consumers, producers = clients
    if deadline is None:
        # the consumers had every record before the producers were seen to end (under load,
        # a producer's exit can take seconds): the sending window still ends when they do
        wait_for_producers(producers)
        enter(meta_doc, "draining")  # a completed run has passed through it, whichever came first
        target.energy.mark("sent")
    if sys.stdout.isatty():
        print()
    if usage.pids:
        meta_doc["cpu_per_part"] = usage.result(request.records)
    check_clients(parts, consumers, producers)


# Once the consumers have every record, a pair's producers only flush and exit (seconds under
# load); not ended after this long, they are hung (stopped, say) and the run fails instead of
# waiting on them. Its teardown then ends them as it ends every part.
PRODUCERS_EXIT_S = 60.0


def wait_for_producers(
    producers: list[subprocess.Popen], limit_s: float = PRODUCERS_EXIT_S
) -> None:
    """Every pair's producers ended within `limit_s` seconds in all, else RunError."""
    deadline = time.monotonic() + limit_s
    for pair, proc in enumerate(producers):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RunError(
                f"the producers (pair {pair}, pid {proc.pid}) had not ended {limit_s:g} s after "
                "the consumers had every record: hung (stopped?)"
            ) from None


def check_clients(parts: Parts, consumers: list, producers: list[subprocess.Popen]) -> None:
    """RunError if a pair's producers or consumer failed."""
    for pair, proc in enumerate(producers):
        if proc.wait() != 0:
            out = tail(parts.work / pair_file("producers.out", pair))
            raise RunError(f"the producers failed:\n{out}")
    for pair, (consumer, _) in enumerate(consumers):
        if consumer.returncode != 0:
            err = tail(parts.work / pair_file("consumer.err", pair))
            raise RunError(f"the consumer failed:\n{err}")


def cpu_times(machine: Machine) -> tuning.CpuTimes:
    return tuning.CpuTimes.parse(machine.run(["cat", "/proc/stat"], timeout=60).stdout)


# The consumer's latency so far, on its progress line (hvbench_load.live): its text, its p99.
LATENCY = re.compile(r" (latency p50 [\d.]+ p99 ([\d.]+) max [\d.]+ ms)")


@dataclass
class Progress:
    """The consumers' progress lines: each pair's [received, due, dead letters] (`pairs`, as
    Stall reads them) and its latency so far (text, p99)."""

    rate: float  # the records sent per second: the time left
    pairs: dict[int, list[int]] = field(default_factory=dict)
    latency: dict[int, tuple[str, float]] = field(default_factory=dict)

    def take(self, pair: int, line: str) -> None:
        self.pairs[pair] = [int(n) for n in re.findall(r"\d+", line)[:3]]
        if found := LATENCY.search(line):
            self.latency[pair] = (found[1], float(found[2]))

    def received(self) -> int:
        return sum(figures[0] for figures in self.pairs.values())

    def text(self) -> str:
        """`received N/M dead-letters D, latency p50 .. p99 .. max .. ms so far, about T left`
        (with several pairs, the latency of the one whose p99 is highest)."""
        got, due, letters = (sum(f[i] for f in self.pairs.values()) for i in range(3))
        text = f"received {got}/{due} dead-letters {letters}"
        if self.latency:
            worst = max(self.latency.values(), key=lambda found: found[1])[0]
            text += f", {worst} so far" + (" (the worst pair's)" if len(self.pairs) > 1 else "")
        if self.rate > 0 and got < due:
            text += f", about {duration_text((due - got) / self.rate)} left"
        return text


def relay(consumers: list, progress: Progress, started: float) -> None:
    """The consumers' lines: their progress on one line (Progress.text), the rest logged as
    they come."""
    fresh, before = False, progress.received()
    for pair, (_, lines) in enumerate(consumers):
        while (line := next_line(lines, 0)) is not None:
            if line.startswith("consumer: received"):
                progress.take(pair, line)
                fresh = True
            elif line:
                log(line if pair == 0 else f"pair {pair}: {line}")
    if not fresh:
        return
    text, elapsed = progress.text(), time.monotonic() - started
    if sys.stdout.isatty():
        print(f"\r  {text}  ({elapsed:.0f} s)", end="", flush=True)
    elif int(elapsed) % 10 == 0 or (before == 0 and progress.received() > 0):  # every 10 s,
        log(f"  {text}")  # and the first


def duration_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def enter(meta_doc: dict, phase: str) -> None:
    """The run's current step, named in its status (and in the reason if it ends there)."""
    meta_doc["status"]["phase"] = phase


def client_pids(target: Target, consumers: list, producers: list) -> dict[str, list[int]]:
    """The producers' and consumers' processes that run here and have not ended (those
    in guests are watched through their progress only)."""
    here = [not m.remote for m in target.client_machines()]
    alive = [
        (name, proc)
        for pair, local in enumerate(here)
        if local
        for name, proc in (("the producers", producers[pair]), ("the consumer", consumers[pair][0]))
    ]
    found: dict[str, list[int]] = {}
    for name, proc in alive:
        if proc.returncode is None:
            found.setdefault(name, []).append(proc.pid)
    return found
