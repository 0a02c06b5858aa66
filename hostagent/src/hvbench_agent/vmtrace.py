"""`hvbench-agent trace`: when the real-time VM's vCPUs ran, waited for a CPU or slept, recorded
on its host for as long as standard input stays open (docs/tracing.md, "On a testbed").

    hvbench-agent trace --backend kvm|xen --domain NAME --out FILE [--clock-of DOMAIN]

- kvm: the vCPU threads (their ids from QMP) as the host's scheduler saw them: sched_switch and
  sched_wakeup through tracefs (trace.SchedTrace, clock x86-tsc), and, in an instance of their
  own, kvm_entry and kvm_exit (many thousands a second under load: filling their buffer never
  costs a scheduler event).
- xen: xentrace in dom0 with the scheduler's runstate events (TRC_SCHED_RUNSTATE_CHANGE: every
  vCPU's running, runnable, blocked, offline, stamped with the host's TSC); the records of the
  domain's vCPUs become text lines (`xen_lines`) the report reads like the kernel's.

The conversation, one line each way:
  out, first: JSON {"clock", "threads", "guest_clock"}: the trace has started
  in "sync N": (kvm) the line "hvbench-sync N" goes into the trace, stamped on its clock, and
      "N" comes back: the harness brackets that moment with its own clock (NTP-style)
  in end of input (also SIGTERM or SIGHUP, or a lost SSH connection): the trace stops, its
      text goes to FILE, and the summary (JSON, with the syncs' trace stamps) comes out.

`--clock-of DOMAIN` also reports how a guest's TSC relates to the host's: KVM's TSC offset
and scaling ratio from debugfs (guest = host × ratio / 2^frac_bits + offset), or for a Xen PV
guest the host's TSC itself; with the domain's UUID, so the harness can tell whether that
guest is the machine that stamps the run.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from .sched.base import Refused
from .trace import KVM_EVENTS, SchedTrace

DEBUGFS_KVM = Path("/sys/kernel/debug/kvm")
MARKER = "hvbench-sync"
KVM_EXITS_BUFFER_KB = 16384  # per CPU, the exits' own instance
XEN_BUFFER_PAGES = 256  # per CPU (1 MB; xentrace drains it to its file as it goes); Xen keeps the
# first size set after boot
XEN_RUNSTATE_MASK = "0x00021000"  # TRC_SCHED_MIN: runstate changes, nothing per scheduler
TRC_TRACE_CPU_CHANGE, TRC_LOST_RECORDS = 0x0001F003, 0x0001F001
TRC_SCHED_RUNSTATE_CHANGE = 0x00021001  # old state in bits 8-9, new in bits 4-5
XEN_RUNSTATES = ("running", "runnable", "blocked", "offline")


# ---------------------------------------------------------------------------------------------
# kvm


def kvm_vcpu_threads(domain: str) -> dict[int, str]:
    from .sched import kvm

    return {tid: f"CPU {index}/KVM" for index, tid in kvm.vcpu_threads(kvm.open_domain(domain))}


def kvm_guest_clock(domain: str, debugfs: Path = DEBUGFS_KVM) -> dict:
    """A guest's TSC against the host's, per vCPU, from KVM's debugfs (<qemu pid>-<fd>/vcpuN)."""
    from .sched import kvm

    dom = kvm.open_domain(domain)
    pid = int(Path(f"/run/libvirt/qemu/{domain}.pid").read_text().strip())
    vcpus = {}
    for vm in sorted(debugfs.glob(f"{pid}-*")):
        for vcpu in sorted(vm.glob("vcpu*")):
            read = {f.name: (vcpu / f.name).read_text().strip() for f in vcpu.glob("tsc-*")}
            vcpus[vcpu.name] = {k: int(v) for k, v in read.items()}
    if not vcpus:
        raise Refused(f"no KVM debugfs entries for {domain} (pid {pid}) under {debugfs}")
    return {"domain": domain, "uuid": dom.UUIDString(), "kind": "kvm tsc offset", "vcpus": vcpus}


class KvmTrace:
    def __init__(self, domain: str, name: str):
        self.threads = kvm_vcpu_threads(domain)
        self.sched = SchedTrace(name, self.threads)
        self.exits = SchedTrace(f"{name}-kvm", self.threads, KVM_EXITS_BUFFER_KB,
                                events=KVM_EVENTS)  # fmt: skip

    def start(self) -> str:
        self.sched.start()
        try:
            self.exits.start()
        except Refused:
            self.sched.stop()
            raise
        return self.sched.clock

    def mark(self, text: str) -> None:
        self.sched.mark(text)

    def stop(self) -> tuple[str, dict]:
        sched_text, summary = self.sched.stop()
        exits_text, exits = self.exits.stop()
        summary["syncs"] = marker_stamps(sched_text)
        summary["kvm_exits"] = {k: exits[k] for k in ("events", "lines", "dropped")}
        return sched_text + exits_text, summary


def marker_stamps(text: str) -> dict[str, str]:
    """{N: the trace's timestamp} of each "hvbench-sync N" line."""
    found = re.finditer(rf"\s(\d+(?:\.\d+)?): tracing_mark_write: {MARKER} (\d+)", text)
    return {m[2]: m[1] for m in found}


# ---------------------------------------------------------------------------------------------
# xen


def xen_domain(domain: str) -> dict:
    from .sched import xen

    return xen.domain(domain)


def xen_guest_clock(domain: str) -> dict:
    """A Xen guest's TSC: a PV guest reads the host's own (no offset, no scaling) unless its
    tsc_mode emulates it; the domain's type and tsc_mode say which."""
    from .sched import xen

    doc = json.loads(xen.xl("list", "-l", domain))
    config = (doc[0] if isinstance(doc, list) else doc).get("config", {})
    info = config.get("c_info", {})
    build = config.get("b_info", {})
    kind, tsc_mode = info.get("type", "pv"), build.get("tsc_mode", "default")
    native = kind == "pv" and tsc_mode in ("default", "native")
    return {"domain": domain, "uuid": info.get("uuid", ""), "kind": f"xen {kind} tsc",
            "type": kind, "tsc_mode": tsc_mode, "host_tsc": native}  # fmt: skip


def read_xentrace(data: bytes):
    """(cpu, tsc, event, extra words) of each record of xentrace's binary output: a header word
    (event:28, extra words:3, TSC included:1), the TSC if included, the extra words; xentrace's
    own CPU-change records say which CPU the records that follow came from."""
    cpu, at = 0, 0
    while at + 4 <= len(data):
        (header,) = struct.unpack_from("<I", data, at)
        event, words, has_tsc = header & 0x0FFFFFFF, (header >> 28) & 7, header >> 31
        at += 4
        tsc = None
        if has_tsc:
            (tsc,) = struct.unpack_from("<Q", data, at)
            at += 8
        if at + 4 * words > len(data):
            return  # cut short when xentrace stopped
        extra = struct.unpack_from(f"<{words}I", data, at)
        at += 4 * words
        if event == TRC_TRACE_CPU_CHANGE and extra:
            cpu = extra[0]
        yield cpu, tsc, event, extra


def xen_lines(data: bytes, domid: int) -> tuple[list[str], dict[int, str], int]:
    """The domain's runstate changes as text lines the report reads, its vCPUs seen, and the
    lost-records count xentrace reported."""
    lines, vcpus, lost = [], {}, 0
    for cpu, tsc, event, extra in read_xentrace(data):
        if event == TRC_LOST_RECORDS:
            lost += extra[0] if extra else 1
        if event & 0x0FFFF00F != TRC_SCHED_RUNSTATE_CHANGE or not extra or tsc is None:
            continue
        dom, vcpu = extra[0] >> 16, extra[0] & 0xFFFF
        if dom != domid:
            continue
        old, new = XEN_RUNSTATES[(event >> 8) & 3], XEN_RUNSTATES[(event >> 4) & 3]
        vcpus[vcpu] = f"d{dom}v{vcpu}"
        lines.append(f"d{dom}v{vcpu} [{cpu:03d}] xen {tsc}: runstate: vcpu={vcpu} {old}->{new}")
    return lines, vcpus, lost


class XenTrace:
    def __init__(self, domain: str, name: str):
        found = xen_domain(domain)
        self.domain, self.domid = domain, int(found["id"])
        self.raw = Path(f"/var/lib/hvbench/{name}.xentrace")
        self.proc: subprocess.Popen | None = None
        self.threads = {v: f"d{self.domid}v{v}" for v in range(found["vcpus"])}

    def start(self) -> str:
        self.raw.parent.mkdir(parents=True, exist_ok=True)
        command = ["xentrace", "-D", "-e", XEN_RUNSTATE_MASK, "-S", str(XEN_BUFFER_PAGES),
                   str(self.raw)]  # fmt: skip
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(1.0)  # xentrace maps the buffers and starts, or says why not
        if self.proc.poll() is not None:
            raise Refused(f"xentrace ended at once: {self.proc.stderr.read().decode()[-500:]}")
        return "tsc"

    def mark(self, text: str) -> None:
        """dom0 cannot put a line into Xen's trace: a Xen trace is placed by the TSC alone."""

    def stop(self) -> tuple[str, dict]:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # flushes what it holds, then exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        data = self.raw.read_bytes() if self.raw.exists() else b""
        self.raw.unlink(missing_ok=True)
        lines, seen, lost = xen_lines(data, self.domid)
        self.threads.update(seen)
        summary = {
            "tool": "xentrace (dom0), scheduler runstate events",
            "event_mask": XEN_RUNSTATE_MASK,
            "clock": "tsc",
            "events": ["runstate"],
            "domain": self.domain,
            "domid": self.domid,
            "threads": {str(k): v for k, v in sorted(self.threads.items())},
            "buffer_kb_per_cpu": XEN_BUFFER_PAGES * 4,
            "bytes": len(data),
            "lines": len(lines),
            "dropped": lost,
            "syncs": {},
        }
        return "".join(line + "\n" for line in lines), summary


# ---------------------------------------------------------------------------------------------
# the conversation


def guest_clock(backend: str, domain: str) -> dict:
    try:
        return kvm_guest_clock(domain) if backend == "kvm" else xen_guest_clock(domain)
    except (Refused, OSError, ValueError) as e:
        return {"domain": domain, "error": str(e)}


class Stop(Exception):
    """SIGTERM or SIGHUP: stop as if standard input had ended."""


def on_stop_signal(_signum, _frame) -> None:
    raise Stop


def run(backend: str, domain: str, out: Path, clock_of: str | None) -> int:
    """Trace until standard input ends (see the module's doc)."""
    name = f"hvbench-vm-{out.stem}"
    trace = KvmTrace(domain, name) if backend == "kvm" else XenTrace(domain, name)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_stop_signal)
    clock = trace.start()
    try:
        started = {"clock": clock, "threads": {str(k): v for k, v in trace.threads.items()}}
        if clock_of:
            started["guest_clock"] = guest_clock(backend, clock_of)
        say(started)
        for line in sys.stdin:
            if line.startswith("sync "):
                trace.mark(f"{MARKER} {int(line.split()[1])}")
                print(line.split()[1], flush=True)
    except Stop:
        pass
    finally:
        text, summary = trace.stop()
        out.write_text(text)
        if clock_of:
            summary["guest_clock_at_end"] = guest_clock(backend, clock_of)
        say(summary)
    return 0


def say(doc: dict) -> None:
    with contextlib.suppress(OSError):  # the harness went away; the trace file stays
        print(json.dumps(doc), flush=True)
