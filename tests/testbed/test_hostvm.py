"""The host VM's boot watchdog (hostvm.BootWatch), without a VM; and a host VM given a broken
kernel command line, which fails at once with its console's end (a real boot under TCG)."""

import os
import subprocess
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest
from hostvm import KVM_HOST_LINUX_ARGS, BootWatch, HostVM, HostVMError, build_image

CACHE = Path(os.environ.get("HVBENCH_TEST_CACHE", "/var/cache/hvbench-test"))


def test_a_silent_boot_is_reset_after_the_stall():
    watch = BootWatch(stall=90, resets=3)
    assert not watch.observe(b"[    2.6] VFS: Dquot-cache hash table entries: 512\n", 0)
    assert not watch.observe(b"", 89)
    assert watch.observe(b"", 90)
    # the reset boot gets its own 90 s
    assert not watch.observe(b"", 179)
    assert watch.observe(b"", 180)


OOPS = (
    b"[    1.633167] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n"
    b"[    1.633625] RIP: 0010:hrtimer_start_range_ns+0x1c6/0x430\n"
)
PANIC = b"[    1.635483] Kernel panic - not syncing: Fatal exception in interrupt\n"


def test_a_boot_that_dies_on_a_stale_code_rewrite_is_reset_and_its_panic_not_counted():
    watch = BootWatch(stall=90, resets=1)
    assert not watch.observe(b"[    0.0] Linux version 6.12.118+deb13-amd64\n", 0)
    assert watch.observe(OOPS, 2) and watch.why == "died on a stale code rewrite"
    assert not watch.observe(PANIC, 4)  # the dead boot's last words
    assert not watch.observe(b"SeaBIOS\n[    0.0] Linux version 6.12.118+deb13-amd64\n", 6)
    assert watch.failure is None
    watch.observe(b"hvbench-host login: ", 50)
    assert not watch.observe(b"", 4000) and watch.failure is None


def test_a_stale_code_rewrite_with_no_reset_left_is_the_boots_failure():
    watch = BootWatch(stall=90, resets=0)
    assert not watch.observe(OOPS + PANIC, 2)
    assert "Kernel panic" in watch.failure


def test_an_int3_after_the_boot_is_no_boots_death():
    watch = BootWatch(stall=90, resets=3)
    watch.observe(b"hvbench-host login: ", 40)
    assert not watch.observe(OOPS, 500)


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


def test_resets_are_bounded_and_the_next_stall_is_the_boots_failure():
    watch = BootWatch(stall=90, resets=2)
    assert not watch.observe(b"", 0)
    assert watch.observe(b"", 90)
    assert watch.observe(b"", 180)
    assert watch.failure is None
    assert not watch.observe(b"", 270)
    assert watch.failure == "no console output for 90 s while booting, after every reset"


@pytest.mark.parametrize(
    ("console", "said"),
    [
        (
            b"[    3.1] VFS: Unable to mount root fs on unknown-block(0,0)\n"
            b"[    3.1] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-b",
            "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-b",
        ),
        (
            b"Gave up waiting for root file system device.  Common problems:\n"
            b"ALERT!  /dev/vdz does not exist.  Dropping to a shell!\n\n(initramfs) ",
            "ALERT!  /dev/vdz does not exist.  Dropping to a shell!",
        ),
        (b"(XEN) ******************************\n(XEN) Panic on CPU 0:\n", "Panic on CPU 0:"),
        (b"error: file `/boot/vmlinuz' not found.\ngrub rescue> ", "grub rescue>"),
    ],
)
def test_a_console_that_says_the_boot_cannot_go_on_is_the_boots_failure(console, said):
    watch = BootWatch(stall=90)
    watch.observe(b"[    0.0] Linux version 6.1.0-56-amd64\n", 0)
    assert watch.failure is None
    half = len(console) // 2  # read in two parts: a marker may be split between them
    watch.observe(console[:half], 5)
    watch.observe(console[half:], 7)
    assert watch.failure == "the console says: " + said


def test_a_failure_after_the_login_prompt_is_seen_too():
    watch = BootWatch(stall=90)
    watch.observe(b"hvbench-host login: ", 40)
    watch.observe(b"[ 900.1] Kernel panic - not syncing: Fatal exception\n", 900)
    assert watch.failure == "the console says: Kernel panic - not syncing: Fatal exception"


class DirectBootVM(HostVM):
    """The image's own kernel and initramfs booted by QEMU with a command line of the test's."""

    def __init__(self, image: Path, work: Path, append: str) -> None:
        super().__init__(image, work, cpus=2, memory_mb=2048)
        self.append = append

    def _boot_args(self) -> list[str]:
        kernel, initrd = (self.from_image(f"/boot/{p}-*") for p in ("vmlinuz", "initrd.img"))
        return ["-kernel", str(kernel), "-initrd", str(initrd), "-append", self.append]

    def from_image(self, pattern: str) -> Path:
        """A file of the image's disk (read with debugfs, the disk left as it is)."""
        disk = str(self.image / "disk.raw")
        folder = str(Path(pattern).parent)
        listed = debugfs(disk, f"ls -p {folder}").split()  # /inode/mode/uid/gid/name/size/
        (name,) = [n for line in listed if fnmatch(n := line.split("/")[5], Path(pattern).name)]
        out = self.work / name
        debugfs(disk, f"dump {folder}/{name} {out}")
        return out


def debugfs(disk: str, request: str) -> str:
    return subprocess.run(
        ["debugfs", "-R", request, disk], check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.testbed
@pytest.mark.slow  # no provisioned host needed: the tier runs it beside the modules (tier.py)
@pytest.mark.timeout(600)
def test_a_host_with_a_broken_kernel_command_line_fails_at_once_with_its_console(tmp_path):
    """root= names a disk the host does not have (vdz for vda): the initramfs gives up after
    its 30 s and drops to its shell. The start fails on that line, not after its timeout."""
    image = build_image(CACHE, linux_args=KVM_HOST_LINUX_ARGS)
    vm = DirectBootVM(image, tmp_path, f"console=ttyS0 root=/dev/vdz rw {KVM_HOST_LINUX_ARGS}")
    started = time.monotonic()
    with pytest.raises(HostVMError) as failed:
        vm.start(timeout=900)
    took = time.monotonic() - started
    print(f"\nbroken root=: the start failed after {took:.0f} s")
    message = str(failed.value)
    assert "the boot failed: the console says: ALERT!  /dev/vdz does not exist." in message
    assert "Gave up waiting for root file system device" in message  # the console's end
    assert vm.process.poll() is not None  # no QEMU left behind
