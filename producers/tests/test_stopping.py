import signal
import subprocess
import sys

import pytest

# A process asked to stop, then asked again while the interpreter exits (here: by a module
# global's finalizer, which runs after CPython has put the handled signal back to default).
ASKED_TWICE = """
import os, signal, sys, threading
stop = threading.Event()
if sys.argv[1] == "python handler":
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
else:
    from hvbench_load.stopping import stop_on_sigterm
    stop_on_sigterm(stop, signal.SIGINT)
os.kill(os.getpid(), signal.SIGTERM)
assert stop.wait(10)
if sys.argv[1] != "python handler":
    os.kill(os.getpid(), signal.SIGINT)  # ignored too, once asked

class AskedAgainOnExit:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)

last = AskedAgainOnExit()
"""


@pytest.mark.parametrize(
    ("how", "code"), [("python handler", -signal.SIGTERM), ("stop_on_sigterm", 0)]
)
def test_a_repeated_sigterm_does_not_cut_the_shutdown_short(how, code):
    ended = subprocess.run([sys.executable, "-c", ASKED_TWICE, how], timeout=60)
    assert ended.returncode == code
