"""Running the harness the way a user does (its own process, its own log), for the
integration tests: the arguments of a short bare run, a driver that reads the harness's log
as it comes and acts on it (to inject faults), and the check that nothing is left running."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_args(tmp_path, data, model, *extra, records: int = 360) -> list[str]:
    return [
        *("--records", str(records), "--warmup-s", "1", "--drain-s", "15"),
        *("--data", str(data), "--model", str(model)),
        *("--kafka-libs", str(REPO / "build/kafka/libs")),
        *("--connector-dir", str(REPO / "build/flink/lib")),
        *("--results", str(tmp_path / "results"), "--work", str(tmp_path / "work")),
        *extra,
    ]


def leftover_processes(tmp_path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(tmp_path) in line and "pytest" not in line]


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Harness:
    """`hvbench run` in its own session (as from a terminal), its log line by line; `command`
    runs the harness another way (a fault injected into it)."""

    def __init__(self, args: list[str], command: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "hvbench_harness.run"]), *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as from a terminal: Ctrl-C is not ignored, even where the tests themselves were
            # started in the background by a shell (which makes its children ignore SIGINT)
            preexec_fn=default_sigint,
        )
        self.lines: list[tuple[float, str]] = []
        self._new: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append((time.monotonic(), line))
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
        """The first line matching `pattern` (a regex), waiting for it."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for _, line in self.lines[seen:]:
                if m := re.search(pattern, line):
                    return m
            seen = len(self.lines)
            try:
                if self._new.get(timeout=0.2) is None and seen == len(self.lines):
                    break
            except queue.Empty:
                continue
        raise AssertionError(f"no line matching {pattern!r}; the log:\n{self.log()}")

    def when(self, pattern: str) -> float | None:
        """monotonic() at which a line matching `pattern` came, or None."""
        return next((t for t, line in self.lines if re.search(pattern, line)), None)

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)  # what a terminal sends to its foreground

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)  # it has taken the last line
        return code

    def log(self) -> str:
        return "\n".join(line for _, line in self.lines)
