"""xl, the Xen toolstack's command line, and the parsers of what it prints: the xen backend's,
and also read by the host's facts, its domains and its real-time profile.
"""

from __future__ import annotations

import re
import subprocess

from .base import Refused


def run(*args: str) -> subprocess.CompletedProcess:
    """`xl ARGS` with its output and exit status; Refused where there is no xl (not a dom0)."""
    try:
        return subprocess.run(["xl", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise Refused("no xl here: this is not a Xen host's dom0") from None


def xl(*args: str) -> str:
    """`xl ARGS`'s output; Refused with xl's last line of complaint when it fails."""
    result = run(*args)
    if result.returncode != 0:
        message = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise Refused(f"xl {' '.join(args)}: {message[-1] if message else 'failed'}")
    return result.stdout


def parse_colon_list(text: str) -> dict[str, str]:
    """`xl info`: one "key : value" per line."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_table(text: str) -> list[dict[str, str]]:
    """A table as xl prints them: a header line of column names, then one row per line. Lines
    before the header (such as "Cpupool hvbench-rt: sched=RTDS") are skipped. The first column
    (a name) may not contain spaces."""
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Name"):
            # "Domain count" and "CPU list" are two words for one column
            header = re.sub(r"Domain count|CPU list", lambda m: m[0].replace(" ", "_"), line)
            header = header.split()
            return [dict(zip(header, row.split(), strict=False)) for row in lines[i + 1 :]]
    return []


def cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        if "-" in part:
            first, last = part.split("-")
            cpus.extend(range(int(first), int(last) + 1))
        elif part.strip():
            cpus.append(int(part))
    return cpus
