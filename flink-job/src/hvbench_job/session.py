"""A Flink standalone session cluster: one JobManager and N TaskManagers, each its own JVM,
started from PyFlink's own distribution (its bin/ scripts and lib/ jars), and the job submitted
to it with `flink run`. On this machine, or over several (a testbed's real-time VMs): each
process then runs `python -m hvbench_job.session ROLE ...` there, with the JobManager's address
and its own (see main).

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

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import cache
from pathlib import Path

from hvbench_job import jvm


@cache
def pyflink_home() -> Path:
    """PyFlink's distribution (its jars, conf/ and bin/). Imported here, when a session or
    the job starts, not when the module loads: a controller that drives a testbed imports this
    module and has no PyFlink."""
    import pyflink

    return Path(pyflink.__file__).resolve().parent


class SessionError(RuntimeError):
    pass


def link_lib(lib: Path, connector: Path) -> None:
    """A Flink lib directory: links to PyFlink's jars, its Python runtime jar (from opt/) and
    the Kafka connector."""
    home = pyflink_home()
    jars = [*home.glob("lib/*.jar"), *home.glob("opt/flink-python-*.jar"), connector]
    for jar in jars:
        with contextlib.suppress(FileExistsError):  # linked before, or by a job beside this one
            (lib / jar.name).symlink_to(jar.resolve())


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
        jobmanager: str | None = None,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.log_dir = Path(log_dir).resolve() if log_dir else self.work_dir / "log"
        self.connector_dir = Path(connector_dir).resolve()
        self.taskmanagers, self.slots = taskmanagers, slots
        # this machine's address, and the JobManager's (the same unless it runs elsewhere)
        self.host, self.jobmanager = host, jobmanager or host
        self.rest_port, self.rpc_port = rest_port, rpc_port
        self.config = self._config()

    @property
    def rest(self) -> str:
        return f"{self.jobmanager}:{self.rest_port}"

    def _config(self) -> dict:
        """The cluster's config.yaml. The TaskManagers run the job's JVM options (hvbench_job.jvm)
        and a heap above their -Xms1g; no managed memory is used (no RocksDB, no batch). Their
        working files go into the work directory (hvbench_job.job.job_settings: tmp_dir)."""
        return {
            "env.java.opts.all": distribution_java_opts(),
            "io.tmp.dirs": str(self.work_dir / "tmp"),
            "env.java.opts.taskmanager": " ".join(jvm.JOB_OPTIONS),
            "jobmanager.bind-host": self.jobmanager,
            "jobmanager.rpc.address": self.jobmanager,
            "jobmanager.rpc.port": self.rpc_port,
            "jobmanager.memory.process.size": "1024m",
            "rest.address": self.jobmanager,
            "rest.bind-address": self.jobmanager,
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
            "FLINK_PID_DIR": str(self.work_dir),  # the scripts' pid files, else in /tmp
        }

    def prepare(self) -> None:
        """conf/ and lib/ in the work directory."""
        conf, lib = self.work_dir / "conf", self.work_dir / "lib"
        for directory in (conf, lib, self.log_dir, self.work_dir / "tmp"):
            directory.mkdir(parents=True, exist_ok=True)
        connectors = sorted(self.connector_dir.glob("flink-sql-connector-kafka-*.jar"))
        if not connectors:
            raise SessionError(f"no Flink Kafka connector jar in {self.connector_dir}")
        link_lib(lib, connectors[-1])
        # flat keys are valid YAML, and JSON is YAML: no YAML writer needed
        (conf / "config.yaml").write_text(json.dumps(self.config, indent=2) + "\n")
        for name in ("log4j-console.properties", "log4j-cli.properties", "log4j.properties"):
            shutil.copy(pyflink_home() / "conf" / name, conf / name)

    def _command(self, script: str, *args: str) -> list[str]:
        env = [f"{k}={v}" for k, v in self.env().items()]
        path = f"PATH={Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        return ["env", path, *env, str(pyflink_home() / "bin" / script), *args]

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
            "distribution": str(pyflink_home()),
        }


def distribution_java_opts() -> str:
    """The --add-opens options PyFlink's own config.yaml gives every Flink JVM (Java 17 needs
    them: without, the client fails as it translates the job)."""
    for line in (pyflink_home() / "conf" / "config.yaml").read_text().splitlines():
        if line.strip().startswith("all: --add"):
            return line.split("all:", 1)[1].strip()
    raise SessionError(f"no env.java.opts.all in {pyflink_home() / 'conf' / 'config.yaml'}")


ROLES = ("jobmanager", "taskmanager", "wait", "submit")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """main's options, and the job's arguments: everything after `--`."""
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m hvbench_job.session", description=main.__doc__)
    p.add_argument("role", choices=ROLES)
    p.add_argument("--work", required=True)
    p.add_argument("--connectors", required=True, help="the Kafka connector jar's directory")
    p.add_argument("--host", required=True, help="this machine's address")
    p.add_argument("--jobmanager", required=True, help="the JobManager's address")
    p.add_argument("--rest-port", type=int, required=True)
    p.add_argument("--rpc-port", type=int, required=True)
    p.add_argument("--log-dir")
    p.add_argument("--taskmanagers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    return p.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    """One process of a session cluster over several machines (a testbed's real-time VMs):

        python -m hvbench_job.session jobmanager|taskmanager --work W --connectors C
               --host OWN --jobmanager ADDRESS --rest-port R --rpc-port P [--log-dir L]
        python -m hvbench_job.session wait ... --taskmanagers N --timeout S
        python -m hvbench_job.session submit ... -- JOB-ARGS

    jobmanager and taskmanager prepare their own work directory and become the JVM; wait
    prints the seconds until N TaskManagers registered (exit 1 if they did not); submit
    becomes `flink run` with the job's arguments."""
    args, job_args = parse_args(sys.argv[1:] if argv is None else argv)
    session = FlinkSession(
        args.work, args.connectors, taskmanagers=args.taskmanagers, host=args.host,
        rest_port=args.rest_port, rpc_port=args.rpc_port, log_dir=args.log_dir,
        jobmanager=args.jobmanager,
    )  # fmt: skip
    try:
        if args.role == "wait":
            print(f"{session.wait_ready(args.timeout):.1f}")
            return 0
        session.prepare()
    except SessionError as e:
        print(f"session: {e}", file=sys.stderr)
        return 1
    command = {
        "jobmanager": session.jobmanager_command,
        "taskmanager": session.taskmanager_command,
        "submit": lambda: session.submit_command(job_args),
    }[args.role]()
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
