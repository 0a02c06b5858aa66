"""make test-testbed's order (tier.py): the modules one after the other, the slow tier beside
the first whose host is ready (restored, or its layer complete), else after both; every step's
exit code counts. Stand-in steps: short Python processes that record when they ran (the tier
itself runs the real ones)."""

import sys

import pytest
import tier


def stand_in(log, name: str, code: int = 0, signal: bool = False, wait_for: str = "") -> list:
    """A step that logs its start, optionally waits for another step's line, writes the
    ready signal, logs its end and exits with `code`."""
    script = f"""
import os, pathlib, time
log = pathlib.Path({str(log)!r})
def say(line):
    with log.open("a") as f:
        f.write(line + "\\n")
say("{name} started")
if {signal!r}:
    pathlib.Path(os.environ["HVBENCH_TESTBED_READY"]).write_text("key")
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


def order(log) -> list[str]:
    return log.read_text().splitlines()


def steps(monkeypatch, kvm: list, xen: list, slow: list) -> None:
    """The tier's three steps replaced by stand-ins."""
    for name, step in (("FIRST", kvm), ("SECOND", xen), ("SLOW", slow)):
        monkeypatch.setattr(tier, name, step)


def test_the_slow_tier_runs_beside_the_first_ready_module(log, monkeypatch, capsys):
    # the KVM module ends only after the slow tier has ended: they overlap
    kvm = stand_in(log, "kvm", signal=True, wait_for="slow ended")
    steps(monkeypatch, kvm, stand_in(log, "xen", signal=True), stand_in(log, "slow"))
    assert tier.main() == 0
    assert order(log) == ["kvm started", "slow started", "slow ended", "kvm ended",
                          "xen started", "xen ended"]  # fmt: skip
    assert "the slow tier, beside the KVM module" in capsys.readouterr().out


def test_the_slow_tier_waits_for_a_ready_module(log, monkeypatch, capsys):
    xen = stand_in(log, "xen", signal=True, wait_for="slow ended")
    steps(monkeypatch, stand_in(log, "kvm"), xen, stand_in(log, "slow"))
    assert tier.main() == 0
    assert order(log) == ["kvm started", "kvm ended", "xen started", "slow started",
                          "slow ended", "xen ended"]  # fmt: skip
    assert "the slow tier, beside the Xen module" in capsys.readouterr().out


def test_without_a_ready_module_the_slow_tier_runs_after_the_modules(log, monkeypatch, capsys):
    steps(monkeypatch, stand_in(log, "kvm"), stand_in(log, "xen"), stand_in(log, "slow"))
    assert tier.main() == 0
    assert order(log) == ["kvm started", "kvm ended", "xen started", "xen ended",
                          "slow started", "slow ended"]  # fmt: skip
    out = capsys.readouterr().out
    assert "the slow tier, alone" in out and "it ended with 0" in out


def test_a_failed_step_fails_the_tier(log, monkeypatch):
    steps(monkeypatch, stand_in(log, "kvm", code=2), stand_in(log, "xen"), stand_in(log, "slow"))
    assert tier.main() == 2 and order(log) == ["kvm started", "kvm ended"]  # make's order
    log.unlink()
    # a module that fails beside the slow tier: the slow tier ends first, its output shown
    failing = stand_in(log, "kvm", code=1, signal=True, wait_for="slow ended")
    monkeypatch.setattr(tier, "FIRST", failing)
    assert tier.main() == 1 and "xen started" not in order(log)
    assert "slow ended" in order(log)
    log.unlink()
    monkeypatch.setattr(tier, "FIRST", stand_in(log, "kvm"))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow", code=5))  # 5: no test collected
    assert tier.main() == 5
