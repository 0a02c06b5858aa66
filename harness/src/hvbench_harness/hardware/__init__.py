"""`make check HOST=...`: is a host's hardware fit for the testbed its inventory describes?

Works before anything of hvbench is on the host: playbooks/hardware.yml sends snapshot.py to
each host (its python3 runs it) and brings back the files it read with the host's inventory
settings; machine.py reads the files, needs.py the settings, judge.py gives the verdicts.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hvbench_harness import playbooks
from hvbench_harness.hardware import judge, machine, needs
from hvbench_harness.testbed import TestbedError


@dataclass(frozen=True)
class HostHardware:
    name: str
    machine: machine.Machine
    needs: needs.Needs
    provisioned: bool  # make provision's agent is there: the tuning checks can run
    checks: list[dict]


def read_hosts(inventory: str, *ansible_args: str) -> list[HostHardware]:
    """Every testbed host of the inventory, read and judged; TestbedError if one cannot be.
    ansible_args: more for ansible-playbook (the tests' `-e @vars.yml`)."""
    with tempfile.TemporaryDirectory() as out:
        proc = playbooks.play(inventory, "hardware.yml", "-e", f"hardware_dir={out}", *ansible_args)
        found = sorted(Path(out).glob("*.json"))
        if proc.returncode != 0 or not found:
            raise TestbedError(
                f"cannot read the hardware of {inventory}'s hosts:\n" + playbooks.last_lines(proc)
            )
        return [judged(p.stem, json.loads(p.read_text())) for p in found]


def judged(name: str, doc: dict) -> HostHardware:
    """One host from the playbook's file: {"files": snapshot, "vars": settings, ...}."""
    found, wanted = machine.parse(doc["files"]), needs.of_host(doc["vars"])
    return HostHardware(
        name, found, wanted, doc.get("provisioned", False), judge.judge(found, wanted)
    )


MARKS = {judge.PASS: "ok  ", judge.WARN: "warn", judge.FAIL: "FAIL", judge.NA: "n/a "}


def table(hosts: list[HostHardware]) -> str:
    lines = []
    for host in hosts:
        lines.append(f"{host.name}: {host.machine.name}, {host.machine.os.get('PRETTY_NAME', '')}")
        for c in host.checks:
            lines.append(f"{MARKS[c['status']]} {host.name:<28} {c['check']:<16} {c['found']}")
            if c["status"] in (judge.WARN, judge.FAIL):
                lines.append(f"{'':5}{'':<28} {'':<16} expected: {c['expected']}")
                lines.append(f"{'':5}{'':<28} {'':<16} fix: {c['fix']}")
    return "\n".join(lines)


def failed(hosts: list[HostHardware]) -> list[dict]:
    return [{"host": h.name, **c} for h in hosts for c in h.checks if c["status"] == judge.FAIL]
