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

A tracepoint is a static key too, and each of its call sites is rewritten when the first tracer
enables it and when the last one disables it: a TRACE=1 run on KVM (hvbench-agent trace) turns
on sched_switch, sched_wakeup, kvm_entry and kvm_exit at its start and off at its end. In a
CI run under load a vCPU thread of the host then hit the int3 of an already finished rewrite in
svm_vcpu_run (Oops: int3, kernel panic). A tracefs instance of the holder's own keeps those
four enabled, its recording off, so the runs' tracers only add to what is on.
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
HELD_INSTANCE = "/sys/kernel/tracing/instances/hold-static-keys"
# the events hvbench-agent's traces enable (hvbench_agent.trace EVENTS and KVM_EVENTS)
HELD_EVENTS = ("sched/sched_switch", "sched/sched_wakeup", "kvm/kvm_entry", "kvm/kvm_exit")


def notify_ready() -> None:
    address = os.environ["NOTIFY_SOCKET"]
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.send(b"READY=1")


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def hold_tracepoints() -> None:
    """The traced events enabled in an instance of the holder's own, which records nothing."""
    os.makedirs(HELD_INSTANCE, exist_ok=True)  # mkdir in instances/ makes a trace instance
    write(f"{HELD_INSTANCE}/tracing_on", "0")
    write(f"{HELD_INSTANCE}/buffer_size_kb", "4")
    for event in HELD_EVENTS:
        write(f"{HELD_INSTANCE}/events/{event}/enable", "1")


def main() -> None:
    kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
    fcntl.ioctl(vm, KVM_CREATE_IRQCHIP, 0)  # so that each vCPU gets KVM's local APIC
    fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)  # its APIC stays software-disabled, as at reset
    vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 1)
    msrs = bytearray(struct.pack("=IIIIQ", 1, 0, MSR_IA32_APICBASE, 0, APIC_DEFAULT_BASE))
    if fcntl.ioctl(vcpu, KVM_SET_MSRS, msrs, True) != 1:
        raise SystemExit("KVM refused to disable the second vCPU's APIC")
    hold_tracepoints()
    notify_ready()
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
