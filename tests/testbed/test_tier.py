"""make test-testbed's order (tier.py): the slow tier starts beside the Xen module only once
its host is restored, else after it; every step's exit code counts. Stand-in steps: short
Python processes that record when they ran (the tier itself runs the real ones)."""

import sys

import pytest
import tier


def stand_in(log, name: str, code: int = 0, signal: bool = False, wait_for: str = "") -> list:
    """A step that logs its start, optionally waits for another step's line, writes the
    restore signal, logs its end and exits with `code`."""
    script = f"""
import os, pathlib, time
log = pathlib.Path({str(log)!r})
def say(line):
    with log.open("a") as f:
        f.write(line + "\\n")
say("{name} started")
if {signal!r}:
    pathlib.Path(os.environ["HVBENCH_TESTBED_RESTORED"]).write_text("key")
while {wait_for!r} and {wait_for!r} not in log.read_text():
    time.sleep(0.05)
say("{name} ended")
raise SystemExit({code})
"""
    return [sys.executable, "-c", script]


@pytest.fixture
def log(tmp_path, monkeypatch):
    monkeypatch.setattr(tier, "POLL_S", 0.05)
    return tmp_path / "steps.log"


def test_the_slow_tier_runs_beside_a_restored_xen_host(log, monkeypatch, capsys):
    # the Xen module ends only after the slow tier has ended: they overlap
    monkeypatch.setattr(tier, "SECOND", stand_in(log, "xen", signal=True, wait_for="slow ended"))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow"))
    assert tier.xen_beside_slow(0.0) == (0, 0)
    assert log.read_text().splitlines() == ["xen started", "slow started", "slow ended",
                                            "xen ended"]  # fmt: skip
    assert "the slow tier, beside the restored Xen host" in capsys.readouterr().out


def test_without_a_restore_the_slow_tier_waits_for_the_xen_module(log, monkeypatch, capsys):
    monkeypatch.setattr(tier, "SECOND", stand_in(log, "xen", code=1))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow"))
    assert tier.xen_beside_slow(0.0) == (1, 0)
    assert log.read_text().splitlines() == ["xen started", "xen ended", "slow started",
                                            "slow ended"]  # fmt: skip
    out = capsys.readouterr().out
    assert "the slow tier, alone" in out and "it ended with 0" in out


def test_a_failed_step_fails_the_tier(log, monkeypatch):
    monkeypatch.setattr(tier, "FIRST", stand_in(log, "kvm", code=2))
    monkeypatch.setattr(tier, "SECOND", stand_in(log, "xen"))
    assert tier.main() == 2 and "xen" not in log.read_text()  # make's order: stop there
    monkeypatch.setattr(tier, "FIRST", stand_in(log, "kvm"))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow", code=5))  # 5: no test collected
    assert tier.main() == 5
