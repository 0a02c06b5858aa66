"""Is a machine ready to measure on? `make check`, and every `make run` before it starts.

Two halves. The agent reads a machine's facts (hvbench_agent.facts.collect_readiness: frequency
governor, turbo, C-states, SMT, irqbalance, isolated CPUs, the TSC's flags and the clock source;
on a Xen host also `xl info`, the cpupools, dom0's vCPU pinning and the guests' tsc_mode; on a
KVM host the QEMU and libvirt versions), here or on a testbed's machine (`hvbench-agent facts
readiness`). `evaluate()` turns facts into checks on the controller.

Each check is pass, fail or n/a (the machine offers no such control, e.g. no cpufreq in a VM)
and required or advised. What is required depends on the machine: a testbed's host is tuned by
make provision, so what provisioning sets is required there; on the bare target (any Linux
machine) only the TSC is. A run on a machine that fails a required check is refused unless
forced (FORCE=1; FORCE_TSC=1 forces the TSC checks), and a forced run's meta.json carries the
failed checks. `make check ENFORCE=1` applies what can be applied: on a testbed, make
provision's tuning (its host_tuning role), on the bare target the run-time settings here
(governor, turbo, irqbalance; until reboot).

    python -m hvbench_harness.readiness check            # this machine (bare)
    python -m hvbench_harness.readiness check --inventory inventory/lab/hosts.yml
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from hvbench_agent import facts as agent_facts
from hvbench_agent import tuning

from hvbench_harness import hardware, playbooks
from hvbench_harness.testbed import TestbedError, resolve

# An idle state whose exit latency is above this counts as deep (C1 takes about 1-2 µs, C1E
# about 10 µs, C6 about 100 µs on Xeons); roles/host_tuning disables them with the same limit.
DEEP_IDLE_US = 10
PASS, FAIL, NA = "pass", "fail", "n/a"


# ---------------------------------------------------------------------------------------------
# evaluate: facts → checks (on the controller)

# role → check → required there. role: bare (this machine as the whole testbed), host (a
# testbed's hypervisor host), guest (a testbed's VM).
REQUIRED = {
    "bare": {"tsc"},
    "host": {"tsc", "governor", "cstates", "irqbalance", "xen_dom0_pinned", "xen_rt_pool"}
    | {"rt_profile"},
    "guest": {"tsc", "rt_profile"},
}


CHECKS = (
    "tsc",
    "clocksource",
    "governor",
    "turbo",
    "cstates",
    "smt",
    "irqbalance",
    "isolated_cpus",
    "rt_profile",
    "xen_dom0_pinned",
    "xen_rt_pool",
    "xen_tsc_mode",
    "energy",
)


def check(name: str, status: str, found, expected: str, role: str) -> dict:
    return {
        "check": name,
        "status": status,
        "required": name in REQUIRED[role],
        "found": found,
        "expected": expected,
    }


def parse_require(text: str | None) -> set[str]:
    """REQUIRE=governor,smt: checks to require beyond the defaults (ValueError if unknown)."""
    names = {n.strip() for n in (text or "").split(",") if n.strip()}
    unknown = sorted(names - set(CHECKS))
    if unknown:
        raise ValueError(
            f"REQUIRE: unknown check(s) {', '.join(unknown)}; valid: {', '.join(CHECKS)}"
        )
    return names


def evaluate(
    facts: dict, role: str, expect: dict | None = None, require: set[str] = frozenset()
) -> list[dict]:
    """The checks of one machine. expect (a Xen host): realtime_domains, realtime_pool.
    require: checks required beyond the role's defaults."""
    checks = _evaluate(facts, role, expect or {})
    for c in checks:
        c["required"] = c["required"] or c["check"] in require
    return checks


def _evaluate(facts: dict, role: str, expect: dict) -> list[dict]:
    checks = [_tsc(facts, role), _clocksource(facts, role), _rt_profile(facts, role)]
    if role == "guest":
        return checks
    xen = facts.get("xen")
    checks += [
        _governor(facts, role),
        _turbo(facts, role),
        _cstates(facts, role),
        _smt(facts, role),
        check(
            "irqbalance",
            PASS if facts["irqbalance"] != "active" else FAIL,
            facts["irqbalance"],
            "not running (interrupts stay where the kernel put them)",
            role,
        ),
        check(
            "isolated_cpus",
            PASS if facts["isolated"] else FAIL,
            facts["isolated"] or "none",
            "the measured CPUs isolated (isolcpus=: roles/rt_profile, docs/rt-profile.md)",
            role,
        ),
    ]
    if xen is not None:
        checks += _xen_checks(xen, role, expect)
    return [*checks, _energy(facts, role)]


def _rt_profile(facts: dict, role: str) -> dict:
    """The real-time profile roles/rt_profile provisioned, read back setting by setting
    (hvbench_agent.rtprofile); n/a where none was provisioned (the bare target, an opt-out)."""
    found = facts.get("rt_profile") or {"provisioned": False}
    expected = "every setting of the real-time profile as provisioned (docs/rt-profile.md)"
    if not found.get("provisioned"):
        return check("rt_profile", NA, "not provisioned here (rt_profile_enabled)", expected, role)
    settings = found["settings"]
    wrong = [f"{name} {s['have']!r} (want {s['want']!r})" for name, s in settings.items()
             if s["ok"] is False]  # fmt: skip
    if wrong:
        return check("rt_profile", FAIL, "; ".join(wrong), expected, role)
    isolated = ",".join(str(c) for c in found["isolated"]) or "none"
    summary = (
        f"{sum(s['ok'] is True for s in settings.values())} settings; isolated CPUs {isolated}"
    )
    return check("rt_profile", PASS, summary, expected, role)


def _energy(facts: dict, role: str) -> dict:
    """Which energy source a run here would sample (hvbench_agent.energy); n/a with the
    reason where there is none (advised only: a run records "not available")."""
    found = facts.get("energy") or {"available": False, "reason": "not collected"}
    expected = "an energy source: RAPL (powercap or perf) or the BMC (IPMI DCMI)"
    if not found["available"]:
        return check("energy", NA, f"none: {found['reason']}", expected, role)
    return check(
        "energy", PASS, f"{found['source']}: {', '.join(found['domains'])}", expected, role
    )


def _tsc(facts: dict, role: str) -> dict:
    missing = {"constant_tsc", "nonstop_tsc"} - set(facts["tsc_flags"])
    return check(
        "tsc",
        FAIL if missing else PASS,
        " ".join(facts["tsc_flags"]) or "no TSC flags",
        "constant_tsc and nonstop_tsc (the stamps are TSC readings)",
        role,
    )


def _clocksource(facts: dict, role: str) -> dict:
    good = {"tsc"} if role != "guest" else {"tsc", "kvm-clock", "xen"}
    source = facts["clocksource"]
    return check(
        "clocksource",
        PASS if source in good else FAIL,
        source,
        " or ".join(sorted(good)) + " (the kernel's timers and sleeps run on it)",
        role,
    )


def _governor(facts: dict, role: str) -> dict:
    xen = facts.get("xen")
    if xen is not None:  # Xen runs the CPUs' frequency, not dom0
        match = re.search(r"\bcpufreq=(\S+)", xen["commandline"])
        found = match.group(1) if match else "Xen's default (ondemand)"
        ok = found.endswith("performance")
        return check("governor", PASS if ok else FAIL, found, "cpufreq=xen:performance", role)
    governors = {g for g in facts["governors"].values() if g is not None}
    if not governors:
        return check("governor", NA, "no cpufreq here", "performance", role)
    status = PASS if governors == {"performance"} else FAIL
    return check("governor", status, ", ".join(sorted(governors)), "performance", role)


def _turbo(facts: dict, role: str) -> dict:
    turbo = facts["turbo"]
    if turbo["intel_pstate_no_turbo"] is not None:
        on = turbo["intel_pstate_no_turbo"] == "0"
    elif turbo["cpufreq_boost"] is not None:
        on = turbo["cpufreq_boost"] == "1"
    else:
        return check("turbo", NA, "no turbo control here", "off", role)
    return check("turbo", FAIL if on else PASS, "on" if on else "off", "off", role)


def _cstates(facts: dict, role: str) -> dict:
    expected = f"no idle state deeper than {DEEP_IDLE_US} µs exit latency in use"
    xen = facts.get("xen")
    if xen is not None:
        match = re.search(r"\bmax_cstate=(\d+)", xen["commandline"])
        ok = match is not None and int(match.group(1)) <= 1
        found = f"max_cstate={match.group(1)}" if match else "no max_cstate on Xen's command line"
        return check("cstates", PASS if ok else FAIL, found, "max_cstate=1 (Xen)", role)
    limit = re.search(r"\b(?:intel_idle|processor)\.max_cstate=([01])\b", facts["cmdline"])
    if limit:
        return check("cstates", PASS, limit.group(0), expected, role)
    idle = facts["idle"]
    deep = [
        s
        for s in idle["states"]
        if s["latency_us"] is not None
        and s["latency_us"] > DEEP_IDLE_US
        and s["disabled_on"] < s["cpus"]
    ]
    if not deep:
        found = "no deep idle states" if idle["states"] else "no cpuidle states"
        return check("cstates", PASS if idle["states"] else NA, found, expected, role)
    names = ", ".join(f"{s['name']} ({s['latency_us']} µs)" for s in deep)
    if role == "bare":  # a run holds /dev/cpu_dma_latency at 0 µs while it runs (CPU_LATENCY)
        return check(
            "cstates", PASS, f"{names} enabled; held off during runs (CPU_LATENCY)", expected, role
        )
    return check("cstates", FAIL, f"{names} enabled", expected, role)


def _smt(facts: dict, role: str) -> dict:
    smt = facts["smt"]
    if smt["active"] is None:
        return check("smt", NA, "no SMT control here", "off", role)
    on = smt["active"] == "1"
    return check("smt", FAIL if on else PASS, f"active={smt['active']}", "off", role)


def _xen_checks(xen: dict, role: str, expect: dict) -> list[dict]:
    unpinned = [v for v in xen["dom0_vcpus"] if not re.fullmatch(r"\d+", v["hard"])]
    checks = [
        check(
            "xen_dom0_pinned",
            PASS if xen["dom0_vcpus"] and not unpinned else FAIL,
            ", ".join(f"vCPU {v['vcpu']}→{v['hard']}" for v in xen["dom0_vcpus"]) or "unknown",
            "each dom0 vCPU pinned to one CPU (dom0_vcpus_pin)",
            role,
        )
    ]
    domains, pool = expect.get("realtime_domains") or [], expect.get("realtime_pool")
    if pool:
        pools = {p["name"]: p for p in xen["cpupools"]}
        found_pool = pools.get(pool)
        in_pool = {d: (xen["domains"].get(d) or {}).get("pool") for d in domains}
        ok = found_pool is not None and all(found == pool for found in in_pool.values())
        checks.append(
            check(
                "xen_rt_pool",
                PASS if ok else FAIL,
                "; ".join(
                    f"{p['name']}: {p['sched']} on {p.get('cpu_list', p['cpus'])}"
                    for p in xen["cpupools"]
                )
                + "".join(f"; {d} in {found}" for d, found in in_pool.items()),
                f"cpupool {pool} holding {', '.join(domains) or 'the real-time VMs'}",
                role,
            )
        )
    modes = {name: d["tsc_mode"] for name, d in xen["domains"].items()}
    emulated = [n for n, m in modes.items() if m in ("always_emulate", "emulate")]
    checks.append(
        check(
            "xen_tsc_mode",
            FAIL if emulated else PASS,
            ", ".join(f"{n}: {m}" for n, m in sorted(modes.items())) or "no guests",
            "the guests read the TSC natively (tsc_mode default or native)",
            role,
        )
    )
    return checks


def failed_required(checks: list[dict]) -> list[dict]:
    return [c for c in checks if c["required"] and c["status"] == FAIL]


def is_forced(c: dict, force: bool, force_tsc: bool) -> bool:
    return force or (force_tsc and c["check"] == "tsc")


def table(results: dict[str, list[dict]]) -> str:
    """A plain-text table: one line per machine and check (FAIL: a required check failed;
    warn: an advised one)."""
    lines = []
    for machine, checks in results.items():
        for c in checks:
            level = "required" if c["required"] else "advised"
            mark = {PASS: "ok  ", FAIL: "FAIL" if c["required"] else "warn", NA: "n/a "}[
                c["status"]
            ]
            lines.append(f"{mark} {machine:<28} {c['check']:<16} {level:<9} {c['found']}")
            if c["status"] == FAIL:
                lines.append(f"{'':5}{'':<28} {'':<16} {'':<9} expected: {c['expected']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# applying what can be applied here (the bare target; a testbed's is make provision's tuning)


# ---------------------------------------------------------------------------------------------
# on the controller: the machines of a run


def probe_machine(machine) -> dict:
    """A testbed.Machine's readiness facts, from its agent."""
    proc = machine.run(machine.agent("facts", "readiness"), root=True, timeout=180)
    return json.loads(proc.stdout)["readiness"]


def check_testbed(
    testbed, require: set[str] = frozenset()
) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """(checks, facts) of a testbed.Testbed's hosts and guests, by machine name."""
    facts, results = {}, {}
    for host in testbed.each_host():
        expect = {}
        if host.realtime_pool:  # Xen: the VMs must be in their cpupool
            expect = {
                "realtime_domains": list(host.realtime_domains),
                "realtime_pool": host.realtime_pool,
            }
        name = host.machine.name
        facts[name] = probe_machine(host.machine)
        results[name] = evaluate(facts[name], "host", expect, require)
    for guest in (*testbed.messaging_vms, *testbed.realtime_vms):
        if guest.name not in facts:
            facts[guest.name] = probe_machine(guest)
            results[guest.name] = evaluate(facts[guest.name], "guest", require=require)
    return results, facts


def check_here(require: set[str] = frozenset()) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    found = agent_facts.collect_readiness()
    return {"this machine": evaluate(found, "bare", require=require)}, {"this machine": found}


# the checks a run's power policy settles itself (GOVERNOR=, TURBO=, MAX_CSTATE=)
SET_BY_POLICY = {"governor": "governor", "turbo": "turbo", "max_cstate": "cstates"}


def set_by_run(results: dict[str, list[dict]], policy: dict) -> None:
    """A check the run's power policy sets is not required: the run applies the setting and
    records its readback (meta.json `power`)."""
    settled = {SET_BY_POLICY[k]: f"{k.upper()}={v}" for k, v in policy.items()}
    for checks in results.values():
        for c in checks:
            if c["check"] in settled:
                c["required"], c["set_by_run"] = False, settled[c["check"]]


def verdict(results: dict[str, list[dict]], force: bool, force_tsc: bool) -> dict:
    """For meta.json: every check, the required ones that failed (each says whether it was
    forced), and whether the run must be refused (a failed required check not forced)."""
    failed = [
        {"machine": machine, **c, "forced": is_forced(c, force, force_tsc)}
        for machine, checks in results.items()
        for c in failed_required(checks)
    ]
    return {
        "checks": results,
        "failed_required": failed,
        "forced": any(f["forced"] for f in failed),
        "refused": any(not f["forced"] for f in failed),
    }


def refusal(verdict_doc: dict) -> str:
    lines = [
        f"{f['machine']}: {f['check']} is {f['found']}; expected {f['expected']}"
        for f in verdict_doc["failed_required"]
        if not f["forced"]
    ]
    return (
        "the machine is not ready to measure on (make check says more):\n  "
        + "\n  ".join(lines)
        + "\nmake check ... ENFORCE=1 applies the tuning; FORCE=1 runs anyway and records the "
        "failed checks (FORCE_TSC=1 forces only the TSC)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvbench check", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["check"])
    p.add_argument("--inventory", help="a testbed's inventory (default: this machine)")
    p.add_argument("--enforce", action="store_true", help="apply what can be applied first")
    p.add_argument("--require", help="checks to require beyond the defaults: governor,smt,...")
    p.add_argument("--out", help="also write the checks here (JSON)")
    args = p.parse_args(argv)
    return run_check(args)


def run_check(args: argparse.Namespace) -> int:
    """make check: print every check; exit 1 if a required one (or a hardware check) fails."""
    try:
        require = parse_require(args.require)
        results, hardware_failed = (
            check_inventory(args.inventory, args.enforce, require)
            if args.inventory
            else (check_here_enforced(args.enforce, require), [])
        )
    except (ValueError, TestbedError) as e:
        print(f"make check: {e}", file=sys.stderr)
        return 1
    if results:
        print(table(results))
    failed = [c for checks in results.values() for c in failed_required(checks)]
    if args.out:
        Path(args.out).write_text(json.dumps(verdict(results, False, False), indent=1) + "\n")
    if hardware_failed:
        print(f"{len(hardware_failed)} hardware check(s) failed: the fixes are above")
    print(summary(results, failed))
    return 1 if failed or hardware_failed else 0


def summary(results: dict[str, list[dict]], failed: list[dict]) -> str:
    if not results:  # a testbed's hosts before make provision: their hardware only
        return "the tuning checks come once make provision has run"
    if failed:
        refused = "make run refuses to run here unless FORCE=1"
        return f"{len(failed)} required check(s) failed; {refused}"
    return "every required check passed"


def check_here_enforced(enforce: bool, require: set[str]) -> dict[str, list[dict]]:
    if enforce:
        print("\n".join(tuning.enforce_here()) or "nothing to apply here")
    return check_here(require)[0]


def check_inventory(
    inventory: str, enforce: bool, require: set[str]
) -> tuple[dict[str, list[dict]], list[dict]]:
    """A testbed's hosts: their hardware first (before provisioning too), then, once make
    provision has run, the tuning of the hosts and guests."""
    hosts = hardware.read_hosts(inventory)
    print(hardware.table(hosts))
    if not all(h.provisioned for h in hosts) and not enforce:
        return {}, hardware.failed(hosts)
    with tempfile.TemporaryDirectory() as tmp:
        testbed = resolve(inventory, Path(tmp) / "testbed.json")
    if enforce:
        print(enforce_testbed(inventory))
    return check_testbed(testbed, require)[0], hardware.failed(hosts)


def enforce_testbed(inventory: str) -> str:
    """make provision's tuning (roles/host_tuning) on the testbed's host, through Ansible."""
    proc = playbooks.play(inventory, "provision.yml", "--tags", "tuning")
    if proc.returncode != 0:
        raise SystemExit(f"make check: applying the tuning failed:\n{proc.stdout[-3000:]}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "tuning applied"


if __name__ == "__main__":
    sys.exit(main())
