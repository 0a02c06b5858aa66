"""Power on the run's hosts: the power policy a run asks for, and the energy it costs.

- `HostPower`: GOVERNOR, MAX_CSTATE and TURBO on every host (this machine on the bare target,
  each hypervisor host of a testbed), through its agent (`hvbench-agent power`): checked before
  anything starts, applied before the consumer starts, read back, and put back as it was on the
  way out.
- `EnergyMeter`: each host's energy counters (`hvbench-agent energy`), sampled every second
  while the run sends, with marks where the run's windows begin and end:
  `sending` (the producers' first send), `measured` (the warm-up over), `sent` (the last send).
  `summary()` gives joules, seconds and mean watts of the run (sending → sent) and of the
  measured window (measured → sent), per record too; or, where a host has no energy source,
  that energy is not available and why (docs/energy.md).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading

from hvbench_agent.power import Policy

from hvbench_harness.parts import RunError
from hvbench_harness.testbed import Machine, TestbedError

WINDOWS = {"run": ("sending", "sent"), "measured": ("measured", "sent")}
ENERGY_PERIOD_S = 1.0
NO_METER = (
    "the meter did not start (a host's agent from before `energy`: make provision updates it)"
)


def policy_args(policy: Policy) -> list[str]:
    flags = {"governor": "--governor", "max_cstate": "--max-cstate", "turbo": "--turbo"}
    return [word for k, v in policy.given().items() for word in (flags[k], str(v))]


def agent_json(machine: Machine, *args: str, input: str | None = None) -> dict:
    """The agent's answer; RunError with its reason if it refused."""
    proc = machine.run(machine.agent(*args), root=True, check=False, timeout=120, input=input)
    if proc.returncode != 0:
        raise RunError(f"{machine.name}: {proc.stderr.strip() or proc.stdout.strip()}")
    return json.loads(proc.stdout)


class HostPower:
    def __init__(self, machines: list[Machine], policy: Policy):
        self.machines, self.policy = machines, policy
        self.before: dict[str, dict] = {}

    def check(self) -> None:
        """Refused (RunError) on a host without the control asked for; nothing is changed."""
        if self.policy.given():
            for m in self.machines:
                agent_json(m, "power", "check", *policy_args(self.policy))

    def apply(self) -> dict:
        """meta.json `power`: what was asked, and each host's readback."""
        readbacks = {}
        for m in self.machines:
            answer = agent_json(m, "power", "apply", *policy_args(self.policy))
            self.before[m.name] = answer["before"]
            readbacks[m.name] = answer["readback"]
        return {"requested": self.policy.given(), "readback": readbacks,
                "before": dict(self.before)}  # fmt: skip

    def read(self) -> dict:
        return {m.name: agent_json(m, "power", "read")["readback"] for m in self.machines}

    def restore(self) -> None:
        """Every host put back as it was; RunError at the end naming those that were not."""
        failed = []
        for m in self.machines:
            if m.name in self.before:
                before = json.dumps(self.before.pop(m.name))
                try:
                    agent_json(m, "power", "restore", input=before)
                except (RunError, TestbedError) as e:
                    failed.append(str(e))
        if failed:
            raise RunError("; ".join(failed))


class EnergyMeter:
    """`hvbench-agent energy` on each host, from start() to stop()."""

    def __init__(self, machines: list[Machine]):
        self.machines = machines
        self.procs: dict[str, subprocess.Popen] = {}
        self.lines: dict[str, list[dict]] = {m.name: [] for m in machines}
        self.readers: list[threading.Thread] = []
        self.marked: list[str] = []

    def start(self) -> None:
        for m in self.machines:
            command = m.agent("energy", "--period-s", str(ENERGY_PERIOD_S))
            proc = m.stream(command, root=True, stderr=subprocess.DEVNULL)
            self.procs[m.name] = proc
            reader = threading.Thread(target=self._read, args=(m.name, proc), daemon=True)
            reader.start()
            self.readers.append(reader)

    def _read(self, name: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                self.lines[name].append(json.loads(line))

    def mark(self, name: str) -> None:
        """A sample named `name` on every host, now (once per name)."""
        if name in self.marked:
            return
        self.marked.append(name)
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.stdin.write(f"mark {name}\n")
                    proc.stdin.flush()

    def stop(self) -> None:
        """Ends every host's meter (also on the teardown); what it sampled stays."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for reader in self.readers:
            reader.join(10)

    def summary(self, records: dict[str, int]) -> dict:
        """meta.json `energy`: each host's source (or why none), and the windows' figures
        (per record: `records` names each window's records)."""
        hosts, windows = {}, {}
        for name, lines in self.lines.items():
            hosts[name] = lines[0] if lines else {"available": False, "reason": NO_METER}
        available = bool(hosts) and all(h.get("available") for h in hosts.values())
        for window, marks in WINDOWS.items():
            windows[window] = self.window(marks, records.get(window)) if available else None
        doc = {"available": available, "hosts": hosts, "windows": windows,
               "marks": list(self.marked)}  # fmt: skip
        if not available:
            doc["reason"] = "; ".join(
                f"{name}: {h.get('reason')}" for name, h in hosts.items() if not h.get("available")
            )
        return doc

    def window(self, marks: tuple[str, str], records: int | None) -> dict | None:
        """The hosts' joules over one window, summed; None if a mark was not reached."""
        from hvbench_agent.energy import TOTAL, window

        found = [window(lines[1:], *marks) for lines in self.lines.values()]
        if any(f is None for f in found):
            return None
        joules = sum(f["joules"][TOTAL] for f in found)
        seconds = max(f["seconds"] for f in found)
        return {
            "from": marks[0],
            "to": marks[1],
            "seconds": seconds,
            "joules": joules,
            "mean_w": joules / seconds if seconds > 0 else None,
            "records": records,
            "joules_per_record": joules / records if records else None,
            "per_host": {name: f for name, f in zip(self.lines, found, strict=True)},
        }

    def samples_csv(self) -> str:
        """energy.csv: every sample of every host, cumulative joules per domain."""
        rows = ["host,t_s,mark,domain,joules"]
        for name, lines in self.lines.items():
            for s in lines[1:]:
                for domain, joules in s.get("joules", {}).items():
                    rows.append(
                        f"{name},{s['t_s']:.6f},{s.get('mark') or ''},{domain},{joules:.6f}"
                    )
        return "\n".join(rows) + "\n"
