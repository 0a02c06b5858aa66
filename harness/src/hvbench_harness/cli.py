"""`hvbench`: the testbed's tasks as one command; `hvbench VERB --help` for each. Every `make`
target of the same name runs the verb after building what it needs (make help); what a verb
needs for its target (a bare run's inputs, a Xen host's hypervisor), it asks of make (build.py).

    hvbench run SCHED=rtds BUDGET=77500        one run (make help lists the NAME=value words)
    hvbench campaign run campaigns/table4-rtds.yml [--resume]
    hvbench rerun --run RUN_ID                 repeat a run and compare the two
    hvbench rerun --account results/RUN_ID     account a run again from its raw files
    hvbench check [--host H --target T | --inventory DIR] [--enforce]
    hvbench sched apply SCHED=cfs BUDGET=30000 [--host H | --inventory DIR]
    hvbench report --results results --out report
    hvbench model fit --results results/explain-deadline-bare
    hvbench advise --fit results/explain-deadline-bare/model --sched deadline --slo 'p99<=20'
    hvbench provision --host root@lab1 --target xen --guest-bundle build/guest-bundle.tar
    hvbench teardown --host lab1
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from hvbench_agent.sched import PARAM_NAMES, Refused, validate

from hvbench_harness import build, inventory, playbooks
from hvbench_harness.targets.kinds import kind
from hvbench_harness.testbed import TARGETS, TestbedError, inventory_target, setting_options

# Verbs that are a module's own command line: (module, what it does).
MODULE_VERBS = {
    "run": ("hvbench_harness.run", "one run, here (bare) or on a testbed"),
    "campaign": ("hvbench_harness.campaign", "validate or run a campaign file"),
    "rerun": ("hvbench_harness.rerun", "repeat a run and compare; --account: account one again"),
    "report": ("hvbench_analysis.report", "figures and tables from results"),
    "model": ("hvbench_analysis.model", "fit a performance model to runs and validate it"),
    "advise": ("hvbench_harness.advise", "the smallest budget a model predicts meets an SLO"),
    "predict": ("hvbench_harness.predict", "a setting's latencies predicted from a traced run"),
}
PLAYBOOK_VERBS = {
    "check": "is this machine, or a testbed, ready to measure on?",
    "sched": "the real-time VM's scheduler setting on a testbed's host",
    "provision": "make a bare host a KVM or Xen testbed (Ansible)",
    "teardown": "remove a testbed's guests; --purge: all make provision set too (Ansible)",
}
SCHED_ACTIONS = ("check", "apply", "read", "reset")
# make sched's words: SCHED and its parameters, named as make run names them (the agent's table)
SCHED_WORDS = {"SCHED": "sched", **{make: field for field, make in PARAM_NAMES.items()}}


class CliError(RuntimeError):
    pass


def where_arguments(p: argparse.ArgumentParser) -> None:
    """Which testbed: INVENTORY, or a one-off HOST with TARGET (inventory.py)."""
    p.add_argument("--inventory", default=None, help="a directory with hosts.yml, or a file")
    p.add_argument("--host", default=None, help="a one-off host: user@host or host")
    p.add_argument("--target", default=None, choices=TARGETS, help="kvm or xen for --host")


def playbook_parser(verb: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"hvbench {verb}", description=PLAYBOOK_VERBS[verb])
    where_arguments(p)
    if verb == "check":
        p.add_argument("--enforce", action="store_true", help="apply the tuning first")
        p.add_argument("--require", help="checks to require beyond the defaults")
    if verb == "sched":
        p.add_argument("action", choices=SCHED_ACTIONS)
        p.add_argument(
            "setting",
            nargs="*",
            metavar="NAME=value",
            help=f"the setting, as make run takes it: {', '.join(SCHED_WORDS)}",
        )
        p.add_argument("--readback", default="build/sched.json", help="where the readback goes")
    if verb == "provision":
        p.add_argument("--guest-bundle", required=True, help="make guest-bundle's file")
        p.add_argument(
            "--xen-build",
            choices=("controller", "host"),
            default="controller",
            help="where a Xen host's hypervisor is built: here (make xen-hypervisor), or there",
        )
        p.add_argument("--xen-dir", default="build/xen", help="make xen-hypervisor's directory")
        p.add_argument(
            "--xen-suite",
            default="",
            help="the hosts' Debian release (bookworm, trixie) when it is not this machine's",
        )
    if verb == "teardown":
        p.add_argument(
            "--purge",
            action="store_true",
            help="then all make provision set on the hosts (tuning, agent, boot entries; reboots)",
        )
    return p


# At the end of a playbook, its slowest tasks with their times (ansible.posix's profile_tasks):
# where a provisioning's hour goes.
TASK_TIMES = {
    "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
    "PROFILE_TASKS_SUMMARY_ONLY": "true",
    "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "15",
}


def ansible_playbook(hosts: str, playbook: str, *extra: str) -> int:
    """ansible-playbook from the repository (its ansible.cfg), the venv's when there is one;
    the slowest tasks' times at the end (TASK_TIMES)."""
    return playbooks.play(hosts, playbook, *extra, keep=False, env=TASK_TIMES).returncode


def check(args: argparse.Namespace) -> int:
    from hvbench_harness import readiness

    hosts = inventory.hosts_file(args.inventory, args.host, args.target)
    target = args.target or inventory_target(hosts)
    argv = ["check", *(["--inventory", hosts] if kind(target).testbed else [])]
    argv += ["--enforce"] if args.enforce else []
    argv += ["--require", args.require] if args.require else []
    return readiness.main(argv)


def sched(args: argparse.Namespace) -> int:
    """Checked here first, so that a bad setting never reaches a host; read and reset take
    none. The playbook gets the checked setting as the agent's options, one JSON value; the
    readback goes to --readback."""
    hosts = inventory.hosts_file(args.inventory, args.host, args.target)
    target = args.target or inventory_target(hosts)
    if not kind(target).testbed:
        raise CliError(f"no testbed host in {hosts} (HOST= or INVENTORY=)")
    given = sched_setting(args.setting)
    options: list[str] = []
    if args.action in ("check", "apply"):
        sched_name = given.pop("sched", "none")
        options = setting_options(validate(kind(target).backend, sched_name, **given))
    elif given:
        raise CliError(f"ACTION={args.action} takes no setting, not {', '.join(args.setting)}")
    extra = {"sched_action": args.action, "sched_options": options}
    extra["sched_readback_file"] = str(Path(args.readback).resolve())
    return ansible_playbook(hosts, "sched.yml", "-e", json.dumps(extra))


def sched_setting(words: list[str]) -> dict:
    """NAME=value words (SCHED_WORDS) as validate's arguments; CliError for another name."""
    given: dict = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or name not in SCHED_WORDS:
            valid = ", ".join(SCHED_WORDS)
            raise CliError(f"make sched takes {valid} as NAME=value, not {word!r}")
        if value != "":  # NAME= is unset, as in Make
            given[SCHED_WORDS[name]] = value
    for field, value in given.items():
        if field != "sched":
            try:
                given[field] = int(value)
            except ValueError:
                message = f"{PARAM_NAMES[field]} must be a whole number, not {value!r}"
                raise CliError(message) from None
    return given


def provision(args: argparse.Namespace) -> int:
    """The target is checked before anything is built or touched; then make builds what the
    hosts get from here (build.py), and the playbook runs."""
    target = args.target or inventory_target(inventory.hosts_path(args.inventory, args.host))
    if not kind(target).testbed:
        raise CliError(f"TARGET=kvm or xen with HOST=, or INVENTORY= with hosts; got {target}")
    bundle, xen_dir = Path(args.guest_bundle).resolve(), Path(args.xen_dir).resolve()
    hypervisor = kind(target).hypervisor_goal if args.xen_build == "controller" else None
    goals = [
        "controller-tools",
        "agent-wheel",
        "guest-bundle",
        *([hypervisor] if hypervisor else []),
    ]
    try:
        build.make(
            goals,
            {"GUEST_BUNDLE": str(bundle), "XEN_DIR": str(xen_dir), "XEN_SUITE": args.xen_suite},
        )
    except build.BuildError as e:
        raise CliError(str(e)) from None
    extra = {"hvbench_guest_bundle": str(bundle)}
    if hypervisor:
        extra["xen_host_prebuilt_dir"] = str(xen_dir)
    hosts = inventory.hosts_file(args.inventory, args.host, args.target)
    return ansible_playbook(hosts, "provision.yml", "-e", json.dumps(extra))


def teardown(args: argparse.Namespace) -> int:
    """The guests go; with --purge, then everything make provision set on the hosts
    (playbooks/purge.yml), and they reboot."""
    hosts = inventory.hosts_file(args.inventory, args.host, args.target)
    code = ansible_playbook(hosts, "teardown.yml")
    return ansible_playbook(hosts, "purge.yml") if code == 0 and args.purge else code


ACTIONS = {"check": check, "sched": sched, "provision": provision, "teardown": teardown}


def usage() -> str:
    verbs = {**{v: what for v, (_, what) in MODULE_VERBS.items()}, **PLAYBOOK_VERBS}
    return "usage: hvbench VERB ... | hvbench --version\n\n" + "\n".join(
        f"  {verb:<10} {what}" for verb, what in verbs.items()
    )


# hvbench's packages, as installed: a run's results name the version that wrote them.
PACKAGES = ("hvbench-harness", "hvbench-agent", "hvbench-analysis", "hvbench-load", "hvbench-job")


def version() -> str:
    """hvbench's version, each package's where they differ, and the results' schema."""
    from importlib import metadata

    from hvbench_analysis.results import SCHEMA_VERSION

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    ours = found["hvbench-harness"]
    others = ", ".join(f"{name} {v}" for name, v in found.items() if v != ours)
    return f"hvbench {ours} (results schema {SCHEMA_VERSION}{'; ' + others if others else ''})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\n" + usage())
        return 0 if argv else 2
    verb, rest = argv[0], argv[1:]
    if verb == "--version":
        print(version())
        return 0
    if verb in MODULE_VERBS:
        return importlib.import_module(MODULE_VERBS[verb][0]).main(rest)
    if verb not in ACTIONS:
        print(f"hvbench: unknown verb {verb!r}\n{usage()}", file=sys.stderr)
        return 2
    try:
        return ACTIONS[verb](playbook_parser(verb).parse_intermixed_args(rest))
    except (CliError, Refused, TestbedError, inventory.InventoryError) as e:
        print(f"hvbench {verb}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
