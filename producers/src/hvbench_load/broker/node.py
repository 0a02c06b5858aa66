"""One Kafka node (KRaft: broker and controller in one JVM), started, watched and stopped here
(the package's docstring says how)."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from hvbench_job import jvm

KAFKA_VERSION = "4.3.1"
# A fixed heap of 1 GB (about 170 MB of it live) and the workload's JVM options
# (hvbench_job.jvm: C1 only, G1, the heap touched at start-up); its background threads yield
# to every other thread once it serves.
DEFAULT_JVM_OPTS = ("-Xms1g", "-Xmx1g", "-Djava.awt.headless=true", *jvm.OPTIONS)
# The storage formatter is a short tool: the broker's heap touched at start-up cost it 0.5-2 s
# of CPU (page faults of 1 GB) for a few MB of use.
FORMAT_JVM_OPTS = ("-Xmx128m", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
# How long main() lets the JVM shut down before it kills it. Under the tether's grace
# (hvbench_agent.tether, 20 s): the JVM has a session of its own, so if the tether killed this
# process first the JVM would be left running.
SERVE_STOP_S = 10.0
# A broker is hung when it does not answer a metadata request (asked every CHECK_S seconds)
# within HANG_S seconds: here, and in a testbed's guest (main(), HANG_GUEST_S, as long as a
# testbed's stall limit: the test hosts' guests run under emulation, where a JVM can pause for
# seconds). A working broker answers in milliseconds.
CHECK_S, HANG_S, HANG_GUEST_S = 2.0, 5.0, 30.0
HUNG = "Kafka does not answer (hung)"  # how a hung broker's failure begins

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


class BrokerError(RuntimeError):
    pass


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): state T in /proc/PID/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] == "T"


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on host now (each socket is held until all are found)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def new_cluster_id() -> str:
    """Kafka's cluster id format: a UUID, base64url without padding (22 characters). Like
    Kafka's own Uuid.randomUuid, never one that starts with "-": the storage tool's argument
    parser would take it for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def replication_properties(replicas: int, min_insync: int) -> dict[str, str]:
    """Every topic, the internal ones included, on `replicas` nodes; a write with acks=all
    needs `min_insync` of them."""
    return {
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_insync),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_insync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_insync),
    }


@dataclass(frozen=True)
class Quorum:
    """A node's place in its KRaft cluster: its id, the controllers (node id → host:port),
    the cluster's id and its replication."""

    node_id: int
    voters: dict[int, str]
    cluster_id: str
    replication: int = 1
    min_insync: int = 1

    @classmethod
    def alone(cls, host: str, controller_port: int) -> Quorum:
        return cls(1, {1: f"{host}:{controller_port}"}, new_cluster_id())

    def voters_text(self) -> str:
        """The voters as --voters takes them: 1@host:port,2@host:port,..."""
        return ",".join(f"{node}@{address}" for node, address in self.voters.items())

    @staticmethod
    def parse_voters(text: str) -> dict[int, str]:
        voters = {}
        for item in text.split(","):
            node, _, address = item.partition("@")
            if not node.isdigit() or ":" not in address:
                raise BrokerError(f"--voters: {item!r} is not NODE@HOST:PORT")
            voters[int(node)] = address
        return voters

    def properties(self) -> dict[str, str]:
        if len(self.voters) == 1:  # a dynamic quorum of one, formatted --standalone
            return {"controller.quorum.bootstrap.servers": next(iter(self.voters.values()))}
        return {
            "controller.quorum.voters": self.voters_text(),  # static: formatted with no options
            # A node stops only when the run ends, all together (a fault kills it): a
            # controlled shutdown (leaders handed over first) has no node to hand them to,
            # and it waits for the quorum's approval, which the last node never gets.
            "controlled.shutdown.enable": "false",
        }

    def format_options(self) -> list[str]:
        return ["--standalone"] if len(self.voters) == 1 else []


Spawn = Callable[..., subprocess.Popen]


def own_session(command: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen(command, start_new_session=True, **popen)


class KafkaBroker:
    def __init__(
        self,
        libs: Path | str,
        work_dir: Path | str,
        host: str = "127.0.0.1",
        port: int | None = None,
        controller_port: int | None = None,
        jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS,
        java: str = "java",
        quorum: Quorum | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        """spawn(command, **popen): how the JVM is started (a harness starts it as a part of
        its run); by default a process of its own session here."""
        self.libs = Path(libs).resolve()
        if not (self.libs / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
            raise BrokerError(f"no Kafka {KAFKA_VERSION} jars in {self.libs} (run `make kafka`)")
        self.work_dir = Path(work_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.controller_port = controller_port or free_port(host)
        self.jvm_opts = jvm_opts
        self.java = java
        self._spawn = spawn or own_session
        self.process: subprocess.Popen | None = None
        self.faults: list[dict] = []
        self.failure: str | None = None
        self.restarting = False  # while the keeper kills and restarts it
        self.ended: list[dict] = []  # processes ended that stop() has not reported yet
        self._keeping = threading.Event()
        self._keeper: threading.Thread | None = None
        self._restart_lock = threading.RLock()  # stop() waits for a restart under way
        self._started_at = 0.0
        self.background_threads: dict = {}  # what jvm.idle_background_threads read back
        self.quorum = quorum or Quorum.alone(host, self.controller_port)
        self.properties = {
            "process.roles": "broker,controller",
            "node.id": str(self.quorum.node_id),
            **self.quorum.properties(),
            "listeners": f"PLAINTEXT://{host}:{self.port},CONTROLLER://{host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",  # topics are created explicitly, or not at all
            "offsets.topic.num.partitions": "1",
            **replication_properties(self.quorum.replication, self.quorum.min_insync),
            "group.initial.rebalance.delay.ms": "0",  # a consumer group starts at once
            # One network thread and two request handlers instead of 3 and 8: a handful of
            # clients on a few cores; fewer hand-offs between threads per request.
            "num.network.threads": "1",
            "num.io.threads": "2",
        }

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        """broker.log; in a cluster broker-<node>.log, so that the nodes' logs keep apart."""
        alone = len(self.quorum.voters) == 1
        return self.work_dir / ("broker.log" if alone else f"broker-{self.quorum.node_id}.log")

    def _java(self, main: str, *args: str, jvm_opts: tuple[str, ...] | None = None) -> list[str]:
        return [
            self.java,
            *(self.jvm_opts if jvm_opts is None else jvm_opts),
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            str(self.libs / "*"),
            main,
            *args,
        ]

    def format(self, timeout: float = 90.0) -> None:
        """Write the configuration and format the storage in work_dir."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        (self.work_dir / "log4j2.properties").write_text(LOG4J2.format(log=self.log_file))
        fmt = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.quorum.cluster_id,
                "-c",
                str(config),
                *self.quorum.format_options(),
                jvm_opts=FORMAT_JVM_OPTS,
            ),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if fmt.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")
        self._started_at = time.monotonic()

    def start(self, timeout: float = 90.0) -> None:
        self.format(timeout)
        self._launch(timeout)

    def _launch(self, timeout: float) -> None:
        """Start the JVM on the configuration and data in work_dir; wait until it serves."""
        self.spawn()
        self.serving(timeout)

    def spawn(self) -> None:
        """Start the JVM on the configuration and data in work_dir."""
        with open(self.work_dir / "broker.out", "ab") as out:
            # own session: stop() signals the JVM alone, a Ctrl-C in the terminal does not
            self.process = self._spawn(
                self._java("kafka.Kafka", str(self.work_dir / "server.properties")),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def serving(self, timeout: float) -> None:
        """Wait until the JVM spawned serves; then its background threads go idle."""
        self._wait_ready(timeout)
        self.background_threads = jvm.idle_background_threads(self.process.pid)

    def keep(self, restarts: int, poll_s: float = 0.5, hang_s: float = HANG_S) -> None:
        """Watch the broker on a thread; see the module's docstring."""
        self._keeping.set()
        self._keeper = threading.Thread(
            target=self._keep, args=(restarts, poll_s, hang_s), name="broker-keeper", daemon=True
        )
        self._keeper.start()

    def _keep(self, restarts: int, poll_s: float, hang_s: float) -> None:
        admin, ask_at = self.admin(), time.monotonic() + CHECK_S
        while self._keeping.is_set():
            code, hung = self.process.poll(), None
            if code is None:
                asking = time.monotonic() >= ask_at
                hung = self.hung(admin if asking else None, hang_s)
                ask_at = time.monotonic() + CHECK_S if asking else ask_at
                if hung is None:
                    time.sleep(poll_s)
                    continue
            with self._restart_lock:
                if not self._keeping.is_set():
                    return  # stop() is under way
                if not self._restart(restarts, code, hung):
                    return
            admin, ask_at = self.admin(), time.monotonic() + CHECK_S  # a client that connects now

    def hung(self, admin: AdminClient | None, timeout: float) -> str | None:
        """Why the running broker is hung: its JVM is stopped, or (asked with `admin`) it does
        not answer a metadata request within `timeout` seconds. None if it is not."""
        pid = self.process.pid
        if is_stopped(pid):
            return f"its JVM (pid {pid}) is stopped (SIGSTOP?), not running"
        if admin is None:
            return None
        try:
            admin.list_topics(timeout=timeout)
        except KafkaException:
            if self.process.poll() is not None or not self._keeping.is_set():
                return None  # it exited (the next round says so), or it is being stopped
            return f"no answer to a metadata request within {timeout:g} s"
        return None

    def _restart(self, restarts: int, code: int | None, hung: str | None) -> bool:
        """Record the broker's exit (or hang) and start it again on its data if a restart is
        left; False once it is gone for good (`failure` says why)."""
        fault = {
            "part": "broker",
            "event": "exited" if hung is None else "hung",
            "exit_code": code,
            "at_s": round(time.monotonic() - self._started_at, 1),
            "detail": f"Kafka exited with {code}" if hung is None else f"{HUNG}: {hung}",
        }
        if sum(f["event"] == "restarted" for f in self.faults) >= restarts:
            if hung is not None:  # its clients then fail at once instead of waiting on it
                fault["exit_code"] = self._kill("hung")
                fault["detail"] += f"; continued and killed ({fault['exit_code']})"
            self._give_up(fault, f"no restart left (BROKER_RESTARTS={restarts})")
            return False
        self.restarting = True
        try:
            if hung is not None:
                fault["exit_code"] = self._kill()
                fault["detail"] += f"; continued and killed ({fault['exit_code']})"
            self._launch(90.0)
        except BrokerError as e:
            self._give_up(fault, f"the restart failed: {e}")
            return False
        finally:
            self.restarting = False
        fault["event"] = "restarted"
        fault["detail"] += (
            f"; restarted on the same data, serving again after "
            f"{time.monotonic() - self._started_at - fault['at_s']:.1f} s"
        )
        self.faults.append(fault)
        return True

    def _kill(self, why: str | None = None) -> int:
        """A hung JVM killed (continued first, as a stopped process is); its exit code. With
        `why`, the kill is one the run's teardown reports (stop() returns it)."""
        pid, was_stopped = self.process.pid, is_stopped(self.process.pid)
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
        if why is not None:
            self.ended.append(self._ended(pid, "SIGKILL", was_stopped) | {"when": why})
        return self.process.wait()

    def _ended(self, pid: int, how: str, was_stopped: bool) -> dict:
        """A process this broker ended, as harness.parts reports a part's processes."""
        return {"pid": pid, "process": Path(self.java).name, "signal": how,
                "was_stopped": was_stopped}  # fmt: skip

    def _give_up(self, fault: dict, why: str) -> None:
        fault["detail"] += f"; {why}"
        self.faults.append(fault)
        self.failure = fault["detail"] + " (the broker's log: broker.log)"

    def _wait_ready(self, timeout: float) -> None:
        """Ready when the listener accepts connections and the broker answers for metadata."""
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.process.poll() is not None:
                code = self.process.returncode
                raise BrokerError(f"Kafka exited with {code} while starting; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"Kafka not listening after {timeout:.0f} s; see {self.log_file}")
            time.sleep(0.2)
        try:
            metadata = self.admin().list_topics(timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as e:
            self.stop()
            raise BrokerError(
                f"Kafka listens but does not answer: {e}; see {self.log_file}"
            ) from None
        if not metadata.brokers:
            self.stop()
            raise BrokerError(f"Kafka reports no broker; see {self.log_file}")

    def _listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topics(self, names: list[str], partitions: int = 1) -> None:
        admin = self.admin()  # must outlive the futures
        futures = admin.create_topics(
            [
                NewTopic(n, num_partitions=partitions, replication_factor=self.quorum.replication)
                for n in names
            ],
            operation_timeout=30,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=60)
            except KafkaException as e:
                raise BrokerError(f"creating topic {name!r} failed: {e}") from None

    def topics(self) -> list[str]:
        return sorted(
            t for t in self.admin().list_topics(timeout=10).topics if not t.startswith("__")
        )

    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.poll() is None else None

    def pids(self) -> list[int]:
        """The JVM started last, as KafkaCluster.pids lists its nodes'."""
        return [self.process.pid] if self.process else []

    def stop(self, timeout: float = 20.0) -> list[dict]:
        """Controlled shutdown on SIGTERM (SIGCONT first: a stopped JVM keeps SIGTERM
        pending), SIGKILL if it does not finish in time. What it ended, not reported before:
        its JVM (pid, process, signal, was_stopped), and one the keeper killed as hung."""
        self._keeping.clear()
        with self._restart_lock:  # a restart under way ends first; a check in flight is let be
            if self.process is not None and self.process.poll() is None:
                pid = self.process.pid
                was_stopped = is_stopped(pid)
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, sig)
                how = "SIGTERM"
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(pid, signal.SIGKILL)
                    self.process.wait()
                    how = "SIGKILL"
                self.ended.append(self._ended(pid, how, was_stopped))
            ended, self.ended = self.ended, []
        return ended

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> dict:
        """What ran, for meta.json."""
        return {
            "version": KAFKA_VERSION,
            "bootstrap": self.bootstrap,
            "properties": self.properties,
            "jvm_opts": list(self.jvm_opts),
            "background_threads": self.background_threads,
            "java": java_version(self.java),
            "work_dir": str(self.work_dir),
        }


def java_version(java: str = "java") -> str:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        return f"unavailable: {e}"
    return out.stderr.strip().splitlines()[0] if out.stderr else "unknown"
