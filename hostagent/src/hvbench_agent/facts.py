"""Facts about a machine and its software: the one collector, for meta.json and the readiness
checks. It runs wherever a part of a run does: here (bare), on a testbed's host
(`hvbench-agent facts ...`) and in its guests.

Small `collect_*` functions, each tolerant of a missing file or tool: a fact that cannot be
read is recorded as None (or with the reason), never guessed.

    hvbench-agent facts host versions readiness [--model DIR]
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from . import energy, rtprofile
from .sched.xl import parse_colon_list, parse_table

CPU = Path("/sys/devices/system/cpu")


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def run_tool(*argv: str) -> str | None:
    """The tool's output, or None when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def collect_readiness() -> dict:
    """What the readiness checks (the harness's readiness.py) look at."""
    cpus = sorted(CPU.glob("cpu[0-9]*"), key=lambda c: int(c.name[3:]))
    flags: set[str] = set()
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    facts = {
        "hostname": os.uname().nodename,
        "kernel": os.uname().release,
        "cmdline": _read("/proc/cmdline") or "",
        "tsc_flags": sorted(flags & {"tsc", "constant_tsc", "nonstop_tsc", "hypervisor"}),
        "clocksource": _read(CPU.parent / "clocksource/clocksource0/current_clocksource"),
        "governors": {c.name: _read(c / "cpufreq/scaling_governor") for c in cpus},
        "scaling_driver": _read(cpus[0] / "cpufreq/scaling_driver") if cpus else None,
        "turbo": {
            "intel_pstate_no_turbo": _read(CPU / "intel_pstate/no_turbo"),
            "cpufreq_boost": _read(CPU / "cpufreq/boost"),
        },
        "idle": _idle(cpus),
        "smt": {"active": _read(CPU / "smt/active"), "control": _read(CPU / "smt/control")},
        "irqbalance": _irqbalance(),
        "isolated": _read(CPU / "isolated") or "",
        "nohz_full": _read(CPU / "nohz_full") or "",
        "xen": _xen() if Path("/proc/xen/capabilities").exists() else None,
        "kvm": _kvm() if shutil.which("virsh") else None,
        "energy": energy.offered(),
        "rt_profile": rtprofile.read(),
    }
    return facts


def _idle(cpus: list[Path]) -> dict:
    """The idle driver and, per state, its exit latency and on how many CPUs it is disabled."""
    states: dict[str, dict] = {}
    for c in cpus:
        for s in sorted((c / "cpuidle").glob("state[0-9]*")):
            entry = states.setdefault(
                s.name,
                {"name": _read(s / "name"), "latency_us": _int(_read(s / "latency")), "cpus": 0},
            )
            entry["cpus"] += 1
            entry["disabled_on"] = entry.get("disabled_on", 0) + (_read(s / "disable") == "1")
    return {
        "driver": _read(CPU / "cpuidle/current_driver"),
        "states": list(states.values()),
        "cpu_dma_latency_us": _cpu_dma_latency(),
    }


def _cpu_dma_latency() -> int | None:
    try:
        with open("/dev/cpu_dma_latency", "rb") as f:
            return int.from_bytes(f.read(4), sys.byteorder, signed=True)
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _irqbalance() -> str:
    active = run_tool("systemctl", "is-active", "irqbalance")
    if active is not None:
        return active.strip()
    running = any((_read(p / "comm") or "") == "irqbalance" for p in Path("/proc").glob("[0-9]*"))
    return "active" if running else "inactive"


def _xen() -> dict:
    info = parse_colon_list(run_tool("xl", "info") or "")
    cpu_lists = {
        row["Name"]: row.get("CPU_list", "")
        for row in parse_table(run_tool("xl", "cpupool-list", "-c") or "")
    }
    pools = [
        {
            "name": row["Name"],
            "cpus": int(row["CPUs"]),
            "sched": row["Sched"],
            "cpu_list": cpu_lists.get(row["Name"], ""),
        }
        for row in parse_table(run_tool("xl", "cpupool-list") or "")
    ]
    dom0 = []
    for line in (run_tool("xl", "vcpu-list", "Domain-0") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8:
            dom0.append({"vcpu": fields[2], "cpu": fields[3], "hard": fields[6]})
    domains = {}
    try:
        listed = json.loads(run_tool("xl", "list", "-l") or "[]")
    except json.JSONDecodeError:
        listed = []
    for dom in listed:
        config = dom.get("config") or {}
        name = (config.get("c_info") or {}).get("name")
        if name and name != "Domain-0":
            b_info = config.get("b_info") or {}
            domains[name] = {
                "tsc_mode": b_info.get("tsc_mode", "default"),
                "pool": (config.get("c_info") or {}).get("pool_name"),
            }
    for line in (run_tool("xl", "list", "-c") or "").splitlines()[1:]:  # pool of each domain
        fields = line.split()
        if len(fields) >= 7 and fields[0] in domains:
            domains[fields[0]]["pool"] = fields[-1]
    return {
        "version": f"{info.get('xen_major', '?')}.{info.get('xen_minor', '?')}"
        f"{info.get('xen_extra', '')}",
        # empty for a build from the distribution's source package: its version says it
        "changeset": info.get("xen_changeset") or None,
        "build": _read("/etc/hvbench/xen-build.env"),  # where make provision's hypervisor came from
        "commandline": info.get("xen_commandline", ""),
        "scheduler": info.get("xen_scheduler"),
        "cpupools": pools,
        "dom0_vcpus": dom0,
        "domains": domains,
        "xenpm_cpufreq": (run_tool("xenpm", "get-cpufreq-para", "0") or "").strip() or None,
    }


def _kvm() -> dict:
    qemu = run_tool("qemu-system-x86_64", "--version")
    return {
        "qemu": qemu.splitlines()[0] if qemu else None,
        "libvirt": (run_tool("virsh", "-c", "qemu:///system", "version") or "").strip() or None,
    }


def collect_cpu() -> dict:
    model = None
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "online": _read("/sys/devices/system/cpu/online"),
        "isolated": _read("/sys/devices/system/cpu/isolated"),
        "nohz_full": _read("/sys/devices/system/cpu/nohz_full"),
    }


def collect_kernel() -> dict:
    return {
        "release": platform.release(),
        "version": platform.version(),
        "cmdline": _read("/proc/cmdline"),
        "clocksource": _read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "sched_rt_runtime_us": _read("/proc/sys/kernel/sched_rt_runtime_us"),
        "sched_rt_period_us": _read("/proc/sys/kernel/sched_rt_period_us"),
        "xen_timer_slop_ns": xen_timer_slop(_read("/proc/timer_list") or ""),
    }


def xen_timer_slop(timer_list: str) -> int | None:
    """A Xen guest's timer slop: the shortest delta its Xen clock event device programs (Linux
    arch/x86/xen/time.c, 100000 ns unless the kernel's xen_timer_slop= says otherwise), from
    /proc/timer_list (root only). None elsewhere."""
    device = None
    for line in timer_list.splitlines():
        if line.startswith("Clock Event Device:"):
            device = line.split(":", 1)[1].strip()
        elif device and device.startswith("xen") and line.strip().startswith("min_delta_ns:"):
            return int(line.split(":", 1)[1])
    return None


def collect_power() -> dict:
    """CPU frequency governor and idle states per CPU, where the kernel exposes them."""
    cpus = sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*"))
    governors = {c.name: _read(c / "cpufreq/scaling_governor") for c in cpus}
    idle = {}
    for c in cpus:
        states = sorted((c / "cpuidle").glob("state*"))
        idle[c.name] = [
            {"name": _read(s / "name"), "disabled": _read(s / "disable")} for s in states
        ]
    return {
        "governor": governors,
        "cpuidle_driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "idle_states": idle,
        "intel_idle_max_cstate": _read("/sys/module/intel_idle/parameters/max_cstate"),
    }


def collect_host() -> dict:
    return {
        "hostname": platform.node(),
        "os": _os_release(),
        "virtualization": _virtualization(),
        "cpu": collect_cpu(),
        "kernel": collect_kernel(),
        "power": collect_power(),
    }


def _os_release() -> str | None:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return None


def _virtualization() -> str | None:
    try:
        out = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        flags = _read("/proc/cpuinfo") or ""
        return "hypervisor flag set" if " hypervisor" in flags else None


def collect_versions() -> dict:
    versions = {"python": platform.python_version()}
    for dist in (
        "apache-flink",
        "tensorflow-cpu",
        "ai-edge-litert",
        "confluent-kafka",
        "numpy",
        "pandas",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    # every installed Python distribution, so a run can be repeated with the same ones
    versions["packages"] = dict(
        sorted(
            (d.metadata["Name"], d.version) for d in metadata.distributions() if d.metadata["Name"]
        )
    )
    try:
        import confluent_kafka

        versions["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    return versions


def model_checksum(model_dir: str | Path) -> str | None:
    manifest = _read(Path(model_dir) / "manifest.json")
    return json.loads(manifest).get("checksum") if manifest else None


SECTIONS = {"host": collect_host, "versions": collect_versions, "readiness": collect_readiness}


def collect(sections: list[str], model: str | None = None) -> dict:
    """The named sections (SECTIONS), and the model's checksum when a model is named."""
    facts = {name: SECTIONS[name]() for name in sections}
    if model:
        facts["model_checksum"] = model_checksum(model)
    return facts
