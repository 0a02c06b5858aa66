"""`hvbench-agent`: what the harness and the playbooks ask of a host or guest.

    hvbench-agent sched validate|check|apply|read|reset --backend kvm|xen --domain NAME
                  [--domain NAME ...] [--pool POOL] [--sched S] [--budget US] [--period US]
                  [--priority N] [--extratime 0|1] [--weight W] [--cap C]
                  [--tslice US] [--ratelimit US]
    hvbench-agent xen prove --sched rtds credit credit2
    hvbench-agent xen pool --pool POOL --sched S [--cpus 2,3]
    hvbench-agent xen pool-destroy --pool POOL
    hvbench-agent facts host versions readiness [--model DIR]
    hvbench-agent tether -- COMMAND [ARG ...]
    hvbench-agent trace --backend kvm|xen --domain NAME --out FILE [--clock-of DOMAIN]
    hvbench-agent noise --seconds S --csv FILE
    hvbench-agent domains read|hold --backend kvm|xen --domain NAME [--domain NAME ...]
                  [--state absent|shutdown|paused|running]
    hvbench-agent energy [--period-s S]      (until standard input closes; `mark NAME` lines)
    hvbench-agent power check|apply|read|restore [--governor G] [--max-cstate N] [--turbo on|off]
                  (restore: apply's `before`, as JSON on standard input)
    hvbench-agent rt-profile apply|read     (the profile roles/rt_profile provisioned here)

Output is JSON on standard output. A refused setting or action exits 2 with the reason on
standard error; nothing was left changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import facts, tether
from .names import BadName, check_name
from .sched import PARAM_NAMES, Refused, guest_scheduler, validate

SCHED_VERBS = ("validate", "check", "apply", "read", "reset")


def setting_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sched", default=None)
    for field in PARAM_NAMES:
        flag = "--" + field.removesuffix("_us")
        parser.add_argument(flag, dest=field, type=int, metavar=PARAM_NAMES[field])


def name_of(what: str):
    """An argparse type: a domain or pool name under the one rule for names (names.py), which
    goes into xl and virsh command lines as root."""

    def check(value: str) -> str:
        try:
            return check_name(value, what)
        except BadName as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return check


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvbench-agent", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sched = sub.add_parser("sched", help="a guest's scheduler setting on a hypervisor host")
    sched.add_argument("verb", choices=SCHED_VERBS)
    sched.add_argument("--backend", required=True, choices=("kvm", "xen"))
    sched.add_argument(
        "--domain", action="append", type=name_of("--domain"), help="once per real-time VM"
    )
    sched.add_argument("--pool", type=name_of("--pool"), help="xen: the domain's cpupool")
    setting_arguments(sched)
    xen = sub.add_parser("xen", help="cpupools on a Xen host")
    xen.add_argument("verb", choices=("prove", "pool", "pool-destroy"))
    xen.add_argument("--pool", type=name_of("--pool"))
    xen.add_argument("--sched", nargs="+", default=["rtds"])
    xen.add_argument("--cpus", help="pool: CPU numbers, e.g. 2,3")
    found = sub.add_parser("facts", help="this machine's facts as JSON")
    found.add_argument("sections", nargs="+", choices=sorted(facts.SECTIONS))
    found.add_argument("--model", help="also the checksum of this model directory")
    sub.add_parser("tether", help="run a command until standard input closes")
    trace = sub.add_parser("trace", help="trace a VM's vCPUs until standard input closes")
    trace.add_argument("--backend", required=True, choices=("kvm", "xen"))
    trace.add_argument("--domain", required=True, type=name_of("--domain"))
    trace.add_argument("--out", required=True, help="where the trace's text goes")
    trace.add_argument(
        "--clock-of",
        type=name_of("--clock-of"),
        help="also how this guest's TSC relates to the host's",
    )
    floor = sub.add_parser("noise", help="the noise floor here: cyclictest, no setting of its own")
    floor.add_argument("--seconds", type=float, required=True)
    floor.add_argument("--csv", required=True, help="where every kept wake-up (µs) goes")
    domains = sub.add_parser("domains", help="neighbour VMs: hold them in a state, read it")
    domains.add_argument("verb", choices=("read", "hold"))
    domains.add_argument("--backend", required=True, choices=("kvm", "xen"))
    domains.add_argument(
        "--domain", action="append", required=True, type=name_of("--domain"), help="once per domain"
    )
    domains.add_argument("--state", help="hold: absent, shutdown, paused or running")
    energy = sub.add_parser("energy", help="sample the energy counters until stdin closes")
    energy.add_argument("--period-s", type=float, default=1.0)
    power = sub.add_parser("power", help="the power policy: governor, idle states, turbo")
    power.add_argument("verb", choices=("check", "apply", "read", "restore"))
    power.add_argument("--governor")
    power.add_argument("--max-cstate", type=int)
    power.add_argument("--turbo")
    profile = sub.add_parser("rt-profile", help="the real-time profile: apply it, read it back")
    profile.add_argument("verb", choices=("apply", "read"))
    return p


def power_command(args: argparse.Namespace) -> dict:
    """check and apply take a policy; apply answers what it found before (for restore) and
    the readback."""
    from . import power

    policy = power.validate_policy(args.governor, args.max_cstate, args.turbo)
    host = power.host_power()
    if args.verb == "check":
        host.check(policy)
        return {"ok": True, "policy": policy.given(), "backend": host.backend}
    if args.verb == "apply":
        if not policy.given():
            raise Refused("apply needs --governor, --max-cstate or --turbo")
        before = host.snapshot()
        try:
            return {"policy": policy.given(), "before": before, "readback": host.apply(policy)}
        except Refused:
            host.restore(before)
            raise
    if args.verb == "restore":
        host.restore(json.load(sys.stdin))
    return {"readback": host.read()}


def rt_profile_command(args: argparse.Namespace) -> dict:
    from . import rtprofile

    config = rtprofile.load_config()
    if args.verb == "read":
        return rtprofile.read(config)
    if config is None:
        raise Refused(f"no real-time profile provisioned here ({rtprofile.CONFIG} is absent)")
    return rtprofile.apply(config)


def domains_command(args: argparse.Namespace) -> dict:
    """Each domain held in the state (hold), or as it is (read): the hypervisor's readback."""
    from . import domains

    if args.verb == "hold":
        if not args.state:
            raise Refused("hold needs --state")
        return {"domains": [domains.hold(args.backend, d, args.state) for d in args.domain]}
    return {"domains": [domains.read(args.backend, d) for d in args.domain]}


def sched_command(args: argparse.Namespace) -> dict:
    """validate the setting first (read and reset take none), then the verb on the host."""
    params = {field: getattr(args, field) for field in PARAM_NAMES}
    setting = None
    if args.verb not in ("read", "reset"):
        if args.sched is None:
            raise Refused(f"{args.verb} needs --sched")
        setting = validate(args.backend, args.sched, **params)
    elif args.sched is not None or any(v is not None for v in params.values()):
        raise Refused(f"{args.verb} takes no setting: the domain's own is read or reset")
    if args.verb == "validate":
        return {"setting": setting.describe()}
    if not args.domain:
        raise Refused(f"{args.verb} needs --domain")
    scheduler = guest_scheduler(args.backend, args.domain, args.pool)
    if args.verb == "check":
        scheduler.check(setting)
        return {"ok": True, "setting": setting.describe()}
    if args.verb == "apply":
        return {"setting": setting.describe(), **readbacks(scheduler.apply(setting))}
    if args.verb == "reset":
        scheduler.reset()
    try:
        return readbacks(scheduler.read())
    except Refused:
        if args.verb == "reset":  # the domain has stopped: nothing to read back
            return {"readback": None}
        raise


def readbacks(found: list[dict]) -> dict:
    """The first real-time VM's readback; with several VMs, every one's too, in order."""
    return {"readback": found[0], **({"readbacks": found} if len(found) > 1 else {})}


def xen_command(args: argparse.Namespace) -> dict:
    from .sched import xen

    if args.verb == "prove":
        found = xen.prove(args.sched)
        missing = [s for s, state in found.items() if state != "present"]
        if missing:
            print(json.dumps(found, indent=1))
            raise Refused(
                f"scheduler(s) {', '.join(missing)} missing from this hypervisor "
                "(see roles/xen_host: the hypervisor must be built with them)"
            )
        return found
    pool = args.pool or xen.DEFAULT_POOL
    if args.verb == "pool":
        changed = xen.ensure_pool(pool, args.sched[0], xen.cpu_list(args.cpus or ""))
        return {"changed": changed, "pool": xen.pools()[pool]}
    return {"changed": xen.destroy_pool(pool)}


def noise_command(args: argparse.Namespace) -> dict:
    """cyclictest in a guest whose vCPUs carry the run's setting (the host applied it): the
    probe's thread takes none of its own, and the guest's idle states stay as they are."""
    from . import noise
    from .sched import Setting

    return noise.measure(Setting("none"), args.seconds, Path(args.csv), pm_qos_us=None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tether"]:  # everything after it is the command, flags included
        command = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        if not command:
            print("usage: hvbench-agent tether -- COMMAND [ARG ...]", file=sys.stderr)
            return 2
        return tether.run(command)
    args = parser().parse_args(argv)
    try:
        if args.command == "sched":
            out = sched_command(args)
        elif args.command == "xen":
            out = xen_command(args)
        elif args.command == "trace":
            from . import vmtrace

            return vmtrace.run(args.backend, args.domain, Path(args.out), args.clock_of)
        elif args.command == "noise":
            out = noise_command(args)
        elif args.command == "domains":
            out = domains_command(args)
        elif args.command == "energy":
            from . import energy

            return energy.run(args.period_s)
        elif args.command == "power":
            out = power_command(args)
        elif args.command == "rt-profile":
            out = rt_profile_command(args)
        else:
            out = facts.collect(args.sections, args.model)
    except Refused as e:
        print(f"hvbench-agent: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0
