"""Facts about the controller's checkout for meta.json (the machines' own facts come from
hvbench_agent.facts, the one collector)."""

from __future__ import annotations

import subprocess

from hvbench_harness.build import REPO


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
