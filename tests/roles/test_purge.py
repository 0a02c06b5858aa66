"""make teardown PURGE=1 (playbooks/purge.yml) removes every file make provision's host roles
write: each path a role's task writes (template, copy, file, lineinfile) is in the purge's
lists, under a folder there, or kept on purpose, for the reason given. A new file in a role
fails this test until the purge knows it. The purge runs for real on the QEMU hosts of the
testbed tier (tests/testbed)."""

import re
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = ("template", "copy", "file", "lineinfile")
# Written by a host role and left by the purge, on purpose.
KEPT = {
    "/etc/default/grub.d": "the distribution's drop-in folder",
    "/etc/systemd/system.conf.d": "systemd's drop-in folder",
    "/etc/default/xen": "one line of the distribution's file (xenconsoled's logs)",
    "/var/log/xen/console": "the guests' console logs, kept to be read",
    "/etc/xen/auto": "Xen's own autostart folder; teardown.yml removes each guest's link",
    "/etc/xen/{{ item.name }}.cfg": "teardown.yml removes each guest's configuration",
    "/etc/xen/auto/{{ item.name }}.cfg": "teardown.yml removes each guest's link",
}


def tasks(items):
    for task in items or []:
        if isinstance(task, dict):
            for key in ("block", "rescue", "always"):
                yield from tasks(task.get(key))
            yield task


def host_roles() -> set[str]:
    """The roles provision.yml's first play (the hosts') runs, both hypervisors' included."""
    play = yaml.safe_load((REPO / "playbooks/provision.yml").read_text())[0]
    names = {r["role"] for r in play["roles"]}
    for task in tasks(play["pre_tasks"] + play["tasks"] + play["post_tasks"]):
        if "ansible.builtin.include_role" in task:
            names.add(task["ansible.builtin.include_role"]["name"])
    hypervisor_roles = {f"{h}_host" for h in ("kvm", "xen")}
    return (names - {"{{ hvbench_hypervisor }}_host"}) | hypervisor_roles


def test_the_host_roles_are_read_from_the_playbook():
    roles = host_roles()
    assert {"kvm_host", "xen_host", "guests", "host_tuning"} <= roles
    assert all((REPO / "roles" / role / "tasks").is_dir() for role in roles), roles


def written() -> set[str]:
    """Every path (as the role spells it, loops expanded) a host role's task writes."""
    found = set()
    for role in host_roles():
        for path in (REPO / "roles" / role / "tasks").glob("*.yml"):
            for task in tasks(yaml.safe_load(path.read_text())):
                found |= task_paths(task)
    return found


def task_paths(task: dict) -> set[str]:
    for module in MODULES:
        args = task.get(f"ansible.builtin.{module}")
        if isinstance(args, dict) and args.get("state") != "absent":
            target = args.get("dest") or args.get("path")
            loop = task.get("loop")
            if "{{ item" not in target or not isinstance(loop, list):
                return {target}
            spelled = re.search(r"{{ item[^}]*}}", target)[0]
            return {target.replace(spelled, i["dest"] if isinstance(i, dict) else i) for i in loop}
    return set()


def role_vars() -> dict:
    """The roles' defaults and the sample inventory's settings: what the paths render with."""
    found: dict = {}
    sample = REPO / "inventory/sample/group_vars/all.yml"
    for path in [*(REPO / "roles").glob("*/defaults/main.yml"), sample]:
        found.update(yaml.safe_load(path.read_text()) or {})
    return found


def render(text: str, variables: dict) -> list[str]:
    """A path with its variables filled in; host_tuning_args_file has one value per caller."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["regex_replace"] = lambda s, pattern, repl: re.sub(pattern, repl, s)
    env.filters["basename"] = lambda s: Path(s).name
    names = re.findall(r"host_tuning_args_file: (\S+)", "".join(
        p.read_text() for p in (REPO / "roles").glob("*/tasks/*.yml")
    ))  # fmt: skip
    return sorted({env.from_string(text).render(variables, host_tuning_args_file=n) for n in names})


def purge_lists() -> tuple[list[str], list[str]]:
    (play,) = yaml.safe_load((REPO / "playbooks/purge.yml").read_text())
    variables = {k: v for k, v in role_vars().items() if "{{" not in str(v)}
    paths = [
        rendered
        for entry in play["vars"]["purge_boot_files"] + play["vars"]["purge_files"]
        for rendered in render(entry, variables)
    ]
    return paths, play["vars"]["purge_units"]


def covered(path: str, paths: list[str], units: list[str]) -> bool:
    unit = re.fullmatch(r"/etc/systemd/system/([^/]+\.service)", path)
    return bool(unit and unit[1] in units) or any(
        path == p or path.startswith(p.rstrip("/") + "/") for p in paths
    )


def test_every_file_the_host_roles_write_is_purged_or_kept_for_a_reason():
    paths, units = purge_lists()
    variables = role_vars()
    # set by the roles' tasks as they run (hvbench_agent, guest_image)
    variables |= {"hvbench_agent_wheel_file": "agent.whl", "guest_image_key": "0123"}
    variables["guest_image_dir"] = f"{variables['hvbench_state_dir']}/images/guest-0123"
    left = {
        (raw, path)
        for raw in written() - set(KEPT)
        for path in render(raw, variables)
        if not covered(path, paths, units)
    }
    assert left == set(), "add them to playbooks/purge.yml or to KEPT here, with the reason"


def test_the_defaults_the_purge_assumes_are_the_roles():
    """The purge names a role's default where the inventory may not set it (`| default(...)`):
    each must be the role's own."""
    text = (REPO / "playbooks/purge.yml").read_text()
    defaults = role_vars()
    assumed = re.findall(r"{{ (\w+) \| default\('([^']*)'\)", text)
    assert assumed, "no defaults found"
    for name, value in assumed:
        assert defaults[name] == value, name


def test_the_units_purged_are_the_units_the_roles_install():
    installed = {
        Path(p).name for p in written() if re.fullmatch(r"/etc/systemd/system/[^/]+\.service", p)
    }
    assert installed == set(purge_lists()[1])
