"""Each package installs with its declared dependencies alone, and its entry points run there.

`make venv` installs hvbench's packages with --no-deps into one environment that has
everything; these tests install them as a user would, each in a clean venv with only what its
pyproject.toml declares (pip's resolution, from the pinned wheels `make venv` keeps, offline),
and check what each install must and must not have:

- the agent alone: the standard library only (hosts and guests run it);
- the analysis alone: the report, without the job, PyFlink or TensorFlow;
- the harness (a controller that drives testbeds): every verb's --help, without PyFlink or
  TensorFlow; a run on this machine refused at once, saying what it lacks;
- the job with its `job` extra (what the real-time VM runs): PyFlink's job module imports.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OWN = ["hostagent", "tsc_timer", "analysis", "flink-job", "producers", "harness"]
PINS = ("constraints.txt", "requirements.txt")
# what only the job (PyFlink, the model's interpreter) and training need
HEAVY = ["pyflink", "tensorflow", "keras", "ai_edge_litert"]


def wheel_cache() -> Path:
    """The pinned wheels scripts/venv keeps, by the digest of the pins (its own formula)."""
    pins = b"".join((REPO / name).read_bytes() for name in ("requirements.txt", "constraints.txt"))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hvbench"
    found = cache / f"wheels-{hashlib.sha256(pins).hexdigest()[:16]}"
    if not found.is_dir():
        pytest.fail(f"no pinned wheels at {found}: `make venv` keeps them")
    return found


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """hvbench's own packages as wheels, each built from a clean copy (a build/ an earlier
    in-tree build left would add its stale modules)."""
    out, sources = tmp_path_factory.mktemp("own-wheels"), tmp_path_factory.mktemp("sources")
    leave = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests", "*.so")
    for name in OWN:
        shutil.copytree(REPO / name, sources / name, ignore=leave)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), *(str(sources / name) for name in OWN)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


def install(venv: Path, wheels: Path, *requirements: str) -> Path:
    """A clean venv with `requirements` and what they declare, nothing else; its bin/."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [str(uv), "pip", "install", "-q", "--python", str(venv / "bin/python"), "--offline",
         "--no-index", "--find-links", str(wheel_cache()), "--find-links", str(wheels),
         "--link-mode", "hardlink", "-c", str(REPO / "constraints.txt"), *requirements],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return venv / "bin"


def run(bin_dir: Path, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """A command of the venv, from an empty folder (not this checkout: nothing of it on the
    path) with the venv's environment only."""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, env=env,
        cwd=bin_dir.parent, timeout=300,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


def importable(bin_dir: Path, *modules: str) -> dict[str, bool]:
    code = (
        "import importlib.util, json, sys\n"
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))"
    )
    import json

    return json.loads(run(bin_dir, "python", "-c", code, *modules).stdout)


def import_every_module(bin_dir: Path, package: str, leave_out: tuple[str, ...] = ()) -> None:
    """Every module of an installed package imports (what a user's script or a verb may)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "top = importlib.import_module(sys.argv[1])\n"
        "for m in pkgutil.walk_packages(top.__path__, sys.argv[1] + '.'):\n"
        "    if m.name.rsplit('.', 1)[-1] != '__main__' and m.name not in sys.argv[2:]:\n"
        "        importlib.import_module(m.name)\n"
    )
    run(bin_dir, "python", "-c", code, package, *leave_out)


def test_the_agent_installs_alone_with_the_standard_library(tmp_path, wheels):
    bin_dir = install(tmp_path / "venv", wheels, "hvbench-agent")
    listed = run(bin_dir, "python", "-m", "pip", "--version", check=False)
    assert listed.returncode != 0  # no pip either: the venv holds the agent only
    site = next((tmp_path / "venv/lib").glob("python3*/site-packages"))
    assert sorted(p.name.split("-")[0] for p in site.glob("*.dist-info")) == ["hvbench_agent"]
    assert "sched" in run(bin_dir, "hvbench-agent", "--help").stdout
    import_every_module(bin_dir, "hvbench_agent")


def test_the_report_installs_without_the_job(tmp_path, wheels):
    bin_dir = install(tmp_path / "venv", wheels, "hvbench-analysis")
    assert importable(bin_dir, "hvbench_job", "pyarrow", *HEAVY) == dict.fromkeys(
        ["hvbench_job", "pyarrow", *HEAVY], False
    )
    import_every_module(bin_dir, "hvbench_analysis")
    runs, out = tmp_path / "runs", tmp_path / "report"
    make_runs = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from hvbench_analysis.synthetic import write_run\n"
        "for i, budget in enumerate((20000, 50000)):\n"
        "    write_run(Path(sys.argv[1]) / f'r{i}', np.full(50, 2_000_000 + i),"
        " sched='deadline', budget=budget)\n"
    )
    run(bin_dir, "python", "-c", make_runs, str(runs))
    run(
        bin_dir,
        "python",
        "-m",
        "hvbench_analysis.report",
        "--results",
        str(runs),
        "--out",
        f"{out}",
    )
    assert (out / "index.html").exists() and (out / "tables" / "percentiles_by_config.csv").exists()
    assert not (runs / "r0" / "samples.parquet").exists()  # no pyarrow: the CSV alone


def test_a_controller_for_testbeds_has_every_verb_and_no_pyflink(tmp_path, wheels):
    bin_dir = install(tmp_path / "venv", wheels, "hvbench-harness")
    assert importable(bin_dir, *HEAVY) == dict.fromkeys(HEAVY, False)
    verbs = ["run", "campaign", "rerun", "check", "sched", "report", "model", "advise", "predict"]
    for verb in [*verbs, "provision", "teardown"]:
        assert "usage:" in run(bin_dir, "hvbench", verb, "--help").stdout, verb
    assert run(bin_dir, "hvbench", "--version").stdout.startswith("hvbench ")
    for package in ("hvbench_harness", "hvbench_analysis", "hvbench_load"):
        import_every_module(bin_dir, package)
    import_every_module(bin_dir, "hvbench_job", leave_out=("hvbench_job.job",))
    refused = run(bin_dir, "hvbench", "run", "RECORDS=2000", check=False)
    assert refused.returncode != 0
    assert "has no PyFlink" in refused.stderr and "3.11" in refused.stderr, refused.stderr[-2000:]
    assert not (bin_dir.parent / "work").exists()  # refused before anything was made


def test_the_real_time_vm_gets_pyflink_with_the_jobs_extra(tmp_path, wheels):
    bin_dir = install(tmp_path / "venv", wheels, "hvbench-job[job]", "hvbench-load")
    assert importable(bin_dir, "pyflink", "ai_edge_litert", "tensorflow", "sklearn") == {
        "pyflink": True, "ai_edge_litert": True, "tensorflow": False, "sklearn": False,
    }  # fmt: skip
    import_every_module(bin_dir, "hvbench_job", leave_out=("hvbench_job.forecast.train",))
    import_every_module(bin_dir, "hvbench_load")


def pins(text: str) -> dict[str, str]:
    """name → version of every `name==version` line (names as PyPI normalises them)."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def test_the_lock_pins_what_requirements_and_constraints_pin_each_with_hashes():
    """requirements.lock (make lock) is the same environment as the pins, every package with
    its files' hashes: scripts/venv downloads against it."""
    lock = (REPO / "requirements.lock").read_text()
    pinned = {name: version for f in PINS for name, version in pins((REPO / f).read_text()).items()}
    locked = pins(lock)
    assert {k: v for k, v in pinned.items() if locked.get(k) != v} == {}
    assert set(locked) - set(pinned) <= {"wheel"}  # pip's build tool, which constraints omit
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.split("\n", 2)[2])
    assert all("--hash=sha256:" in block for block in blocks if "==" in block)
