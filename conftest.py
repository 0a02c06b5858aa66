"""Fixtures shared by the tests of every package: small generated data, a small model, a
lock for the tests that set this machine's idle states, and a run registry of each test's
own."""

import fcntl
import subprocess
from datetime import date

import pytest
from hvbench_harness import runlocks
from hvbench_job import generate
from hvbench_job.forecast import train

SMALL_START = date(2024, 3, 4)  # a Monday
SMALL_DAYS = 6


@pytest.fixture(scope="session")
def small_span():
    """The small data's first day and its number of days. (A fixture, not an import: with a
    second conftest.py in the tree, `import conftest` may name either.)"""
    return SMALL_START, SMALL_DAYS


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """Six days of generated data for the six detectors, and the generator's own summary."""
    out = tmp_path_factory.mktemp("pems")
    summary = generate.generate(out, SMALL_START, SMALL_DAYS, seed=7)
    return out, summary


@pytest.fixture(scope="session")
def small_model(small_data, tmp_path_factory):
    """The full LSTM trained for one epoch on the small data, through the CLI, exported."""
    data_dir, _ = small_data
    out = tmp_path_factory.mktemp("forecaster")
    train.main(
        ["--data", str(data_dir), "--out", str(out), "--epochs", "1", "--baselines", "linear"]
    )
    return out


@pytest.fixture(scope="session")
def bay_data(tmp_path_factory):
    """One day of generated data for the 325 PEMS-BAY sensors."""
    out = tmp_path_factory.mktemp("pems-bay")
    summary = generate.generate(out, SMALL_START, 1, seed=7, network="bay")
    return out, summary


@pytest.fixture
def idle_states():
    """The tests that set this machine's idle states take turns (the unit tests run on two
    workers): each one's snapshot is then the machine's own, not another test's setting."""
    with open("/tmp/hvbench-test-idle-states.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def own_run_registry(tmp_path, monkeypatch):
    """Every test has a run registry of its own (hvbench_harness.runlocks): runs and campaigns
    that tests start on two workers (pytest-xdist), or beside a real run on this machine, do
    not see each other. (A module's shared run, set up before this, uses the machine's.)"""
    monkeypatch.setenv(runlocks.ENV, str(tmp_path / "run-registry"))


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs: a full disk for a run's results (about 200 KB); skipped where a tmpfs
    cannot be mounted (it needs root)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
