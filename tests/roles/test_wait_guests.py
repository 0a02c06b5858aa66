"""The guests' boot wait (roles/guests/files/wait-guests), as make provision runs it on a host
after starting the guests, here with stand-ins for the guests: a console log written by the
test, a listening socket for the guest's SSH and a script that lists the running domains. A
guest that will never boot fails within its first-sign limit, with its console's end."""

import socket
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/guests/files/wait-guests"


@pytest.fixture
def host(tmp_path):
    """Two ports: a booted guest's SSH (listening) and a booting one's (bound, not listening, so
    it refuses and no other process takes it); a list of the running domains g1 and g2."""
    with socket.socket() as ssh, socket.socket() as shut:
        ssh.bind(("127.0.0.1", 0))
        ssh.listen()
        shut.bind(("127.0.0.1", 0))
        listing = tmp_path / "list-domains"
        listing.write_text("#!/bin/sh\necho ' Id   Name   State'\necho ' 1    g1     running'\n"
                           "echo ' 2    g2     running'\n")  # fmt: skip
        listing.chmod(0o755)
        yield tmp_path, (ssh.getsockname()[1], shut.getsockname()[1]), str(listing)


def wait(
    tmp_path: Path, port: int, listing: str, *guests: str, **how
) -> subprocess.CompletedProcess:
    """wait-guests ssh (or `mode`), first sign within 2 s, a boot within `boot_s`."""
    mode, boot_s, panic = how.get("mode", "ssh"), how.get("boot_s", 60), how.get("panic", "fatal")
    command = [str(SCRIPT), mode, str(tmp_path / "mark"), "2", str(boot_s), listing, panic]
    env = {"WAIT_GUESTS_PORT": str(port), "PATH": "/usr/bin:/bin"}
    return subprocess.run([*command, *guests], capture_output=True, text=True, env=env, timeout=120)


def mark(tmp_path: Path, *consoles: Path) -> None:
    subprocess.run([str(SCRIPT), "mark", str(tmp_path / "mark"), *map(str, consoles)], check=True)


def test_a_guest_that_answers_passes_though_its_console_is_silent(host):
    tmp_path, (port, _), listing = host
    console = tmp_path / "g1.log"
    console.write_text("Kernel panic - not syncing: an earlier boot's\n")
    mark(tmp_path, console)
    done = wait(tmp_path, port, listing, f"g1:127.0.0.1:{console}")
    assert done.returncode == 0 and f"guest g1 answers on port {port}" in done.stdout, done


def test_a_guest_that_prints_nothing_fails_at_its_first_sign_limit(host):
    """g1 is up and answers; g2 (its SSH at another address, where nothing listens) prints
    nothing: the wait ends with g2's failure, g1 found on the way."""
    tmp_path, (port, _), listing = host
    consoles = [tmp_path / "g1.log", tmp_path / "g2.log"]
    mark(tmp_path, *consoles)
    done = wait(
        tmp_path, port, listing, f"g2:127.0.0.2:{consoles[1]}", f"g1:127.0.0.1:{consoles[0]}"
    )
    assert done.returncode == 1
    assert f"guest g1 answers on port {port}" in done.stdout, done
    assert "guest g2 printed nothing on its console in 2 s" in done.stdout, done
    assert "1    g1     running" in done.stdout  # the hypervisor's list, as evidence


@pytest.mark.parametrize(
    ("name", "printed", "why"),
    [
        ("g1", "Linux version 6.1\nKernel panic - not syncing: VFS: Unable to mount root fs\n",
         "panicked"),
        ("g3", "Linux version 6.1\n", "is not running any more"),
        ("g1", "Linux version 6.1\n", "did not answer on port"),
    ],
)  # fmt: skip
def test_a_guest_that_panics_stops_or_stays_shut_fails_with_its_console(host, name, printed, why):
    tmp_path, (_, shut), listing = host
    console = tmp_path / f"{name}.log"
    console.write_text("an earlier boot's lines\n")
    mark(tmp_path, console)
    with console.open("a") as out:
        out.write(printed)
    done = wait(tmp_path, shut, listing, f"{name}:127.0.0.1:{console}", boot_s=3)
    assert done.returncode == 1 and done.stdout.startswith(f"guest {name} {why}"), done
    tail = done.stdout.split("--- the end of its console")[1]
    assert printed.splitlines()[-1] in tail and "an earlier boot's" not in tail


def test_a_panic_is_not_final_where_the_hypervisor_restarts_a_crashed_guest(host):
    tmp_path, (_, shut), listing = host
    console = tmp_path / "g1.log"
    mark(tmp_path, console)
    console.write_text("Kernel panic - not syncing: Attempted to kill init!\n")
    done = wait(tmp_path, shut, listing, f"g1:127.0.0.1:{console}", boot_s=3, panic="restarts")
    assert done.returncode == 1 and done.stdout.startswith("guest g1 did not answer on port")


def test_the_first_sign_is_a_console_line_since_the_mark(host):
    """`sign`, right after the guests started: g1 printed and passes, on no port; g2, whose
    console has only what it printed before the mark, fails at the limit."""
    tmp_path, (_, shut), listing = host
    consoles = [tmp_path / "g1.log", tmp_path / "g2.log"]
    consoles[1].write_text("Linux version 6.1, an earlier boot\n")
    mark(tmp_path, *consoles)
    consoles[0].write_text("Linux version 6.1\n")
    first = wait(tmp_path, shut, listing, f"g1:127.0.0.1:{consoles[0]}", mode="sign")
    assert first.returncode == 0 and "guest g1 printed on its console" in first.stdout, first
    second = wait(tmp_path, shut, listing, f"g2:127.0.0.1:{consoles[1]}", mode="sign")
    assert second.returncode == 1, second
    assert second.stdout.startswith("guest g2 printed nothing on its console in 2 s"), second
