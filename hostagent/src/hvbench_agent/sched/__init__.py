"""Scheduler settings, one interface over three backends (see base.py)."""

from .base import (
    BACKEND_OF_TARGET,
    PARAM_NAMES,
    SCHEDULERS,
    Refused,
    Scheduler,
    Setting,
    suggest,
    validate,
)

__all__ = [
    "BACKEND_OF_TARGET",
    "PARAM_NAMES",
    "SCHEDULERS",
    "Refused",
    "Scheduler",
    "Setting",
    "guest_scheduler",
    "suggest",
    "validate",
]


def guest_scheduler(backend: str, domains: list[str], pool: str | None = None):
    """The scheduler of a hypervisor host for its real-time VMs (one or more): kvm (their vCPU
    threads) or xen (the domains in their cpupool). apply and read give one readback per
    domain, in the order given."""
    if backend == "kvm":
        from .kvm import KvmScheduler

        return KvmScheduler(domains)
    if backend == "xen":
        from .xen import DEFAULT_POOL, XenScheduler

        return XenScheduler(domains, pool or DEFAULT_POOL)
    raise Refused(f"no guest scheduler for backend {backend!r}; valid: kvm, xen")
