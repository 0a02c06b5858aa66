"""A Flink standalone session cluster on this machine: one JobManager and N TaskManagers, each
its own JVM, started from PyFlink's own distribution (its bin/ scripts and lib/ jars), and the
job submitted to it with `flink run`.

The cluster lives in a work directory: conf/ (config.yaml written here), lib/ (links to
PyFlink's jars, plus the Python runtime jar from its opt/ and the Kafka connector, which every
TaskManager needs on its class path), and the logs (log_dir). The scripts take these through
FLINK_CONF_DIR, FLINK_LIB_DIR and FLINK_LOG_DIR; `start-foreground` ends in `exec java`, so each
started process is the JVM itself.

    session = FlinkSession(work, connector_dir, taskmanagers=2)
    session.prepare()
    jobmanager = Popen(session.jobmanager_command()); ...
    session.wait_ready(timeout)
    Popen(session.submit_command(["--bootstrap", ...]))
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyflink

from hvbench_job import jvm

PYFLINK = Path(pyflink.__file__).resolve().parent


class SessionError(RuntimeError):
    pass


class FlinkSession:
    def __init__(
        self,
        work_dir: Path | str,
        connector_dir: Path | str,
        taskmanagers: int = 2,
        slots: int = 1,
        host: str = "127.0.0.1",
        rest_port: int = 8081,
        rpc_port: int = 6123,
        log_dir: Path | str | None = None,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.log_dir = Path(log_dir).resolve() if log_dir else self.work_dir / "log"
        self.connector_dir = Path(connector_dir).resolve()
        self.taskmanagers, self.slots, self.host = taskmanagers, slots, host
        self.rest_port, self.rpc_port = rest_port, rpc_port
        self.config = self._config()

    @property
    def rest(self) -> str:
        return f"{self.host}:{self.rest_port}"

    def _config(self) -> dict:
        """The cluster's config.yaml. The TaskManagers run the job's JVM options (hvbench_job.jvm)
        and a heap above their -Xms1g; no managed memory is used (no RocksDB, no batch)."""
        return {
            "env.java.opts.all": distribution_java_opts(),
            "env.java.opts.taskmanager": " ".join(jvm.JOB_OPTIONS),
            "jobmanager.bind-host": self.host,
            "jobmanager.rpc.address": self.host,
            "jobmanager.rpc.port": self.rpc_port,
            "jobmanager.memory.process.size": "1024m",
            "rest.address": self.host,
            "rest.bind-address": self.host,
            "rest.port": self.rest_port,
            "taskmanager.bind-host": self.host,
            "taskmanager.host": self.host,
            "taskmanager.numberOfTaskSlots": self.slots,
            "taskmanager.memory.process.size": "2048m",
            "taskmanager.memory.managed.size": "64m",
        }

    def env(self) -> dict[str, str]:
        return {
            "FLINK_CONF_DIR": str(self.work_dir / "conf"),
            "FLINK_LIB_DIR": str(self.work_dir / "lib"),
            "FLINK_LOG_DIR": str(self.log_dir),
        }

    def prepare(self) -> None:
        """conf/ and lib/ in the work directory."""
        conf, lib = self.work_dir / "conf", self.work_dir / "lib"
        for directory in (conf, lib, self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        connectors = sorted(self.connector_dir.glob("flink-sql-connector-kafka-*.jar"))
        if not connectors:
            raise SessionError(f"no Flink Kafka connector jar in {self.connector_dir}")
        jars = [*PYFLINK.glob("lib/*.jar"), *PYFLINK.glob("opt/flink-python-*.jar"), connectors[-1]]
        for jar in jars:
            link = lib / jar.name
            if not link.exists():
                link.symlink_to(jar)
        # flat keys are valid YAML, and JSON is YAML: no YAML writer needed
        (conf / "config.yaml").write_text(json.dumps(self.config, indent=2) + "\n")
        for name in ("log4j-console.properties", "log4j-cli.properties", "log4j.properties"):
            shutil.copy(PYFLINK / "conf" / name, conf / name)

    def _command(self, script: str, *args: str) -> list[str]:
        env = [f"{k}={v}" for k, v in self.env().items()]
        path = f"PATH={Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        return ["env", path, *env, str(PYFLINK / "bin" / script), *args]

    def jobmanager_command(self) -> list[str]:
        return self._command("jobmanager.sh", "start-foreground")

    def taskmanager_command(self) -> list[str]:
        return self._command("taskmanager.sh", "start-foreground")

    def submit_command(self, job_args: list[str]) -> list[str]:
        """`flink run`, attached: the client lives until the job ends, or until it is stopped
        (stopping the cluster ends the job). Client and TaskManagers use this Python."""
        python = sys.executable
        return self._command(
            "flink", "run", "-m", self.rest, "-pyclientexec", python, "-pyexec", python,
            "-pym", "hvbench_job.job", *job_args,
        )  # fmt: skip

    def registered(self) -> int:
        """TaskManagers registered with the JobManager; 0 while its REST endpoint is down."""
        try:
            with urllib.request.urlopen(f"http://{self.rest}/taskmanagers", timeout=5) as r:
                return len(json.load(r)["taskmanagers"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return 0

    def wait_ready(self, timeout: float, gone: Callable[[], str | None] = lambda: None) -> float:
        """Seconds until every TaskManager registered; SessionError if one of the cluster's
        processes exits (gone() says why) or time runs out."""
        start = time.monotonic()
        while self.registered() < self.taskmanagers:
            if why := gone():
                raise SessionError(why)
            if time.monotonic() - start > timeout:
                raise SessionError(
                    f"{self.registered()} of {self.taskmanagers} TaskManagers registered after "
                    f"{timeout:.0f} s; see {self.log_dir}"
                )
            time.sleep(0.5)
        return time.monotonic() - start

    def describe(self) -> dict:
        """What ran, for meta.json."""
        return {
            "jobmanager": self.rest,
            "taskmanagers": self.taskmanagers,
            "slots_per_taskmanager": self.slots,
            "config": self.config,
            "distribution": str(PYFLINK),
        }


def distribution_java_opts() -> str:
    """The --add-opens options PyFlink's own config.yaml gives every Flink JVM (Java 17 needs
    them: without, the client fails as it translates the job)."""
    for line in (PYFLINK / "conf" / "config.yaml").read_text().splitlines():
        if line.strip().startswith("all: --add"):
            return line.split("all:", 1)[1].strip()
    raise SessionError(f"no env.java.opts.all in {PYFLINK / 'conf' / 'config.yaml'}")
