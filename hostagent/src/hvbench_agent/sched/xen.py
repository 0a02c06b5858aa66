"""The xen backend: cpupools and scheduler settings for a domain (target xen, the real-time VM).

SCHED=rtds|credit|credit2. BUDGET and PERIOD are in microseconds, as `xl sched-rtds` takes them
and as on the other targets:

- rtds: every vCPU gets BUDGET per PERIOD (PERIOD defaults to 100000), with EXTRATIME 0 or 1
  (default 0). Xen's own default is extratime on, under which a vCPU may run beyond its budget
  when the pool has idle time, so the budget is no limit; with 0 it is one.
  `xl sched-rtds -d DOM -v all -p PERIOD -b BUDGET -e EXTRATIME`: the per-vCPU form, because on
  Xen < 4.22 the domain-wide form does not check budget <= period, and 4.17's xl needs -e there.
- credit, credit2: WEIGHT (1..65535, default 256) and CAP (percent of one physical CPU, 0 = no
  cap, at most 100 × the domain's vCPUs: `xl sched-credit -c 153` is 1.53 CPUs and needs two).
- credit: TSLICE_US (the pool's time slice, whole ms 1..1000, Xen's default 30 ms) and
  RATELIMIT_US (how long a vCPU runs before another may preempt it, 0 or 100..500000 µs and no
  longer than the slice, Xen's default 1000); credit2: RATELIMIT_US. Both belong to the pool,
  not the domain (`xl sched-credit -s -p POOL -t MS -r US`); unset, the pool gets what a new
  pool starts with (the boot parameters sched_credit_tslice_ms and sched_ratelimit_us), so a
  run never inherits the last run's values.

The real-time VM runs in its own cpupool (POOL) whose scheduler is the run's: `apply` re-creates
the pool with that scheduler when it has another one, moves the domain into it and only then
sets the parameters, because moving a domain to another pool resets them. A move also resets
every vCPU's affinity to all CPUs (sched_move_domain), so each vCPU's hard affinity is read
before and pinned again after. Everything is read back from xl afterwards. dom0 stays in Pool-0.

One exception, measured on Xen 4.17.5: a CPU leaving an RTDS pool panics the hypervisor
(FATAL PAGE FAULT in rt.c move_repl_timer, called from rt_deinit_pdata with the CPU's cpupool
already NULL), so an RTDS pool that holds CPUs is never dismantled here. Moving from credit or
credit2 to rtds works; from rtds to another scheduler is refused with that reason: set the
pool's boot scheduler (xen_host_rt_pool_sched) and reboot the host. `pool-destroy` keeps such
a pool too (it goes with the next reboot).

On the host, as root (`hvbench-agent xen ...` and `hvbench-agent sched VERB --backend xen`):
`prove` creates and destroys an empty cpupool with each scheduler (a scheduler
that is not compiled in fails loudly instead of falling back), `pool` makes the real-time pool
(at boot, from hvbench-xen-pool.service), `pool-destroy` removes it, `check` asks whether a
setting can be applied and changes nothing, `apply` applies it and prints the readback, `read`
prints the readback, `reset` puts the scheduler's defaults back.

    hvbench-agent sched apply --backend xen --domain hvbench-realtime --sched rtds --budget 77500

Needs only xl and the standard library.
"""

from __future__ import annotations

import json
import re
import sys
import time

from .base import CREDIT_DEFAULT_WEIGHT, Refused, Setting, check_pool_params
from .xl import cpu_list, parse_colon_list, parse_table, xl

# What a domain starts with, and what `reset` puts back.
DEFAULTS = {
    "rtds": {"period": 10_000, "budget": 4_000, "extratime": 1},
    "credit": {"weight": CREDIT_DEFAULT_WEIGHT, "cap": 0},
    "credit2": {"weight": CREDIT_DEFAULT_WEIGHT, "cap": 0},
}
# The pool-wide parameters of each scheduler, and what Xen gives a new pool unless its boot
# parameters say otherwise (sched_credit_tslice_ms, sched_ratelimit_us; common/sched/core.c).
POOL_PARAMS = {"rtds": (), "credit": ("tslice_us", "ratelimit_us"), "credit2": ("ratelimit_us",)}
BOOT_PARAMS = {
    "tslice_us": ("sched_credit_tslice_ms", 30, 1000),
    "ratelimit_us": ("sched_ratelimit_us", 1000, 1),
}  # option, Xen's default, µs per unit
# Xen programs its timer this far past the earliest deadline (common/timer.c timer_slop, ns).
TIMER_SLOP_DEFAULT_NS = 50_000
DEFAULT_POOL = "hvbench-rt"
HOST_POOL = "Pool-0"
RTDS_CPU_REMOVAL = (
    "Xen 4.17 panics when a CPU leaves an RTDS cpupool (rt.c move_repl_timer), so {pool} "
    "keeps RTDS until the host reboots: set xen_host_rt_pool_sched and reboot it (make "
    "provision, then reboot) to run {sched} there"
)


# ---------------------------------------------------------------------------------------------
# pools and domains, as xl reports them


def pools() -> dict[str, dict]:
    """Every cpupool: its scheduler, CPUs and domains."""
    table = {row["Name"]: row for row in parse_table(xl("cpupool-list"))}
    cpus = {row["Name"]: row.get("CPU_list", "") for row in parse_table(xl("cpupool-list", "-c"))}
    out = {}
    for name, row in table.items():
        out[name] = {
            "sched": row["Sched"],
            "cpus": cpu_list(cpus.get(name, "")),
            "domains": int(row["Domain_count"]),
        }
    return out


def domains() -> dict[str, dict]:
    """Every domain: its id, vCPUs and cpupool (`xl list -c`)."""
    out = {}
    for row in parse_table(xl("list", "-c")):
        out[row["Name"]] = {
            "id": int(row["ID"]),
            "vcpus": int(row["VCPUs"]),
            "pool": row.get("Cpupool"),
        }
    return out


def hard_affinity(name: str) -> dict[int, str]:
    """Each vCPU's hard affinity, as `xl vcpu-list` shows it ("2", "2-3", "all")."""
    pins = {}
    for line in xl("vcpu-list", name).splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 7:
            pins[int(fields[2])] = " ".join(fields[6:]).split("/")[0].strip()
    return pins


def migrate(name: str, pool: str) -> None:
    """Move a domain to another pool, keeping its vCPUs' hard affinity (a move resets it)."""
    pins = hard_affinity(name)
    xl("cpupool-migrate", name, pool)
    for vcpu, cpus in pins.items():
        xl("vcpu-pin", name, str(vcpu), cpus)


def domain(name: str) -> dict:
    found = domains().get(name)
    if found is None:
        raise Refused(f"no domain {name!r} on this host (xl list)")
    return found


# ---------------------------------------------------------------------------------------------
# pools


def prove(scheds: list[str]) -> dict[str, str]:
    """Create and destroy an empty cpupool with each scheduler: "present" or xl's error."""
    result = {}
    for name in scheds:
        pool = f"hvbench-probe-{name}"
        if pool in pools():  # left over from an interrupted proof
            xl("cpupool-destroy", pool)
        try:
            xl("cpupool-create", f'name="{pool}"', f'sched="{name}"')
        except Refused as e:
            result[name] = str(e)
            continue
        xl("cpupool-destroy", pool)
        result[name] = "present"
    return result


def _create_pool(pool: str, sched_name: str, cpus: list[int]) -> None:
    for cpu in cpus:
        if cpu in pools()[HOST_POOL]["cpus"]:
            xl("cpupool-cpu-remove", HOST_POOL, str(cpu))
    cpu_list = ",".join(str(c) for c in cpus)
    xl("cpupool-create", f'name="{pool}"', f'sched="{sched_name}"', f'cpus="{cpu_list}"')


def ensure_pool(pool: str, sched_name: str, cpus: list[int] | None = None) -> bool:
    """Make POOL with the scheduler, keeping its CPUs and domains if it exists with another;
    True when something changed. New pools take CPUS, by default the host's last CPU."""
    existing = pools().get(pool)
    if existing and existing["sched"] == sched_name:
        return False
    if existing and _rtds_with_cpus(existing):
        raise Refused(RTDS_CPU_REMOVAL.format(pool=pool, sched=sched_name))
    if existing:
        members = {n: hard_affinity(n) for n, d in domains().items() if d["pool"] == pool}
        for name in members:
            xl("cpupool-migrate", name, HOST_POOL)
        xl("cpupool-destroy", pool)
        _create_pool(pool, sched_name, existing["cpus"])
        for name, pins in members.items():
            xl("cpupool-migrate", name, pool)
            for vcpu, cpus in pins.items():
                xl("vcpu-pin", name, str(vcpu), cpus)
        return True
    if not cpus:
        cpus = [int(parse_colon_list(xl("info"))["nr_cpus"]) - 1]
    if cpus == pools()[HOST_POOL]["cpus"]:
        raise Refused(f"cpupool {pool} would take all of {HOST_POOL}'s CPUs {cpus}; dom0 needs one")
    _create_pool(pool, sched_name, cpus)
    return True


def _rtds_with_cpus(pool: dict) -> bool:
    return pool["sched"] == "rtds" and bool(pool["cpus"])


def destroy_pool(pool: str) -> bool:
    """Move POOL's domains to Pool-0, destroy it and give its CPUs back to Pool-0. An RTDS
    pool with CPUs stays (see above); its domains still move out."""
    existing = pools().get(pool)
    if not existing:
        return False
    if _rtds_with_cpus(existing):
        for name, d in domains().items():
            if d["pool"] == pool:
                xl("cpupool-migrate", name, HOST_POOL)
        print(f"hvbench-agent: {pool} stays until the next reboot", file=sys.stderr)
        return False
    for name, d in domains().items():
        if d["pool"] == pool:
            xl("cpupool-migrate", name, HOST_POOL)
    xl("cpupool-destroy", pool)
    for cpu in existing["cpus"]:
        xl("cpupool-cpu-add", HOST_POOL, str(cpu))
    return True


# ---------------------------------------------------------------------------------------------
# the pool's scheduler parameters and the hypervisor's timer


def boot_options() -> dict[str, str]:
    """The hypervisor's command line as option → value (`xl info` xen_commandline)."""
    line = parse_colon_list(xl("info")).get("xen_commandline", "")
    return dict(o.partition("=")[::2] for o in line.split())


def boot_pool_params(sched_name: str) -> dict[str, int]:
    """What a new pool with this scheduler starts with, in µs."""
    if not POOL_PARAMS[sched_name]:
        return {}
    options = boot_options()
    out = {}
    for key in POOL_PARAMS[sched_name]:
        option, default, unit_us = BOOT_PARAMS[key]
        out[key] = int(options.get(option, default)) * unit_us
    return out


def parse_pool_params(text: str) -> dict[str, int]:
    """`xl sched-credit -s -p POOL`: "Cpupool P: tslice=30ms ratelimit=1000us
    migration-delay=0us" (credit2: "ratelimit=1000us"), in µs by name."""
    if "[sched params unavailable]" in text:
        raise Refused(f"xl has no scheduler parameters for the pool: {text.strip()}")
    out = {}
    for name, value, unit in re.findall(r"([a-z-]+)=(\d+)(ms|us)", text):
        out[f"{name.replace('-', '_')}_us"] = int(value) * (1000 if unit == "ms" else 1)
    return out


def pool_params(pool: str, sched_name: str) -> dict[str, int]:
    if not POOL_PARAMS[sched_name]:
        return {}
    return parse_pool_params(xl(f"sched-{sched_name}", "-s", "-p", pool))


def wanted_pool_params(setting: Setting) -> dict[str, int]:
    """The pool's parameters a setting asks for: its own, the boot values for the rest."""
    wanted = boot_pool_params(setting.sched)
    for key in wanted:
        if getattr(setting, key) is not None:
            wanted[key] = getattr(setting, key)
    return wanted


def set_pool_params(pool: str, sched_name: str, wanted: dict[str, int]) -> None:
    if not wanted:
        return
    args = ["-t", str(wanted["tslice_us"] // 1000)] if "tslice_us" in wanted else []
    xl(f"sched-{sched_name}", "-s", "-p", pool, *args, "-r", str(wanted["ratelimit_us"]))


def timer_slop() -> dict:
    """Xen's timer slop (a boot parameter, not readable otherwise) and where it came from."""
    given = boot_options().get("timer_slop")
    if given is None:
        return {"ns": TIMER_SLOP_DEFAULT_NS, "from": "Xen's default"}
    return {"ns": int(given), "from": "the hypervisor's command line"}


# ---------------------------------------------------------------------------------------------
# settings


def check(name: str, setting: Setting, pool: str) -> dict:
    """Whether `apply` can work: the domain exists and fits the setting. Changes nothing."""
    dom = domain(name)
    if setting.cap is not None and setting.cap > 100 * dom["vcpus"]:
        raise Refused(
            f"CAP {setting.cap} is more than {name}'s {dom['vcpus']} vCPU(s) can use "
            f"(at most {100 * dom['vcpus']}: 100 per vCPU)"
        )
    existing = pools().get(pool)
    if existing is None:
        raise Refused(f"no cpupool {pool!r} on this host: provision the host (roles/xen_host)")
    if setting.sched != existing["sched"] and _rtds_with_cpus(existing):
        raise Refused(RTDS_CPU_REMOVAL.format(pool=pool, sched=setting.sched))
    wanted = wanted_pool_params(setting)  # the boot values may clash with the setting's own
    check_pool_params(setting.sched, wanted.get("tslice_us"), wanted.get("ratelimit_us"))
    return dom


def apply(name: str, setting: Setting, pool: str) -> dict:
    check(name, setting, pool)
    ensure_pool(pool, setting.sched)
    if domain(name)["pool"] != pool:
        migrate(name, pool)
    set_pool_params(pool, setting.sched, wanted_pool_params(setting))
    _set(name, setting)
    return readback(name)


def _set(name: str, setting: Setting) -> None:
    if setting.sched == "rtds":
        _set_rtds(name, setting)
    else:
        xl(f"sched-{setting.sched}", "-d", name, "-w", str(setting.weight), "-c", str(setting.cap))


def _set_rtds(name: str, setting: Setting) -> None:
    """Extratime switched on while a vCPU has used up its budget breaks RTDS on Xen before
    4.22.0, 4.21.2 and 4.20.4 (a debug build crashes; hvbench's own build carries a fix, see
    roles/xen_host/files/xen-patches). On any hypervisor that case never arises here: a vCPU
    that gets extratime is paused first and stays paused past its deadline, so Xen refills
    its budget when it wakes (rt_unit_wake), before it can be queued."""
    command = (
        "sched-rtds", "-d", name, "-v", "all", "-p", str(setting.period_us),
        "-b", str(setting.budget_us), "-e", str(setting.extratime),
    )  # fmt: skip
    now = parse_table(xl("sched-rtds", "-d", name, "-v", "all"))
    if not setting.extratime or all(r["Extratime"] == "yes" for r in now):
        xl(*command)
        return
    xl("pause", name)
    try:
        xl(*command)
        time.sleep(2 * max(int(r["Period"]) for r in now) / 1e6)
    finally:
        xl("unpause", name)


def reset(name: str) -> dict:
    """The scheduler's defaults for the domain (what it had when it was created), and the
    pool's parameters as a new pool has them."""
    sched_name = _pool_sched(name)
    set_pool_params(domain(name)["pool"], sched_name, boot_pool_params(sched_name))
    d = DEFAULTS[sched_name]
    if sched_name == "rtds":
        setting = Setting(
            "rtds", budget_us=d["budget"], period_us=d["period"], extratime=d["extratime"]
        )
    else:
        setting = Setting(sched_name, weight=d["weight"], cap=d["cap"])
    _set(name, setting)
    return readback(name)


def _pool_sched(name: str) -> str:
    return pools()[domain(name)["pool"]]["sched"]


def readback(name: str) -> dict:
    """What xl reports for the domain: its pool and scheduler, the parameters per vCPU (rtds)
    or per domain (credit, credit2), the pool's own parameters (and what it starts with), its
    tsc_mode, Xen's timer slop, the raw `xl vcpu-list` and `xl cpupool-list -c`, and `xl info`
    (the hypervisor's version, changeset, command line)."""
    dom = domain(name)
    sched_name = _pool_sched(name)
    if sched_name == "rtds":
        rows = parse_table(xl("sched-rtds", "-d", name, "-v", "all"))
        params = {
            "vcpus": [
                {
                    "vcpu": int(r["VCPU"]),
                    "period_us": int(r["Period"]),
                    "budget_us": int(r["Budget"]),
                    "extratime": 1 if r["Extratime"] == "yes" else 0,
                }
                for r in rows
            ]
        }
    else:
        (row,) = parse_table(xl(f"sched-{sched_name}", "-d", name))
        params = {"weight": int(row["Weight"]), "cap": int(row["Cap"])}
    return {
        "domain": name,
        "domid": dom["id"],
        "pool": dom["pool"],
        "sched": sched_name,
        **params,
        "pool_params": pool_params(dom["pool"], sched_name),
        "pool_params_at_boot": boot_pool_params(sched_name),
        "timer_slop": timer_slop(),
        "tsc_mode": tsc_mode(name),
        "vcpu_list": xl("vcpu-list", name),
        "cpupool_list": xl("cpupool-list", "-c"),
        "xl_info": parse_colon_list(xl("info")),
    }


def tsc_mode(name: str) -> str:
    """The domain's tsc_mode as xl created it (`xl list -l`; "default" when not set)."""
    doc = json.loads(xl("list", "-l", name))
    return doc[0]["config"]["b_info"].get("tsc_mode", "default")


def matches(setting: Setting, back: dict) -> bool:
    """Whether a readback shows exactly the setting."""
    if back["sched"] != setting.sched:
        return False
    if setting.sched == "rtds":
        want = (setting.period_us, setting.budget_us, setting.extratime)
        got = {(v["period_us"], v["budget_us"], v["extratime"]) for v in back["vcpus"]}
        return got == {want}
    wanted = wanted_pool_params(setting)
    pool = {key: back["pool_params"].get(key) for key in wanted}
    return (back["weight"], back["cap"], pool) == (setting.weight, setting.cap, wanted)


class XenScheduler:
    """The xen backend for the real-time VMs (domains) and their cpupool: one setting on each
    domain, applied, read back and undone together."""

    backend = "xen"

    def __init__(self, domains: list[str], pool: str = DEFAULT_POOL):
        self.domains = domains
        self.pool = pool

    def check(self, setting: Setting) -> None:
        for name in self.domains:
            check(name, setting, self.pool)

    def apply(self, setting: Setting) -> list[dict]:
        self.check(setting)  # every domain, before any is touched
        backs = []
        try:
            for name in self.domains:
                back = apply(name, setting, self.pool)
                if not matches(setting, back):
                    raise Refused(f"xl reads back something else than was applied: {back}")
                backs.append(back)
        except Refused:
            self.reset()
            raise
        return backs

    def read(self) -> list[dict]:
        return [readback(name) for name in self.domains]

    def reset(self) -> None:
        for name in self.domains:
            reset(name)
