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


def guest_scheduler(backend: str, domain: str, pool: str | None = None) -> Scheduler:
    """The scheduler of a hypervisor host for one guest: kvm (its vCPU threads) or xen (the
    domain in its cpupool)."""
    if backend == "kvm":
        from .kvm import KvmScheduler

        return KvmScheduler(domain)
    if backend == "xen":
        from .xen import DEFAULT_POOL, XenScheduler

        return XenScheduler(domain, pool or DEFAULT_POOL)
    raise Refused(f"no guest scheduler for backend {backend!r}; valid: kvm, xen")
