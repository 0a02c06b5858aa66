"""Provisioned test hosts kept between runs of the testbed tier, by content key.

A module's first provision is its longest step (the host's roles, the guests' first boots, the
reboot into Xen). After it passes, the module saves its host VM as a layer above the cached
image: the disk as it stands and the running machine (RAM and devices, guests booted). The
layer's key is a hash of everything the host's provisioning reads: the roles it runs, the
playbook, the sample group_vars, the agent's sources, the test's own inventory and variables,
the image and the other layers below it (the Xen build, the guest image recipe), and the source
of the tests the layer stands for. The layer counts only once the module's second provision has
changed nothing; it is never patched, only made again when its key changes. The two layers of
each module made or restored last are kept (KEEP), so that a change tried and taken back, or
two branches in turn, rebuild nothing.

On a hit the module restores the machine in seconds instead of booting and provisioning it;
every other test then runs for real from the restored machine. The tests that the layer stands
for (the first and second provision, the KVM host's reboot into its kernel isolation) say that
it covered them: its key, its folder and its age, skipped with that reason if they passed when
the layer was made. One that never started then (that run was stopped before it, after the
layer was complete) runs for real on the restored host, and its pass proves the layer. A layer
on which a covered test started and did not pass (it failed, or the run was stopped during it)
is withdrawn at its next hit, so that the next run makes it again instead of failing that test
on every hit. HVBENCH_TESTBED_FRESH=1 makes every layer again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYOUT = 1  # bump when what a layer holds, or how it is made, changes
KEEP = 2  # layers kept per module: the ones made or restored last
# What a host's provisioning reads from the repository (files tracked by git, by content),
# besides the roles it runs (`host_roles`): the guest roles (kafka, flink, producers, job,
# testbed_bundle) install on the controller in the tests, not on the host VM.
PROVISIONING_INPUTS = [
    "ansible.cfg",
    "playbooks/provision.yml",
    "inventory/sample/group_vars",
    "hostagent/src",
    "hostagent/pyproject.toml",
    "tests/testbed/hold_static_keys.py",
]
# The roles the first play of provision.yml runs on every host; each module adds its
# hypervisor's (kvm_host or xen_host).
HOST_ROLES = ["guests", "host_tuning", "hvbench_agent", "rt_profile", "guest_image"]
FRESH = os.environ.get("HVBENCH_TESTBED_FRESH", "") not in ("", "0")
REPORT: list[str] = []  # what each module did with its layer, for the tier's summary
# a file written once a module's host is past its provisions (restored from its layer, or its
# layer just completed): tier.py starts the slow tier beside the rest of the module
READY = os.environ.get("HVBENCH_TESTBED_READY", "")
# a file that exists once the tier's first lane has ended: a module started beside it waits for
# it before a first provision (two side by side outlasted their timeouts); unset: no wait
TURN = os.environ.get("HVBENCH_TESTBED_TURN", "")
TURN_POLL_S = 5


def files_digest(paths: list[str]) -> str:
    """A hash of the tracked files under `paths`: their names and contents."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *paths], cwd=REPO, capture_output=True, check=True
    ).stdout
    digest = hashlib.sha256()
    for name in sorted(filter(None, listed.split(b"\0"))):
        digest.update(name + b"\0" + (REPO / name.decode()).read_bytes() + b"\0")
    return digest.hexdigest()


def current_test() -> str | None:
    """The running test's function name (pytest's PYTEST_CURRENT_TEST: path::name[...] (call))."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    return current.split("::")[-1].split(" ")[0].split("[")[0] if current else None


class Layer:
    """One module's provisioned host: `kind` names the module, `inputs` its own settings (the
    inventory, the variables, the images below, the VM's shape), `covers` the tests that the
    layer stands for on a hit, `roles` the module's own roles besides HOST_ROLES. `quiesce`:
    the commands run on the host before it is saved and after (again after a restore), such as
    pausing its guests and resuming them."""

    def __init__(
        self,
        cache: Path,
        kind: str,
        inputs: dict,
        covers: list[Callable],
        roles: list[str],
        quiesce: tuple[str, str] | None = None,
    ) -> None:
        paths = PROVISIONING_INPUTS + [f"roles/{role}" for role in HOST_ROLES + roles]
        recipe = {
            "layout": LAYOUT,
            "files": files_digest(paths),
            "inputs": inputs,
            "tests": {test.__name__: inspect.getsource(test) for test in covers},
        }
        if quiesce:
            recipe["quiesce"] = quiesce
        blob = json.dumps(recipe, sort_keys=True, default=str).encode()
        self.key = hashlib.sha256(blob).hexdigest()[:16]
        self.kind, self.cache, self.quiesce = kind, cache, quiesce
        self.dir = cache / f"{kind}-provisioned-{self.key}"
        self.proven: list[str] = []  # the covered tests that passed while this layer was made
        self.pending: list[str] = []  # the covered tests started then, not (yet) passed
        self.restored = False  # True once the module's host was restored from this layer
        self.saved = False

    @property
    def record(self) -> Path:
        return self.dir / "layer.json"

    def hit(self) -> bool:
        """A complete layer for this key on which no covered test failed, and no fresh run
        asked for."""
        if FRESH or not self.record.exists():
            return False
        record = json.loads(self.record.read_text())
        if record.get("complete") and record.get("pending"):
            self._withdraw(f"{', '.join(record['pending'])} did not pass when it was made")
            return False
        return record.get("complete", False)

    def to_restore(self) -> Path | None:
        """The folder to restore the host VM from on a hit; on a miss None, once a first
        provision may run here (TURN)."""
        if self.hit():
            return self.restore_from()
        if TURN and not Path(TURN).exists():
            print(f"\nlayer {self.kind} key {self.key} missed: waiting for the first lane's end")
            while not Path(TURN).exists():
                time.sleep(TURN_POLL_S)  # waits for a condition, polled
        return None

    def restore_from(self) -> Path:
        """The folder the host VM restores from; the layer's record is read for its tests."""
        self.proven = json.loads(self.record.read_text())["proven"]
        self.restored = True
        REPORT.append(f"restored from {self.describe()}; covered: {', '.join(self.proven)}")
        if READY:
            Path(READY).write_text(f"restored from layer {self.key}")
        os.utime(self.dir)  # used now: the last kept (save)
        return self.dir

    def resume(self, vm) -> None:
        """After a restore: what the save paused goes on (`quiesce`)."""
        if self.quiesce:
            vm.ssh(self.quiesce[1], timeout=300)

    def describe(self) -> str:
        made = json.loads(self.record.read_text())["made"]
        age = (time.time() - made) / 3600
        return f"layer {self.kind} key {self.key} ({self.dir}, made {age:.1f} h ago)"

    def cover(self, test: str) -> None:
        """In a covered test: on a hit, skip it if it passed when the layer was made (saying
        so), and otherwise run it for real: it never started then (that run was stopped before
        it; one that started and did not pass withdrew the layer at its hit), and its pass
        proves the layer. Without a hit the test runs for real."""
        test = current_test() or test
        if self.restored:
            if test in json.loads(self.record.read_text())["proven"]:  # as the record stands now
                pytest.skip(f"covered by {self.describe()}: it passed when the layer was made")
            REPORT.append(f"{test} never ran on {self.describe()}: it runs for real")
        self.pending.append(test)  # until it passes: a failure withdraws the layer at its hit
        if self.saved or self.restored:
            self._write(complete=self._complete())

    def prove(self, test: str) -> None:
        """A covered test passed on a fresh host, or for real on a restored one (cover): the
        layer keeps it, by the name of the test that is running (pytest's own), whatever name
        it was given."""
        test = current_test() or test
        if self.restored and test not in self.pending:
            return
        self.proven.append(test)
        if test in self.pending:
            self.pending.remove(test)
        if self.saved or self.restored:
            self._write(complete=self._complete())

    def save(self, vm) -> None:
        """Save the module's host VM (hostvm.HostVM.save), after its first provision passed;
        incomplete until complete() (the second provision)."""
        if self.restored:
            return
        partial = self.dir.with_name(self.dir.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        if self.quiesce:
            vm.ssh(self.quiesce[0], timeout=300)
        try:
            vm.save(partial)
        finally:
            if self.quiesce:
                vm.ssh(self.quiesce[1], timeout=300)
        shutil.rmtree(self.dir, ignore_errors=True)
        partial.rename(self.dir)
        self.saved = True
        self._write(complete=False)
        REPORT.append(f"made {self.describe()}")
        older = [d for d in self.cache.glob(f"{self.kind}-provisioned-*") if d != self.dir]
        older.sort(key=lambda d: d.stat().st_mtime, reverse=True)  # used last first
        for old in older[KEEP - 1 :]:
            shutil.rmtree(old, ignore_errors=True)

    def complete(self) -> None:
        """The second provision changed nothing: from now on the layer is a hit, and the rest
        of the module loads the host as a restored one does."""
        if self.saved:
            self._write(complete=True)
            if READY:
                Path(READY).write_text(f"layer {self.key} made")

    def _complete(self) -> bool:
        return json.loads(self.record.read_text()).get("complete", False)

    def _write(self, complete: bool) -> None:
        made = json.loads(self.record.read_text())["made"] if self.record.exists() else None
        record = {
            "kind": self.kind,
            "key": self.key,
            "made": made or time.time(),
            "complete": complete,
            "proven": self.proven,
            "pending": self.pending,
        }
        self.record.write_text(json.dumps(record, indent=1))

    def _withdraw(self, why: str) -> None:
        """No longer a hit (its folder is replaced when the layer is made again): a covered
        test did not pass on it. A restored host may still run from its files."""
        record = json.loads(self.record.read_text())
        record.update(complete=False, withdrawn=why)
        self.record.write_text(json.dumps(record, indent=1))
        REPORT.append(f"withdrew layer {self.kind} key {self.key} ({self.dir}): {why}")
