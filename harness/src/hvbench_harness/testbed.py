"""Where the parts of a run execute: this machine, or a machine of a provisioned testbed
reached over SSH.

On the bare target every part runs here. On a KVM testbed the broker, the producers and the
consumer run in the messaging VM, the Flink job in the real-time VM, and the scheduler setting
is applied on the host; the harness stays on the controller and starts each part over SSH.
Which machines those are, and how to reach them, comes from the Ansible inventory through
playbooks/testbed.yml (the guests are reached through their host).
"""

from __future__ import annotations

import atexit
import functools
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hvbench_agent.names import BadName, check_name

from hvbench_harness import playbooks
from hvbench_harness.targets.kinds import KINDS


class TestbedError(RuntimeError):
    __test__ = False  # not a test class, despite its name


# A machine's short commands (Machine.run, Machine.fetch) share one SSH connection: a run makes
# dozens of them (the agent's apply, read-back, reset, checks), and each new connection pays a
# whole handshake (about 2 s on an emulated test host). The parts a run starts keep a connection
# each, so that one part's connection lost or stopped is that part's fault alone.
SHARED_IDLE_S = 30  # a shared connection ends this long after its last command
SOCKET_PATH_MAX = 100  # a Unix socket's path is at most 108 bytes; %C is 40 of them


@functools.cache
def shared_sockets() -> Path | None:
    """This process's folder of shared connections (their sockets), made on first use; at
    exit each connection is told to end and the folder goes. None where the temporary folder's
    path leaves no room for a socket's name: the commands then connect each on their own."""
    folder = Path(tempfile.mkdtemp(prefix="hvbench-ssh-"))
    if len(str(folder)) + 41 > SOCKET_PATH_MAX:
        folder.rmdir()
        return None
    atexit.register(close_shared, folder)
    return folder


def close_shared(folder: Path) -> None:
    """End every shared connection in `folder` and remove it."""
    for socket in folder.glob("*"):
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "shared"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    shutil.rmtree(folder, ignore_errors=True)


def shared_options() -> tuple[str, ...]:
    """ssh's options for a command over the machine's shared connection (the inventory's own
    ssh_args come first and win: an inventory with ControlMaster=no keeps its own)."""
    folder = shared_sockets()
    if folder is None:
        return ()
    return (
        *("-o", "ControlMaster=auto", "-o", f"ControlPath={folder}/%C"),
        *("-o", f"ControlPersist={SHARED_IDLE_S}"),
    )


@dataclass(frozen=True)
class Machine:
    name: str
    ssh: tuple[str, ...] = ()  # empty: this machine
    python: str = sys.executable
    sudo: bool = False  # an SSH user other than root runs root's commands through sudo
    cpus: str = ""  # taskset CPU list for the run's parts there (empty: any CPU)
    # how to run hvbench-agent there: here and in the guests, as a module of the run's Python;
    # on a testbed's host, the command its agent role installed
    agent_command: tuple[str, ...] = ()

    @property
    def remote(self) -> bool:
        return bool(self.ssh)

    def command(self, args: list[str], root: bool = False, shared: bool = False) -> list[str]:
        """The command line that runs `args` there; `shared`: over the machine's shared SSH
        connection (short commands only, see SHARED_IDLE_S)."""
        args = [str(a) for a in args]
        if root and self.sudo:
            args = ["sudo", "-n", *args]
        if not self.ssh:
            return args
        *ssh, destination = self.ssh
        return [*ssh, *(shared_options() if shared else ()), destination, shlex.join(args)]

    def module(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *[str(a) for a in args]]

    def agent(self, *args: str) -> list[str]:
        command = list(self.agent_command) or [self.python, "-m", "hvbench_agent"]
        return [*command, *[str(a) for a in args]]

    def start(self, args: list[str], **popen_kwargs) -> subprocess.Popen:
        """A part that runs until asked to stop, in its own process group. There, it is
        tethered to the SSH connection (hvbench-agent tether): closing the returned process's
        stdin stops it on the far side, as does a lost connection."""
        if self.cpus:
            args = ["taskset", "-c", self.cpus, *args]
        if not self.ssh:
            return subprocess.Popen(args, start_new_session=True, **popen_kwargs)
        tethered = self.agent("tether", "--", *args)
        return subprocess.Popen(
            self.command(tethered), stdin=subprocess.PIPE, start_new_session=True, **popen_kwargs
        )

    def stream(
        self, args: list[str], root: bool = False, stderr=subprocess.PIPE
    ) -> subprocess.Popen:
        """An agent's stream there (trace, energy): a process the caller talks to line by line,
        text on stdin and stdout, in its own process group. Closing its stdin ends it, here as
        over SSH (the agent's streams stop at the end of their input)."""
        return subprocess.Popen(
            self.command(args, root=root),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )

    def run(
        self,
        args: list[str],
        timeout: float = 600,
        root: bool = False,
        check: bool = True,
        input: str | None = None,  # stdin's text (as subprocess.run takes it)
    ) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(
                self.command(args, root=root, shared=True),
                **({"input": input} if input is not None else {"stdin": subprocess.DEVNULL}),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise TestbedError(
                f"{self.name}: `{shlex.join(args)}` took over {timeout:.0f} s"
            ) from None
        if check and proc.returncode != 0:
            raise TestbedError(
                f"{self.name}: `{shlex.join(args)}` failed ({proc.returncode}): "
                + (proc.stderr.strip() or proc.stdout.strip())[-2000:]
            )
        return proc

    def fetch(self, directory: str, into: Path, timeout: float = 600) -> None:
        """Copy a directory's contents from the machine into a local directory."""
        into.mkdir(parents=True, exist_ok=True)
        if not self.ssh:
            subprocess.run(["cp", "-a", f"{directory}/.", str(into)], check=True)
            return
        with subprocess.Popen(
            self.command(["tar", "-C", directory, "-cf", "-", "."], shared=True),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        ) as sender:
            unpacked = subprocess.run(
                ["tar", "-C", str(into), "-xf", "-"], stdin=sender.stdout, timeout=timeout
            )
        if sender.returncode != 0 or unpacked.returncode != 0:
            raise TestbedError(f"{self.name}: copying {directory} back failed")


HERE = Machine("this machine")  # the harness's own machine: the bare target's parts run here


def ssh_command(conn: dict, keepalives: int = 4) -> tuple[str, ...]:
    """ssh's argument list for one inventory host (its Ansible connection variables). A
    connection that stops answering ends after `keepalives` unanswered keepalives 2 s apart
    (8 s by default), so a run notices a lost guest as fast as a part that died; the
    inventory's ssh_args come first and win (ssh keeps the first value of an option)."""
    args = ["ssh", *shlex.split(conn.get("ssh_args") or ""), "-o", "BatchMode=yes"]
    args += ["-o", "ServerAliveInterval=2", "-o", f"ServerAliveCountMax={keepalives}"]
    if conn.get("port"):
        args += ["-p", str(conn["port"])]
    if conn.get("key"):
        args += ["-i", conn["key"]]
    user = conn.get("user") or "root"
    return (*args, f"{user}@{conn['address']}")


NEIGHBOUR_KEEPALIVES = 15  # 30 s: see neighbour_ssh


def neighbour_ssh(conn: dict) -> tuple[str, ...]:
    """ssh's argument list for a neighbour VM. A neighbour is loaded on purpose (stress-ng on
    every vCPU) and its sshd answers keepalives late; nothing of the run waits on noticing a
    lost neighbour (its stress-ng has a timeout of its own), so its connection bears 30 s of
    silence instead of a guest's 8."""
    return ssh_command(conn, keepalives=NEIGHBOUR_KEEPALIVES)


@dataclass(frozen=True)
class TestbedHost:
    """One host of a testbed and the VMs it runs: the scheduler setting of its real-time VMs is
    applied and read back there, by its agent."""

    __test__ = False  # not a test class, despite its name

    machine: Machine
    realtime_domains: tuple[str, ...]
    messaging_domains: tuple[str, ...] = ()
    realtime_pool: str = ""  # xen: its real-time VMs' cpupool
    facts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Testbed:
    """The machines of a provisioned KVM or Xen testbed, as playbooks/testbed.yml found them.
    A cluster has several messaging or real-time VMs, on one host or several; `messaging` and
    `realtime` are the first of each (where the producers, the consumer and the job start),
    `host` the first host (the one that runs the first real-time VM and the neighbours)."""

    __test__ = False  # not a test class, despite its name

    host: Machine
    messaging_vms: tuple[Machine, ...]
    realtime_vms: tuple[Machine, ...]
    # the brokers listen here, on the guests' private network, one address per messaging VM
    messaging_addresses: tuple[str, ...]
    realtime_addresses: tuple[str, ...]  # the same for the real-time VMs (Flink's processes)
    realtime_domains: tuple[str, ...]  # every real-time VM's name on the host (libvirt or xl)
    install_dir: str
    work_dir: str
    host_facts: dict = field(default_factory=dict)
    target: str = "kvm"  # the hypervisor: kvm or xen
    realtime_pool: str = ""  # xen: the real-time VMs' cpupool
    messaging_domain: str = ""  # the first messaging VM's name on the host (libvirt or xl)
    # the neighbour VMs (make provision, hvbench_neighbours): their domain names and machines
    neighbours: tuple[tuple[str, Machine], ...] = ()
    # those of them that have the workload installed (hvbench_neighbours.workload)
    workload_neighbours: tuple[str, ...] = ()
    # every host with its VMs; empty: `host` alone runs them all
    hosts: tuple[TestbedHost, ...] = ()

    def each_host(self) -> tuple[TestbedHost, ...]:
        """Every host of the testbed with the VMs it runs."""
        if self.hosts:
            return self.hosts
        return (
            TestbedHost(
                self.host,
                self.realtime_domains,
                (self.messaging_domain,) if self.messaging_domain else (),
                self.realtime_pool,
                self.host_facts,
            ),
        )

    @property
    def messaging(self) -> Machine:
        return self.messaging_vms[0]

    @property
    def realtime(self) -> Machine:
        return self.realtime_vms[0]

    @property
    def messaging_address(self) -> str:
        return self.messaging_addresses[0]

    @property
    def realtime_address(self) -> str:
        return self.realtime_addresses[0]

    @property
    def realtime_domain(self) -> str:
        return self.realtime_domains[0]

    @classmethod
    def from_json(cls, doc: dict) -> Testbed:
        check_guest_names(doc)

        def machine(role: str, conn: dict) -> Machine:
            return Machine(
                name=f"{role} ({conn['name']})",
                ssh=ssh_command(conn),
                python=f"{doc['install_dir']}/venv/bin/python",
                sudo=(conn.get("user") or "root") != "root",
                cpus=str(conn.get("workload_cpus") or ""),
                agent_command=("hvbench-agent",) if role == "host" else (),
            )

        def vms(role: str) -> tuple[Machine, ...]:
            return tuple(machine(role, conn) for conn in doc[f"{role}_vms"])

        neighbours = tuple(
            (conn["name"], Machine(name=f"neighbour ({conn['name']})", ssh=neighbour_ssh(conn)))
            for conn in doc.get("neighbours", [])
        )
        hosts = tuple(
            TestbedHost(
                machine=machine("host", h["host"]),
                realtime_domains=tuple(h["realtime_domains"]),
                messaging_domains=tuple(h.get("messaging_domains", [])),
                realtime_pool=h.get("realtime_pool", ""),
                facts=h.get("host_facts", {}),
            )
            for h in doc.get("hosts", [])
        )
        return cls(
            hosts=hosts,
            neighbours=neighbours,
            workload_neighbours=tuple(
                conn["name"] for conn in doc.get("neighbours", []) if conn.get("workload")
            ),
            host=machine("host", doc["host"]),
            messaging_vms=vms("messaging"),
            realtime_vms=vms("realtime"),
            messaging_addresses=tuple(c["private_address"] for c in doc["messaging_vms"]),
            realtime_addresses=tuple(c["private_address"] for c in doc["realtime_vms"]),
            realtime_domains=tuple(doc["realtime_domains"]),
            install_dir=doc["install_dir"],
            work_dir=doc["work_dir"],
            host_facts=doc.get("host_facts", {}),
            target=doc.get("target", "kvm"),
            realtime_pool=doc.get("realtime_pool", ""),
            messaging_domain=doc.get("messaging_domain", ""),
        )


def check_guest_names(doc: dict) -> None:
    """The testbed's hosts, guests, domains and neighbours are names (hvbench_agent.names):
    they go into commands and file names on the hosts, as root. TestbedError otherwise."""
    conns = [doc.get("host") or {}, *doc.get("messaging_vms", []), *doc.get("realtime_vms", [])]
    conns += [*doc.get("neighbours", []), *(h.get("host") or {} for h in doc.get("hosts", []))]
    found = [("a guest's or host's name", c.get("name")) for c in conns]
    domains = [*doc.get("realtime_domains", [])]
    domains += [d for h in doc.get("hosts", []) for d in h.get("realtime_domains", [])]
    domains += [d for h in doc.get("hosts", []) for d in h.get("messaging_domains", [])]
    domains += [doc["messaging_domain"]] if doc.get("messaging_domain") else []
    found += [("a domain's name", d) for d in domains]
    found += [("the real-time pool", doc["realtime_pool"])] if doc.get("realtime_pool") else []
    try:
        for what, name in found:
            check_name(name, what)
    except BadName as e:
        raise TestbedError(f"the testbed's inventory: {e}") from None


def setting_options(setting) -> list[str]:
    """A checked Setting as `hvbench-agent sched`'s options (its setting_arguments)."""
    options = ["--sched", setting.sched]
    for name, value in setting.params().items():
        options += ["--" + name.removesuffix("_us"), str(value)]
    return options


def resolve(inventory: str, out: Path) -> Testbed:
    """Ask Ansible for the testbed of `inventory` (and check that it is provisioned)."""
    proc = playbooks.play(inventory, "testbed.yml", "-e", f"testbed_file={out.resolve()}")
    if proc.returncode != 0 or not out.exists():
        raise TestbedError(
            f"the testbed of {inventory} is not ready (is it provisioned? `make provision`):\n"
            + playbooks.last_lines(proc)
        )
    return Testbed.from_json(json.loads(out.read_text()))


# Where a run executes: this machine, or the guests of a KVM or Xen testbed.
TARGETS = tuple(KINDS)
# The inventory groups of the testbed hosts, and the target each stands for.
HYPERVISOR_GROUPS = {k.inventory_group: k.name for k in KINDS.values() if k.inventory_group}


def inventory_target(inventory: str) -> str:
    """The target an inventory implies: kvm or xen when its hosts are in kvm_hosts or xen_hosts,
    bare when it lists none (the sample inventory). No host is contacted."""
    doc = read_inventory(inventory)
    found = {target for group, target in HYPERVISOR_GROUPS.items() if group_hosts(doc, group)}
    if len(found) > 1:
        raise TestbedError(
            f"{inventory} has hosts in both kvm_hosts and xen_hosts; TARGET=kvm or xen picks one"
        )
    return found.pop() if found else "bare"


def read_inventory(inventory: str) -> dict:
    """The inventory as `ansible-inventory --list` reads it (groups, and host variables under
    _meta); TestbedError if there is none or Ansible cannot read it. No host is contacted."""
    if not Path(inventory).exists():
        raise TestbedError(f"no inventory at {inventory}")
    proc = playbooks.run("ansible-inventory", "-i", inventory, "--list")
    if proc.returncode != 0:
        raise TestbedError(f"ansible-inventory cannot read {inventory}:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout)


def group_hosts(doc: dict, group: str) -> set[str]:
    """The hosts of an inventory group (read_inventory's), its child groups' included."""
    found = set(doc.get(group, {}).get("hosts", []))
    for child in doc.get(group, {}).get("children", []):
        found |= group_hosts(doc, child)
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m hvbench_harness.testbed target INVENTORY [TARGET]`: print the run's target, the
    one given or the one the inventory implies (make run uses it when TARGET is not given)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] != "target":
        print("usage: python -m hvbench_harness.testbed target INVENTORY [TARGET]", file=sys.stderr)
        return 2
    given = args[2] if len(args) == 3 else ""
    if given and given not in TARGETS:
        print(f"make run: unknown TARGET {given!r}; valid: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    try:
        print(given or inventory_target(args[1]))
    except TestbedError as e:
        print(f"make run: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
