"""Facts about the machine and the software, for meta.json.

Small `collect_*` functions, each tolerant of a missing file or tool: a fact that cannot be
read is recorded as None (or with the reason), never guessed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


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
    }


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


def collect_git() -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.rstrip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        # what differs from the commit, file by file (git status --porcelain)
        "changed": status.splitlines() if status else [],
    }


def main(argv: list[str] | None = None) -> int:
    """Print this machine's facts and software versions as JSON (for a run's meta.json when
    the machine is a guest of the testbed)."""
    p = argparse.ArgumentParser(prog="python -m hvbench_load.meta", description=main.__doc__)
    p.add_argument("--model", help="also report this model directory's checksum")
    args = p.parse_args(argv)
    facts = {"host": collect_host(), "versions": collect_versions()}
    if args.model:
        manifest = _read(Path(args.model) / "manifest.json")
        facts["model_checksum"] = json.loads(manifest).get("checksum") if manifest else None
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
