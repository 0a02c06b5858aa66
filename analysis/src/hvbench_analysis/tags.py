"""A run's tags from its meta.json: the scheduler setting, the load, the measurement and the
setup, each as one value (None where a target has none); what a configuration's label names."""

from __future__ import annotations

import math

from hvbench_analysis.fields import FIELDS, PRODUCERS
from hvbench_analysis.sections import Energy, Status, present
from hvbench_analysis.sections import ResultsError as RunError

# The scheduler setting and the load: what a configuration's label always names.
SETTINGS = (
    "target",
    "hypervisor",
    "sched",
    "period",
    "budget",
    "extratime",
    "cap",
    "weight",
    "priority",  # SCHED_FIFO on kvm
    "tslice",  # Credit's time slice (µs) on xen, None: the pool's boot value
    "ratelimit",  # the Credit/Credit2 rate limit (µs) on xen, None: the pool's boot value
    "rate",  # records/s over all producers: runs at different rates are different configs
    "noise",  # the neighbours and what they did (NOISE), "" for none
    "noise_cpus",  # bare: where the loads ran (job, apart or a CPU list), "" without loads
    "job_cpus",  # bare: the CPUs the job was held to, "" for all
    "scale",  # one broker and one Flink JVM (""), or e.g. "3 brokers, 2 TaskManagers"
    "network",  # the six freeway detectors (""), or e.g. "bay" (325 sensors)
    "load",  # six producer groups, a record a message (""), or e.g. "1 group, by group"
    "power",  # the host's power policy as it was (""), or e.g. "powersave, C-state ≤ 1"
)
# The scheduler parameters that are tags as asked, each by its request field's name.
SETTING_FIELDS = ("period", "budget", "extratime", "cap", "weight", "priority")
# How a run measured (requested records, warmup_s, ramp_s, cpu_latency; forced: a failed
# required readiness check was overridden). Runs that differ in these are never pooled.
MEASUREMENT = ("records", "warmup_s", "ramp_s", "cpu_latency", "forced")
NUMERIC_TAGS = ("rate", "records", "warmup_s", "ramp_s")
# Columns that say which configuration produced a record; every table can group on them.
# setup: the measurement settings the label shows, where they tell configurations apart.
TAGS = (*SETTINGS, *MEASUREMENT, "setup", "rep", "run_id")
# A configuration is everything but the repetition and the run's name.
CONFIG = tuple(t for t in TAGS if t not in ("rep", "run_id"))
# How a measurement setting reads in a label: with its value, and when it is unknown.
MEASUREMENT_TEXT = {
    "records": ("{} records", "records unknown"),
    "warmup_s": ("warm-up {} s", "warm-up unknown"),
    "ramp_s": ("ramp {} s", "ramp unknown"),
    "cpu_latency": ("CPU latency {}", "CPU latency unknown"),
}
# Quality flags beside a run's numbers, in the order they are listed (quality_flags).
FLAGS = (
    "failed",
    "interrupted",
    "unaccounted",
    "forced checks",
    "broker restarted",
    "faults",
    "foreign records",
    "dead letters lost",
    "contradictions",
)
HYPERVISOR_OF_TARGET = {"bare": "none", "kvm": "kvm", "xen": "xen"}
# The load: six producers, each sending one record per period (100 ms unless set otherwise).
DEFAULT_RATE_PER_S = 60.0
# Each request field's key in meta.json `requested` (fields.FIELDS), by the field's name.
REQUESTED_KEYS = {f.name: f.requested for f in FIELDS}


def asked(requested: dict, name: str, absent=None):
    """Request field `name`'s value as the run recorded it; `absent` where it recorded none."""
    return requested.get(REQUESTED_KEYS[name], absent)


def tags_of(meta: dict) -> dict:
    """Tag values of a run from its meta.json; what a target does not have is None."""
    requested = meta.get("requested")
    if not isinstance(requested, dict):
        raise RunError("meta.json has no 'requested' settings")
    for name in ("target", "sched"):
        if not asked(requested, name):
            raise RunError(f"meta.json does not say the {name}")
    target = asked(requested, "target")
    network = asked(requested, "network", "freeway")
    return {
        "target": target,
        "hypervisor": requested.get("hypervisor", HYPERVISOR_OF_TARGET.get(target, target)),
        "sched": asked(requested, "sched"),
        **{name: asked(requested, name) for name in SETTING_FIELDS},
        "tslice": asked(requested, "tslice_us"),
        "ratelimit": asked(requested, "ratelimit_us"),
        "rate": rate_per_s(asked(requested, "send_ms"), requested.get("detectors")),
        **noise_tags(requested),
        "scale": scale_tag(requested),
        "network": "" if network == "freeway" else network,
        "load": load_tag(requested),
        "power": power_tag(requested),
        "records": number_or_none(asked(requested, "records")),
        "warmup_s": number_or_none(asked(requested, "warmup")),
        "ramp_s": number_or_none(asked(requested, "ramp")),
        "cpu_latency": text_or_none(asked(requested, "cpu_latency")),
        "forced": forced_checks(meta),
        "setup": "",  # filled in when all runs are loaded (setup_labels)
        "rep": requested.get("rep"),
        "run_id": meta.get("run_id"),
    }


def power_tag(requested: dict) -> str:
    """The power policy a run set (GOVERNOR, MAX_CSTATE, TURBO): "" for none, else e.g.
    "powersave, C-state ≤ 1, turbo off"."""
    parts = []
    if governor := asked(requested, "governor"):
        parts.append(str(governor))
    if (deepest := asked(requested, "max_cstate")) is not None:
        parts.append(f"C-state ≤ {deepest}")
    if turbo := asked(requested, "turbo"):
        parts.append(f"turbo {turbo}")
    return ", ".join(parts)


def energy_facts(meta: dict) -> dict:
    """The measured window's energy (meta.json `energy`), or why there is none."""
    energy = Energy.of(meta, "energy")
    if energy is None:
        return {"energy": "not recorded", **NO_ENERGY}
    if not energy.available:
        what = f"not available: {present(energy.reason)}"
    else:
        what = ", ".join(sorted({h.get("source", "?") for h in energy.hosts.values()}))
    window = energy.windows.get("measured")
    if window is None:
        return {"energy": what, **NO_ENERGY}
    per_record = window.joules_per_record
    return {
        "energy": what,
        "joules": window.joules,
        "mean_w": window.mean_w,
        "mj_per_record": per_record * 1000 if per_record is not None else None,
    }


NO_ENERGY = {"joules": None, "mean_w": None, "mj_per_record": None}


def load_tag(requested: dict) -> str:
    """How the producers sent (PRODUCERS, MESSAGES, CLIENTS): "" for six groups each sending a
    record a message from one client pair (every run before MESSAGES), else e.g. "1 group,
    by group" or "6 groups, 2 client pairs"."""
    groups = asked(requested, "producers", PRODUCERS)
    by_group = asked(requested, "messages", "record") == "group"
    pairs = asked(requested, "clients", 1)
    if groups == PRODUCERS and not by_group and pairs == 1:
        return ""
    tag = f"{groups} group{'s' if groups != 1 else ''}" + (", by group" if by_group else "")
    return tag + (f", {pairs} client pairs" if pairs > 1 else "")


def noise_tags(requested: dict) -> dict:
    """noise, noise_cpus and job_cpus as text, "" where a run had none (runs before schema 5
    had no neighbours and held the job to no CPUs)."""
    noise = str(asked(requested, "noise") or "")
    bare = asked(requested, "target") == "bare"
    where = str(asked(requested, "noise_cpus") or "") if noise and bare else ""
    job_cpus = str(asked(requested, "job_cpus") or "")
    return {"noise": noise, "noise_cpus": where, "job_cpus": job_cpus}


def scale_tag(requested: dict) -> str:
    """ "" for one broker and one Flink JVM (every run before schema 6), else the cluster."""
    if asked(requested, "scale", "one") == "one":
        return ""
    brokers, taskmanagers = asked(requested, "brokers"), asked(requested, "taskmanagers")
    return f"{brokers} brokers, {taskmanagers} TaskManagers"


def number_or_none(value) -> float | int | None:
    """A number read from meta.json, or None where it is absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def float_or_none(value) -> float | None:
    """A tag's value as a float, or None where it is absent, NaN or not a number."""
    try:
        found = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(found) else found


def text_or_none(value) -> str | None:
    return None if value is None else str(value)


def forced_checks(meta: dict) -> bool:
    """Whether the run was asked to go ahead despite failed readiness checks, or did."""
    requested = meta.get("requested") or {}
    readiness = meta.get("readiness")
    failed = readiness.get("failed_required") if isinstance(readiness, dict) else None
    return asked(requested, "force") is True or bool(failed)


def status_of(meta: dict) -> dict:
    """The run's status (state, reason's first line, phase); a run without one reads as state
    "unknown"."""
    status = Status.of(meta, "status")
    if status is None:
        return {"state": "unknown", "reason": "meta.json has no status", "phase": None}
    return {
        "state": status.state or "unknown",
        "reason": status.reason.strip().split("\n")[0] if status.reason else None,
        "phase": status.phase,
    }


def rate_per_s(producer_period_ms, detectors=None) -> float | None:
    """Records per second over all detectors, from each one's send period (runs before
    schema 7 name no detectors: the six of the freeway network); None if the period is absent
    or not a positive number."""
    if isinstance(producer_period_ms, bool) or not isinstance(producer_period_ms, int | float):
        return None
    if not producer_period_ms > 0:
        return None
    count = detectors if isinstance(detectors, int) and detectors > 0 else PRODUCERS
    return count * 1000.0 / producer_period_ms
