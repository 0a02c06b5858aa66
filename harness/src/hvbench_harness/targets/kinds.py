"""What each target is, known before one is chosen: the command line, provisioning, campaigns,
the run registry, reruns, inventories and the host trace ask it here instead of branching on
the target's name. Standard library and the agent's setting table only, so that `hvbench`
starts without loading a target.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvbench_agent.sched import BACKEND_OF_TARGET


@dataclass(frozen=True)
class Kind:
    name: str  # TARGET
    testbed: bool  # its parts run in a provisioned testbed's guests (it needs an inventory)
    inputs: tuple[str, ...]  # the harness's inputs a run there reads (spec.INPUTS' names)
    overhead_s: float  # a run's start and end beside its sending (a campaign's estimate)
    inventory_group: str | None = None  # the inventory's group of its hosts
    guest_uuid: str | None = None  # where a guest reads its UUID (placing a host's trace)
    hypervisor_facts: tuple[str, ...] | None = None  # its facts kept per run (None: all)
    hypervisor_goal: str | None = None  # the make goal that builds its hypervisor here

    @property
    def backend(self) -> str:
        """The agent's scheduler backend that takes the run's setting."""
        return BACKEND_OF_TARGET[self.name]


BARE_INPUTS = ("data", "model", "kafka_libs", "connector_dir")
KINDS = {
    kind.name: kind
    for kind in (
        Kind("bare", testbed=False, inputs=BARE_INPUTS, overhead_s=60.0),
        Kind(
            "kvm", testbed=True, inputs=("inventory",), overhead_s=120.0,
            inventory_group="kvm_hosts", guest_uuid="/sys/class/dmi/id/product_uuid",
        ),
        Kind(
            "xen", testbed=True, inputs=("inventory",), overhead_s=120.0,
            inventory_group="xen_hosts", guest_uuid="/sys/hypervisor/uuid",
            hypervisor_facts=("version", "changeset", "build", "commandline", "scheduler"),
            hypervisor_goal="xen-hypervisor",  # XEN_BUILD=controller: built here, copied
        ),
    )
}  # fmt: skip


def kind(name: str) -> Kind:
    """The target named `name` (spec.py's TARGET has checked it)."""
    return KINDS[name]


def is_testbed(name: str | None) -> bool:
    """Whether `name` names a testbed's hypervisor (kvm, xen): False for bare and for none."""
    found = KINDS.get(name or "")
    return bool(found and found.testbed)
