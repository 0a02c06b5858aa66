"""TRACE=1 on a testbed: the real-time VM's vCPUs traced on their host by its agent
(`hvbench-agent trace`, hostagent/src/hvbench_agent/vmtrace.py), and that trace put on the
run's clock (docs/tracing.md, "On a testbed").

The run's clock is the messaging VM's TSC; the trace's is the host's. How they relate, best
first:

1. The messaging VM is a guest of this host, recognised by its UUID: KVM's TSC offset and
   scaling ratio for it, or the host's TSC itself for a Xen PV guest. Exact (bound 0).
2. The harness shares the messaging machine's clock (the same kernel: the same boot id, as
   when one machine plays the messaging VM): syncs through the trace. The harness sends
   "sync N" and stamps its TSC before and after the answer; the agent writes a marker into the
   trace in between (KVM; dom0 cannot write into Xen's trace). NTP-style, at the start and
   the end, within half the tightest round trip.
3. Neither: the trace is kept, and the report says it cannot be placed.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

from hvbench_analysis import sched_trace

import tsc_timer
from hvbench_harness.targets.kinds import kind
from hvbench_harness.testbed import Testbed, TestbedError

SYNCS = 8  # at the start and at the end; the tightest of each counts
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class HostTrace:
    def __init__(self, testbed: Testbed, run_id: str, hz: float):
        self.testbed, self.hz = testbed, hz
        self.out = f"/var/lib/hvbench/trace-{run_id}.txt"
        self.proc: subprocess.Popen | None = None
        self.syncs: list[dict] = []
        self.started: dict = {}
        self.result: tuple[str, dict] | None = None
        self.same_boot = shares_boot(testbed)
        self.guest_uuid = guest_uuid(testbed)

    def start(self) -> dict:
        host, args = self.testbed.host, ["--domain", self.testbed.realtime_domain]
        if self.testbed.messaging_domain:
            args += ["--clock-of", self.testbed.messaging_domain]
        command = host.agent("trace", "--backend", self.testbed.target, *args, "--out", self.out)
        self.proc = host.stream(command, root=True)
        line = self.proc.stdout.readline()
        if not line.startswith("{"):
            self.proc.wait(30)
            raise TestbedError(f"the host's trace did not start: {self.proc.stderr.read()[-2000:]}")
        self.started = json.loads(line)
        self.sync()
        return self.started

    def sync(self) -> None:
        """SYNCS round trips through the trace (only where they can place it, see 2.)."""
        if not self.same_boot or self.started.get("clock") == "tsc":  # xen: no markers
            return
        for _ in range(SYNCS):
            n = len(self.syncs)
            sent = tsc_timer.ticks()
            self.proc.stdin.write(f"sync {n}\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
            answered = tsc_timer.ticks()
            if answer != str(n):
                raise TestbedError(f"the host's trace answered {answer!r} to sync {n}")
            self.syncs.append({"n": n, "sent_ticks": sent, "answered_ticks": answered})

    def stop(self) -> tuple[str, dict] | None:
        """The last syncs, then the trace's end: its text, fetched from the host, and its
        summary with the alignment. Also on the teardown: then no syncs, and what was
        recorded until then."""
        if self.proc is None:
            return self.result
        with contextlib.suppress(OSError, TestbedError):
            self.sync()  # the trace ends anyway; the alignment uses the syncs there are
        proc, self.proc = self.proc, None
        out, err = proc.communicate(timeout=120)  # closes stdin: the agent stops the trace
        last = [line for line in out.splitlines() if line.startswith("{")]
        if not last:
            raise TestbedError(f"the host's trace ended without a summary: {err[-2000:]}")
        summary = json.loads(last[-1])
        host = self.testbed.host
        text = host.run(["cat", self.out], root=True).stdout
        host.run(["rm", "-f", self.out], root=True, check=False)
        summary["alignment"] = self.alignment(summary)
        summary["guest_clock"] = self.started.get("guest_clock")
        summary["where"] = f"{host.name}: the vCPUs of {self.testbed.realtime_domain}"
        self.result = (text, summary)
        return self.result

    def alignment(self, summary: dict) -> dict:
        guest = self.started.get("guest_clock") or {}
        if guest and not guest.get("error") and guest.get("uuid", "").lower() == self.guest_uuid:
            found = sched_trace.alignment_from_guest_clock(
                guest, summary.get("guest_clock_at_end") or {}
            )
            return {**found, "guest": guest}
        if self.syncs:
            stamps = summary.get("syncs") or {}
            for s in self.syncs:
                s["trace_ts"] = stamps.get(str(s["n"]))
            return {**sched_trace.alignment_from_syncs(self.syncs, self.hz), "pairs": self.syncs}
        reason = (
            f"the messaging VM is not the host's guest {self.testbed.messaging_domain!r} "
            "(its UUID differs) and does not share the harness's clock"
        )
        return {"method": "none", "known": False, "reason": reason, "guest": guest}


def shares_boot(testbed: Testbed) -> bool:
    """Whether the messaging machine runs the harness's own kernel (one machine, one TSC)."""
    here = Path(BOOT_ID).read_text().strip()
    there = testbed.messaging.run(["cat", BOOT_ID], check=False).stdout.strip()
    return here == there


def guest_uuid(testbed: Testbed) -> str:
    """The messaging machine's own idea of its VM UUID (empty if it has none)."""
    path = kind(testbed.target).guest_uuid or ""
    found = testbed.messaging.run(["cat", path], root=True, check=False)
    return found.stdout.strip().lower() if found.returncode == 0 else ""
