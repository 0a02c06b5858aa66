"""Which Ansible inventory a command uses: INVENTORY (a directory with hosts.yml and
group_vars/, or a hosts file), or a one-off inventory for HOST=user@host.

The one-off inventory (build/inventory/hosts.yml) puts HOST in the kvm_hosts or xen_hosts group
that TARGET names and uses INVENTORY's group_vars. Without TARGET, the one written before for the
same host (by make provision HOST=... TARGET=...) is used, so that it says what the host runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from hvbench_harness.targets.kinds import is_testbed

ONE_OFF = Path("build/inventory/hosts.yml")
DEFAULT = "inventory/sample"


class InventoryError(ValueError):
    pass


def hosts_file(inventory: str | None, host: str | None = None, target: str | None = None) -> str:
    """The hosts file to use; with HOST and a TARGET naming a hypervisor, the one-off
    inventory, written here."""
    if host and is_testbed(target):
        write_one_off(host, target, inventory)
    return hosts_path(inventory, host, target)


def hosts_path(inventory: str | None, host: str | None = None, target: str | None = None) -> str:
    """The hosts file a command would use, nothing written: with HOST, the one-off inventory
    (InventoryError if there is none for HOST and TARGET names no hypervisor)."""
    if host:
        if is_testbed(target) or host.rpartition("@")[2] in listed_hosts(ONE_OFF):
            return str(ONE_OFF)
        raise InventoryError(
            f"HOST={host}: say TARGET=kvm or xen (make provision HOST={host} TARGET=... "
            "remembers it)"
        )
    inventory = inventory or DEFAULT
    if Path(inventory).is_dir():
        return str(Path(inventory) / "hosts.yml")
    return inventory


def write_one_off(host: str, target: str, group_vars_from: str | None) -> Path:
    """The one-off inventory: HOST in TARGET's group, with the group_vars of INVENTORY."""
    user, _, name = host.rpartition("@")
    entry = {"ansible_host": name, **({"ansible_user": user} if user else {})}
    doc = {"all": {"children": {f"{target}_hosts": {"hosts": {name: entry}}}}}
    ONE_OFF.parent.mkdir(parents=True, exist_ok=True)
    ONE_OFF.write_text(yaml.safe_dump(doc, sort_keys=False))
    group_vars = ONE_OFF.parent / "group_vars"
    source = Path(group_vars_from or DEFAULT)
    source = (source if source.is_dir() else source.parent) / "group_vars"
    if group_vars.is_symlink() or group_vars.exists():
        group_vars.unlink()
    group_vars.symlink_to(source.resolve())
    return ONE_OFF


def listed_hosts(path: Path) -> set[str]:
    """Every host named anywhere in a hosts file (empty if there is none)."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError:
        return set()
    found: set[str] = set()

    def walk(group: dict) -> None:
        found.update((group.get("hosts") or {}).keys())
        for child in (group.get("children") or {}).values():
            walk(child or {})

    for group in doc.values():
        walk(group or {})
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m hvbench_harness.inventory INVENTORY [HOST [TARGET]]`: print the hosts file
    (make campaign uses it for HOST=)."""
    args = (sys.argv[1:] if argv is None else argv) + ["", ""]
    try:
        print(hosts_file(args[0] or None, args[1] or None, args[2] or None))
    except InventoryError as e:
        print(f"hvbench: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
