"""The run request's field table: what a run can be asked, and how meta.json `requested`
records it. The harness builds its options, Make's variables and the request from it
(hvbench_harness.spec); the analysis reads `requested` by it (results, tags).

Standard library only: the Makefile runs hvbench_harness.spec, which imports this, with the
system python3 before the venv exists.
"""

from __future__ import annotations

from dataclasses import dataclass

PRODUCERS = 6  # producer groups (Kafka clients) by default; the freeway network's six detectors
MESSAGES = ("record", "group")  # what one Kafka message carries (hvbench_load.producers)
# Each network's detectors (hvbench_job.networks; a unit test keeps the two equal): one
# record per detector every send period, so the rate is DETECTORS × 1000 / send_ms.
DETECTORS = {"freeway": 6, "bay": 325}


@dataclass(frozen=True)
class Field:
    name: str  # the RunSpec attribute and the campaign key
    kind: type  # int, float, str or bool (a flag)
    default: object
    flag: str  # the harness's option
    help: str
    requested: str | None = None  # its key in meta.json "requested" (None: an input, not recorded)
    make_name: str | None = None  # the Make variable, when it is not NAME in upper case
    short: str | None = None  # its code in run ids and campaign point ids (None: its name)

    @property
    def make(self) -> str:
        return self.make_name or self.name.upper()


# What a run measures. Each is recorded in meta.json "requested" and can vary in a campaign.
FIELDS = (
    Field("target", str, None, "--target", "bare, kvm or xen; unset: what the inventory implies",
          "target"),
    Field("sched", str, "none", "--sched", "the scheduler (docs/schedulers.md)", "sched"),
    Field("budget", int, None, "--budget", "µs of CPU time per PERIOD", "budget_us", short="b"),
    Field("period", int, None, "--period", "µs; 100000 where it applies", "period_us", short="p"),
    Field("priority", int, None, "--priority", "SCHED=fifo (kvm): 1..99", "priority", short="prio"),
    Field("extratime", int, None, "--extratime", "SCHED=rtds (xen): 0 (default) or 1", "extratime",
          short="e"),
    Field("weight", int, None, "--weight", "SCHED=credit|credit2 (xen): 1..65535, 256", "weight",
          short="w"),
    Field("cap", int, None, "--cap", "SCHED=credit|credit2 (xen): % of one CPU, 0 = none", "cap",
          short="c"),
    Field("tslice_us", int, None, "--tslice-us",
          "SCHED=credit (xen): the real-time pool's time slice, whole ms in µs (1000..1000000); "
          "unset: the boot value (Xen's default 30000)", "tslice_us", short="ts"),
    Field("ratelimit_us", int, None, "--ratelimit-us",
          "SCHED=credit|credit2 (xen): the real-time pool's rate limit, 0 (off) or "
          "100..500000 µs; unset: the boot value (xen_host_sched_ratelimit_us)", "ratelimit_us",
          short="rl"),
    Field("network", str, "freeway", "--network",
          "the road network: freeway (the study's six detectors) or bay (the 325 PEMS-BAY "
          "sensors, each record routed to a destination of its own; bare; docs/cluster.md)",
          "network"),
    Field("producers", int, PRODUCERS, "--producers",
          "producer groups, one Kafka client each: 1 up to the network's detectors", "producers"),
    Field("messages", str, "record", "--messages",
          "what one Kafka message carries: record (one record) or group (a producer group's "
          "records, which then fall due together; docs/cluster.md)", "messages"),
    Field("clients", int, 1, "--clients",
          "client pairs the producer groups are dealt to, each a producers process and its own "
          "consumer on one machine (a testbed's messaging VMs in turn): 1 up to PRODUCERS",
          "clients"),
    Field("records", int, 20_000, "--records", "records in all, over the detectors", "records",
          short="n"),
    Field("send_ms", float, 100.0, "--period-ms", "each detector's send period (ms)",
          "producer_period_ms", short="ms"),
    Field("warmup", float, 10.0, "--warmup-s", "seconds left out of the statistics", "warmup_s",
          short="wu"),
    Field("ramp", float, 0.0, "--ramp-s", "seconds to rise to the full rate, within WARMUP",
          "ramp_s"),
    Field("malformed", int, 0, "--malformed", "malformed records to inject (dead-lettered)",
          "malformed"),
    Field("drain", float, 20.0, "--drain-s", "seconds to wait for results after the last send",
          "drain_s"),
    Field("broker_restarts", int, 1, "--broker-restarts",
          "times Kafka is restarted on its data if it exits mid-run (recorded); 0: the run ends",
          "broker_restarts"),
    Field("stall_s", float, None, "--stall-s",
          "seconds without a result while the producers send that fail the run as stalled; "
          "unset: 8 on the bare target, 30 on a testbed (docs/running.md)", "stall_s"),
    Field("cpu_latency", str, "auto", "--cpu-latency",
          "bare: hold C-states at this many µs while running; auto (0 where permitted) or off",
          "cpu_latency"),
    Field("require", str, None, "--require",
          "readiness checks to require beyond the defaults, comma-separated", "require"),
    Field("force", bool, False, "--force",
          "run although a required readiness check fails (meta.json says which)", "force"),
    Field("concurrent", bool, False, "--concurrent",
          "run although another run or campaign holds this machine or testbed host (they "
          "disturb each other's latency; meta.json `concurrent` records both)", "concurrent"),
    Field("force_tsc", bool, False, "--force-tsc",
          "accept a TSC without constant_tsc/nonstop_tsc (recorded)", "force_tsc"),
    Field("trace", bool, False, "--trace",
          "trace when the job's threads (bare) or the real-time VM's vCPUs (testbed) run, wait "
          "or sleep while sending (docs/tracing.md)",
          "trace"),
    Field("baseline", bool, False, "--baseline",
          "bare: the noise floor first, cyclictest under the same setting (docs/tracing.md)",
          "baseline"),
    Field("baseline_s", float, 10.0, "--baseline-s", "seconds of the noise floor (BASELINE=1)",
          "baseline_s"),
    Field("noise", str, None, "--noise",
          "neighbours and what they do, COUNT:STATE,...: e.g. 3:idle, 3:paused, 2:cpu,1:membw "
          "(docs/interference.md)", "noise", short=""),
    Field("noise_cpus", str, "job", "--noise-cpus",
          "bare: where the loads run: job (the job's CPUs), apart (the others) or a CPU list",
          "noise_cpus", short="on-"),
    Field("scale", str, "one", "--scale",
          "one (a broker, a Flink JVM) or cluster (BROKERS brokers, replication up to 3, "
          "min in-sync up to 2; a Flink session cluster of TASKMANAGERS TaskManagers, the job at "
          "that parallelism; on a testbed over its messaging and real-time VMs) "
          "(docs/cluster.md)", "scale"),
    Field("brokers", int, None, "--brokers", "SCALE=cluster: Kafka nodes, 3 if unset", "brokers"),
    Field("taskmanagers", int, None, "--taskmanagers",
          "SCALE=cluster: TaskManagers, one slot each: the job's parallelism; 2 if unset (on a "
          "testbed one per real-time VM)",
          "taskmanagers"),
    Field("governor", str, None, "--governor",
          "the host's CPU frequency governor for the run: performance, schedutil, powersave, "
          "...; unset: as it is (docs/energy.md)", "governor", short=""),
    Field("max_cstate", int, None, "--max-cstate",
          "the deepest idle state the host's CPUs may enter for the run (Linux: cpuidle state "
          "number; Xen: C-state); unset: as it is", "max_cstate", short="cmax"),
    Field("turbo", str, None, "--turbo", "turbo on or off on the host for the run; unset: as it is",
          "turbo", short="turbo-"),
    Field("job_cpus", str, None, "--job-cpus",
          "bare: the CPUs the job may use, a list such as 1 or 2-3; unset: all", "job_cpus",
          short="job"),
)  # fmt: skip
