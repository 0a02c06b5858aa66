"""Fixtures shared by the tests of every package: small generated data, a small model, a
lock for the tests that set this machine's idle states, and a run registry of each test's
own."""

import fcntl
import hashlib
import os
import shutil
import subprocess
from datetime import date
from pathlib import Path

# One BLAS thread, as make exports it (Makefile): with two, OpenBLAS splits a matrix product
# and sums in another order, and the tests that compare numbers to the bit (test_compare) fail
# when pytest is run by hand. Set before numpy is first imported, below.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest
from hvbench_harness import runlocks
from hvbench_job import generate
from hvbench_job.forecast import train

REPO = Path(__file__).resolve().parent
SMALL_START = date(2024, 3, 4)  # a Monday
SMALL_DAYS = 6
SMALL_SEED = 7
SMALL_TRAINING = ["--epochs", "1", "--baselines", "linear"]
# Trained small models, one per content key (small_model_key), kept between pytest sessions as
# the wheels are (scripts/venv)
MODEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvbench/models"


@pytest.fixture(scope="session")
def small_span():
    """The small data's first day and its number of days. (A fixture, not an import: with a
    second conftest.py in the tree, `import conftest` may name either.)"""
    return SMALL_START, SMALL_DAYS


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """Six days of generated data for the six detectors, and the generator's own summary."""
    out = tmp_path_factory.mktemp("pems")
    summary = generate.generate(out, SMALL_START, SMALL_DAYS, seed=SMALL_SEED)
    return out, summary


@pytest.fixture(scope="session")
def small_model(small_data, tmp_path_factory):
    """The full LSTM trained for one epoch on the small data, through the CLI, exported: a
    copy of its session's own. It is trained once per content key and kept in MODEL_CACHE, so
    the pytest sessions of make test and of the testbed tier, and the unit tests' two workers,
    train it once between them. Training itself is tested where it runs (test_forecast.py)."""
    out = tmp_path_factory.mktemp("forecaster")
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    with open(MODEL_CACHE / ".lock", "w") as lock:  # one session trains, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.copytree(trained_small_model(small_data[0]), out, dirs_exist_ok=True)
    return out


def trained_small_model(data_dir: Path) -> Path:
    """The cached small model, trained first if its key has none. It is made in a folder of its
    own and renamed, so none is ever half there; only the newest key's model is kept."""
    cached = MODEL_CACHE / small_model_key()
    if not cached.exists():
        making = cached.with_name(f"{cached.name}.{os.getpid()}")
        shutil.rmtree(making, ignore_errors=True)
        train.main(["--data", str(data_dir), "--out", str(making), *SMALL_TRAINING])
        for other in MODEL_CACHE.iterdir():
            if other.is_dir() and other != making:
                shutil.rmtree(other)
        making.rename(cached)
    return cached


def small_model_key() -> str:
    """What the small model is made from: the job's sources (the data's generator, the
    training, the export), the pinned packages (TensorFlow's and Keras's versions), the data's
    span and seed and the training's arguments."""
    digest = hashlib.sha256(repr((SMALL_START, SMALL_DAYS, SMALL_SEED, SMALL_TRAINING)).encode())
    sources = sorted(
        p for p in (REPO / "flink-job/src").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
    )  # fmt: skip
    for path in [*sources, REPO / "requirements.txt", REPO / "constraints.txt"]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


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
