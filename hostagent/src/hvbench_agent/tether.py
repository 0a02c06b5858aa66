"""Run a command for as long as our standard input stays open.

The harness starts the parts of a run on other machines through SSH. SSH without a terminal
sends no signal when its connection ends, so a broker or a job would outlive a harness that
was interrupted. Started through this, the command (in its own process group) gets SIGTERM
when standard input closes, which is how the harness asks it to stop and what happens when the
connection drops, and SIGKILL if it is still there after a grace period.

    hvbench-agent tether -- python -m hvbench_job.job ...
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

GRACE_S = 20.0


def end(child: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGCONT)  # a stopped process keeps SIGTERM pending
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(argv: list[str]) -> int:
    """Run argv until standard input closes; its exit code (128 + signal if killed)."""
    # The child must not read our standard input: it is the tether.
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)

    def on_signal(_signum, _frame) -> None:
        threading.Thread(target=end, args=(child,), daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)

    def watch_stdin() -> None:
        # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader aborts the
        # interpreter at exit
        while os.read(0, 4096):
            pass
        end(child)

    threading.Thread(target=watch_stdin, daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code
