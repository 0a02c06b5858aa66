"""A Debian 13 controller: trixie's own Python (3.13) installs the controller with pip, drives
the `hvbench` verbs and makes a report; the full environment refuses at once, naming what it
needs (PyFlink has no wheels for 3.13).

Debian 13's userland is a chroot made with mmdebstrap from the distribution's mirror (cached
by its package list, as the testbed's images are); the packages come from PyPI, their
downloads kept in a cache of their own. Slow tier: the first chroot and download take minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HVBENCH_TEST_CACHE", "/var/cache/hvbench-test"))
SUITE = "trixie"
# What the controller needs from the distribution: Python and its venv, and gcc with Python's
# headers for the TSC timer's C extension.
PACKAGES = ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "ca-certificates"]
OWN = ["hostagent", "tsc_timer", "analysis", "flink-job", "producers", "harness"]
LAYOUT = 1  # bump when the way the chroot is made changes
PIP_CACHE = CACHE / f"{SUITE}-pip"


def userland() -> Path:
    """trixie's root file system as a tarball, made once per package list."""
    key = hashlib.sha256(f"{LAYOUT} {SUITE} {' '.join(PACKAGES)}".encode()).hexdigest()[:16]
    tarball = CACHE / f"{SUITE}-controller-{key}.tar"
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        making = CACHE / f"{SUITE}-controller-{key}.{os.getpid()}.tar"  # a tarball by its name
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
             str(making)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800,
        )  # fmt: skip
        making.rename(tarball)
    return tarball


def in_chroot(root: Path, script: str, check: bool = True) -> subprocess.CompletedProcess:
    """A shell script run in the chroot, with /proc, /dev and pip's cache (PIP_CACHE, kept
    between test sessions) mounted in a mount namespace of its own: gone with the process."""
    PIP_CACHE.mkdir(parents=True, exist_ok=True)
    mounts = (
        f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && "
        f"mount --rbind /sys {root}/sys && "
        f"mount --bind {PIP_CACHE} {root}/root/.cache/pip"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c",
         f'{mounts} && exec chroot {root} /bin/sh -ec "$0"', script],
        capture_output=True, text=True, timeout=1800,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"},
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, f"{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def trixie(tmp_path_factory) -> Path:
    """The chroot, with a copy of this checkout in /src (its packages, scripts, playbooks,
    roles and inventory: an installed harness finds the playbooks in its checkout)."""
    root = tmp_path_factory.mktemp("trixie") / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(userland())], check=True)
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    # this machine's trust: its own CAs, where a proxy between it and PyPI signs with one
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    leave = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests", "*.so")
    for name in [*OWN, "scripts", "playbooks", "roles", "inventory"]:
        shutil.copytree(REPO / name, root / "src" / name, ignore=leave)
    for name in ("constraints.txt", "requirements.txt", "requirements.lock", "ansible.cfg"):
        shutil.copy(REPO / name, root / "src" / name)
    (root / "root/.cache/pip").mkdir(parents=True)
    return root


def test_debian_13_has_python_3_13(trixie):
    out = in_chroot(trixie, ". /etc/os-release; echo $VERSION_ID; python3 --version").stdout
    assert out.split()[:3] == ["13", "Python", out.split()[2]] and out.split()[2].startswith("3.13")


def test_the_full_environment_refuses_python_3_13_at_once_saying_what_it_needs(trixie):
    proc = in_chroot(trixie, "cd /src && sh scripts/venv python3 hostagent", check=False)
    assert proc.returncode != 0
    assert "needs Python 3.11" in proc.stderr and "3.13" in proc.stderr, proc.stderr
    assert "docs/first-testbed.md" in proc.stderr
    assert not (trixie / "src/.venv").exists()  # refused before anything was made


def test_a_debian_13_controller_installs_with_pip_and_makes_a_report(trixie):
    """pip of trixie's Python 3.13, the packages (editable, in the checkout) with their
    declared dependencies under the project's constraints (from PyPI): every verb answers, a
    report is made, a bare run is refused, and make check's hardware playbook runs with this
    Ansible against this machine as a KVM host."""
    packages = " ".join(f"-e ./{name}" for name in OWN)
    in_chroot(
        trixie,
        "python3 -m venv /opt/controller && cd /src && "
        f"/opt/controller/bin/pip install -q -c constraints.txt {packages}",
    )
    out = in_chroot(trixie, "/opt/controller/bin/hvbench --version").stdout
    assert out.startswith("hvbench "), out
    for verb in ("run", "campaign", "check", "sched", "report", "model", "provision"):
        in_chroot(trixie, f"/opt/controller/bin/hvbench {verb} --help >/dev/null")
    in_chroot(trixie, "/opt/controller/bin/ansible-playbook --version >/dev/null")
    make_runs = (
        "import numpy as np; from pathlib import Path; "
        "from hvbench_analysis.synthetic import write_run; "
        "[write_run(Path('/tmp/runs') / f'r{b}', np.full(50, 2_000_000 + b), sched='deadline',"
        " budget=b) for b in (20000, 50000)]"
    )
    in_chroot(trixie, f'/opt/controller/bin/python -c "{make_runs}"')
    in_chroot(trixie, "/opt/controller/bin/hvbench report --results /tmp/runs --out /tmp/report")
    assert (trixie / "tmp/report/index.html").exists()
    refused = in_chroot(
        trixie, "cd /tmp && /opt/controller/bin/hvbench run RECORDS=2000", check=False
    )
    assert refused.returncode != 0 and "has no PyFlink" in refused.stderr, refused.stderr
    assert "3.13" in refused.stderr
    inventory = trixie / "src/inventory/trixie"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to("../sample/group_vars")
    host = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    (inventory / "hosts.yml").write_text(json.dumps({"kvm_hosts": {"hosts": {"lab-host": host}}}))
    checked = in_chroot(
        trixie, "cd /src && /opt/controller/bin/hvbench check --inventory inventory/trixie", False
    )
    assert " cpus " in checked.stdout and " numa " in checked.stdout, checked.stdout[-3000:]
    assert "Debian GNU/Linux 13" in checked.stdout  # the chroot's os-release, read by the playbook
    assert checked.stdout.rstrip().endswith("the tuning checks come once make provision has run")
