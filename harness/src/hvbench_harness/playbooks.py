"""Ansible's commands as the harness runs them: the ones installed beside this Python (the
project's venv), else those on PATH, from the repository (its ansible.cfg), never reading this
process's stdin when their output is kept (Ansible refuses a non-blocking stdin, and a harness's
may be one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hvbench_harness.build import REPO


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def run(command: str, *args: str, keep: bool = True, env: dict | None = None):
    """`command args` in the repository. keep: its output is returned (without colour), else it
    goes to this process's terminal, and so does the terminal's input."""
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    if keep:
        environ["ANSIBLE_NOCOLOR"] = "1"
    return subprocess.run(
        [tool(command), *args],
        cwd=REPO,
        env={**environ, **(env or {})},
        **({"stdin": subprocess.DEVNULL, "capture_output": True, "text": True} if keep else {}),
    )


def play(inventory: str, playbook: str, *args: str, keep: bool = True, env: dict | None = None):
    """ansible-playbook -i inventory args playbooks/<playbook>."""
    path = str(REPO / "playbooks" / playbook)
    return run("ansible-playbook", "-i", inventory, *args, path, keep=keep, env=env)


def last_lines(proc: subprocess.CompletedProcess, count: int = 25) -> str:
    """The end of what a kept command printed, stdout then stderr."""
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-count:])
