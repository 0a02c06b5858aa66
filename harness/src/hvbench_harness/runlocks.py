"""Which runs and campaigns are live on a machine: a registry of lock files, one per run, each
held with flock(2) for the run's life. A held lock is a live run; the file of a run that
crashed is no longer held, and is ignored (and removed). Two runs on one machine disturb
each other's latency, so a run refuses to start beside another unless forced (CONCURRENT=1),
and records what it saw in meta.json `concurrent` either way.

A run holds the machines it uses: "this machine" on the bare target, each testbed host's
address (address:port) on kvm and xen, so that two runs on two testbed hosts driven from one
controller do not refuse each other. A campaign holds its machines too; its own runs (its
child processes) do not count it as another run.

The registry is one folder, machine-wide: $HVBENCH_RUNS_DIR if set (tests isolate themselves
with it), else /run/lock/hvbench (cleared at boot), else <tmp>/hvbench-runs where /run/lock
cannot be written. Each run's file is <pid>-<random>.lock, holding JSON: id, kind, pid,
started_at, machines, forced.

    with hold("try-1", ["this machine"], forced=False) as seen:   # RunError if another runs
        ...                                                       # seen.record: meta.json
        seen.glance()                          # while sending: every LOOK_S, into `seen`
        seen.look_again()                                         # the runs live at the end
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from hvbench_harness.parts import RunError
from hvbench_harness.targets.kinds import kind
from hvbench_harness.testbed import group_hosts, read_inventory

ENV = "HVBENCH_RUNS_DIR"
FOLDERS = (Path("/run/lock/hvbench"), Path(tempfile.gettempdir()) / "hvbench-runs")
THIS_MACHINE = "this machine"
LOOK_S = 5.0  # how often a sending run looks for other runs (Held.glance)
MUTEX = ".registry"  # held while a run looks and registers, so two starting runs take turns


def folder() -> Path:
    """The registry's folder, made (and opened to every user) if it is not there."""
    if os.environ.get(ENV):
        path = Path(os.environ[ENV])
        path.mkdir(parents=True, exist_ok=True)
        return path
    for path in FOLDERS:
        try:
            if not path.is_dir():
                path.mkdir(parents=True)
                path.chmod(0o1777)  # every user's runs register here (sticky, as /tmp)
            if os.access(path, os.W_OK | os.X_OK):
                return path
        except OSError:
            continue
    raise RunError(f"no folder for the run registry ({', '.join(map(str, FOLDERS))}); set {ENV}")


def registered_machines(target: str, inventory: str | None) -> list[str]:
    """The machines a run or campaign holds: this machine, or the testbed's hosts."""
    if not kind(target).testbed:
        return [THIS_MACHINE]
    return testbed_hosts(inventory, target)


def testbed_hosts(inventory: str | None, target: str) -> list[str]:
    """Each host in the inventory's kvm_hosts or xen_hosts as address:port (ansible_host,
    ansible_port; no host is contacted). Test testbeds run several hosts on 127.0.0.1 apart
    by port."""
    if not inventory:
        raise RunError(f"TARGET={target} needs the testbed: HOST=<host> or INVENTORY=<dir>")
    doc = read_inventory(inventory)
    hostvars = (doc.get("_meta") or {}).get("hostvars") or {}
    found = []
    for host in group_hosts(doc, f"{target}_hosts"):
        facts = hostvars.get(host) or {}
        found.append(f"{facts.get('ansible_host', host)}:{facts.get('ansible_port', 22)}")
    return sorted(found)


def ancestors(pid: int) -> set[int]:
    """The processes `pid` descends from (its parent, theirs, ...), from /proc."""
    found: set[int] = set()
    while pid > 1 and pid not in found:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rpartition(")")[2].split()[1])  # the field after the state: ppid
        found.add(pid)
    return found


def holder(path: Path) -> dict | None:
    """The run holding `path`, or None if it holds it no more (the file is then removed)."""
    try:
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):  # stale: its run ended without removing it
        path.unlink()
    return None


def live(registry: Path, keys: list[str], own: Path | None = None) -> list[dict]:
    """The other live runs holding any of `keys`; this process's ancestors (the campaign a
    run belongs to, the run a workload copy is a neighbour of) are not others."""
    mine = ancestors(os.getpid())
    found = []
    for path in sorted(registry.glob("*.lock")):
        if path == own:
            continue
        entry = holder(path)
        if entry is None or entry.get("pid") in mine:
            continue
        shared = sorted(set(entry.get("machines") or []) & set(keys))
        if shared:
            found.append({**entry, "machines": shared})
    return found


def describe(entry: dict) -> str:
    """e.g. run try-1 (pid 4242, started 2026-11-27T21:50:02+00:00, on this machine)"""
    return (
        f"{entry.get('kind', 'run')} {entry.get('id')} (pid {entry.get('pid')}, started "
        f"{entry.get('started_at')}, on {', '.join(entry.get('machines') or [])})"
    )


class Held:
    """A run's entry in the registry, held until release(); `record` is meta.json
    `concurrent`."""

    def __init__(self, registry: Path, path: Path, lock, record: dict) -> None:
        self.registry, self.path, self.lock, self.record = registry, path, lock, record
        self.looked = time.monotonic()

    def glance(self) -> None:
        """While the run sends: every LOOK_S seconds, the other runs live then join `seen`
        (a run that started and ended in the middle of this one is recorded too)."""
        if time.monotonic() - self.looked >= LOOK_S:
            self.see(live(self.registry, self.record["machines"], self.path))

    def look_again(self) -> list[dict]:
        """The other runs live now, kept in the record as `at_end` (and in `seen`)."""
        self.record["at_end"] = live(self.registry, self.record["machines"], self.path)
        self.see(self.record["at_end"])
        return self.record["at_end"]

    def see(self, entries: list[dict]) -> None:
        self.looked = time.monotonic()
        known = {(e.get("id"), e.get("pid")) for e in self.record["seen"]}
        self.record["seen"] += [e for e in entries if (e.get("id"), e.get("pid")) not in known]

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.lock.close()  # closing the file releases the lock


def register(name: str, keys: list[str], kind: str = "run", forced: bool = False) -> Held:
    """Register a run holding `keys`; RunError naming the other runs if some hold one of them
    and it is not forced. Nothing is left in the registry after a refusal."""
    registry = folder()
    # read-only is enough for flock, and lets every user open another user's mutex
    with open(os.open(registry / MUTEX, os.O_RDONLY | os.O_CREAT, 0o644)) as mutex:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        others = live(registry, keys)
        if others and not forced:
            names = "; ".join(describe(e) for e in others)
            raise RunError(
                f"another run holds {'these machines' if len(keys) > 1 else 'this machine'}: "
                f"{names}. Two runs disturb each other's latency: wait for it to end, or "
                "CONCURRENT=1 to run beside it (meta.json `concurrent` records it)"
            )
        entry = {
            "id": name,
            "kind": kind,
            "pid": os.getpid(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machines": keys,
            "forced": forced,
        }
        path = registry / f"{os.getpid()}-{secrets.token_hex(4)}.lock"
        lock = write_held(path, entry)
    record = {
        "registry": str(registry),
        "machines": keys,
        "forced": forced,
        "at_start": others,
        "seen": list(others),
    }
    return Held(registry, path, lock, record)


def write_held(path: Path, entry: dict):
    """The entry's file, locked before it appears under its name: a reader never finds it
    unlocked while its run lives. Returns the open file (the lock lives as long as it)."""
    partial = path.with_suffix(".new")
    lock = open(partial, "w")  # noqa: SIM115 — held open for the run's life
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write(json.dumps(entry))
    lock.flush()
    os.chmod(partial, 0o644)
    partial.rename(path)
    return lock


@contextlib.contextmanager
def hold(name: str, keys: list[str], kind: str = "run", forced: bool = False):
    """register() for the life of a `with` block."""
    held = register(name, keys, kind, forced)
    try:
        yield held
    finally:
        held.release()
