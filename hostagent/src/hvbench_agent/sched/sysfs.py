"""Reading and writing the kernel's own files (cgroupfs, tracefs, sysfs)."""

from __future__ import annotations

import os
from pathlib import Path


def read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def write_file(path: Path, value: str) -> None:
    # unbuffered, so that the kernel's refusal raises here (a buffered write to a cgroup file
    # fails only at close, which an unclosed file object would swallow)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
