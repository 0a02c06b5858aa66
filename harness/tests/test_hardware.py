"""make check's hardware checks: recorded /proc and /sys trees of other machines' layouts
(hardware_trees/README.md says how each was recorded), this machine's own, and the playbook
that reads a host, run for real by Ansible against this machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hvbench_harness import hardware, readiness
from hvbench_harness.hardware import judge, machine, needs, snapshot

TREES = Path(__file__).parent / "hardware_trees"
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventory/sample/group_vars"
XL_INFO = """\
host                   : xen1
nr_cpus                : 8
virt_caps              : pv hvm hvm_directio pv_directio hap shadow
total_memory           : 32767
cpu_topology           :
cpu:    core    socket     node
  0:       0        0        0
  1:       0        1        1
  2:       1        0        0
  3:       1        1        1
  4:       0        0        0
  5:       0        1        1
  6:       1        0        0
  7:       1        1        1
device topology        :
device           node
numa_info              :
node:    memsize    memfree    distances
   0:     16384      9000      10,21
   1:     16383     15000      21,10
xen_major              : 4
"""


def tree(name: str) -> dict[str, str]:
    return snapshot.snapshot(str(TREES / name))


def sample_vars(**changes) -> dict:
    found = {}
    for group in ("all", "kvm_hosts"):
        found.update(yaml.safe_load((SAMPLE / f"{group}.yml").read_text()))
    return {**found, **changes}


def layout(messaging: list[int], realtime: list[int], memory_mb: int = 1024, **more) -> dict:
    guests = {
        "messaging": {"name": "msg", "vcpus": len(messaging), "memory_mb": memory_mb,
                      "host_cpus": messaging},
        "realtime": {"name": "rt", "vcpus": len(realtime), "memory_mb": memory_mb,
                     "host_cpus": realtime},
    }  # fmt: skip
    return sample_vars(hvbench_guests=guests, **more)


def verdicts(files: dict[str, str], host_vars: dict) -> dict[str, dict]:
    checks = judge.judge(machine.parse(files), needs.of_host(host_vars))
    return {c["check"]: c for c in checks}


def test_every_recorded_tree_reads_and_records_back(tmp_path):
    names = sorted(p.name for p in TREES.iterdir() if p.is_dir())
    assert names, "no recorded trees"
    for name in names:
        files = tree(name)
        m = machine.parse(files)
        assert m.cpus and set(m.siblings) == set(m.cpus) and set(m.package) == set(m.cpus)
        assert frozenset().union(*m.nodes.values()) == m.cpus, name
        snapshot.record(files, str(tmp_path / name))
        assert snapshot.snapshot(str(tmp_path / name)) == files


def test_the_sample_inventory_needs_twelve_cpus_and_26_gib():
    wanted = needs.of_host(sample_vars())
    assert wanted.cpus == frozenset(range(2, 12))
    assert wanted.memory_mb == 16384 + 8192 + needs.KVM_HOST_RESERVE_MB
    xen = needs.of_host(sample_vars(hvbench_hypervisor="xen", xen_host_dom0_mem="4G"))
    assert xen.reserve_mb == 4096 and not xen.hardware_virtualization
    assert needs.of_host(
        sample_vars(hvbench_hypervisor="xen", guests_xen_type="hvm")
    ).hardware_virtualization


@pytest.mark.parametrize(
    "text, mb",
    [("2048M", 2048), ("4G", 4096), ("max:2G", 2048), ("1048576", 1024), ("1T", 1048576)],
)
def test_xen_sizes(text, mb):
    assert needs.size_mb(text) == mb


def test_a_small_host_fails_the_sample_layout_and_says_how_to_fix_it():
    found = verdicts(tree("two-sockets-smt"), sample_vars())
    assert found["cpus"]["status"] == judge.FAIL
    assert "at least 12" in found["cpus"]["expected"] and "host_cpus" in found["cpus"]["fix"]
    assert found["memory"]["status"] == judge.FAIL and "26624 MiB" in found["memory"]["expected"]
    for check in ("smt", "numa"):  # judged once the CPUs exist
        assert (found[check]["status"], found[check]["found"]) == (
            judge.NA,
            "no CPU 8-11 on this host (see cpus)",
        )


def test_two_sockets_each_guest_on_its_own_node():
    found = verdicts(tree("two-sockets-smt"), layout([0, 1, 2, 3], [4, 5]))
    assert found["numa"]["status"] == judge.PASS
    assert found["cpus"]["status"] == found["memory"]["status"] == judge.PASS
    assert found["smt"]["status"] == judge.PASS  # 4 and 5 are one core's two threads
    assert found["virtualization"]["found"] == "AMD-V"  # TCG emulates SVM, not VMX


def test_a_realtime_vm_across_sockets_fails_with_each_nodes_cpus():
    found = verdicts(tree("two-sockets-smt"), layout([0, 1], [3, 4]))
    assert found["numa"]["status"] == judge.FAIL
    assert "rt spans node 0: 3, node 1: 4" in found["numa"]["found"]
    assert "node 0: CPUs 0-3; node 1: CPUs 4-7" in found["numa"]["fix"]


def test_a_messaging_vm_across_sockets_is_a_warning():
    found = verdicts(tree("two-sockets-smt"), layout([2, 3, 4], [6, 7]))
    assert found["numa"]["status"] == judge.WARN


def test_a_realtime_vm_memory_larger_than_its_node():
    node_mb = machine.parse(tree("two-sockets-smt")).node_memory_mb[1]
    found = verdicts(tree("two-sockets-smt"), layout([0], [4], memory_mb=node_mb + 1))
    assert (
        found["numa"]["status"] == judge.WARN and f"node 1 has {node_mb}" in found["numa"]["found"]
    )


def test_a_sibling_busy_with_another_guest_or_the_host_is_a_warning():
    found = verdicts(tree("two-sockets-smt"), layout([5, 6], [4]))
    assert found["smt"]["status"] == judge.WARN
    assert found["smt"]["found"] == "CPU 4's sibling 5 runs msg"
    found = verdicts(tree("two-sockets-smt"), layout([6, 7], [4]))
    assert found["smt"]["found"] == "CPU 4's sibling 5 runs the host's own work (not in isolcpus)"
    isolated = dict(tree("two-sockets-smt"))
    isolated["proc/cmdline"] = "root=/dev/vda isolcpus=managed_irq,domain,4,5 nohz_full=4,5\n"
    found = verdicts(isolated, layout([6, 7], [4]))
    assert (found["smt"]["status"], found["smt"]["found"]) == (judge.PASS, "siblings idle")


def test_without_smt_no_sibling_is_shared():
    for name in ("one-socket-smt-off", "two-sockets-amd-no-smt"):
        found = verdicts(tree(name), layout([0, 1], [2, 3]))
        assert (found["smt"]["status"], found["smt"]["found"]) == (judge.PASS, "SMT off"), name


def test_interleaved_ids_put_the_sample_layouts_cpus_on_both_sockets():
    """A dual-socket host numbering its CPUs in turn (even: socket 0, odd: socket 1; siblings
    N and N+4): CPUs 2-3 lie on two nodes, CPUs 2 and 6 are one core of one node."""
    m = machine.parse(tree("two-sockets-interleaved"))
    assert m.package == {c: c % 2 for c in range(8)} and m.siblings[2] == {2, 6}
    found = verdicts(tree("two-sockets-interleaved"), layout([1, 3], [2, 3]))
    assert found["numa"]["status"] == judge.FAIL
    assert (
        found["numa"]["fix"]
        == "pin each guest to CPUs of one node (node 0: CPUs 0,2,4,6; node 1: CPUs 1,3,5,7)"
    )
    found = verdicts(tree("two-sockets-interleaved"), layout([1, 3, 5, 7], [2, 6]))
    assert found["numa"]["status"] == found["smt"]["status"] == judge.PASS


def test_an_iommu_is_seen_where_the_machine_has_one():
    assert verdicts(tree("one-socket-smt"), layout([0], [2]))["iommu"]["found"] == "dmar0"
    assert verdicts(tree("one-socket-smt-off"), layout([0], [2]))["iommu"]["status"] == judge.NA


def test_tcg_has_no_invariant_tsc_and_that_fails():
    found = verdicts(tree("two-sockets-smt"), layout([0], [4]))
    assert found["tsc"]["status"] == judge.FAIL and "invariant TSC" in found["tsc"]["fix"]
    assert found["virtualization"]["status"] == judge.PASS  # TCG's -cpu max emulates SVM
    assert found["nested_paging"]["found"] == "NPT"


def test_no_vt_x_fails_on_kvm_and_warns_for_xen_pv_guests():
    files = dict(tree("two-sockets-smt"))
    files["proc/cpuinfo"] = files["proc/cpuinfo"].replace(" svm", "").replace(" npt", "")
    assert verdicts(files, layout([0], [4]))["virtualization"]["status"] == judge.FAIL
    xen_pv = layout([0], [4], hvbench_hypervisor="xen", guests_xen_type="pv")
    assert verdicts(files, xen_pv)["virtualization"]["status"] == judge.WARN
    assert verdicts(files, xen_pv)["nested_paging"]["status"] == judge.WARN


def test_vmx_flags_line_counts_for_ept():
    cpuinfo = (
        "processor\t: 0\nflags\t\t: fpu vmx constant_tsc nonstop_tsc\n"
        "vmx flags\t: vnmi ept vpid\n\n"
    )
    assert machine.cpu_flags(cpuinfo) == {"vmx", "ept", "constant_tsc", "nonstop_tsc"}


def test_a_xen_dom0_is_judged_from_xl_info():
    files = {**tree("two-sockets-smt"), "xl-info": XL_INFO}  # dom0 sees 8 CPUs, as Xen has
    m = machine.parse(files)
    assert m.memory_mb == 32767 and m.nodes == {0: {0, 2, 4, 6}, 1: {1, 3, 5, 7}}
    assert m.siblings[1] == {1, 5} and m.node_memory_mb == {0: 16384, 1: 16383}
    host = layout([2, 6], [5], hvbench_hypervisor="xen", xen_host_dom0_mem="2048M")
    found = verdicts(files, host)
    assert found["virtualization"]["found"].startswith("Xen: pv hvm")
    assert found["nested_paging"]["status"] == found["numa"]["status"] == judge.PASS
    assert found["smt"]["status"] == judge.PASS and found["smt"]["found"] == "siblings idle"
    found = verdicts(files, layout([2, 3], [4, 6], hvbench_hypervisor="xen"))
    assert found["smt"]["found"] == "CPU 4's sibling 0 runs dom0; CPU 6's sibling 2 runs msg"
    found = verdicts(files, layout([1, 3], [2, 4], hvbench_hypervisor="xen"))
    assert found["numa"]["status"] == judge.PASS
    assert verdicts(files, layout([0, 2], [3, 4]))["numa"]["status"] == judge.FAIL


@pytest.mark.parametrize(
    "name, version, hypervisor, status",
    [
        ("Debian GNU/Linux", "12", "kvm", judge.PASS),
        ("Debian GNU/Linux", "13", "kvm", judge.PASS),
        ("Debian GNU/Linux", "12", "xen", judge.PASS),
        ("Debian GNU/Linux", "13", "xen", judge.FAIL),  # Xen on Debian 13 is not tested yet
        ("Ubuntu", "24.04", "kvm", judge.FAIL),
        ("CentOS Stream", "9", "kvm", judge.FAIL),
    ],
)
def test_the_host_release_is_one_provisioning_takes(name, version, hypervisor, status):
    os_release = f'NAME="{name}"\nVERSION_ID="{version}"\n'
    files = {**tree("two-sockets-smt"), "etc/os-release": os_release}
    settings = layout([0], [4], hvbench_hypervisor=hypervisor)
    assert verdicts(files, settings)["os"]["status"] == status


def test_the_tested_releases_are_the_guests_roles():
    defaults = yaml.safe_load((REPO / "roles/guests/defaults/main.yml").read_text())
    assert defaults["guests_tested_releases"] == needs.TESTED_RELEASES


def test_this_machine_reads_and_judges():
    files = snapshot.snapshot("/")
    m = machine.parse(files)
    assert len(m.cpus) == os.cpu_count()
    found = verdicts(files, layout([0], [len(m.cpus) - 1]))
    assert set(found) == {
        "os", "cpus", "memory", "virtualization", "nested_paging", "tsc", "smt", "numa",
        "idle_states", "turbo", "iommu",
    }  # fmt: skip
    assert all(
        c["status"] in (judge.PASS, judge.WARN, judge.FAIL, judge.NA) for c in found.values()
    )
    assert all(c["fix"] for c in found.values() if c["status"] in (judge.WARN, judge.FAIL))


def test_the_playbook_reads_this_machine_as_a_kvm_host(tmp_path):
    """playbooks/hardware.yml for real: Ansible sends snapshot.py, runs it with python3 and
    brings back the files with the host's settings from the inventory's group_vars."""
    (tmp_path / "group_vars").symlink_to(SAMPLE)
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"kvm_hosts": {"hosts": {"lab-host": local}}}))
    hosts = hardware.read_hosts(str(inventory))
    assert [h.name for h in hosts] == ["lab-host"]
    (host,) = hosts
    assert host.machine.cpus == machine.parse(snapshot.snapshot("/")).cpus
    assert host.needs.cpus == frozenset(range(2, 12))  # the sample group_vars
    assert host.provisioned == Path("/usr/local/sbin/hvbench-agent").exists()
    text = hardware.table(hosts)
    assert "lab-host" in text and "cpus" in text and "numa" in text


def test_make_check_on_a_host_not_yet_provisioned_judges_its_hardware_alone(tmp_path, capsys):
    """hvbench check --inventory before make provision: the hardware table, no tuning checks,
    and the exit status of the hardware checks (a machine of fewer than 12 CPUs fails the
    sample's)."""
    if Path("/usr/local/sbin/hvbench-agent").exists():
        pytest.skip("this machine has a provisioned agent")
    (tmp_path / "group_vars").symlink_to(SAMPLE)
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"kvm_hosts": {"hosts": {"lab-host": local}}}))
    code = readiness.main(["check", "--inventory", str(inventory)])
    out = capsys.readouterr().out
    assert " cpus " in out and " numa " in out, out
    assert (code == 1) == ("FAIL lab-host" in out) == ("hardware check(s) failed" in out), out
    assert out.rstrip().endswith("the tuning checks come once make provision has run")


def test_an_unreachable_host_is_a_clear_error(tmp_path):
    (tmp_path / "group_vars").symlink_to(SAMPLE)
    inventory = tmp_path / "hosts.yml"
    unreachable = {"ansible_host": "192.0.2.1", "ansible_ssh_common_args": "-o ConnectTimeout=2"}
    inventory.write_text(json.dumps({"kvm_hosts": {"hosts": {"gone": unreachable}}}))
    with pytest.raises(hardware.TestbedError, match="cannot read the hardware"):
        hardware.read_hosts(str(inventory))


def test_check_module_runs_standalone_with_python3_only(tmp_path):
    """The host has no hvbench: the reader imports only the standard library."""
    script = Path(snapshot.__file__)
    proc = subprocess.run(
        ["python3", "-I", "-S", str(script), "--root", str(TREES / "two-sockets-smt")],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert json.loads(proc.stdout) == tree("two-sockets-smt")
