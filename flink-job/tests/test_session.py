"""The Flink session cluster's work directory and commands (hvbench_job.session); the cluster
itself runs for real in tests/integration/test_cluster_integration.py."""

import shutil
from pathlib import Path

import pytest
import yaml
from hvbench_job import jvm
from hvbench_job.session import FlinkSession, SessionError, pyflink_home


@pytest.fixture
def session(tmp_path):
    connectors = tmp_path / "connectors"
    connectors.mkdir()
    (connectors / "flink-sql-connector-kafka-5.0.0-2.2.jar").write_bytes(b"")
    return FlinkSession(tmp_path / "cluster", connectors, taskmanagers=2, rest_port=1)


def test_prepare_links_the_distribution_the_python_runtime_and_the_connector(session):
    session.prepare()
    lib = {p.name for p in (session.work_dir / "lib").iterdir()}
    assert {p.name for p in pyflink_home().glob("lib/*.jar")} <= lib
    assert any(name.startswith("flink-python-") for name in lib)
    assert "flink-sql-connector-kafka-5.0.0-2.2.jar" in lib
    config = yaml.safe_load((session.work_dir / "conf" / "config.yaml").read_text())
    assert config["taskmanager.numberOfTaskSlots"] == 1
    assert config["env.java.opts.taskmanager"] == " ".join(jvm.JOB_OPTIONS)
    assert "--add-opens=java.base/java.util=ALL-UNNAMED" in config["env.java.opts.all"]
    assert (session.work_dir / "conf" / "log4j-console.properties").exists()
    # the processes' working files and pid files stay in the work directory, not in /tmp
    assert config["io.tmp.dirs"] == str(session.work_dir / "tmp")
    assert (session.work_dir / "tmp").is_dir()
    assert session.env()["FLINK_PID_DIR"] == str(session.work_dir)


def test_no_connector_is_refused(tmp_path):
    with pytest.raises(SessionError, match="no Flink Kafka connector jar"):
        FlinkSession(tmp_path / "cluster", tmp_path).prepare()


def test_every_command_runs_on_the_work_directory(session):
    env = f"FLINK_CONF_DIR={session.work_dir / 'conf'}"
    assert session.jobmanager_command()[-2:] == [
        str(pyflink_home() / "bin/jobmanager.sh"),
        "start-foreground",
    ]
    assert session.taskmanager_command()[-1] == "start-foreground"
    submit = session.submit_command(["--bootstrap", "b:1"])
    assert ["-m", session.rest] == submit[submit.index("run") + 1 : submit.index("run") + 3]
    assert submit[-4:] == ["-pym", "hvbench_job.job", "--bootstrap", "b:1"]
    for command in (session.jobmanager_command(), session.taskmanager_command(), submit):
        assert command[0] == "env" and env in command


def test_waiting_ends_when_a_part_exits_or_time_runs_out(session):
    assert session.registered() == 0  # nothing listens on port 1
    with pytest.raises(SessionError, match="the TaskManager exited"):
        session.wait_ready(30, lambda: "the TaskManager exited")
    with pytest.raises(SessionError, match="0 of 2 TaskManagers registered"):
        session.wait_ready(0.1)


def test_a_remote_process_takes_its_options_and_the_jobs_arguments_after_the_dashes(tmp_path):
    from hvbench_job.session import parse_args

    own = ["--work", str(tmp_path), "--connectors", "c", "--host", "10.0.0.12",
           "--jobmanager", "10.0.0.11", "--rest-port", "8081", "--rpc-port", "6123",
           "--taskmanagers", "2"]  # fmt: skip
    job = ["--bootstrap", "10.0.0.10:9092", "--parallelism", "2"]
    args, job_args = parse_args(["submit", *own, "--", *job])
    assert args.role == "submit" and job_args == job
    assert (args.host, args.jobmanager, args.taskmanagers) == ("10.0.0.12", "10.0.0.11", 2)
    args, job_args = parse_args(["taskmanager", *own])
    assert args.role == "taskmanager" and job_args == []
    # the JobManager's address is the REST endpoint's and the RPC's; the TaskManager's own
    # address is where it binds
    remote = FlinkSession(tmp_path, tmp_path, host="10.0.0.12", jobmanager="10.0.0.11")
    assert remote.rest == "10.0.0.11:8081"
    assert remote.config["jobmanager.rpc.address"] == "10.0.0.11"
    assert remote.config["taskmanager.host"] == "10.0.0.12"


def test_the_jobs_own_jvm_gets_the_connector_on_its_class_path(tmp_path, monkeypatch):
    """hvbench_job.job started alone: PyFlink builds its JVM's class path from FLINK_LIB_DIR,
    which holds the distribution's jars and the connector (not only `pipeline.jars`)."""
    from hvbench_job import job

    connector = tmp_path / "flink-sql-connector-kafka-5.0.0-2.2.jar"
    connector.write_bytes(b"")
    lib = Path(job.gateway_lib(connector))
    try:
        names = {p.name for p in lib.iterdir()}
        assert {p.name for p in pyflink_home().glob("lib/*.jar")} | {connector.name} <= names
        assert (lib / connector.name).resolve() == connector.resolve()
        assert job.gateway_lib(connector) == str(lib)  # the next job's: the same links
        lib.chmod(0o777)  # writable by others: its jars are not trusted, a fresh one is made
        fresh = Path(job.gateway_lib(connector))
        assert fresh != lib and (fresh / connector.name).resolve() == connector.resolve()
        shutil.rmtree(fresh)
    finally:
        shutil.rmtree(lib)


def test_the_jobs_scratch_files_go_where_it_is_told(tmp_path, monkeypatch):
    """--tmp-dir: Flink's local cluster (io.tmp.dirs), the JVM and Python all write there."""
    import tempfile

    from hvbench_job import job

    monkeypatch.setenv("JVM_ARGS", "-Xss1m")
    # setenv records TMPDIR's old value (even its absence) so the test puts it back: delenv of an
    # unset name records nothing, and the job's TMPDIR then leaked into the worker's later tests
    # (chromium, given that long TMPDIR, died on a socket path over 108 bytes)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    scratch = tmp_path / "work" / "job-tmp"
    job.use_tmp_dir(str(scratch))
    assert scratch.is_dir() and tempfile.gettempdir() == str(scratch)
    assert job.os.environ["JVM_ARGS"] == f"-Xss1m -Djava.io.tmpdir={scratch}"
    assert job.job_settings(tmp_dir=str(scratch))["io.tmp.dirs"] == str(scratch)
    assert "io.tmp.dirs" not in job.job_settings()
