"""A QEMU guest that plays the bare-metal host in the provisioning tests.

These machines cannot run a stock kernel under their /dev/kvm, so the "host" runs under TCG
(`-cpu max`: its emulated SVM lets KVM start guests inside it). Its disk is a Debian image built
with mmdebstrap from the distribution's mirror, cached by the hash of everything that goes into
it; each boot writes to a throw-away overlay, so every test starts from the same host.

The image already holds the packages the kvm_host role and the guest roles install with apt:
unpacking them under TCG takes many minutes, and each role's apt task is the same task either
way (it then reports "ok").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
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
    "cpufrequtils",
]
# What the guest roles (kafka, flink, producers) install with apt: in the tests the host VM
# itself runs the workload (see test_provision_kvm.py).
GUEST_ROLE_PACKAGES = ["openjdk-17-jre-headless", "python3-venv", "libpython3.11"]
IMAGE_SIZE = "12G"  # sparse: the host keeps guest images too
LAYOUT = 1  # bump when the way the image is made changes


class HostVMError(RuntimeError):
    pass


def image_key(pubkey: str, packages: list[str]) -> str:
    recipe = {"suite": SUITE, "packages": sorted(packages), "pubkey": pubkey, "layout": LAYOUT}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def ssh_key(cache: Path) -> Path:
    key = cache / "id_ed25519"
    if not key.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvbench-test", "-f", str(key)],
            check=True,
        )
    return key


def build_image(cache: Path, packages: list[str] | None = None) -> Path:
    """The host image directory (disk, kernel, initrd), built once per content key."""
    packages = packages or BASE_PACKAGES + ROLE_PACKAGES + GUEST_ROLE_PACKAGES
    key = ssh_key(cache)
    pubkey = key.with_suffix(".pub").read_text().strip()
    out = cache / f"host-{image_key(pubkey, packages)}"
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
            SUITE,
            str(root),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        boot = root / "boot"
        shutil.copy(next(boot.glob("vmlinuz-*")), out / "vmlinuz")
        shutil.copy(next(boot.glob("initrd.img-*")), out / "initrd.img")
        subprocess.run(
            ["mke2fs", "-q", "-t", "ext4", "-d", str(root), str(out / "disk.raw"), IMAGE_SIZE],
            check=True,
        )
    (out / "done").write_text("")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HostVM:
    """Boots the image under TCG with SSH forwarded to 127.0.0.1:<port>."""

    def __init__(self, image: Path, work: Path, cpus: int = 3, memory_mb: int = 6144) -> None:
        self.image, self.work = image, work
        self.cpus, self.memory_mb = cpus, memory_mb
        self.port = free_port()
        self.key = image.parent / "id_ed25519"
        self.process: subprocess.Popen | None = None

    @property
    def console(self) -> Path:
        return self.work / "console.log"

    @property
    def monitor(self) -> Path:
        return self.work / "monitor.sock"

    def start(self, timeout: float = 300) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        overlay = self.work / "overlay.qcow2"
        subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                str(self.image / "disk.raw"),
                str(overlay),
            ],
            check=True,
        )
        self.process = subprocess.Popen(
            [
                "qemu-system-x86_64",
                "-accel",
                "tcg,thread=multi",
                "-cpu",
                "max",
                "-smp",
                str(self.cpus),
                "-m",
                str(self.memory_mb),
                "-kernel",
                str(self.image / "vmlinuz"),
                "-initrd",
                str(self.image / "initrd.img"),
                # npt=0: with nested paging, the first nested guest panicked this host's
                # kernel (stack guard page hit in the vCPU thread) under TCG's emulated SVM
                "-append",
                # vgif=0: twice the host hung with its vCPUs spinning in KVM's interrupt
                # delivery soon after its nested guests started; without virtual GIF, KVM
                # gates interrupts with plain CLGI/STGI, the older path of TCG's SVM
                "root=/dev/vda rw console=ttyS0 net.ifnames=1 kvm_amd.npt=0 kvm_amd.vgif=0 "
                "sysrq_always_enabled=1",
                "-drive",
                f"file={overlay},if=virtio,format=qcow2",
                "-netdev",
                f"user,id=net0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
                "-device",
                "virtio-net-pci,netdev=net0",
                "-display",
                "none",
                "-serial",
                f"file:{self.console}",
                # the human monitor, for sysrq dumps when the host stops answering
                "-monitor",
                f"unix:{self.monitor},server=on,wait=off",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / "qemu.err", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        try:
            self._wait_for_ssh(timeout)
        except BaseException:
            self.kill()  # never leave a QEMU behind
            raise

    def _wait_for_ssh(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HostVMError("QEMU exited: " + (self.work / "qemu.err").read_text())
            try:
                if self.ssh("true", check=False, timeout=20).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass  # QEMU accepts the forwarded port before sshd answers
            time.sleep(3)
        raise HostVMError(f"no SSH within {timeout:.0f} s; console in {self.console}")

    def ssh(self, command: str, check: bool = True, timeout: float = 600):
        return subprocess.run(
            ["ssh", *self.ssh_options(), "-p", str(self.port), "root@127.0.0.1", command],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

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
        try:
            text = self.console.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])

    def sysrq(self, key: str) -> None:
        """Press Alt+SysRq+key on the host's keyboard (through QEMU's monitor)."""
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.monitor))
            s.sendall(f"sendkey alt-sysrq-{key}\n".encode())
            time.sleep(0.5)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.ssh("systemctl poweroff", check=False, timeout=20)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> HostVM:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
