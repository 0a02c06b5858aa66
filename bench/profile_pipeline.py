"""Where the CPU goes per record: the real pipeline at one rate, sampled by perf on every CPU.

One run of the pipeline (six producers, the broker, the Flink job, the consumer) at `--rate`,
a record a message (`--grouped`: one producer, a round of the six detectors a message). Once
its warm-up is over, `perf record` samples every CPU for `--seconds` with call stacks. The
two JVMs (broker and job) start with `-XX:+PreserveFramePointer` and write the names of their
compiled methods to `/tmp/perf-<pid>.map` when they end (`-XX:+DumpPerfMapAtExit`, given
through `JAVA_TOOL_OPTIONS`): perf then names Java frames as well as native and kernel ones.
Python frames show as the interpreter's C functions (Python 3.11 has no perf trampoline); the
job's Python runs inside the JVM's task thread (thread mode).

Printed: for each part and each of its busiest threads, the CPU time per record sent while
sampling, and the functions that used most of it (where the sample was, not its callers).
Not a benchmark: the profiled JVMs keep a frame pointer, which costs a little, and perf's
sampling costs more. Every sample goes to `--out` (perf.data and the perf maps).

    python bench/profile_pipeline.py --rate 1200 --seconds 10
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import pipeline
from bench_scale import GROUPED

JVM_PROFILING = "-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit -XX:+PreserveFramePointer"
# what a process's command line says it is, first match wins
PARTS = (
    ("kafka.Kafka", "broker"),
    ("hvbench_job", "flink job"),
    ("org.apache.flink", "flink job"),
    ("hvbench_load.producers", "producers"),
    ("hvbench_load.consumer", "consumer"),
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="artifacts/forecaster")
    p.add_argument("--data", default="data/pems")
    p.add_argument("--rate", type=float, default=1200.0, help="rec/s, all producers together")
    p.add_argument("--warmup-seconds", type=float, default=60.0, help="before sampling")
    p.add_argument("--seconds", type=float, default=10.0, help="sampled")
    p.add_argument("--frequency", type=int, default=2000, help="samples a second, each CPU")
    p.add_argument("--out", type=Path, default=Path("bench/out/profile"))
    p.add_argument("--top", type=int, default=8, help="functions shown per thread")
    p.add_argument(
        "--grouped",
        action="store_true",
        help="the six detectors as one producer whose round goes out as one message "
        "(PRODUCERS=1 MESSAGES=group), as bench_scale.py's grouped layout",
    )
    return p.parse_args()


def part_of(pid: int) -> str | None:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return next((part for needle, part in PARTS if needle in cmdline), None)


def find_parts(parts: dict[int, str]) -> None:
    parts[0] = "idle"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (part := part_of(int(entry.name))):
            parts[int(entry.name)] = part


def sample(args: argparse.Namespace, parts: dict[int, str], done: threading.Event) -> None:
    """Once the producers have sent for the warm-up: which process is which part, then perf on
    every CPU."""
    while not done.wait(0.5) and "producers" not in parts.values():
        find_parts(parts)
    if done.wait(args.warmup_seconds):
        return
    find_parts(parts)
    subprocess.run(
        ["perf", "record", "-a", "-g", "-F", str(args.frequency), "-o",
         str(args.out / "perf.data"), "--", "sleep", str(args.seconds)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def samples(out: Path) -> collections.Counter:
    """{(pid, thread name, function): samples}, the function where each sample was."""
    text = subprocess.run(
        ["perf", "script", "-i", str(out / "perf.data"), "-F", "comm,pid,tid,ip,sym"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    counts: collections.Counter = collections.Counter()
    thread = None
    for line in text.splitlines():
        if line and not line[0].isspace():  # "comm pid/tid": a sample's first line
            comm, _, ids = line.rstrip().rpartition(" ")
            thread = (int(ids.split("/")[0]), comm.strip())
        elif line.strip() and thread:  # its first frame: where the sample was
            counts[(*thread, short_name(line.split(None, 1)[1:]))] += 1
            thread = None
    return counts


def short_name(sym: list[str]) -> str:
    """A Java method without its return type, arguments and shaded package prefix."""
    name = sym[0].strip() if sym else "[unknown]"
    if "(" in name and " " in name.split("(")[0]:
        name = name.split("(")[0].rsplit(" ", 1)[1]
    return name.replace("org.apache.flink.kafka.shaded.org.apache.kafka", "kafka")[:110]


def print_profile(args: argparse.Namespace, parts: dict[int, str], records: float) -> None:
    counts = samples(args.out)
    per_record_ms = 1000.0 / args.frequency / records  # a sample's CPU time, per record
    by_part: collections.Counter = collections.Counter()
    by_thread: collections.Counter = collections.Counter()
    for (pid, comm, _), n in counts.items():
        by_part[parts.get(pid, "other")] += n
        by_thread[(parts.get(pid, "other"), comm)] += n
    total = sum(counts.values())
    print(f"\n{total} samples over {args.seconds:g} s, {records:.0f} records sent meanwhile")
    print("CPU per record (ms), by part:")
    for part, n in by_part.most_common():
        print(f"  {part:12} {n * per_record_ms:8.3f}  ({100 * n / total:4.1f} %)")
    print("\nBusiest threads, and where their time went:")
    for (part, comm), n in by_thread.most_common(args.top):
        print(f"  {part} / {comm}: {n * per_record_ms:.3f} ms a record")
        funcs = collections.Counter()
        for (pid, c, func), k in counts.items():
            if c == comm and parts.get(pid, "other") == part:
                funcs[func] += k
        for func, k in funcs.most_common(args.top):
            print(f"      {100 * k / n:5.1f} %  {func}")


def main() -> int:
    args = parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: linux-perf)")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["JAVA_TOOL_OPTIONS"] = (
        os.environ.get("JAVA_TOOL_OPTIONS", "") + " " + JVM_PROFILING
    ).strip()
    parts: dict[int, str] = {}
    done = threading.Event()
    sampler = threading.Thread(target=sample, args=(args, parts, done))
    sampler.start()
    ramp_s = min(30.0, args.warmup_seconds / 2)  # a cold pipeline at full rate falls behind
    records = int(args.rate * (args.warmup_seconds + args.seconds + 10 - 0.45 * ramp_s))
    started = time.monotonic()
    try:
        grouped = GROUPED if args.grouped else ()
        result = pipeline(
            args, records, 6 * 1000.0 / args.rate, args.warmup_seconds, "profile", ramp_s, grouped
        )
    finally:
        done.set()
        sampler.join()
    took = time.monotonic() - started
    print(f"run: exit {result['exit']}, latency {result['latency']}, {took:.0f} s")
    for pid in parts:
        if Path(f"/tmp/perf-{pid}.map").exists():
            shutil.copy(f"/tmp/perf-{pid}.map", args.out)
    print_profile(args, parts, args.rate * args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
