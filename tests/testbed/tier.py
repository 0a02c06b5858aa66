"""make test-testbed: the testbed modules, then the slow tier (docs/testing.md has the figures).

1. The KVM module and the other testbed tests, alone.
2. The Xen module. Once its host is restored from its layer (layers.py: a hit, so nothing is
   provisioned or booted from scratch), the slow tier starts beside it: the module then keeps
   about two thirds of the cores busy, and the two together take about as long as the slower
   one. On a miss the slow tier waits for the module's end: the Xen host's first provision
   beside the model's fits outlasted its timeouts.

The Xen module prints as it goes; the slow tier's output is kept in a file and printed whole
when both have ended. Exits non-zero when any step failed (pytest's own codes: a step that
collected no test fails too).
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
FIRST = [*PYTEST, "-rs", "-m", "testbed and not two_hosts", "--durations=15",
         f"--ignore={XEN}", "tests/testbed"]  # fmt: skip
SECOND = [*PYTEST, "-rs", "-m", "testbed and not two_hosts", "--durations=15", XEN]
# the slow tier's model fits use both cores each: never two of its tests at once
SLOW = [*PYTEST, "-m", "slow and not testbed", "--durations=15"]
POLL_S = 2


def step(name: str, started: float) -> None:
    print(f"=== {name} ({time.monotonic() - started:.0f} s into the tier)", flush=True)


def xen_beside_slow(started: float) -> tuple[int, int]:
    """The Xen module, and the slow tier beside it once the module's host is restored."""
    with tempfile.TemporaryDirectory(prefix="hvbench-tier-") as scratch:
        restored = Path(scratch) / "restored"
        slow_log = Path(scratch) / "slow.log"
        env = {**os.environ, "HVBENCH_TESTBED_RESTORED": str(restored)}
        xen = subprocess.Popen(SECOND, cwd=REPO, env=env)
        while xen.poll() is None and not restored.exists():
            time.sleep(POLL_S)  # waits for a condition, polled
        beside = xen.poll() is None
        step("the slow tier, " + ("beside the restored Xen host" if beside else "alone"), started)
        with slow_log.open("wb") as out:
            slow = subprocess.Popen(SLOW, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
            codes = xen.wait(), slow.wait()
        step(f"the slow tier's output (it ended with {codes[1]})", started)
        sys.stdout.write(slow_log.read_text(errors="replace"))
        return codes


def main() -> int:
    started = time.monotonic()
    step("the KVM module and the other testbed tests", started)
    first = subprocess.run(FIRST, cwd=REPO).returncode
    if first != 0:
        return first
    step("the Xen module", started)
    xen, slow = xen_beside_slow(started)
    step(f"done: Xen module {xen}, slow tier {slow}", started)
    return xen or slow


if __name__ == "__main__":
    sys.exit(main())
