"""The provisioned layers' keys and records (layers.py), without a VM: a stand-in machine
writes the two files a saved QEMU machine leaves (the testbed tier saves and restores real
ones)."""

import json
import os

import layers
import pytest
from layers import Layer

PYTESTS_CURRENT_TEST = layers.current_test  # the real reader; own_report stands it down


def covered_a():
    """A stand-in covered test (its source is in the key)."""


def covered_b():
    """Another stand-in covered test."""


@pytest.fixture(autouse=True)
def own_report(monkeypatch):
    """The tier's summary is the testbed modules', not these tests'."""
    monkeypatch.setattr(layers, "REPORT", [])
    # these tests name the covered tests they stand in for
    monkeypatch.setattr(layers, "current_test", lambda: None)


class SavedMachine:
    """What HostVM.save leaves in its folder; the commands it was given over SSH."""

    def __init__(self):
        self.commands = []

    def ssh(self, command, timeout=600):
        self.commands.append(command)

    def save(self, out):
        self.commands.append("(saved)")
        out.mkdir(parents=True)
        (out / "state").write_bytes(b"ram")
        (out / "disk.qcow2").write_bytes(b"disk")


def layer(tmp_path, **inputs) -> Layer:
    return Layer(tmp_path, "kvm", inputs or {"vm": {"cpus": 4}}, [covered_a], roles=["kvm_host"])


def test_the_key_follows_the_inputs_and_the_covered_tests(tmp_path):
    assert layer(tmp_path).key == layer(tmp_path).key
    assert layer(tmp_path, vm={"cpus": 3}).key != layer(tmp_path).key
    other = Layer(tmp_path, "kvm", {"vm": {"cpus": 4}}, [covered_b], roles=["kvm_host"])
    assert other.key != layer(tmp_path).key
    xen = Layer(tmp_path, "kvm", {"vm": {"cpus": 4}}, [covered_a], roles=["xen_host"])
    assert xen.key != layer(tmp_path).key  # each module's key has its hypervisor's role


def test_the_repositorys_inputs_are_tracked_files():
    digest = layers.files_digest(layers.PROVISIONING_INPUTS)
    assert digest == layers.files_digest(list(reversed(layers.PROVISIONING_INPUTS)))
    assert digest != layers.files_digest(["roles/kvm_host"])


def test_a_layer_is_a_hit_only_once_complete(tmp_path):
    made = layer(tmp_path)
    assert not made.hit()
    made.prove("test_covered_a")  # a refusal that ran before the save
    made.save(SavedMachine())
    assert not made.hit()  # saved after the first provision, not yet proven idempotent
    made.prove("test_second_provision_changes_nothing")
    made.complete()
    assert layer(tmp_path).hit()
    record = json.loads(made.record.read_text())
    assert record["proven"] == ["test_covered_a", "test_second_provision_changes_nothing"]
    assert sorted(p.name for p in made.dir.iterdir()) == ["disk.qcow2", "layer.json", "state"]


def test_a_module_keeps_the_two_layers_it_used_last(tmp_path):
    """Made or restored: a change tried and taken back restores the layer from before it."""
    first, second, third = (layer(tmp_path, vm={"cpus": n}) for n in (1, 2, 3))
    for made in (first, second):
        made.save(SavedMachine())
        made.complete()
    os.utime(first.dir, (0, 0))
    os.utime(second.dir, (1, 1))
    layer(tmp_path, vm={"cpus": 1}).restore_from()  # the first is used again: kept
    third.save(SavedMachine())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.dir.name, third.dir.name])


def test_a_fresh_run_asked_for_ignores_the_layer(tmp_path, monkeypatch):
    made = layer(tmp_path)
    made.save(SavedMachine())
    made.complete()
    monkeypatch.setattr(layers, "FRESH", True)
    assert not layer(tmp_path).hit()


def test_a_restored_module_skips_what_the_layer_proved(tmp_path):
    made = layer(tmp_path)
    made.save(SavedMachine())
    made.prove("test_covered_a")
    made.complete()
    restored = layer(tmp_path)
    assert restored.restore_from() == made.dir and restored.restored
    with pytest.raises(pytest.skip.Exception, match=f"key {made.key}.*made 0.0 h ago"):
        restored.cover("test_covered_a")
    restored.save(SavedMachine())  # nothing is saved again over a restored layer
    assert sorted(p.name for p in made.dir.iterdir()) == ["disk.qcow2", "layer.json", "state"]
    assert layer(tmp_path).hit()


def test_a_covered_test_that_never_ran_runs_on_the_restored_host_and_proves_the_layer(tmp_path):
    """The run that made the layer was stopped after its second provision, before the reboot
    into the profile: a restored module runs that test for real instead of failing it."""
    made = layer(tmp_path)
    made.save(SavedMachine())
    made.cover("test_second_provision_changes_nothing")
    made.prove("test_second_provision_changes_nothing")
    made.complete()  # then the run was stopped
    restored = layer(tmp_path)
    restored.restore_from()
    restored.prove("test_covered_a")  # not run for real here: proves nothing
    restored.cover("test_the_profile_reboots")  # returns: the test goes on
    assert "test_the_profile_reboots never ran on layer kvm" in layers.REPORT[-1]
    assert json.loads(made.record.read_text())["pending"] == ["test_the_profile_reboots"]
    restored.prove("test_the_profile_reboots")
    record = json.loads(made.record.read_text())
    assert record["proven"] == [
        "test_second_provision_changes_nothing",
        "test_the_profile_reboots",
    ]
    assert record["pending"] == [] and record["complete"]
    again = layer(tmp_path)
    assert again.hit()
    again.restore_from()
    with pytest.raises(pytest.skip.Exception, match="it passed when the layer was made"):
        again.cover("test_the_profile_reboots")


def test_a_covered_test_that_failed_on_the_restored_host_withdraws_the_layer(tmp_path):
    made = layer(tmp_path)
    made.save(SavedMachine())
    made.complete()
    restored = layer(tmp_path)
    restored.restore_from()
    restored.cover("test_the_profile_reboots")  # runs for real, and fails: never proved
    again = layer(tmp_path)
    assert not again.hit() and (made.dir / "state").exists()
    withdrawn = json.loads(made.record.read_text())["withdrawn"]
    assert "test_the_profile_reboots did not pass" in withdrawn


def test_a_layer_on_which_a_covered_test_failed_is_withdrawn_at_its_next_hit(tmp_path):
    """The host panicked after the layer was complete, and the last covered test failed: the
    next run makes the layer again and runs that test for real, instead of failing it."""
    made = layer(tmp_path)
    made.save(SavedMachine())
    made.cover("test_second_provision_changes_nothing")
    made.prove("test_second_provision_changes_nothing")
    made.complete()
    made.cover("test_the_profile_reboots")  # started; it failed: never proved
    assert json.loads(made.record.read_text())["pending"] == ["test_the_profile_reboots"]
    again = layer(tmp_path)
    assert not again.hit()
    assert layers.REPORT[-1] == (
        f"withdrew layer kvm key {made.key} ({made.dir}): "
        "test_the_profile_reboots did not pass when it was made"
    )
    assert again.to_restore() is None  # made again, on a fresh host
    again.save(SavedMachine())
    again.cover("test_the_profile_reboots")
    again.prove("test_the_profile_reboots")
    again.complete()
    record = json.loads(again.record.read_text())
    assert record["pending"] == [] and "withdrawn" not in record
    assert layer(tmp_path).hit()


def test_a_fresh_module_runs_its_covered_tests(tmp_path):
    layer(tmp_path).cover("test_covered_a")  # returns: the test goes on


def test_the_guests_are_paused_while_the_host_is_saved_and_resumed_after_a_restore(tmp_path):
    quiesce = ("pause the guests", "resume the guests")
    made = Layer(tmp_path, "kvm", {}, [covered_a], roles=["kvm_host"], quiesce=quiesce)
    machine = SavedMachine()
    made.save(machine)
    assert machine.commands == ["pause the guests", "(saved)", "resume the guests"]
    made.complete()
    restored = Layer(tmp_path, "kvm", {}, [covered_a], roles=["kvm_host"], quiesce=quiesce)
    restored.restore_from()
    machine = SavedMachine()
    restored.resume(machine)
    assert machine.commands == ["resume the guests"]


def test_a_proved_test_is_recorded_by_the_running_tests_name(tmp_path, monkeypatch):
    """A covered test's own variable may shadow the name it passes (it did: a loop variable):
    the record takes the running test's name from pytest."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/testbed/t.py::test_the_reboot[x] (call)")
    monkeypatch.setattr(layers, "current_test", PYTESTS_CURRENT_TEST)
    made = layer(tmp_path)
    made.save(SavedMachine())
    made.prove("rcu_nocbs")
    assert json.loads(made.record.read_text())["proven"] == ["test_the_reboot"]


def test_a_completed_layer_and_a_restore_tell_the_tier_that_the_host_is_ready(
    tmp_path, monkeypatch
):
    """tier.py starts the slow tier beside the module once this file is written: the host is
    past its provisions, made (the layer complete) or restored."""
    signal = tmp_path / "signal" / "ready"
    signal.parent.mkdir()
    monkeypatch.setattr(layers, "READY", str(signal))
    made = layer(tmp_path / "cache")
    made.save(SavedMachine())
    assert not signal.exists()  # saved after the first provision: the second is to come
    made.complete()
    assert signal.read_text() == f"layer {made.key} made"
    signal.unlink()
    restored = layer(tmp_path / "cache")
    restored.restore_from()
    assert signal.read_text() == f"restored from layer {made.key}"


def test_beside_the_first_lane_a_missed_layer_waits_for_its_turn_to_provision(
    tmp_path, monkeypatch
):
    """tier.py starts the Xen module beside the first lane: on a hit it restores at once, on
    a miss its first provision waits for the first lane's end (the TURN file)."""
    turn = tmp_path / "first-lane-ended"
    monkeypatch.setattr(layers, "TURN", str(turn))
    waited = []

    def first_lane_ends(seconds):  # the poll's sleep: the first lane ends meanwhile
        waited.append(seconds)
        turn.touch()

    monkeypatch.setattr(layers.time, "sleep", first_lane_ends)
    assert layer(tmp_path / "cache").to_restore() is None
    assert waited == [layers.TURN_POLL_S] and turn.exists()
    made = layer(tmp_path / "cache")
    made.save(SavedMachine())
    made.complete()
    turn.unlink()
    assert layer(tmp_path / "cache").to_restore() == made.dir  # a hit: no wait
    assert len(waited) == 1
