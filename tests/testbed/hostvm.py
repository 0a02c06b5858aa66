"""A QEMU guest that plays the bare-metal host in the provisioning tests.

These machines cannot run a stock kernel under their /dev/kvm, so the "host" runs under TCG
(`-cpu max`: its emulated SVM lets KVM start guests inside it). Its disk is a Debian image built
with mmdebstrap from the distribution's mirror, cached by the hash of everything that goes into
it; each boot writes to a throw-away overlay, so every test starts from the same host.

The image already holds the packages the host roles (kvm_host or xen_host and the others)
install with apt: unpacking them under TCG takes many minutes, and each role's apt task is the
same task either way (it then reports "ok").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from hvbench_agent import trace

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
# The test hosts' release: Debian 13; test_provision_kvm_debian12.py keeps a Debian 12 host and
# the Xen module stays on Debian 12 (docs/testing.md says why).
SUITE = "trixie"
# GRUB, as on an installed host (see build_image), and dbus: a role reboots the host, and
# systemd's shutdown asks logind over D-Bus.
GRUB_PACKAGES = ["grub2-common", "grub-pc-bin", "dbus"]
# What a fresh Debian host has, plus what the kvm_host role would install (see above).
BASE_PACKAGES = [
    "linux-image-amd64",
    "systemd-sysv",
    "udev",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "ca-certificates",
]
ROLE_PACKAGES = [
    "qemu-system-x86",
    "qemu-utils",
    "libvirt-daemon-system",
    "libvirt-clients",
    "dnsmasq-base",
    "iptables",
    "python3-libvirt",
    "python3-lxml",
    "mmdebstrap",
    "e2fsprogs",
    "ipmitool",  # host_tuning: the energy meter's BMC source
    *GRUB_PACKAGES,
]
# What the hvbench_agent role installs with apt (the KVM host's and the Xen host's alike).
AGENT_PACKAGES = ["python3-venv"]
# What the xen_host and guests (Xen) roles install with apt, GRUB and dbus, as on the KVM host.
XEN_PACKAGES = [
    *("xen-system-amd64", "dnsmasq-base", "iptables", "qemu-utils"),
    *GRUB_PACKAGES,
    *AGENT_PACKAGES,
    "ipmitool",
]
IMAGE_SIZE = "12G"  # sparse: the host keeps guest images too
LAYOUT = 1  # bump when the way the image is made changes
# GRUB's own modules, in the core image that QEMU loads; the rest come from /boot/grub.
GRUB_CORE_MODULES = ["biosdisk", "ext2", "part_msdos", "part_gpt", "normal", "configfile"]
# The KVM host's kernel arguments, in its image's GRUB configuration (GRUB_CMDLINE_LINUX), so
# that they stay when a role runs update-grub.
# npt=0: with nested paging, the first nested guest panicked this host's kernel (stack guard
# page hit in the vCPU thread) under TCG's emulated SVM.
# vgif=0: twice the host hung with its vCPUs spinning in KVM's interrupt delivery soon after its
# nested guests started; without virtual GIF, KVM gates interrupts with plain CLGI/STGI, the
# older path of TCG's SVM.
KVM_HOST_LINUX_ARGS = "net.ifnames=1 kvm_amd.npt=0 kvm_amd.vgif=0 sysrq_always_enabled=1"
# The test hosts' guests boot under emulation (nested KVM with shadow paging, or Xen under TCG):
# a boot took 16 minutes in a CI run here, and systemd's 90 s start timeouts then failed
# journald, udevd and networkd, which left a guest without its network. Guests on hardware boot
# in seconds and keep systemd's defaults.
SLOW_GUEST_KERNEL_ARGS = [
    "systemd.default_timeout_start_sec=1800",
    "systemd.service_watchdogs=0",  # journald's 3 min watchdog
    "udev.event_timeout=1800",
]


HOLD_STATIC_KEYS_UNIT = """\
[Unit]
Description=Keep the test's static keys on (the TCG test host; see hold_static_keys.py)
After=systemd-modules-load.service
# libvirtd's guests are pinned to CPUs that are offline while this starts
Before=libvirtd.service

[Service]
Type=notify
NotifyAccess=main
# /dev/kvm comes with kvm_amd, which udev loads for the CPU: not before
ExecStartPre=/bin/udevadm wait --timeout=120 /dev/kvm
# KVM's keys flip when the holder creates its VM: with the other CPUs offline (see
# HOLD_STATIC_KEYS_START), back online once it holds them, or if it failed
ExecStartPre=/bin/sh -c 'for c in /sys/devices/system/cpu/cpu[1-9]*/online; do echo 0 >$$c; done'
ExecStart=/usr/bin/python3 /usr/local/sbin/hold-static-keys
ExecStartPost=/bin/sh -c 'for c in /sys/devices/system/cpu/cpu[1-9]*/online; do echo 1 >$$c; done'
# Its stop releases the same keys (KVM's as its VM closes, then its cgroup's), so the other CPUs
# go offline first. At shutdown they stay offline until the reboot: with them online, the
# release once hung a host's shutdown on the int3 of the code being patched in __schedule.
ExecStop=/bin/sh -c 'for c in /sys/devices/system/cpu/cpu[1-9]*/online; do echo 0 >$$c; done'
ExecStopPost=/bin/sh -c '[ "$$(systemctl is-system-running)" = stopping ] || \
  for c in /sys/devices/system/cpu/cpu[1-9]*/online; do echo 1 >$$c; done'
# Its own CPU quota and cpuset hold CFS bandwidth control's key and the cpusets key on. The
# quota never binds: the holder only sleeps.
CPUQuota={quota}%
AllowedCPUs=0-{last_cpu}

[Install]
WantedBy=multi-user.target
"""


# The service's start flips the keys it holds: its cgroup's quota and cpuset, then KVM's keys
# when it creates its VM. That one flip hung a freshly booted host too (a vCPU looping on the
# int3 of the code being patched in finish_task_switch, soft lockups on every CPU), so it
# happens with every other CPU offline: no other vCPU runs the code while it is rewritten. At
# boot the unit itself takes them offline around KVM's keys (its cgroup's are set before).
OTHERS_OFFLINE = (
    'others() { for cpu in /sys/devices/system/cpu/cpu[1-9]*/online; do echo "$1" > "$cpu"; done; }'
)
HOLD_STATIC_KEYS_START = (
    OTHERS_OFFLINE
    + """
others 0
systemctl daemon-reload && systemctl enable --now hold-static-keys
started=$?
others 1
if [ "$started" -ne 0 ]; then journalctl -u hold-static-keys -o cat --no-pager; exit 1; fi
cd /sys/fs/cgroup/system.slice/hold-static-keys.service && cat cpu.max cpuset.cpus
cat /sys/devices/system/cpu/online
"""
)


# What `hvbench-agent trace --backend kvm` enables
HELD_TRACEPOINTS = (*trace.EVENTS, *trace.KVM_EVENTS)
HOLD_TRACEPOINTS = """\
set -e
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
for i in 1 2; do
  d=/sys/kernel/tracing/instances/hvbench-test-hold-$i
  [ -d $d ] || mkdir $d
  echo 0 > $d/tracing_on
  for e in {events}; do
    echo 'common_pid < 0' > $d/events/$e/filter
    echo 1 > $d/events/$e/enable
  done
done
"""


# A boot runs from QEMU's start, or from the kernel's "reboot: Restarting system", to the
# getty's login prompt on the serial console.
BOOT_STARTS = re.compile(rb"reboot: Restarting system")
BOOT_ENDS = re.compile(rb" login: ")
# A boot that cannot go on says so on the console: the kernel's panic, Xen's, the initramfs
# giving up on the root device (a wrong root= waits 30 s, then drops to its shell), GRUB's rescue
# prompt. Waiting on for SSH would only wait out the timeout.
BOOT_FAILS = re.compile(
    rb"Kernel panic - not syncing[^\n]*|Panic on CPU \d+[^\n]*|[^\n]*Dropping to a shell!"
    rb"|grub rescue>"
)

# The kernel's trap on an int3 it did not place: the breakpoint of a code rewrite (a static
# key, an alternative) that this CPU still ran after the rewrite had ended. Under
# multi-threaded TCG one vCPU does not always see another's code writes (docs/testing.md); a
# host VM died so 1.6 s into its boot ("Oops: int3" in hrtimer_start_range_ns, then "Kernel
# panic - not syncing: Fatal exception in interrupt"). The same boot on hardware cannot.
STALE_REWRITE = re.compile(rb"int3: [0-9a-f]{4} \[#\d+\]")
KERNEL_STARTS = re.compile(rb"Linux version ")


class BootWatch:
    """Decides when a boot has stalled: no new console output for `stall` seconds while
    booting. Under multi-threaded TCG a boot now and then hangs for good (one stopped 2.6 s
    into the kernel's boot, the console silent from then on); a normal boot of the test's hosts
    is silent for at most 9 s, Linux or Xen (measured here at 1 s steps: 44 s and 73 s to the
    login prompt). A boot that dies on a stale code rewrite (STALE_REWRITE) is reset as well,
    and its panic is not the boot's failure. At most `resets` stalls and such deaths are
    answered; the next one is the boot's failure, as is a console that says the boot cannot go
    on (BOOT_FAILS)."""

    def __init__(self, stall: float = 90, resets: int = 3, booting: bool = True) -> None:
        self.stall, self.resets_left = stall, resets
        self.booting = booting  # False for a VM restored running: its console starts silent
        self.tail = b""  # the end of what came before, for a marker split across two reads
        self.last_output: float | None = None
        self.failure: str | None = None  # why the boot cannot end, once known
        self.crashed = False  # reset after a stale rewrite: its last lines are not the boot's
        self.why = ""  # what the last reset answered

    def observe(self, new: bytes, now: float) -> bool:
        """Take the console's new bytes at time `now`; True when the VM is to be reset."""
        if self.last_output is None or new:
            self.last_output = now
        if new:
            text = self.tail + new
            if self.crashed:  # the dead boot's panic, until the reset boot's kernel starts
                started = KERNEL_STARTS.search(text)
                self.tail = b"" if started else text[-128:]
                if not started:
                    return False
                text, self.crashed = text[started.start() :], False
            if self.booting and self.resets_left and STALE_REWRITE.search(text):
                self.resets_left -= 1
                self.crashed, self.tail, self.why = True, b"", "died on a stale code rewrite"
                return True
            starts = [m.end() for m in BOOT_STARTS.finditer(text)]
            ends = [m.end() for m in BOOT_ENDS.finditer(text)]
            if starts or ends:
                self.booting = max(starts, default=-1) > max(ends, default=-1)
            if self.failure is None and (failed := BOOT_FAILS.search(text)):
                self.failure = "the console says: " + failed.group().decode(errors="replace")
            self.tail = text[-128:]
            return False
        if self.booting and now - self.last_output >= self.stall:
            if not self.resets_left:
                self.failure = self.failure or (
                    f"no console output for {self.stall:.0f} s while booting, after every reset"
                )
                return False
            self.resets_left -= 1
            self.last_output = now  # the reset boot gets its own `stall` seconds
            self.why = "stalled"
            return True
        return False


class HostVMError(RuntimeError):
    pass


def image_key(pubkey: str, packages: list[str], linux_args: str, suite: str) -> str:
    recipe = {"suite": suite, "packages": sorted(packages), "pubkey": pubkey, "layout": LAYOUT}
    recipe["grub"] = GRUB_CORE_MODULES
    if linux_args:
        recipe["linux_args"] = linux_args
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def ssh_key(cache: Path) -> Path:
    """The test hosts' key, made once; under a lock, since the KVM and the Xen modules run side
    by side (make test-testbed)."""
    key = cache / "id_ed25519"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "id_ed25519.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvbench-test", "-f",
                 str(key)],
                check=True,
            )  # fmt: skip
    return key


def agent_wheel() -> None:
    """The agent's wheel in build/agent/, which the hvbench_agent role installs on the host."""
    subprocess.run(["make", "-s", "agent-wheel"], cwd=REPO, check=True, timeout=600)


def build_image(
    cache: Path, packages: list[str] | None = None, linux_args: str = "", suite: str = SUITE
) -> Path:
    """The host image directory (disk and GRUB's loader), built once per content key.

    The image boots through GRUB, as a real host does, so that a role can change GRUB's
    configuration and reboot: QEMU loads GRUB's core image (grub.lnx: lnxboot.img and a core.img
    made from the image's own GRUB), which reads /boot/grub/grub.cfg from the disk. The image
    has no partition table and no boot sector; everything after that is the host's own GRUB.
    Until update-grub runs on the host, grub.cfg boots the image's kernel. linux_args go on
    Linux's command line, in the first grub.cfg and in /etc/default/grub alike.
    """
    packages = packages or BASE_PACKAGES + ROLE_PACKAGES + AGENT_PACKAGES
    key = ssh_key(cache)
    pubkey = key.with_suffix(".pub").read_text().strip()
    out = cache / f"host-{image_key(pubkey, packages, linux_args, suite)}"
    if (out / "done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="hvbench-rootfs-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        network = "[Match]\nName=en*\n\n[Network]\nDHCP=yes\n"
        hooks = [
            f'mkdir -p "$1/root/.ssh" && echo "{pubkey}" > "$1/root/.ssh/authorized_keys"',
            'chmod 700 "$1/root/.ssh" && chmod 600 "$1/root/.ssh/authorized_keys"',
            f"printf '{network}' > \"$1/etc/systemd/network/50-dhcp.network\"",
            'chroot "$1" systemctl enable systemd-networkd',
            'echo hvbench-host > "$1/etc/hostname"',
            "printf '/dev/vda / ext4 defaults 0 1\\n' > \"$1/etc/fstab\"",
        ]
        cmd = [
            "mmdebstrap",
            "--variant=minbase",
            "--include=" + ",".join(packages),
            *[f"--customize-hook={h}" for h in hooks],
            suite,
            str(root),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        _install_grub(root, out / "grub.lnx", " ".join(["console=ttyS0", linux_args]).strip())
        subprocess.run(
            ["mke2fs", "-q", "-t", "ext4", "-d", str(root), str(out / "disk.raw"), IMAGE_SIZE],
            check=True,
        )
    (out / "done").write_text("")
    return out


def _install_grub(root: Path, loader: Path, linux_args: str) -> None:
    """What grub-install would put in /boot/grub, a first grub.cfg, and the loader for QEMU."""
    grub = root / "boot" / "grub"
    shutil.copytree(root / "usr/lib/grub/i386-pc", grub / "i386-pc")
    kernel = next((root / "boot").glob("vmlinuz-*")).name
    initrd = next((root / "boot").glob("initrd.img-*")).name
    (grub / "grub.cfg").write_text(
        "set timeout=0\n"
        "menuentry 'Debian (image)' {\n"
        f"\tlinux /boot/{kernel} root=/dev/vda rw {linux_args}\n"
        f"\tinitrd /boot/{initrd}\n"
        "}\n"
    )
    # The host's own update-grub keeps these: Linux on the serial console, no menu delay.
    # /etc/default/grub as grub-pc's postinst makes it (grub-pc itself would run grub-install)
    defaults = root / "etc/default/grub"
    if not defaults.exists():
        shutil.copy(root / "usr/share/grub/default/grub", defaults)
    text = defaults.read_text()
    for name, value in (("GRUB_TIMEOUT", "0"), ("GRUB_CMDLINE_LINUX", f'"{linux_args}"')):
        text = re.sub(rf"(?m)^{name}=.*$", f"{name}={value}", text)
    defaults.write_text(text + "GRUB_TERMINAL=console\n")
    subprocess.run(
        [
            "chroot",
            str(root),
            "grub-mkimage",
            "-O",
            "i386-pc",
            "-o",
            "/tmp/core.img",
            "-p",
            "(hd0)/boot/grub",
            *GRUB_CORE_MODULES,
        ],
        check=True,
    )
    loader.write_bytes(
        (root / "usr/lib/grub/i386-pc/lnxboot.img").read_bytes()
        + (root / "tmp/core.img").read_bytes()
    )
    (root / "tmp/core.img").unlink()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HostVM:
    """Boots the image under TCG with SSH forwarded to 127.0.0.1:<port>."""

    def __init__(
        self,
        image: Path,
        work: Path,
        cpus: int = 3,
        memory_mb: int = 6144,
        cpu: str = "max",
        link: tuple[int, int] | None = None,
    ) -> None:
        self.image, self.work = image, work
        self.cpus, self.memory_mb, self.cpu = cpus, memory_mb, cpu
        # a second NIC on a link shared with other host VMs: (this VM's UDP port, the other's)
        self.link = link
        self.port = free_port()
        self.key = image.parent / "id_ed25519"
        self.process: subprocess.Popen | None = None
        self.resets: list[str] = []  # the stalled boots the watchdog reset, as log lines
        self.watch = BootWatch()

    @property
    def console(self) -> Path:
        return self.work / "console.log"

    @property
    def monitor(self) -> Path:
        return self.work / "monitor.sock"

    def start(self, timeout: float = 300, restore: Path | None = None) -> None:
        """Boot the image, or with `restore` a saved machine (layers.Layer: its disk and its
        RAM and devices, which QEMU reads back instead of booting)."""
        self.work.mkdir(parents=True, exist_ok=True)
        overlay = self.work / "overlay.qcow2"
        backing = (restore / "disk.qcow2", "qcow2") if restore else (self.image / "disk.raw", "raw")
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", backing[1], "-b", str(backing[0]),
             str(overlay)],
            check=True,
        )  # fmt: skip
        incoming = ["-incoming", f"exec:cat {restore / 'state'}"] if restore else []
        self.process = subprocess.Popen(
            [
                "qemu-system-x86_64",
                "-accel",
                "tcg,thread=multi",
                "-cpu",
                self.cpu,
                "-smp",
                str(self.cpus),
                "-m",
                str(self.memory_mb),
                *self._boot_args(),
                "-drive",
                f"file={overlay},if=virtio,format=qcow2",
                "-netdev",
                f"user,id=net0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
                "-device",
                "virtio-net-pci,netdev=net0",
                *self._link_args(),
                "-display",
                "none",
                "-serial",
                f"file:{self.console}",
                # the human monitor, for sysrq dumps when the host stops answering, and to
                # save the machine
                "-monitor",
                f"unix:{self.monitor},server=on,wait=off",
                *incoming,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / "qemu.err", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        self.watch = watch = BootWatch(booting=restore is None)
        threading.Thread(target=self._watch_boots, args=(self.process, watch), daemon=True).start()
        try:
            if restore:
                self._resume_restored(timeout)
            self._wait_for_ssh(timeout)
            if restore:
                self.sync_clock()
        except BaseException:
            self.kill()  # never leave a QEMU behind
            raise

    def _resume_restored(self, timeout: float) -> None:
        """Run the machine once QEMU has read it back: it was saved paused, and comes back
        paused."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HostVMError("QEMU exited: " + (self.work / "qemu.err").read_text())
            try:
                status = self.monitor_query("info status").strip()
            except OSError:
                status = ""  # the monitor's socket is not there yet
            if status == "VM status: paused":  # not "paused (inmigrate)": read back
                self.monitor_query("cont")
                return
            if status == "VM status: running":
                return
            time.sleep(1)
        raise HostVMError(f"the saved machine was not read back within {timeout:.0f} s")

    def sync_clock(self) -> None:
        """Set the host's clock to this machine's: a restored machine's clock stands where it
        was saved. (Its own guests' clocks are not set: the tests stamp nothing in them.)"""
        self.ssh(f"date -s @{time.time():.3f} >/dev/null", timeout=60)

    def save(self, out: Path) -> None:
        """Save the running machine into `out`: its RAM and devices (`state`, QEMU's migration
        stream through exec:, as this QEMU has no file: migration) and its disk as it stands
        (`disk.qcow2`, an overlay on the cached image). The machine is paused meanwhile, so
        the two agree, and then goes on."""
        out.mkdir(parents=True, exist_ok=True)
        self.monitor_query("stop")
        try:
            self.monitor_query(f'migrate "exec:cat > {out / "state"}"', timeout=1800)
            status = self.monitor_query("info migrate")
            if "Migration status: completed" not in status:
                raise HostVMError("saving the machine failed:\n" + status)
            shutil.copyfile(self.work / "overlay.qcow2", out / "disk.qcow2")
        finally:
            self.monitor_query("cont")

    def _link_args(self) -> list[str]:
        """The link between host VMs: UDP datagrams between two ports on 127.0.0.1, so either
        VM may start first."""
        if self.link is None:
            return []
        here, there = self.link
        return [
            *("-netdev", f"socket,id=net1,udp=127.0.0.1:{there},localaddr=127.0.0.1:{here}"),
            *("-device", f"virtio-net-pci,netdev=net1,mac={self.link_mac}"),
        ]

    @property
    def link_mac(self) -> str:
        """The link NIC's MAC, one of each VM's own (from its port)."""
        port = self.link[0] if self.link else 0
        return f"52:54:00:99:{port >> 8 & 0xFF:02x}:{port & 0xFF:02x}"

    def link_address(self, address: str) -> None:
        """Give the link's NIC an address (a /24) in the VM."""
        self.ssh(
            f"nic=$(ip -o link | awk -F': ' '/{self.link_mac}/ {{print $2}}'); "
            f"ip address replace {address}/24 dev $nic && ip link set $nic up"
        )

    def _watch_boots(self, process: subprocess.Popen, watch: BootWatch, every: float = 2) -> None:
        """Reset the VM when a boot stalls (see BootWatch), the first boot or a reboot: the
        playbook or the test waiting for it then sees a slower boot, not a dead host."""
        offset = 0
        while process.poll() is None:
            try:
                with self.console.open("rb") as console:
                    console.seek(offset)
                    new = console.read()
            except OSError:
                new = b""
            offset += len(new)
            if watch.observe(new, time.monotonic()):
                tail = self.console.read_bytes()[-300:].decode(errors="replace").splitlines()
                line = f"{time.strftime('%H:%M:%S')} boot {watch.why}, reset; console ended: " + (
                    tail[-1] if tail else "(nothing)"
                )
                self.resets.append(line)
                with (self.work / "boot-resets.log").open("a") as log:
                    log.write(line + "\n")
                self.monitor_command("system_reset")
            time.sleep(every)

    def _boot_args(self) -> list[str]:
        return ["-kernel", str(self.image / "grub.lnx")]  # GRUB reads the disk's grub.cfg

    def _wait_for_ssh(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        resets = 0
        while time.monotonic() < deadline:
            if len(self.resets) > resets:  # a reset boot gets the whole timeout again
                resets, deadline = len(self.resets), time.monotonic() + timeout
            if self.process.poll() is not None:
                raise HostVMError("QEMU exited: " + (self.work / "qemu.err").read_text())
            if self.watch.failure:
                raise HostVMError(
                    f"the boot failed: {self.watch.failure}; the console's end "
                    f"({self.console}):\n" + self.console_text(40)
                )
            try:
                if self.ssh("true", check=False, timeout=20).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass  # QEMU accepts the forwarded port before sshd answers
            time.sleep(3)
        raise HostVMError(
            f"no SSH within {timeout:.0f} s; console in {self.console}"
            + "".join("\n" + line for line in self.resets)
        )

    def ssh(self, command: str, check: bool = True, timeout: float = 600, input: str | None = None):
        to_host = ["-p", str(self.port), "root@127.0.0.1"]
        return subprocess.run(
            ["ssh", *self.ssh_options(), *self.shared_options(), *to_host, command],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def hold_static_keys(self) -> None:
        """Start hold_static_keys.py on the host as a service, before any guest starts.

        This QEMU's multi-threaded TCG does not reliably show one vCPU's code writes to the
        others. When a static key flips, Linux rewrites the instructions that test it while
        other CPUs may be running them, and under TCG a vCPU then spun there for good: the host
        hung, soft lockups on every CPU, in KVM's interrupt delivery (__apic_accept_irq) or in
        __schedule, soon after a nested guest started or stopped, which flips KVM's keys; and
        it stopped answering the moment a cfs quota was applied while the workload ran, which
        flips CFS bandwidth control's key.
        """
        script = (Path(__file__).parent / "hold_static_keys.py").read_text()
        unit = HOLD_STATIC_KEYS_UNIT.format(quota=100 * self.cpus, last_cpu=self.cpus - 1)
        self.ssh("cat > /usr/local/sbin/hold-static-keys", input=script)
        self.ssh("cat > /etc/systemd/system/hold-static-keys.service", input=unit)
        start = self.ssh(HOLD_STATIC_KEYS_START, check=False, timeout=120)
        if start.returncode != 0:
            raise HostVMError("hold-static-keys did not start:\n" + start.stdout + start.stderr)
        quota, cpus, online = start.stdout.split("\n")[:3]
        if quota.startswith("max") or cpus != f"0-{self.cpus - 1}":
            raise HostVMError(f"hold-static-keys holds no quota or cpuset: {start.stdout!r}")
        if online != cpus:
            raise HostVMError(f"the host's CPUs are not all back online: {online}")

    def hold_tracepoints(self, others_offline: bool) -> None:
        """Keep the tracepoints a traced run enables (HELD_TRACEPOINTS) enabled twice over, in
        two ftrace instances of the test's own that record nothing, for as long as the host
        runs: the run's trace then adds a third user and takes it away, and no code changes.

        A tracepoint's first user flips its static key and its second changes its static call,
        both rewrites of the code that runs it. Under TCG a traced run's rewrite while the
        nested guests ran panicked the host twice (an int3 left in __schedule and in
        svm_vcpu_run, "Oops: int3"). `others_offline`: rewrite with one CPU online, as
        hold_static_keys does; a restored host has its paused guests pinned, whose CPUs must
        stay online, and is rewritten while idle instead."""
        script = HOLD_TRACEPOINTS.format(events=" ".join(HELD_TRACEPOINTS))
        if others_offline:
            script = f"{OTHERS_OFFLINE}\nothers 0\n({script})\nheld=$?\nothers 1\nexit $held"
        held = self.ssh(script, check=False, timeout=120)
        if held.returncode != 0:
            raise HostVMError("the tracepoints could not be held:\n" + held.stdout + held.stderr)

    def shared_options(self) -> list[str]:
        """The test's commands share one SSH connection to the host while they follow each
        other: each new one costs about 2 s of handshake under TCG. It ends 10 s after the last
        command, so a host that reboots (in a playbook, which takes minutes) is never asked
        through a connection from before. Ansible shares its own (inventory)."""
        path = f"{self.work}/ssh-%C"
        if len(path) > 100:  # a Unix socket's path: 108 bytes at most
            return []
        return ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", "ControlPersist=10"]

    def ssh_options(self) -> list[str]:
        return [
            "-i",
            str(self.key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            # Generous: while nested guests boot, TCG keeps this host's CPUs very busy.
            "-o",
            "ConnectTimeout=60",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=8",
            "-o",
            "BatchMode=yes",
        ]

    def inventory(self, path: Path, group: str) -> Path:
        """A one-host inventory for ansible-playbook."""
        path.write_text(
            json.dumps(
                {
                    group: {
                        "hosts": {
                            "testhost": {
                                "ansible_host": "127.0.0.1",
                                "ansible_port": self.port,
                                "ansible_user": "root",
                                "ansible_ssh_private_key_file": str(self.key),
                                "ansible_ssh_common_args": " ".join(self.ssh_options()[2:]),
                                # the key the guests trust: make run reaches the neighbour
                                # VMs with it, reading only the inventory
                                "hvbench_ssh_public_key_file": str(self.key.with_suffix(".pub")),
                                # Ansible's default without -C: over this local link,
                                # compressing the bundle's wheels only costs the emulated
                                # host CPU time to inflate them
                                "ansible_ssh_args": "-o ControlMaster=auto -o ControlPersist=60s",
                            }
                        }
                    }
                }
            )
        )
        return path

    def console_tail(self, lines: int = 60) -> str:
        """The end of the serial console, for failure messages. When SSH does not answer, the
        kernel is first asked (sysrq) for every CPU's backtrace and the blocked tasks."""
        try:
            if self.ssh("true", check=False, timeout=30).returncode != 0:
                self.sysrq("l")
                self.sysrq("w")
                time.sleep(5)
                lines = 300
        except subprocess.TimeoutExpired:
            pass
        return "\n".join([*self.resets, self.console_text(lines)])

    def console_text(self, lines: int) -> str:
        """The serial console's last `lines` lines."""
        try:
            text = self.console.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])

    def sysrq(self, key: str) -> None:
        """Press Alt+SysRq+key on the host's keyboard."""
        self.monitor_command(f"sendkey alt-sysrq-{key}")

    def monitor_command(self, command: str) -> None:
        """Give QEMU's human monitor one command."""
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.monitor))
            s.sendall(f"{command}\n".encode())
            time.sleep(0.5)

    def monitor_query(self, command: str, timeout: float = 60) -> str:
        """Give QEMU's human monitor one command and return what it answered (up to its next
        prompt)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.monitor))
            answer = self._read_to_prompt(s)  # the banner
            s.sendall(f"{command}\n".encode())
            answer = self._read_to_prompt(s)
        # the monitor echoes the command with terminal escapes before answering
        return answer.split("\r\n", 1)[-1].removesuffix("(qemu) ")

    @staticmethod
    def _read_to_prompt(s: socket.socket) -> str:
        data = b""
        while not data.endswith(b"(qemu) "):
            chunk = s.recv(65536)
            if not chunk:
                raise HostVMError("QEMU's monitor closed: " + data.decode(errors="replace"))
            data += chunk
        return data.decode(errors="replace")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()

    def stop(self) -> None:
        """The end of the VM: its overlay is thrown away, so nothing needs shutting down
        cleanly. A poweroff took more than 60 s under TCG with nested guests running, and was
        then killed anyway: a minute at the end of each module."""
        self.kill()

    def __enter__(self) -> HostVM:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ControllerSSH:
    """This machine (the controller) reached over SSH, as a testbed reaches its guests: a
    private sshd on 127.0.0.1, a child of the test with its own host key, configuration and
    authorized key, stopped at the end. The KVM module runs the guest roles and the workload
    here: a JVM and PyFlink under TCG took minutes where this machine takes seconds, and the
    parts still start, run and come back over SSH."""

    def __init__(self, work: Path, key: Path) -> None:
        self.work, self.key = work, key
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        host_key = self.work / "ssh_host_ed25519_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True
        )
        authorized = self.work / "authorized_keys"
        authorized.write_text(self.key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        config = self.work / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {authorized}\nPidFile {self.work / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "Subsystem sftp internal-sftp\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        self.process = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / "sshd.log", "wb"),  # noqa: SIM115 — sshd's until it stops
        )
        deadline = time.monotonic() + timeout
        while self.run("true", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise HostVMError("the controller's sshd did not answer: " + self.log())
            time.sleep(0.5)

    def log(self) -> str:
        return (self.work / "sshd.log").read_text(errors="replace")[-2000:]

    def ssh_options(self) -> list[str]:
        return [
            *("-i", str(self.key), "-o", "StrictHostKeyChecking=no"),
            *("-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"),
        ]

    def run(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", *self.ssh_options(), "-p", str(self.port), "root@127.0.0.1", command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def inventory_host(self, **host_vars) -> dict:
        """This machine as an inventory host, reached through the private sshd."""
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": " ".join(self.ssh_options()[2:]),
            # the distribution's Python for Ansible's modules: a shell here may put other
            # Pythons first on the PATH (pyenv's shims), which discovery would pick
            "ansible_python_interpreter": "/usr/bin/python3",
            **host_vars,
        }

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


PLAYBOOK_TIMEOUT_S = 1800


def text_of(output: bytes | str | None) -> str:
    """A stopped process's output as TimeoutExpired holds it (bytes even in text mode)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def run_playbook(
    vm: HostVM, inventory: Path, extra: Path, name: str, *extra_args: str
) -> tuple[int, str, dict]:
    """ansible-playbook playbooks/<name> against the host VM: exit code, output (with the end
    of the host's console when it failed) and the recap's counts for the host."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_TIMEOUT": "60",  # the host is slow to answer while its guests boot
        # the slowest tasks' times at the output's end: where a slow test spends its minutes
        # (the summary only: the tests read the output above it)
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
        "PROFILE_TASKS_SUMMARY_ONLY": "true",
        "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "30",
    }
    command = ["ansible-playbook", "-i", str(inventory), "-e", f"@{extra}", *extra_args,
               f"playbooks/{name}"]  # fmt: skip
    try:
        # Ansible refuses a non-blocking stdin, which the test's own may be
        proc = subprocess.run(
            command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=PLAYBOOK_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as stopped:
        # what it printed until then says which task it was in
        proc = subprocess.CompletedProcess(
            command,
            -1,
            text_of(stopped.stdout),
            text_of(stopped.stderr) + f"\nstopped: still running after {PLAYBOOK_TIMEOUT_S} s\n",
        )
    recap = re.search(r"testhost\s+:\s+(.*)", proc.stdout)
    counts = dict(re.findall(r"(\w+)=(\d+)", recap.group(1))) if recap else {}
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        out += "\n--- host console ---\n" + vm.console_tail()
    runs = sorted(vm.work.glob("playbook-*.log"))
    (vm.work / f"playbook-{len(runs) + 1:02d}-{name.removesuffix('.yml')}.log").write_text(out)
    return proc.returncode, out, {k: int(v) for k, v in counts.items()}
