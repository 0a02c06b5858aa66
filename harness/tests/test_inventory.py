"""The inventory a command uses: INVENTORY, or the one-off inventory for HOST=."""

import pytest
import yaml
from hvbench_harness import inventory


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inventory/sample/group_vars").mkdir(parents=True)
    return tmp_path


def test_a_directory_means_its_hosts_file(here):
    assert inventory.hosts_file("inventory/sample") == "inventory/sample/hosts.yml"
    assert inventory.hosts_file(None) == "inventory/sample/hosts.yml"
    assert inventory.hosts_file("lab/hosts.yml") == "lab/hosts.yml"


def test_host_and_target_write_a_one_host_inventory_with_the_group_vars(here):
    path = inventory.hosts_file("inventory/sample", "admin@lab1", "xen")
    doc = yaml.safe_load((here / path).read_text())
    assert doc == {
        "all": {
            "children": {
                "xen_hosts": {"hosts": {"lab1": {"ansible_host": "lab1", "ansible_user": "admin"}}}
            }
        }
    }
    group_vars = here / "build/inventory/group_vars"
    assert group_vars.resolve() == (here / "inventory/sample/group_vars").resolve()


def test_without_target_the_host_provisioned_before_is_used(here):
    inventory.hosts_file(None, "lab1", "kvm")
    assert inventory.hosts_file(None, "root@lab1") == str(inventory.ONE_OFF)
    assert inventory.listed_hosts(inventory.ONE_OFF) == {"lab1"}


def test_an_unknown_host_without_target_is_refused(here):
    with pytest.raises(inventory.InventoryError, match="HOST=lab2: say TARGET=kvm or xen"):
        inventory.hosts_file(None, "lab2")
