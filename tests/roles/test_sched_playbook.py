"""make sched's playbook (playbooks/sched.yml) over a testbed of two hosts, both this machine,
with an hvbench-agent on PATH that logs what it is asked and answers with a readback per
domain: each host's agent gets its own real-time VMs, every host checks the setting before any
applies it, and the readback file has each host's answer. The real agent runs on QEMU hosts in
the testbed tier (tests/testbed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.roles.test_guest_settings import hosts_inventory, vm

REPO = Path(__file__).resolve().parents[2]
AGENT = """#!{python}
import json, sys
verb = sys.argv[2]
domains = [a.removeprefix("--domain=") for a in sys.argv if a.startswith("--domain=")]
with open({log!r}, "a") as f:
    f.write(verb + " " + " ".join(domains) + "\\n")
if verb == "check" and "refuses" in domains:
    sys.exit("refused: no bandwidth left")
print(json.dumps({{"readback": {{"domain": domains[0], "sched": "fifo"}}}}))
"""


def sched(tmp_path: Path, second_vm: str) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "agent.log"
    bin_dir.mkdir()
    (bin_dir / "hvbench-agent").write_text(AGENT.format(python=sys.executable, log=str(log)))
    (bin_dir / "hvbench-agent").chmod(0o755)
    messaging = vm("m", [0])
    inventory = hosts_inventory(
        tmp_path,
        host_a={"hvbench_guests": {"messaging": messaging, "realtime": vm("r", [1])}},
        host_b={"hvbench_guests": {"messaging": [], "realtime": [vm(second_vm, [1])]}},
        host_c={"hvbench_guests": {"messaging": [vm("m-c", [0])], "realtime": []}},
    )
    readback = tmp_path / "sched.json"
    extra = {"sched_name": "fifo", "sched_priority": "9", "sched_readback_file": str(readback),
             "ansible_become": False}  # fmt: skip
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         "-e", json.dumps(extra), str(REPO / "playbooks/sched.yml")],
        cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    asked = sorted(log.read_text().splitlines()) if log.exists() else []
    return proc, asked, readback


def test_each_host_sets_its_own_real_time_vms_and_the_answers_are_kept_by_host(tmp_path):
    proc, asked, readback = sched(tmp_path, "r-b")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert asked == ["apply r", "apply r-b", "check r", "check r-b"]  # host_c has none
    found = json.loads(readback.read_text())["hosts"]
    domains = {h: a["readback"]["domain"] for h, a in found.items()}
    assert domains == {"host_a": "r", "host_b": "r-b"}


def test_a_host_that_refuses_stops_every_host_before_any_applies(tmp_path):
    proc, asked, _ = sched(tmp_path, "refuses")
    assert proc.returncode != 0
    assert "refused: no bandwidth left" in proc.stdout + proc.stderr
    assert asked == ["check r", "check refuses"]
