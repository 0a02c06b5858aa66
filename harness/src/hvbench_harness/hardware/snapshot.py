"""What a host's hardware looks like to its kernel: the /proc and /sys files `make check` judges.

The standard library only: the controller sends this file to a host that has nothing of
hvbench yet (playbooks/hardware.yml runs it with the host's python3) and it prints one JSON
object, the snapshot: every file read, by its path under the root, with its text. The judging
is done on the controller (hardware.judge), from the snapshot alone, so a recorded tree (a
folder holding the same paths) is judged by the same code as a live host.

    python3 snapshot.py                      # this machine: the snapshot as JSON
    python3 snapshot.py --root tests/...     # a recorded tree
    python3 snapshot.py --record DIR         # write this machine's files as a tree in DIR
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

# The files read, as globs under the root. CPU idle states: cpu0's (every CPU has the same).
PATTERNS = (
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/cmdline",
    "proc/xen/capabilities",
    "etc/os-release",
    "sys/class/dmi/id/sys_vendor",
    "sys/class/dmi/id/product_name",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/smt/active",
    "sys/devices/system/cpu/smt/control",
    "sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id",
    "sys/devices/system/cpu/cpu[0-9]*/topology/core_id",
    "sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list",
    "sys/devices/system/cpu/cpuidle/current_driver",
    "sys/devices/system/cpu/cpu0/cpuidle/state[0-9]*/name",
    "sys/devices/system/cpu/cpu0/cpuidle/state[0-9]*/latency",
    "sys/devices/system/cpu/cpu0/cpufreq/scaling_driver",
    "sys/devices/system/cpu/intel_pstate/no_turbo",
    "sys/devices/system/cpu/cpufreq/boost",
    "sys/devices/system/node/node[0-9]*/cpulist",
    "sys/devices/system/node/node[0-9]*/meminfo",
)
# Folders whose entries are the fact (an IOMMU shows as one entry per unit: dmar0, ivhd0).
LISTED = ("sys/class/iommu",)
# On a Xen dom0 the kernel sees dom0's vCPUs and memory, not the machine's: `xl info -n` has
# them (its CPU and NUMA tables too).
XL_INFO = "xl-info"


def read_tree(root: str) -> dict[str, str]:
    """Every file of PATTERNS under root, by its path relative to root, and LISTED's entries."""
    files: dict[str, str] = {}
    for pattern in PATTERNS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    files[os.path.relpath(path, root)] = f.read()
            except OSError:
                continue  # unreadable (a permission, a file that went away): not a fact
    for folder in LISTED:
        path = os.path.join(root, folder)
        entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
        if entries:
            files[folder + "/"] = "\n".join(entries)
    return files


def xl_info(root: str, files: dict[str, str]) -> str | None:
    """`xl info -n` on a live Xen dom0; a recorded tree keeps it as the file xl-info."""
    if root != "/":
        recorded = os.path.join(root, XL_INFO)
        return open(recorded, encoding="utf-8").read() if os.path.exists(recorded) else None
    if "control_d" not in files.get("proc/xen/capabilities", ""):
        return None
    try:
        proc = subprocess.run(["xl", "info", "-n"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def snapshot(root: str = "/") -> dict[str, str]:
    files = read_tree(root)
    xl = xl_info(root, files)
    if xl is not None:
        files[XL_INFO] = xl
    return files


def record(files: dict[str, str], into: str) -> None:
    """Write a snapshot as a tree, to be read back by read_tree(into). A listed folder's
    entries are written as empty files (git keeps those, not empty folders)."""
    for rel, text in files.items():
        if rel.endswith("/"):
            os.makedirs(os.path.join(into, rel), exist_ok=True)
            for entry in filter(None, text.split("\n")):
                open(os.path.join(into, rel, entry), "w").close()
            continue
        path = os.path.join(into, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default="/", help="read a recorded tree instead of this machine")
    p.add_argument("--record", metavar="DIR", help="write the files read as a tree in DIR")
    args = p.parse_args(argv)
    files = snapshot(args.root)
    if args.record:
        record(files, args.record)
    else:
        json.dump(files, sys.stdout, indent=1, sort_keys=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
