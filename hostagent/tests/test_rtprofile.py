"""The real-time profile on a /proc and /sys laid out as the kernel lays them out (Linux 6.1:
THP's bracketed choice, the workqueue masks in hex, the watchdog's CPU list), and read for
real on this machine. Applied for real on the test hosts: tests/testbed."""

import json
import pathlib

from hvbench_agent import cli, rtprofile


def machine(root: pathlib.Path) -> pathlib.Path:
    """A 4-CPU machine as Debian 12 boots it, with three interrupts."""
    files = {
        "sys/devices/system/cpu/online": "0-3\n",
        "proc/sys/kernel/sched_rt_runtime_us": "950000\n",
        "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
        "sys/kernel/mm/transparent_hugepage/defrag": "always defer defer+madvise [madvise] never\n",
        "sys/kernel/mm/ksm/run": "1\n",
        "proc/sys/kernel/timer_migration": "1\n",
        "proc/sys/vm/stat_interval": "1\n",
        "proc/sys/kernel/watchdog_cpumask": "0-3\n",
        "sys/devices/virtual/workqueue/cpumask": "f\n",
        "sys/bus/workqueue/devices/writeback/cpumask": "f\n",
        "proc/irq/default_smp_affinity": "f\n",
        "proc/irq/1/smp_affinity_list": "0-3\n",
        "proc/irq/1/effective_affinity_list": "2\n",
        "proc/irq/24/smp_affinity_list": "0-1\n",
        "proc/irq/30/smp_affinity_list": "3\n",  # a per-CPU queue the kernel keeps
        "proc/1/status": "Name:\tsystemd\nCpus_allowed_list:\t0-1\n",
        "proc/cmdline": "root=/dev/sda1 ro isolcpus=managed_irq,domain,2-3 nohz_full=2-3 "
        "rcu_nocbs=2-3\n",
        "sys/devices/system/cpu/isolated": "2-3\n",
        "sys/devices/system/cpu/nohz_full": "2-3\n",
    }  # no NMI watchdog: a VM's kernel may have none
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def keep_irq_30(monkeypatch) -> None:
    """The kernel refuses to move IRQ 30 (EIO, as for a managed interrupt)."""
    write = pathlib.Path.write_text

    def refusing(self, text, *args, **kwargs):
        if self.parts[-2:] == ("30", "smp_affinity_list"):
            raise OSError(5, "Input/output error")
        return write(self, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", refusing)


def test_a_host_gets_every_setting_and_reads_it_back(tmp_path, monkeypatch):
    root, state = machine(tmp_path / "root"), tmp_path / "run/rt-profile.json"
    keep_irq_30(monkeypatch)
    config = {"isolated": [2, 3], "boot": True}
    before = rtprofile.read(config, root, state)
    assert before["ok"] is False and before["housekeeping"] == [0, 1]
    assert before["settings"]["thp"] == {"want": "never", "have": "madvise", "ok": False}
    done = rtprofile.apply(config, root, state)
    assert done["ok"], done["settings"]
    assert {"rt_throttling", "thp", "ksm", "workqueue_cpus", "irq 1"} <= set(done["changed"])
    assert "irq 24" not in done["changed"]  # already on housekeeping CPUs
    assert (root / "proc/sys/kernel/sched_rt_runtime_us").read_text() == "-1"
    assert (root / "sys/devices/virtual/workqueue/cpumask").read_text() == "3"
    assert (root / "proc/sys/kernel/watchdog_cpumask").read_text() == "0,1"
    assert (root / "proc/irq/1/smp_affinity_list").read_text() == "0,1"
    settings = done["settings"]
    assert settings["nmi_watchdog"] == {"want": "0", "have": None, "ok": True}
    # IRQ 30 is one the kernel keeps; IRQ 1 was last delivered to CPU 2 (it moves when it
    # next fires): recorded, not judged
    assert settings["irqs"]["have"] == {
        "on_isolated": [30], "kept_by_kernel": [30], "last_delivered_on_isolated": [1]
    }  # fmt: skip
    assert settings["irqs"]["ok"]
    again = rtprofile.apply(config, root, state)
    assert again["ok"] and again["changed"] == []  # a second apply changes nothing
    assert again["settings"]["isolcpus"] == {"want": "2,3", "have": "2,3", "ok": True}
    assert again["settings"]["systemd_cpus"] == {"want": "0,1", "have": "0,1", "ok": None}


def test_without_the_kernels_isolation_the_boot_settings_fail_or_are_not_asked(tmp_path):
    root, state = machine(tmp_path / "root"), tmp_path / "state.json"
    asked = rtprofile.read({"isolated": [2, 3], "boot": True}, root, state)["settings"]
    assert asked["irqs"]["ok"] is False  # IRQ 30 on CPU 3, and no apply said it must stay
    (root / "sys/devices/system/cpu/isolated").write_text("\n")
    (root / "proc/cmdline").write_text("root=/dev/sda1 ro\n")
    asked = rtprofile.read({"isolated": [2, 3], "boot": True}, root, state)["settings"]
    assert asked["isolcpus"] == {"want": "2,3", "have": "", "ok": False}
    assert asked["rcu_nocbs"]["ok"] is False
    runtime_only = rtprofile.read({"isolated": [2, 3], "boot": False}, root, state)["settings"]
    assert runtime_only["isolcpus"]["ok"] is None  # not asked for: systemd and IRQs isolate


def test_a_guest_without_isolated_cpus_gets_the_machine_wide_settings_only(tmp_path):
    root, state = machine(tmp_path / "root"), tmp_path / "state.json"
    done = rtprofile.apply({"isolated": [], "boot": False}, root, state)
    assert done["ok"] and "irqs" not in done["settings"]
    assert set(done["settings"]) == {
        "rt_throttling", "thp", "thp_defrag", "ksm", "timer_migration", "nmi_watchdog",
        "vm_stat_interval",
    }  # fmt: skip
    assert (root / "proc/sys/kernel/watchdog_cpumask").read_text() == "0-3\n"  # untouched


def test_masks_and_lists_as_the_kernel_writes_them():
    assert rtprofile.parse_mask("00000000,0000000c") == {2, 3}
    assert rtprofile.cpu_mask([0, 1, 8]) == "103"
    assert rtprofile.parse_cpus("0-2,5\n") == {0, 1, 2, 5}


def test_this_machine_reads_as_not_provisioned_and_apply_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(rtprofile, "CONFIG", pathlib.Path("/nonexistent/rt-profile.json"))
    assert cli.main(["rt-profile", "read"]) == 0
    assert json.loads(capsys.readouterr().out) == {"provisioned": False, "ok": None}
    assert cli.main(["rt-profile", "apply"]) == 2
    assert "no real-time profile provisioned here" in capsys.readouterr().err
