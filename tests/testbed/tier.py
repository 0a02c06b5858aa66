"""make test-testbed: the testbed modules one after the other, and the slow tier beside the first
of them whose host is past its provisions (docs/testing.md has the figures).

1. The KVM module and the other testbed tests.
2. The Xen module.
3. The slow tier (marker `slow`: real campaigns, and a host booted to fail): it starts beside
   the first module whose host is ready: restored from its layer (layers.py: a hit), or, on a
   miss, once its layer is complete (the first and second provision passed). From then on the
   module's host loads the cores only partly; a host's first provision beside other load
   outlasted its timeouts, so no provision runs beside the slow tier's start.

The modules print as they go; the slow tier's output is kept in a file and printed whole when
it has ended. Exits non-zero when any step failed (pytest's own codes: a step that collected no
test fails too); a failed module ends the tier once the slow tier, if started, has ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q"]
XEN = "tests/testbed/test_provision_xen.py"
MODULES = "testbed and not two_hosts and not slow"
FIRST = [*PYTEST, "-rs", "-m", MODULES, "--durations=15", f"--ignore={XEN}", "tests/testbed"]
SECOND = [*PYTEST, "-rs", "-m", MODULES, "--durations=15", XEN]
# The slow tier's model fits use both cores each: never two of its tests at once. It holds the
# one testbed test that needs no provisioned host (a host booted to fail, test_hostvm.py): two
# minutes of one emulated CPU, which made the first module's host, and so the slow tier, wait.
SLOW = [*PYTEST, "-rs", "-m", "slow and not two_hosts", "--durations=15"]
POLL_S = 2


def step(name: str, started: float) -> None:
    print(f"=== {name} ({time.monotonic() - started:.0f} s into the tier)", flush=True)


class SlowTier:
    """The slow tier, started once, its output kept in `log`."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self, where: str, started: float) -> None:
        step(f"the slow tier, {where}", started)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(SLOW, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def wait(self, started: float) -> int:
        code = self.proc.wait()
        step(f"the slow tier's output (it ended with {code})", started)
        sys.stdout.write(self.log.read_text(errors="replace"))
        return code


def module(name: str, command: list[str], ready: Path, slow: SlowTier, started: float) -> int:
    """One testbed module; the slow tier starts beside it once its host is past its
    provisions, unless it runs already."""
    step(name, started)
    env = {**os.environ, "HVBENCH_TESTBED_READY": str(ready)}
    proc = subprocess.Popen(command, cwd=REPO, env=env)
    while slow.proc is None and proc.poll() is None:
        if ready.exists():
            slow.start(f"beside {name}, whose host is ready", started)
        else:
            time.sleep(POLL_S)  # waits for a condition, polled
    return proc.wait()


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hvbench-tier-") as scratch:
        slow = SlowTier(Path(scratch) / "slow.log")
        codes = []
        for i, (name, command) in enumerate(
            [("the KVM module and the other testbed tests", FIRST), ("the Xen module", SECOND)]
        ):
            codes.append(module(name, command, Path(scratch) / f"ready-{i}", slow, started))
            if codes[-1] != 0:
                break  # make's order: a failed module ends the tier
        if slow.proc is None and not any(codes):
            slow.start("alone, after the modules", started)
        if slow.proc is not None:
            codes.append(slow.wait(started))
    step(f"done: exit codes {codes}", started)
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
