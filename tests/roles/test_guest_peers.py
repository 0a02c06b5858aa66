"""Several hosts as one testbed: the guests role's routes script (hvbench-guest-peers, in
roles/guests/templates) run for real in network namespaces on this machine. Two namespaces
play the hosts on one link, each with a bridge for its guest network, and a namespace per host
plays a guest. A guest reaches the other host's guest with its own address (no NAT) and
everything else through its host's NAT; a second `up` changes nothing and `down` takes it
all away."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.roles.test_guest_settings import hosts_inventory, play

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("iptables"),
    reason="network namespaces and iptables need root (make test installs iptables)",
)

SUFFIX = str(os.getpid() % 100000)
HOSTS = {"a": ("10.99.0.1", "192.168.123"), "b": ("10.99.0.2", "192.168.124")}
# a TCP server that answers its first client with the client's address
SERVE = (
    "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
    "s.bind((sys.argv[1],5000)); s.listen(); print('ready',flush=True); c,a=s.accept();"
    "c.sendall(a[0].encode()); c.close()"
)
ASK = (
    "import socket,sys; c=socket.create_connection((sys.argv[1],5000),timeout=10);"
    "print(c.recv(100).decode())"
)


def ns(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", f"{name}{SUFFIX}", *args],
        capture_output=True, text=True, timeout=60, check=check,
    )  # fmt: skip


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Namespaces h<x> (a host at 10.99.0.x on a shared link, with bridge br<x> at
    <prefix>.1) and g<x> (its guest at <prefix>.10)."""
    names = [f"{kind}{x}{SUFFIX}" for kind in ("h", "g") for x in HOSTS]
    for name in names:
        ip("netns", "add", name)
    try:
        ip("link", "add", f"la{SUFFIX}", "type", "veth", "peer", "name", f"lb{SUFFIX}")
        for x, (address, prefix) in HOSTS.items():
            host, guest = f"h{x}", f"g{x}"
            ip("link", "set", f"l{x}{SUFFIX}", "netns", f"{host}{SUFFIX}")
            ip("link", "add", f"v{x}{SUFFIX}", "type", "veth", "peer", "name", f"w{x}{SUFFIX}")
            ip("link", "set", f"v{x}{SUFFIX}", "netns", f"{guest}{SUFFIX}")
            ip("link", "set", f"w{x}{SUFFIX}", "netns", f"{host}{SUFFIX}")
            for line in (
                f"link set lo up; addr add {address}/24 dev l{x}{SUFFIX}; link set l{x}{SUFFIX} up",
                f"link add br{x} type bridge; addr add {prefix}.1/24 dev br{x}; link set br{x} up",
                f"link set w{x}{SUFFIX} master br{x}; link set w{x}{SUFFIX} up",
            ):
                for command in line.split("; "):
                    ns(host, "ip", *command.split())
            for command in (
                "link set lo up",
                f"addr add {prefix}.10/24 dev v{x}{SUFFIX}",
                f"link set v{x}{SUFFIX} up",
                f"route add default via {prefix}.1",
            ):
                ns(guest, "ip", *command.split())
        yield
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def scripts(tmp_path: Path) -> dict[str, Path]:
    """Each host's routes script, as the guests role writes it for this inventory."""
    inventory = hosts_inventory(
        tmp_path,
        **{
            f"host_{x}": {"ansible_host": address, "guests_network_prefix": prefix}
            for x, (address, prefix) in HOSTS.items()
        },
    )
    proc = play(inventory, "peers.yml", "-e", f"peers_dir={tmp_path}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return {x: tmp_path / f"host_{x}.sh" for x in HOSTS}


def seen_by(server_ns: str, address: str, client_ns: str) -> str:
    """The source address a server at address in server_ns sees for a client in client_ns."""
    with subprocess.Popen(
        ["ip", "netns", "exec", f"{server_ns}{SUFFIX}", sys.executable, "-c", SERVE, address],
        stdout=subprocess.PIPE, text=True,
    ) as server:  # fmt: skip
        try:
            assert server.stdout.readline().strip() == "ready"
            return ns(client_ns, sys.executable, "-c", ASK, address).stdout.strip()
        finally:
            server.kill()


def rules(host: str) -> str:
    """The host's firewall and routes, without iptables-save's timestamped comment lines."""
    saved = ns(host, "iptables-save").stdout.splitlines(keepends=True)
    kept = "".join(line for line in saved if not line.startswith("#"))
    return kept + ns(host, "ip", "route").stdout


def test_guests_reach_the_other_hosts_guests_unchanged_and_the_rest_through_nat(
    tmp_path, two_hosts
):
    found = scripts(tmp_path)
    for x in HOSTS:
        ns(f"h{x}", "sh", str(found[x]), "up")
    # guest a → guest b: b sees a's own address; and back
    assert seen_by("gb", "192.168.124.10", "ga") == "192.168.123.10"
    assert seen_by("ga", "192.168.123.10", "gb") == "192.168.124.10"
    # guest a → host b itself: through host a's NAT
    assert seen_by("hb", "10.99.0.2", "ga") == "10.99.0.1"

    before = rules("ha")
    ns("ha", "sh", str(found["a"]), "up")
    assert rules("ha") == before  # a second `up` changes nothing

    ns("ha", "sh", str(found["a"]), "down")
    after = rules("ha")
    assert "192.168.124.0/24" not in after, after
    assert "MASQUERADE" in after  # this host's NAT for its guests stays
