"""The host VM's boot watchdog (hostvm.BootWatch), without a VM."""

from hostvm import BootWatch


def test_a_silent_boot_is_reset_after_the_stall():
    watch = BootWatch(stall=90, resets=3)
    assert not watch.observe(b"[    2.6] VFS: Dquot-cache hash table entries: 512\n", 0)
    assert not watch.observe(b"", 89)
    assert watch.observe(b"", 90)
    # the reset boot gets its own 90 s
    assert not watch.observe(b"", 179)
    assert watch.observe(b"", 180)


def test_nothing_at_all_on_the_console_is_a_stall_too():
    watch = BootWatch(stall=90)
    assert not watch.observe(b"", 0)
    assert watch.observe(b"", 90)


def test_a_booted_host_is_never_reset_until_it_reboots():
    watch = BootWatch(stall=90)
    watch.observe(b"Debian GNU/Linux 12 hvbench-host ttyS0\n\nhvbench-host login: ", 40)
    assert not watch.observe(b"", 4000)  # idle after boot: no output is normal
    watch.observe(b"[  255.3] reboot: Restarting system\n[  255.3] reboot: machine restart\n", 4100)
    assert not watch.observe(b"", 4189)
    assert watch.observe(b"", 4190)


def test_a_power_down_is_not_a_boot():
    watch = BootWatch(stall=90)
    watch.observe(b"hvbench-host login: ", 40)
    watch.observe(b"[ 1359.1] reboot: Power down\n", 100)
    assert not watch.observe(b"", 1000)


def test_a_marker_split_across_two_reads_is_seen():
    watch = BootWatch(stall=90)
    watch.observe(b"hvbench-host log", 40)
    watch.observe(b"in: [   31.1] powernow_k8: Power state transitions not supported\n", 42)
    assert not watch.observe(b"", 1000)
    watch.observe(b"[ 255.3] reboot: Restarting sys", 1001)
    watch.observe(b"tem\n(XEN) Xen version 4.17.5\n", 1002)
    assert watch.observe(b"", 1092)


def test_resets_are_bounded():
    watch = BootWatch(stall=90, resets=2)
    assert not watch.observe(b"", 0)
    assert watch.observe(b"", 90)
    assert watch.observe(b"", 180)
    assert not watch.observe(b"", 10_000)
