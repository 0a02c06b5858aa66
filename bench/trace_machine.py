"""Who held the CPUs while a run's slowest records waited: every thread of the machine.

`TRACE=1` records the job's own threads (docs/tracing.md): it says when they waited for a CPU,
not who had it. This records `sched_switch` and `sched_wakeup` of every thread on every CPU,
without a filter, for a while inside a run (a tracefs instance of its own, on the TSC clock, as
the agent's trace), and then sets the run's slowest records beside it: for each, the CPU time of
the two CPUs during its life, by who ran: idle, a JVM's garbage collector, each other thread.

    python bench/trace_machine.py record --delay 75 --seconds 25 &   # beside a run:
    make run RECORDS=6000 WARMUP=40 RUN_ID=m1
    python bench/trace_machine.py explain results/m1

Not a benchmark, and not part of a run: a tool to find what the pipeline's tail waits for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from hvbench_agent.sched.sysfs import write_file
from hvbench_agent.trace import cpu_stats, pick_clock, tracefs
from hvbench_analysis.sched_trace import LINE, SWITCH, clock_to_ns

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT

TRACE = OUT / "machine_trace.txt"
INSTANCE = "hvbench-machine"
EVENTS = ("sched/sched_switch", "sched/sched_wakeup")
# who ran, by the thread's name: the JVMs' stop-the-world threads, and the idle task
KINDS = (("JVM garbage collection", ("GC Thread", "VM Thread", "G1 ")), ("idle", ("swapper/",)))


def record(delay_s: float, seconds: float, out: Path, buffer_kb: int = 65536) -> None:
    """Every thread's switches and wake-ups for `seconds`, starting after `delay_s`."""
    time.sleep(delay_s)
    instance = tracefs() / "instances" / INSTANCE
    instance.mkdir()
    try:
        clock = pick_clock((instance / "trace_clock").read_text())
        write_file(instance / "trace_clock", clock)
        write_file(instance / "buffer_size_kb", str(buffer_kb))
        write_file(instance / "options" / "overwrite", "0")
        for event in EVENTS:
            write_file(instance / "events" / event / "enable", "1")
        write_file(instance / "tracing_on", "1")
        time.sleep(seconds)
        write_file(instance / "tracing_on", "0")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# clock {clock}\n" + (instance / "trace").read_text(errors="replace"))
        stats = [cpu_stats(p / "stats") for p in (instance / "per_cpu").iterdir()]
        dropped = sum(s.get("dropped events", 0) + s.get("overrun", 0) for s in stats)
        print(f"{out}: {seconds:g} s, clock {clock}, {dropped} events dropped")
    finally:
        for event in EVENTS:
            write_file(instance / "events" / event / "enable", "0")
        instance.rmdir()


def who_ran(text: str, to_ns) -> pd.DataFrame:
    """Each CPU's stretches of one thread running: start, end (run ns), cpu, who."""
    rows, current = [], {}
    for line in text.splitlines():
        found = LINE.search(line)
        if not found or found[3] != "sched_switch" or not (m := SWITCH.match(found[4])):
            continue
        cpu, ts = int(found[1]), float(to_ns(float(found[2])))
        if cpu in current:
            rows.append((*current[cpu], ts, cpu))
        current[cpu] = (ts, m[4].strip())
    ran = pd.DataFrame(rows, columns=["start", "who", "end", "cpu"])
    ran["who"] = [kind_of(name) for name in ran["who"]]
    return ran


def kind_of(name: str) -> str:
    for kind, prefixes in KINDS:
        if name.startswith(prefixes):
            return kind
    return name


def explain(run: Path, trace: Path, above_pct: float = 99.0, shown: int = 4) -> pd.DataFrame:
    """The records above the run's p`above_pct` sent inside the trace, each with its CPU time
    by who ran meanwhile (ms, both CPUs: twice its latency in all)."""
    meta = json.loads((run / "meta.json").read_text())
    text = trace.read_text(errors="replace")
    clock = text.split("\n", 1)[0].removeprefix("# clock ").strip()
    ran = who_ran(text, clock_to_ns(clock, meta["clock"]["tsc"]))
    if ran.empty:
        raise SystemExit(f"{trace}: no sched_switch events (was it recorded with `record`?)")
    samples = pd.read_csv(run / "samples.csv")
    measured = samples[(samples["warmup"] == 0) & samples["received_ns"].notna()]
    inside = measured[(measured["sent_ns"] > ran["start"].min())
                      & (measured["received_ns"] < ran["end"].max())]  # fmt: skip
    if inside.empty:
        raise SystemExit(f"{trace}: no measured record of {run} was sent and received inside it")
    slow = inside[inside["latency_ns"] >= np.percentile(inside["latency_ns"], above_pct)]
    rows = []
    for record in slow.sort_values("latency_ns").itertuples():
        overlap = (np.minimum(ran["end"], record.received_ns)
                   - np.maximum(ran["start"], record.sent_ns)).clip(lower=0) / 1e6  # fmt: skip
        by_who = overlap.groupby(ran["who"]).sum().sort_values(ascending=False)
        others = by_who.drop(["idle", "JVM garbage collection"], errors="ignore")
        rows.append({
            "latency_ms": round(record.latency_ns / 1e6, 2),
            "input/job/output leg_ms": "/".join(
                f"{(b - a) / 1e6:.2f}" for a, b in ((record.sent_ns, record.job_in_ns),
                (record.job_in_ns, record.job_out_ns), (record.job_out_ns, record.received_ns))
            ),
            "idle_ms": round(by_who.get("idle", 0.0), 2),
            "gc_ms": round(by_who.get("JVM garbage collection", 0.0), 2),
            "most_cpu": ", ".join(f"{w} {ms:.2f}" for w, ms in others.head(shown).items()),
        })  # fmt: skip
    print(f"{len(inside)} measured records sent inside the trace; "
          f"{len(rows)} at or above their p{above_pct:g}")  # fmt: skip
    return pd.DataFrame(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    rec = sub.add_parser("record", help="trace every thread for a while")
    rec.add_argument("--delay", type=float, default=75.0, help="s before the trace starts")
    rec.add_argument("--seconds", type=float, default=25.0)
    rec.add_argument("--out", type=Path, default=TRACE)
    exp = sub.add_parser("explain", help="the run's slowest records beside the trace")
    exp.add_argument("run", type=Path, help="the run's results folder")
    exp.add_argument("--trace", type=Path, default=TRACE)
    exp.add_argument("--above", type=float, default=99.0, help="percentile of the records shown")
    args = p.parse_args()
    if args.step == "record":
        record(args.delay, args.seconds, args.out)
    else:
        with pd.option_context("display.width", 200, "display.max_colwidth", 120):
            print(explain(args.run, args.trace, args.above).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
