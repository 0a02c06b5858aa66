"""make test-testbed's order (tier.py): the slow tier beside the first module whose host is
ready (restored, or its layer complete), else after both; the second lane (the Xen module, then
the Debian 12 KVM module) beside the first lane once the slow tier has ended, else after it;
every step's exit code counts. Stand-in steps:
short Python processes that record when they ran (the tier itself runs the real ones)."""

import os
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
if "HVBENCH_TESTBED_TURN" in os.environ:  # a first provision may run: the first lane ended
    say("{name} turn " + str(os.path.exists(os.environ["HVBENCH_TESTBED_TURN"])))
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


def test_the_slow_tier_then_the_xen_module_run_beside_the_first_lane(log, monkeypatch, capsys):
    # the KVM module ends only after the Xen module has ended: all overlap
    kvm = stand_in(log, "kvm", signal=True, wait_for="xen ended")
    steps(monkeypatch, kvm, stand_in(log, "xen", signal=True), stand_in(log, "slow"))
    assert tier.main() == 0
    assert order(log) == ["kvm started", "slow started", "slow ended", "xen started",
                          "xen turn False", "xen ended", "kvm ended"]  # fmt: skip
    out = capsys.readouterr().out
    assert "the slow tier, beside the KVM module" in out
    second = "the Xen and Debian 12 modules, beside the KVM module and the other testbed tests"
    assert second in out


def test_the_slow_tier_waits_for_a_ready_module(log, monkeypatch, capsys):
    xen = stand_in(log, "xen", signal=True, wait_for="slow ended")
    steps(monkeypatch, stand_in(log, "kvm"), xen, stand_in(log, "slow"))
    assert tier.main() == 0
    assert order(log) == ["kvm started", "kvm ended", "xen started", "xen turn True",
                          "slow started", "slow ended", "xen ended"]  # fmt: skip
    assert "the slow tier, beside the second lane" in capsys.readouterr().out


def test_without_a_ready_module_the_slow_tier_runs_after_the_modules(log, monkeypatch, capsys):
    steps(monkeypatch, stand_in(log, "kvm"), stand_in(log, "xen"), stand_in(log, "slow"))
    assert tier.main() == 0
    assert order(log) == ["kvm started", "kvm ended", "xen started", "xen turn True",
                          "xen ended", "slow started", "slow ended"]  # fmt: skip
    out = capsys.readouterr().out
    assert "the slow tier, alone" in out and "it ended with 0" in out


def test_a_failed_step_fails_the_tier(log, monkeypatch):
    steps(monkeypatch, stand_in(log, "kvm", code=2), stand_in(log, "xen"), stand_in(log, "slow"))
    assert tier.main() == 2 and order(log) == ["kvm started", "kvm ended"]  # make's order
    log.unlink()
    # a module that fails beside the slow tier: the slow tier ends, its output shown
    monkeypatch.setattr(tier, "FIRST", stand_in(log, "kvm", 1, signal=True, wait_for="slow st"))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow", wait_for="kvm ended"))
    assert tier.main() == 1 and "slow ended" in order(log)
    log.unlink()
    # one that fails beside the Xen module: the Xen module ends, its code counts too
    monkeypatch.setattr(
        tier, "FIRST", stand_in(log, "kvm", code=1, signal=True, wait_for="xen ended")
    )
    monkeypatch.setattr(tier, "SECOND", stand_in(log, "xen", code=3))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow"))
    assert tier.main() == 1 and order(log)[-1] == "kvm ended"
    log.unlink()
    monkeypatch.setattr(tier, "SECOND", stand_in(log, "xen"))
    monkeypatch.setattr(tier, "FIRST", stand_in(log, "kvm"))
    monkeypatch.setattr(tier, "SLOW", stand_in(log, "slow", code=5))  # 5: no test collected
    assert tier.main() == 5


def registry_of(record, name: str, signal: bool = False) -> list:
    """A step that records which run registry its runs would use (runlocks.py)."""
    script = f"""
import os, pathlib
with open({str(record)!r}, "a") as f:
    f.write("{name} " + os.environ.get("HVBENCH_RUNS_DIR", "machine-wide") + "\\n")
if {signal!r}:
    pathlib.Path(os.environ["HVBENCH_TESTBED_READY"]).write_text("key")
"""
    return [sys.executable, "-c", script]


def test_the_slow_tiers_runs_register_apart_from_the_modules(tmp_path, log, monkeypatch):
    # the first lane starts a workload copy on this machine over SSH, held in the machine-wide
    # registry for minutes: the slow tier's runs and the second lane's (the Debian 12 module's
    # make run), each in a registry of their own, are not refused
    record = tmp_path / "registries"
    kvm, xen, slow = (registry_of(record, n, signal=n != "slow") for n in ("kvm", "xen", "slow"))
    steps(monkeypatch, kvm, xen, slow)
    assert tier.main() == 0
    found = dict(line.split(" ", 1) for line in record.read_text().splitlines())
    own = os.environ.get("HVBENCH_RUNS_DIR", "machine-wide")  # the tier's (this test's)
    assert found["kvm"] == own
    assert found["slow"] != own and found["slow"].endswith("slow-runs")
    assert found["xen"] != own and found["xen"].endswith("second-runs")
