"""Neighbour VMs on a testbed's host: each held in a state for a run, and read back.

    hvbench-agent domains read --backend kvm --domain hvbench-neighbour-0 ...
    hvbench-agent domains hold --backend xen --state paused --domain hvbench-neighbour-0 ...

States (hvbench_agent.neighbours.VM_STATES, and a load's VM is "running"):
- absent, shutdown: the domain does not run (libvirt: shut off, destroyed if it ran; Xen: no
  such domain, `xl destroy`d if it ran). Stopped hard: a neighbour holds no data, and a clean
  shutdown under emulation takes minutes.
- paused: the domain exists and none of its vCPUs is scheduled (libvirt suspend, `xl pause`).
- running: started or resumed if it was not (libvirt create/resume; `xl create` from its
  configuration in /etc/xen, `xl unpause`). Whether it has booted is the harness's to wait for.

The readback is the hypervisor's own word: libvirt's domain state, or `xl list`'s state
letters; on Xen also the domain's type (pv, pvh, hvm) from `xl list -l`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .sched import xen
from .sched import xl as xl_tool
from .sched.base import Refused
from .sched.xl import xl

HELD = ("absent", "shutdown", "paused", "running")
XEN_CONFIG_DIR = Path("/etc/xen")


def hold(backend: str, name: str, state: str) -> dict:
    """Put one domain in `state`; its readback afterwards."""
    if state not in HELD:
        raise Refused(f"unknown state {state!r}; one of {', '.join(HELD)}")
    (hold_kvm if backend == "kvm" else hold_xen)(name, state)
    return read(backend, name)


def read(backend: str, name: str) -> dict:
    return read_kvm(name) if backend == "kvm" else read_xen(name)


# ---------------------------------------------------------------------------------------------
# KVM: libvirt


def kvm_domain(name: str):
    from .sched.kvm import LIBVIRT_URI, _libvirt

    libvirt, _ = _libvirt()
    try:
        return libvirt, libvirt.open(LIBVIRT_URI).lookupByName(name)
    except libvirt.libvirtError as e:
        raise Refused(f"domain {name}: {e}") from e


def read_kvm(name: str) -> dict:
    libvirt, dom = kvm_domain(name)
    names = {
        libvirt.VIR_DOMAIN_RUNNING: "running",
        libvirt.VIR_DOMAIN_BLOCKED: "running",  # running, its vCPUs waiting
        libvirt.VIR_DOMAIN_PAUSED: "paused",
        libvirt.VIR_DOMAIN_SHUTDOWN: "shutting down",
        libvirt.VIR_DOMAIN_SHUTOFF: "shut off",
        libvirt.VIR_DOMAIN_CRASHED: "crashed",
    }
    from .sched.kvm import vcpu_pins

    state, reason = dom.state()
    active = dom.isActive()
    return {
        "name": name,
        "state": names.get(state, f"libvirt state {state}"),
        "libvirt_state": [state, reason],
        "vcpus": dom.maxVcpus() if active else None,
        "host_cpus": vcpu_pins(dom) if active else None,  # per vCPU, as libvirt pins it
    }


def hold_kvm(name: str, state: str) -> None:
    libvirt, dom = kvm_domain(name)
    try:
        current = dom.state()[0]
        if state in ("absent", "shutdown"):
            if dom.isActive():
                dom.destroy()
            return
        if not dom.isActive():
            dom.create()
        elif current == libvirt.VIR_DOMAIN_PAUSED and state == "running":
            dom.resume()
        if state == "paused" and dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED:
            dom.suspend()
    except libvirt.libvirtError as e:
        raise Refused(f"domain {name}: cannot hold it {state}: {e}") from e


# ---------------------------------------------------------------------------------------------
# Xen: xl


def xen_states(letters: str) -> str:
    """`xl list`'s state column (r, b, p, s, c, d; '-' where not set) as one word."""
    if "p" in letters:
        return "paused"
    if "d" in letters or "s" in letters:
        return "shutting down"
    if "c" in letters:
        return "crashed"
    return "running"  # r (on a CPU), b (blocked) or neither (runnable)


def read_xen(name: str) -> dict:
    listed = xl_tool.run("list", name)
    if listed.returncode != 0:
        return {"name": name, "state": "shut off", "xl_state": None, "type": None}
    row = listed.stdout.strip().splitlines()[-1].split()
    # Name ID Mem VCPUs State Time(s)
    detail = json.loads(xl("list", "-l", name) or "[]")
    c_info = (detail[0].get("config", {}).get("c_info", {})) if detail else {}
    return {
        "name": name,
        "state": xen_states(row[4]),
        "xl_state": row[4],
        "vcpus": int(row[3]),
        "type": c_info.get("type"),  # pv, pvh or hvm, as the hypervisor built the domain
        "pool": xen.domains().get(name, {}).get("pool"),
        "host_cpus": xen.hard_affinity(name),  # per vCPU, its hard affinity
    }


def hold_xen(name: str, state: str) -> None:
    now = read_xen(name)["state"]
    if state in ("absent", "shutdown"):
        if now != "shut off":
            xl("destroy", name)
        return
    if now == "shut off":
        config = XEN_CONFIG_DIR / f"{name}.cfg"
        if not config.exists():
            raise Refused(f"domain {name}: no configuration at {config} (make provision)")
        xl("create", str(config))
        now = "running"
    if state == "running" and now == "paused":
        xl("unpause", name)
    if state == "paused" and now != "paused":
        xl("pause", name)
