"""The linux backend (hvbench_agent.sched: linux.py, deadline.py, cgroup.py) on the real kernel
(as root, here).

Helper processes are plain `python -c` programs with named threads; every one is killed and
every cgroup removed by fixture finalizers, also when a test fails. Deadline threads release
their bandwidth when the helper dies.
"""

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hvbench_agent.sched import Refused, cgroup, deadline, linux, validate

# Worker threads named hvb-worker-<i> sleep in a loop; "pin" adds one thread restricted to CPU 0;
# "long" adds one with a name longer than 15 characters. The main thread (hvb-main) answers
# "spawn" on stdin by starting a thread and printing its result.
HELPER = r"""
import os, sys, threading, time

def set_name(name):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name)

def sleeper(name, ready, pin=False):
    set_name(name)
    if pin:
        os.sched_setaffinity(0, {0})
    ready.release()
    while True:
        time.sleep(0.01)

names = [f"hvb-worker-{i}" for i in range(int(sys.argv[1]))]
pinned = "pin" in sys.argv[2:]
if pinned:
    names.append("hvb-pinned")
if "long" in sys.argv[2:]:
    names.append("hvbench-very-long-thread-name")
ready = threading.Semaphore(0)
for name in names:
    threading.Thread(target=sleeper, args=(name, ready, name == "hvb-pinned"), daemon=True).start()
for _ in names:
    ready.acquire()
set_name("hvb-main")
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "spawn":
        try:
            t = threading.Thread(target=sleeper, args=("hvb-child", ready), daemon=True)
            t.start()
            ready.acquire()
            print("spawned", flush=True)
        except RuntimeError as e:
            print("spawn-failed", e, flush=True)
"""

# Waits for "go" on stdin, then spins one thread until killed.
SPINNER = r"""
import sys
sys.stdin.readline()
while True:
    pass
"""


def _readline(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError("helper process did not answer")
    return proc.stdout.readline().strip()


@pytest.fixture
def start():
    """start(code, *args) -> running helper; all helpers are killed at teardown."""
    procs = []

    def _start(code: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        if code is HELPER:
            assert _readline(proc) == "ready"
        return proc

    yield _start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def quotas():
    """Every CpuQuota made through this list is closed at teardown."""
    made: list[cgroup.CpuQuota] = []
    yield made
    for q in made:
        q.close()


def _policy(tid: int) -> int:
    # the stdlib's view, without the reset-on-fork bit it reports in the same number
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK


def _workers(pid: int) -> list[int]:
    return [tid for tid, _ in deadline.threads_of(pid, [r"^hvb-worker-"])]


# ---------------------------------------------------------------------------------------------
# threads and SCHED=none


def test_threads_of_matches_truncated_comm(start):
    proc = start(HELPER, "3", "long")
    assert [name for _, name in deadline.threads_of(proc.pid, [r"^hvb-worker-"])] == [
        "hvb-worker-0",
        "hvb-worker-1",
        "hvb-worker-2",
    ]
    # the kernel keeps 15 characters of a thread name
    assert deadline.threads_of(proc.pid, [r"^hvbench-very-lo$"])[0][1] == "hvbench-very-lo"
    assert deadline.threads_of(proc.pid, ["long-thread-name"]) == []
    names = [name for _, name in deadline.threads_of(proc.pid, ["^hvb-main$", "worker-1"])]
    assert names == ["hvb-main", "hvb-worker-1"]
    with pytest.raises(ProcessLookupError):
        deadline.threads_of(2**22 + 1, [""])


def test_readback_none(start):
    proc = start(HELPER, "3")
    rb = deadline.readback_none(proc.pid)
    assert rb["pid"] == proc.pid
    assert rb["threads"] == 4
    assert rb["policies"] == {"SCHED_OTHER": 4}
    assert rb["nice"] == {0: 4}
    assert rb["cpu_cgroup"] is not None


# ---------------------------------------------------------------------------------------------
# SCHED=deadline


def test_check_permitted_deadline():
    linux.check_permitted(
        validate("linux", "deadline", budget_us=5000, period_us=100000), threads=4
    )
    linux.check_permitted(validate("linux", "none", budget_us=None, period_us=None))
    too_much = validate("linux", "deadline", budget_us=100000, period_us=100000)
    threads = (os.cpu_count() or 1) + 1
    with pytest.raises(Refused, match="admission control would refuse"):
        linux.check_permitted(too_much, threads=threads)


def test_apply_deadline_and_read_back(start):
    proc = start(HELPER, "3")
    tids = _workers(proc.pid)
    setting = validate("linux", "deadline", budget_us=5000, period_us=100000)
    result = deadline.apply_deadline(tids, setting)
    assert [r.tid for r in result] == tids
    for r in result:
        assert r.name.startswith("hvb-worker-")
        assert r.policy == "SCHED_DEADLINE"
        assert (r.runtime_ns, r.deadline_ns, r.period_ns) == (5_000_000, 100_000_000, 100_000_000)
        assert r.reset_on_fork
        # the same seen through the stdlib, independent of our own readback
        assert os.sched_getscheduler(r.tid) == deadline.SCHED_DEADLINE | os.SCHED_RESET_ON_FORK
    rb = deadline.readback_none(proc.pid)
    assert rb["policies"] == {"SCHED_DEADLINE": 3, "SCHED_OTHER": 1}


def test_deadline_thread_can_spawn_only_with_reset_on_fork(start):
    setting = validate("linux", "deadline", budget_us=5000, period_us=100000)
    for reset_on_fork, answer in ((True, "spawned"), (False, "spawn-failed")):
        proc = start(HELPER, "1")
        main = deadline.threads_of(proc.pid, ["^hvb-main$"])[0][0]
        deadline.apply_deadline([main], setting, reset_on_fork=reset_on_fork)
        proc.stdin.write("spawn\n")
        proc.stdin.flush()
        assert _readline(proc).startswith(answer)
        if reset_on_fork:
            child = deadline.threads_of(proc.pid, ["^hvb-child$"])[0][0]
            assert _policy(child) == deadline.SCHED_OTHER


def test_admission_refusal_restores_and_does_not_leak(start):
    ncpus = os.cpu_count() or 1
    proc = start(HELPER, str(ncpus + 1))
    tids = _workers(proc.pid)
    full = validate(
        "linux", "deadline", budget_us=100000, period_us=100000
    )  # one whole CPU per thread
    for _ in range(2):
        with pytest.raises(Refused) as info:
            deadline.apply_deadline(tids, full)
        message = str(info.value)
        assert "admission control refused" in message
        assert "EBUSY" in message
        assert "restored" in message
        assert all(_policy(tid) == deadline.SCHED_OTHER for tid in tids)
    # the rolled-back threads gave their bandwidth back: a whole CPU is still admitted
    [rb] = deadline.apply_deadline(tids[:1], full)
    assert rb.policy == "SCHED_DEADLINE"


def test_restricted_affinity_is_refused_with_reason(start):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: with 1 CPU a thread pinned to CPU 0 is not restricted")
    proc = start(HELPER, "1", "pin")
    tids = [*_workers(proc.pid), deadline.threads_of(proc.pid, ["^hvb-pinned$"])[0][0]]
    with pytest.raises(Refused, match=r"EPERM.*affinity") as info:
        deadline.apply_deadline(
            tids, validate("linux", "deadline", budget_us=5000, period_us=100000)
        )
    assert "restored 1 thread(s)" in str(info.value)
    assert all(_policy(tid) == deadline.SCHED_OTHER for tid in tids)


def test_apply_deadline_refuses_other_settings():
    with pytest.raises(ValueError, match="needs a SCHED=deadline setting"):
        deadline.apply_deadline(
            [os.getpid()], validate("linux", "cfs-quota", budget_us=5000, period_us=100000)
        )


# ---------------------------------------------------------------------------------------------
# SCHED=cfs-quota


def _cgroup_names() -> set[str]:
    controller = cgroup.find_cpu_controller()
    return {p.name for p in Path(controller[1]).iterdir()} if controller else set()


def test_find_cpu_controller_on_this_machine():
    controller = cgroup.find_cpu_controller()
    if controller is None:
        pytest.skip("no cpu cgroup controller mounted")
    version, path = controller
    wanted = "cpu.cfs_quota_us" if version == 1 else "cgroup.controllers"
    assert (Path(path) / wanted).exists()


def test_find_cpu_controller_reads_v2_and_escaped_paths(tmp_path):
    root = tmp_path / "cg 2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    escaped = str(root).replace(" ", "\\040")
    mountinfo = (
        "30 23 0:26 / /sys/fs/cgroup/cpuset rw,relatime shared:9 - cgroup cgroup rw,cpuset\n"
        f"31 23 0:27 / {escaped} rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    assert cgroup.find_cpu_controller(mountinfo) == (2, str(root))
    (root / "cgroup.controllers").write_text("cpuset io\n")
    assert cgroup.find_cpu_controller(mountinfo) is None
    v1 = mountinfo + "32 23 0:28 / /x/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    assert cgroup.find_cpu_controller(v1) == (1, "/x/cpu,cpuacct")


def test_check_permitted_cfs_quota_leaves_nothing():
    before = _cgroup_names()
    linux.check_permitted(validate("linux", "cfs-quota", budget_us=10000, period_us=100000))
    assert _cgroup_names() == before


def test_cpu_quota_throttles_and_cleans_up(start, quotas):
    setting = validate("linux", "cfs-quota", budget_us=10000, period_us=100000)
    quota = cgroup.CpuQuota(setting, run_id=f"test-{os.getpid()}")
    quotas.append(quota)
    path = Path(quota.path)
    assert path.is_dir()
    assert path.name == f"hvbench-test-{os.getpid()}"

    proc = start(SPINNER)
    quota.add(proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    time.sleep(0.5)
    rb = quota.readback()
    assert rb["path"] == str(path)
    assert (rb["quota_us"], rb["period_us"]) == (10000, 100000)
    assert rb["tasks"] >= 1
    assert rb["cpu_stat"]["nr_throttled"] > 0
    throttled = rb["cpu_stat"]["throttled_time" if rb["version"] == 1 else "throttled_usec"]
    assert throttled > 0

    quota.close()
    assert not path.exists()
    # the spinner is back in the root cgroup and still running
    cgroups = Path(f"/proc/{proc.pid}/cgroup").read_text()
    assert re.search(r"^\d+:[^:]*\bcpu\b[^:]*:/$|^0::/$", cgroups, re.M)
    assert proc.poll() is None
    quota.close()  # twice is fine


def test_cpu_quota_context_manager_and_existing_group(start):
    setting = validate("linux", "cfs-quota", budget_us=50000, period_us=100000)
    run_id = f"test-cm-{os.getpid()}"
    proc = start(HELPER, "2")
    with cgroup.CpuQuota(setting, run_id) as quota:
        quota.add(proc.pid)
        assert quota.readback()["tasks"] == 3
        with pytest.raises(Refused, match="already exists"):
            cgroup.CpuQuota(setting, run_id)
        assert Path(quota.path).is_dir()  # the refused second one did not remove it
    assert not Path(quota.path).exists()


def test_cpu_quota_removed_when_body_fails(start):
    setting = validate("linux", "cfs-quota", budget_us=50000, period_us=100000)
    proc = start(SPINNER)
    run_id = f"test-err-{os.getpid()}"
    with pytest.raises(RuntimeError, match="boom"), cgroup.CpuQuota(setting, run_id) as quota:
        quota.add(proc.pid)
        raise RuntimeError("boom")
    assert not Path(quota.path).exists()


def test_cpu_quota_refuses_bad_input():
    with pytest.raises(ValueError, match="needs a SCHED=cfs-quota setting"):
        cgroup.CpuQuota(validate("linux", "deadline", budget_us=5000, period_us=100000), "x")
    with pytest.raises(ValueError, match="run_id"):
        cgroup.CpuQuota(
            validate("linux", "cfs-quota", budget_us=5000, period_us=100000), "../escape"
        )
