"""What a verb needs built on this machine, asked of the repository's Makefile: the harness
decides what, once it has checked the request (a bare run's inputs, a Xen host's hypervisor),
and make how and whether (it builds only what is missing or out of date). So the Makefile has
no branch on the target. An installed harness has no Makefile: nothing is built there, and the
caller's own checks say what is missing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# The repository, when this file is its harness/src/hvbench_harness/build.py (a source checkout).
REPO = Path(__file__).resolve().parents[3]


class BuildError(RuntimeError):
    """make failed, or is not there to run."""


def make(
    goals: list[str],
    variables: dict[str, str] | None = None,
    repo: Path = REPO,
    log: Path | None = None,
) -> bool:
    """`make GOAL... NAME=value...` in `repo`, its output the caller's, or into `log` (kept
    off the screen: Maven's and TensorFlow's lines); False, and nothing run, where `repo` has
    no Makefile. The variables go on make's command line, the only place the Makefile takes
    them from; under `make VERB`, MAKEFLAGS passes that make's own command line on (SEED=,
    EPOCHS=, ...), as it would to a sub-make."""
    if not (repo / "Makefile").is_file():
        return False
    words = [f"{name}={value}" for name, value in (variables or {}).items()]
    argv = ["make", "--no-print-directory", "-C", str(repo), *goals, *words]
    try:
        code = run(argv, log)
    except FileNotFoundError:
        raise BuildError(f"{repo} has a Makefile but make is not installed") from None
    if code != 0:
        said = f"; its output is in {log}:\n{tail(log)}" if log else ""
        raise BuildError(f"make {' '.join(goals)} failed (exit {code}){said}")
    return True


def run(argv: list[str], log: Path | None) -> int:
    if log is None:
        return subprocess.run(argv).returncode
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
