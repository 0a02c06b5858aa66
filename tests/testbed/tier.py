"""make test-testbed: the testbed modules in two lanes, and the slow tier (docs/testing.md has
the figures).

1. The KVM module (Debian 13) and the other testbed tests, in the first lane, from the start.
2. The slow tier (marker `slow`: real campaigns, and a host booted to fail) starts beside the
   first module whose host is ready: restored from its layer (layers.py: a hit), or, on a miss,
   once its layer is complete (the first and second provision passed). From then on the
   module's host loads the cores only partly; a host's first provision beside other load
   outlasted its timeouts, so no provision runs beside the slow tier's start.
3. The Xen module, then the Debian 12 KVM module, start in the second lane once the slow tier
   has ended, beside the rest of the first lane; or after the first lane, if that ends first.
   Started beside it, on a miss of its layer a module waits for the first lane's end before its
   first provision (layers.TURN): two first provisions side by side outlasted their timeouts.
   (The Debian 12 module ran after the KVM module in the first lane, which then ended alone
   about 15 minutes after the second.)

The first lane prints as it goes; the slow tier's and the second lane's output is kept in a file
each and printed whole when it has ended. Exits non-zero when any step failed (pytest's own
codes: a step that collected no test fails too); a failed first lane ends the tier once what
was started beside it has ended.
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
DEBIAN12 = "tests/testbed/test_provision_kvm_debian12.py"
MODULES = "testbed and not two_hosts and not slow"
FIRST = [*PYTEST, "-rs", "-m", MODULES, "--durations=15", f"--ignore={XEN}",
         f"--ignore={DEBIAN12}", "tests/testbed"]  # fmt: skip
SECOND = [*PYTEST, "-rs", "-m", MODULES, "--durations=15", XEN, DEBIAN12]  # in this order
# The slow tier's model fits use both cores each: never two of its tests at once. It holds the
# one testbed test that needs no provisioned host (a host booted to fail, test_hostvm.py): two
# minutes of one emulated CPU, which made the first module's host, and so the slow tier, wait.
SLOW = [*PYTEST, "-rs", "-m", "slow and not two_hosts", "--durations=15"]
POLL_S = 2


def step(name: str, started: float) -> None:
    print(f"=== {name} ({time.monotonic() - started:.0f} s into the tier)", flush=True)


class Beside:
    """A step run beside the first lane, started once, its output kept in `log`."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict | None = None):
        self.name, self.command, self.log, self.env = name, command, log, env
        self.proc: subprocess.Popen | None = None

    def start(self, where: str, started: float) -> None:
        step(f"{self.name}, {where}", started)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def wait(self, started: float) -> int:
        code = self.proc.wait()
        step(f"the output of {self.name} (it ended with {code})", started)
        sys.stdout.write(self.log.read_text(errors="replace"))
        return code


def first_lane(scratch: Path, slow: Beside, second: Beside, started: float) -> int:
    """The KVM module; the slow tier starts beside it once its host is ready, the second lane
    once the slow tier has ended."""
    name = "the KVM module and the other testbed tests"
    step(name, started)
    ready = scratch / "ready-kvm"
    proc = subprocess.Popen(
        FIRST, cwd=REPO, env={**os.environ, "HVBENCH_TESTBED_READY": str(ready)}
    )
    while proc.poll() is None:
        if slow.proc is None and ready.exists():
            slow.start(f"beside {name}, whose host is ready", started)
        elif slow.ended() and second.proc is None:
            second.start(f"beside {name}, once the slow tier has ended", started)
        else:
            time.sleep(POLL_S)  # waits for a condition, polled
    return proc.wait()


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hvbench-tier-") as scratch:
        scratch = Path(scratch)
        turn = scratch / "first-lane-ended"
        ready = scratch / "ready-second"
        # The slow tier's runs and the second lane's register in a run registry of their own
        # each (runlocks.py): the first lane starts a workload copy on this machine over SSH,
        # which holds it in the machine-wide registry for minutes, and the slow tier's runs
        # started meanwhile were refused ("another run holds this machine"). The Debian 12
        # module's make run may come while it runs too. Tests here check runs, not latency.
        env = {**os.environ, "HVBENCH_TESTBED_READY": str(ready), "HVBENCH_TESTBED_TURN": str(turn),
               "HVBENCH_RUNS_DIR": str(scratch / "second-runs")}  # fmt: skip
        slow_env = {**os.environ, "HVBENCH_RUNS_DIR": str(scratch / "slow-runs")}
        slow = Beside("the slow tier", SLOW, scratch / "slow.log", slow_env)
        second = Beside("the Xen and Debian 12 modules", SECOND, scratch / "second.log", env)
        codes = [first_lane(scratch, slow, second, started)]
        turn.touch()
        if codes[0] == 0 and second.proc is None:
            second.start("after the first lane", started)
            while slow.proc is None and not second.ended():
                if ready.exists():
                    slow.start("beside the second lane, whose host is ready", started)
                time.sleep(POLL_S)  # waits for a condition, polled
        if codes[0] == 0 and slow.proc is None:
            slow.start("alone, after the modules", started)
        codes += [beside.wait(started) for beside in (slow, second) if beside.proc is not None]
    step(f"done: exit codes {codes}", started)
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
