"""A testbed's scheduler: the run's setting for the real-time VMs, applied, read back and reset
on each host by its agent (`hvbench-agent sched`), every host checked before any applies."""

from __future__ import annotations

import json

from hvbench_harness.testbed import Testbed, TestbedError, TestbedHost, setting_options


class HostScheduler:
    """The scheduler of the real-time VMs, driven from here through each host's agent
    (`hvbench-agent sched VERB --backend kvm|xen --domain ... --domain ...`): the same verbs
    as the agent's own backends, on every real-time VM at once; a refusal on a host (exit 2)
    is a TestbedError with the host's reason. With several VMs the answer has every VM's
    readback (readbacks, each naming its host in on_host) beside the first's (readback)."""

    def __init__(self, testbed: Testbed):
        self.testbed = testbed
        self.backend = testbed.target
        self.hosts = [h for h in testbed.each_host() if h.realtime_domains]

    def where(self) -> str:
        return "; ".join(self.where_on(h) for h in self.hosts)

    def where_on(self, host: TestbedHost) -> str:
        names = ", ".join(host.realtime_domains)
        several = len(self.hosts) > 1
        on = f" on {host.machine.name}" if several else ""
        if host.realtime_pool:  # Xen: the VMs and their cpupool
            return f"{names} in cpupool {host.realtime_pool}{on}"
        return f"the vCPUs of {names}{on}"

    def command(self, verb: str, setting=None, host: TestbedHost | None = None) -> list[str]:
        """The agent's command line on a host (the first by default) for one verb."""
        host = host or self.hosts[0]
        args = ["sched", verb, "--backend", self.backend]
        for domain in host.realtime_domains:
            args += ["--domain", domain]
        if host.realtime_pool:
            args += ["--pool", host.realtime_pool]
        if setting is not None:
            args += setting_options(setting)
        return host.machine.agent(*args)

    def _agent(self, verb: str, setting=None) -> dict:
        """The verb on every host, in order; their answers as one."""
        answers = []
        for host in self.hosts:
            command = self.command(verb, setting, host)
            proc = host.machine.run(command, root=True, check=False)
            if proc.returncode != 0:
                reason = proc.stderr.strip() or f"hvbench-agent sched {verb} failed"
                raise TestbedError(
                    f"{host.machine.name}: {reason}" if len(self.hosts) > 1 else reason
                )
            answers.append((host, json.loads(proc.stdout) if proc.stdout.strip() else {}))
        return merged(answers)

    def check(self, setting) -> None:
        self._agent("check", setting)

    def apply(self, setting) -> dict:
        try:
            answer = self._agent("apply", setting)
        except TestbedError:
            if len(self.hosts) > 1:  # the hosts that took it before one refused
                for host in self.hosts:
                    host.machine.run(self.command("reset", host=host), root=True, check=False)
            raise
        return {"applied": f"{setting.sched} on {self.where()}", **answer}

    def read(self) -> dict:
        return self._agent("read")

    def reset(self) -> None:
        self._agent("reset")


def merged(answers: list[tuple[TestbedHost, dict]]) -> dict:
    """One answer for several hosts: the first host's, with every VM's readback in
    readbacks, each naming its host in on_host (the agent's own `host` is the host's CPUs)."""
    if len(answers) == 1:
        return answers[0][1]
    first = answers[0][1]
    found = [
        {**(readback or {}), "on_host": host.machine.name}
        for host, answer in answers
        for readback in answer.get("readbacks") or [answer.get("readback")]
    ]
    return {**first, "readbacks": found}
