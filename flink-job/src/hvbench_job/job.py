"""The PyFlink job: Kafka input → parse/validate → LSTM forecast → A* route → Kafka output.

    python -m hvbench_job.job --bootstrap 127.0.0.1:9092 --model artifacts/forecaster \\
        --input input --output output --dead-letter dead-letter --settings-out job.json

`build()` takes the source stream and returns the output stream; dead letters go out through
the operator's own client (hvbench_job.dead_letters). `main()` attaches Kafka. The
latency-relevant settings are chosen in `job_settings()` and written, as applied, to
`--settings-out` for the run's meta.json.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import hashlib
import json
import os
import site
import sys
import tempfile
from pathlib import Path

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream import (
    DataStream,
    OutputTag,
    ProcessFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import (
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaRecordSerializationSchema,
    KafkaSink,
    KafkaSource,
)

from hvbench_job import clients, detectors, jvm, networks
from hvbench_job.dead_letters import CONFIG as DEAD_LETTER_CONFIG
from hvbench_job.dead_letters import DeadLetterWriter
from hvbench_job.session import link_lib, pyflink_home

# Kafka client settings of the job's source and sink (the Java client inside the connector).
SOURCE_PROPERTIES = {
    "fetch.min.bytes": "1",  # answer a fetch as soon as one record is there
    "fetch.max.wait.ms": "100",  # bounds only empty fetches (see the consumer's settings)
    "isolation.level": "read_uncommitted",  # the producers do not use transactions
    "client.id.prefix": "hvbench-job",
}
SINK_PROPERTIES = {
    "linger.ms": "0",  # Kafka 4 clients default to 5 ms
    "acks": "1",
    "max.in.flight.requests.per.connection": "5",
}


def job_settings(
    checkpoint_interval_ms: int = 10_000,
    parallelism: int = 1,
    jobmanager: str | None = None,
    tmp_dir: str | None = None,
) -> dict[str, str]:
    """Flink configuration of the job; each entry is chosen for latency, and recorded.

    - thread mode runs the Python operator inside the JVM (no gRPC hop, no bundles): measured
      p50 4.3 ms against 16 ms in process mode even with bundles of one record;
    - buffer timeout 0 flushes the network buffer after every record (the default waits
      up to 100 ms to fill it);
    - parallelism 1: one record every ~17 ms is far below one slot's capacity, and one task
      keeps the routing state in one place; on a cluster, one task per TaskManager, each
      reading the input partitions of its own detectors (the producers key by detector);
    - checkpoints are AT_LEAST_ONCE and sparse: an exactly-once sink would hold output back
      until the checkpoint completes;
    - object reuse: the source hands each message's bytes to the chained operator as they are.
      Without it Flink copies them on the way, and the copy of a tombstone's null value throws
      (NullPointerException) and ends the job; with it the operator gets None and dead-letters it;
    - tmp_dir: the local cluster's working files (its RPC jar of 24 MB, its blobs and task
      directories, about 35 MB a job) go into the run's work directory, removed with it. In /tmp
      they stayed whenever the JVM ended by a signal, and filled the disk over runs.
    """
    return {
        "python.execution-mode": "thread",
        "python.executable": sys.executable,
        # thread mode's embedded interpreter sees neither the venv nor editable installs
        "python.pythonpath": ":".join(import_roots()),
        "execution.buffer-timeout.enabled": "true",
        "execution.buffer-timeout.interval": "0 ms",
        "parallelism.default": str(parallelism),
        "pipeline.operator-chaining.enabled": "true",
        "pipeline.object-reuse": "true",
        "execution.checkpointing.interval": f"{checkpoint_interval_ms} ms",
        "execution.checkpointing.mode": "AT_LEAST_ONCE",
        "pipeline.name": "hvbench",
        # a failing job ends the run loudly instead of restarting in the middle of a measurement
        "restart-strategy.type": "none",
        **({"io.tmp.dirs": tmp_dir} if tmp_dir else {}),
        # a session cluster's JobManager (host:port of its REST endpoint), else a local one
        **(remote_target(jobmanager) if jobmanager else {}),
    }


def remote_target(jobmanager: str) -> dict[str, str]:
    host, _, port = jobmanager.rpartition(":")
    return {"execution.target": "remote", "rest.address": host, "rest.port": port}


def import_roots() -> list[str]:
    """Directories the job's Python code imports from: site-packages (pemja, pyflink, numpy, …)
    and wherever hvbench_job and tsc_timer are installed (src/ folders for editable installs)."""
    import hvbench_job
    import tsc_timer

    roots = [*site.getsitepackages()]
    for package in (hvbench_job, tsc_timer):
        root = str(Path(package.__file__).resolve().parents[1])
        if root not in roots:
            roots.append(root)
    return roots


def import_litert_on_python_thread() -> None:
    """Import LiteRT's pybind11 extension on a thread Python itself started.

    In thread mode the function runs on a JVM thread whose Python thread state PyGILState does
    not know; pybind11's first-import setup calls PyGILState_Ensure there and waits forever for
    the GIL this thread already holds (seen with gdb). Once the import is done, calls into the
    extension from the JVM thread work.
    """
    import threading

    errors: list[BaseException] = []

    def load() -> None:
        try:
            import ai_edge_litert.interpreter  # noqa: F401
        except BaseException as e:  # re-raised on the calling thread
            errors.append(e)

    loader = threading.Thread(target=load, name="litert-import")
    loader.start()
    loader.join()
    if errors:
        raise errors[0]


class ForecastAndRoute(ProcessFunction):
    """One record in, one route out; or one dead letter, written by the operator's own client.
    A group's message (an array of records) in, one array of routes out, and a dead letter per
    refused element.

    The routing state (latest speed and forecast per detector) is the Pipeline's router, in
    the operator's memory. Not Flink keyed state on purpose: keyed state needs keyBy, and keyBy
    always repartitions, even at parallelism 1, which splits source and operator into two tasks
    with a network hand-off between them. Measured at 1,200 rec/s: chained, p50 9.8 ms and no
    backlog; keyed, p50 36 ms with a backlog of seconds while the JIT warmed. The job does not
    restart (restart strategy none), so there is no state to restore.
    """

    def __init__(
        self,
        model_dir: str,
        route: tuple[str, str, str, str],
        dead_letters: tuple[str, str],
        force_tsc: bool,
        calibration: dict | None = None,
        settings_path: str | None = None,
        answers: dict[str, int] | None = None,
    ) -> None:
        self.model_dir, self.route, self.force_tsc = model_dir, route, force_tsc
        # detector -> client pair (hvbench_job.clients); pair k > 0 is answered on a side output
        self.client_of = answers or {}
        self.tags = answer_tags(max(self.client_of.values(), default=0) + 1)
        self.calibration = calibration  # the run's, where the job shares its machine's clock
        self.settings_path = settings_path  # the JVM's background threads are recorded there
        self.dead_letter_target = dead_letters  # (bootstrap, topic)
        self.pipeline = None
        self.dead_letters = None

    def open(self, runtime_context: RuntimeContext) -> None:
        import_litert_on_python_thread()
        from hvbench_job.pipeline import Pipeline  # loads LiteRT: once per task

        self.pipeline = Pipeline(
            self.model_dir, *self.route, force_tsc=self.force_tsc, calibration=self.calibration
        )
        self.dead_letters = DeadLetterWriter(*self.dead_letter_target)
        record_background_threads(self.settings_path)
        # Move everything loaded so far (PyFlink, numpy, LiteRT, the model) out of the cyclic
        # collector's reach: its full collections then walk only what records create.
        gc.freeze()

    def process_element(self, value: bytes | None, ctx: ProcessFunction.Context):
        outcome = self.pipeline.process_message(value)
        for letter in outcome.dead_letters:
            self.dead_letters.write(letter)
        if outcome.output is not None:
            self.dead_letters.serve()
            client = self.client_of.get(outcome.detector, 0)
            yield outcome.output if client == 0 else (self.tags[client], outcome.output)

    def close(self) -> None:
        if self.dead_letters is not None:
            self.dead_letters.close()


def answer_tags(pairs: int) -> list[OutputTag | None]:
    """The side output of each client pair past the first (whose answers are the main output)."""
    return [None] + [OutputTag(clients.output_topic(k), Types.STRING()) for k in range(1, pairs)]


def record_background_threads(settings_path: str | None) -> None:
    """The operator runs inside the job's JVM (thread mode): its background threads yield to
    the record-handling ones (hvbench_job.jvm), as read back into the job's settings, by
    process (on a cluster each TaskManager writes its own, under a lock)."""
    applied = jvm.idle_background_threads(os.getpid())
    if not settings_path or not Path(settings_path).exists():
        return
    with open(settings_path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        settings = json.load(f)
        settings["jvm"]["background_threads"] = applied
        settings["jvm"].setdefault("background_threads_by_process", {})[os.getpid()] = applied
        f.seek(0)
        f.truncate()
        f.write(json.dumps(settings, indent=2) + "\n")


def build(
    source: DataStream,
    model_dir: str,
    dead_letters: tuple[str, str],
    route: tuple[str, str, str, str] = (
        detectors.DEFAULT_ORIGIN,
        detectors.DEFAULT_DESTINATION,
        "distance",
        "freeway",
    ),
    force_tsc: bool = False,
    calibration: dict | None = None,
    settings_path: str | None = None,
    answers: dict[str, int] | None = None,
) -> DataStream:
    """The job's logic on any stream of raw records: the outputs. Dead letters go to
    `dead_letters` (bootstrap, topic) from the operator; route is (origin, destination,
    heuristic, network); with `calibration` (tsc_timer's) the job stamps on that clock; the JVM's
    background threads are recorded in the settings at `settings_path`. With `answers`
    (detector -> client pair), pair k > 0's outputs are side output answer_tags(...)[k]."""
    function = ForecastAndRoute(
        model_dir, route, dead_letters, force_tsc, calibration, settings_path, answers
    )
    return (
        source.process(function, output_type=Types.STRING())
        .name("forecast-route")
        .uid("forecast-route")
    )


def forecast_batches(model: Path) -> dict:
    """The model's weights (float32, or int8: forecast/quantise.py) and how the operator
    forecasts the records of an array message (forecast/serving.py): in batches where the
    model has the batch export, else one by one."""
    from hvbench_job.forecast.serving import BATCH, BATCH_MODEL, MANIFEST, PAD_FROM

    manifest = json.loads((model / MANIFEST).read_text())
    weights = manifest.get("weights", "float32")
    if BATCH_MODEL not in manifest.get("files", {}):
        why = f"{BATCH_MODEL} is not in the model (trained before it)"
        return {"weights": weights, "batch": 1, "why": why}
    return {"weights": weights, "batch": BATCH, "model": BATCH_MODEL, "pad_from": PAD_FROM}


def connector_jar(directory: Path) -> Path:
    jars = sorted(directory.glob("flink-sql-connector-kafka-*.jar"))
    if not jars:
        raise SystemExit(
            f"no Flink Kafka connector jar in {directory} (run `make flink-connector`)"
        )
    return jars[-1]


def gateway_lib(connector: Path) -> str:
    """The lib directory of the JVM PyFlink starts for the job (session.link_lib), so that the
    Kafka connector is on that JVM's class path. `pipeline.jars` alone puts it on the context
    class loader of the one py4j thread that set it; a call py4j serves on another of its
    connections then cannot find the connector's classes ("Could not found the Java class
    ...KafkaSource.builder", seen once at a job's start). Links only, one directory per user,
    PyFlink and connector, kept for the next job (a stopped job runs no clean-up); one that is
    not this user's alone is not used (its jars would run in the job)."""
    key = hashlib.sha256(f"{pyflink_home()}\n{connector.resolve()}".encode()).hexdigest()[:12]
    lib = Path(tempfile.gettempdir()) / f"hvbench-job-lib-{os.getuid()}-{key}"
    lib.mkdir(mode=0o700, exist_ok=True)
    found = lib.lstat()
    if lib.is_symlink() or found.st_uid != os.getuid() or found.st_mode & 0o077:
        lib = Path(tempfile.mkdtemp(prefix="hvbench-job-lib-"))
    link_lib(lib, connector)
    return str(lib)


def use_tmp_dir(tmp_dir: str) -> None:
    """Python's temporary files (PyFlink's copies of the job's files) and the JVM's go into
    tmp_dir as well; Java ignores TMPDIR, hence java.io.tmpdir."""
    Path(tmp_dir).mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = tmp_dir
    os.environ["JVM_ARGS"] = f"{os.environ['JVM_ARGS']} -Djava.io.tmpdir={tmp_dir}".strip()


def environment(settings: dict[str, str], jars: list[Path]) -> StreamExecutionEnvironment:
    config = Configuration()
    for key, value in settings.items():
        config.set_string(key, value)
    config.set_string("pipeline.jars", ";".join(p.resolve().as_uri() for p in jars))
    return StreamExecutionEnvironment.get_execution_environment(config)


def kafka_sink(bootstrap: str, topic: str) -> KafkaSink:
    builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(bootstrap)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(topic)
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE)
    )
    for key, value in SINK_PROPERTIES.items():
        builder = builder.set_property(key, value)
    return builder.build()


def kafka_source(bootstrap: str, topic: str, group: str) -> KafkaSource:
    builder = (
        KafkaSource.builder()
        .set_bootstrap_servers(bootstrap)
        .set_topics(topic)
        .set_group_id(group)
        # a fresh group starts at the beginning: nothing sent before the job is up is lost
        .set_starting_offsets(
            KafkaOffsetsInitializer.committed_offsets(KafkaOffsetResetStrategy.EARLIEST)
        )
        .set_properties(SOURCE_PROPERTIES)
    )
    builder._j_builder.setDeserializer(raw_values())  # PyFlink has no setter for this one
    return builder.build()


# The connector's shaded copy of Kafka's deserializer that hands a value over as it is.
BYTES_DESERIALIZER = (
    "org.apache.flink.kafka.shaded.org.apache.kafka.common.serialization.ByteArrayDeserializer"
)


def raw_values():
    """The source's deserializer: each message's value as bytes, None for a tombstone (a key
    and a null value), for the operator to check. Flink's SimpleStringSchema throws on a null
    value, which ends the job, and replaces bytes that are not UTF-8 without a word."""
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import load_java_class

    schemas = get_gateway().jvm.org.apache.flink.connector.kafka.source.reader.deserializer
    return schemas.KafkaRecordDeserializationSchema.valueOnly(load_java_class(BYTES_DESERIALIZER))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_job.job", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port")
    p.add_argument("--model", required=True, help="trained forecaster directory (make train)")
    p.add_argument("--input", default="input")
    p.add_argument("--output", default=clients.OUTPUT, help="pair k > 0 is answered on OUTPUT-k")
    p.add_argument("--producers", type=int, help="the load's producer groups (with --clients)")
    p.add_argument("--clients", type=int, default=1, help="the load's client pairs")
    p.add_argument("--dead-letter", default="dead-letter")
    p.add_argument("--group", default="hvbench-job")
    p.add_argument("--network", default="freeway", choices=networks.NAMES)
    p.add_argument("--origin", help="of a record without a destination; the network's default")
    p.add_argument("--destination", help="of a record without one; the network's default")
    p.add_argument("--heuristic", default="distance", choices=("distance", "paper", "none"))
    p.add_argument("--checkpoint-interval-ms", type=int, default=10_000)
    p.add_argument("--parallelism", type=int, default=1, help="one task per TaskManager slot")
    p.add_argument(
        "--jobmanager", help="a session cluster's REST endpoint, host:port; unset: a local one"
    )
    p.add_argument("--connector-dir", default="build/flink/lib", help="holds the Kafka connector")
    p.add_argument("--settings-out", help="write the applied settings here as JSON")
    p.add_argument("--tmp-dir", help="the job's scratch files (made if missing); default: /tmp")
    p.add_argument(
        "--force-tsc", action="store_true", help="stamp with a TSC without constant/nonstop"
    )
    p.add_argument(
        "--calibration",
        help="the run's TSC calibration (JSON), when the job runs on the machine that stamps "
        "send and receipt: the job's stamps are then on the same clock",
    )
    return p.parse_args(argv)


def answers(net: networks.Network, producers: int | None, pairs: int) -> dict[str, int] | None:
    """Which client pair each detector's outputs answer (hvbench_job.clients); None for one."""
    if pairs <= 1:
        return None
    keys = [d.key for d in net.detectors]
    return clients.clients_by_detector(keys, clients.groups(producers, len(keys)), pairs)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    net = networks.network(args.network)
    args.origin, args.destination = args.origin or net.origin, args.destination or net.destination
    calibration = json.loads(Path(args.calibration).read_text()) if args.calibration else None
    # the JVM PyFlink starts for the job takes these (read when the gateway starts, below)
    os.environ["JVM_ARGS"] = " ".join([os.environ.get("JVM_ARGS", ""), *jvm.JOB_OPTIONS]).strip()
    settings = job_settings(
        args.checkpoint_interval_ms, args.parallelism, args.jobmanager, args.tmp_dir
    )
    jar = connector_jar(Path(args.connector_dir))
    if "PYFLINK_GATEWAY_PORT" not in os.environ:  # PyFlink starts the JVM (not `flink run`)
        # FLINK_HOME as PyFlink would find it: unset, PyFlink also resets FLINK_LIB_DIR
        os.environ.update(FLINK_HOME=str(pyflink_home()), FLINK_LIB_DIR=gateway_lib(jar))
    if args.tmp_dir:
        use_tmp_dir(args.tmp_dir)
    env = environment(settings, [jar])
    source = env.from_source(
        kafka_source(args.bootstrap, args.input, args.group),
        WatermarkStrategy.no_watermarks(),
        "kafka-input",
    ).uid("kafka-input")
    outputs = build(
        source,
        str(Path(args.model).resolve()),
        (args.bootstrap, args.dead_letter),
        (args.origin, args.destination, args.heuristic, args.network),
        args.force_tsc,
        calibration,
        args.settings_out,
        answers(net, args.producers, args.clients),
    )
    outputs.sink_to(kafka_sink(args.bootstrap, args.output)).name("kafka-output")
    for k, tag in enumerate(answer_tags(args.clients)[1:], start=1):
        topic = clients.output_topic(k, args.output)
        outputs.get_side_output(tag).sink_to(kafka_sink(args.bootstrap, topic)).name(topic)
    if args.settings_out:
        applied = applied_settings(args, settings, jar, calibration)
        Path(args.settings_out).write_text(json.dumps(applied, indent=2) + "\n")
    env.execute("hvbench")


def applied_settings(args, settings: dict, jar: Path, calibration: dict | None) -> dict:
    """What the job was started with, as job_settings.json records it (--settings-out)."""
    return {
        "flink": settings,
        "connector_jar": jar.name,
        "source_properties": SOURCE_PROPERTIES,
        "sink_properties": SINK_PROPERTIES,
        "source_values": f"bytes as read ({BYTES_DESERIALIZER.rpartition('.')[2]}), "
        "None for a tombstone; the operator checks them",
        "sink_delivery_guarantee": "AT_LEAST_ONCE",
        "dead_letters": {"writer": "the operator's own client", "config": DEAD_LETTER_CONFIG},
        "topics": {"input": args.input, "output": args.output, "dead_letter": args.dead_letter},
        # each client pair's output topic (hvbench_job.clients)
        "answers": clients.output_topics(args.clients, args.output),
        "network": args.network,
        "route": {"origin": args.origin, "destination": args.destination},
        "heuristic": args.heuristic,
        "forecast": forecast_batches(Path(args.model)),
        "force_tsc": args.force_tsc,
        "stamps": "the run's calibration" if calibration else "the job's own calibration",
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL")},
        # background_threads: filled in by the operator once it runs in the JVM
        "jvm": {"args": os.environ["JVM_ARGS"], "background_threads": None},
    }


if __name__ == "__main__":
    main()
