"""Keeps the static keys that the KVM test would flip switched on in the host VM for as long
as it runs (see HostVM.hold_static_keys). Runs on the host VM as a systemd service, with its
python3 alone.

Linux rewrites its own code when a static key flips between off and on. KVM flips three of them
whenever the first VM starts or the last one stops: the scheduler's preempt notifiers, and the
local APIC's "software disabled" and "hardware disabled" keys, which every interrupt delivered
to a guest tests. One idle VM that never runs, with one vCPU whose APIC is software-disabled (as
at reset) and one whose APIC is hardware-disabled, keeps all three on, so starting and stopping
the real guests no longer rewrites code.

Two more keys guard code every CPU runs all the time: CFS bandwidth control (flipped by the
first and the last cgroup with a cpu.max quota, that is by each cfs setting the test applies
and resets) and cpusets (flipped by the first and the last cpuset cgroup, that is by the first
guest libvirt starts and the last it stops). The service's unit holds those two: a CPU quota
and a cpuset of its own.
"""

import fcntl
import os
import signal
import socket
import struct

KVM_CREATE_VM = 0xAE01
KVM_CREATE_IRQCHIP = 0xAE60
KVM_CREATE_VCPU = 0xAE41
KVM_SET_MSRS = 0x4008AE89  # _IOW(KVMIO, 0x89, struct kvm_msrs)
MSR_IA32_APICBASE = 0x1B
APIC_DEFAULT_BASE = 0xFEE00000  # without the enable bit (0x800): hardware-disabled


def notify_ready() -> None:
    address = os.environ["NOTIFY_SOCKET"]
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.send(b"READY=1")


def main() -> None:
    kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
    fcntl.ioctl(vm, KVM_CREATE_IRQCHIP, 0)  # so that each vCPU gets KVM's local APIC
    fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)  # its APIC stays software-disabled, as at reset
    vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 1)
    msrs = bytearray(struct.pack("=IIIIQ", 1, 0, MSR_IA32_APICBASE, 0, APIC_DEFAULT_BASE))
    if fcntl.ioctl(vcpu, KVM_SET_MSRS, msrs, True) != 1:
        raise SystemExit("KVM refused to disable the second vCPU's APIC")
    notify_ready()
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
