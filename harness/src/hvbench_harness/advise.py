"""`hvbench advise`: the smallest budget (or cap, or weight) a fitted model (`hvbench model
fit`) predicts to meet a latency SLO, and the run that confirms it; with --verify that run is
made and the SLO checked on what it measured.

    hvbench advise --fit results/explain/model --sched deadline --rate 60 --slo 'p99 <= 20'

The confirming run repeats the model's runs as they were asked for (records, warm-up, where the
job ran, ...: the meta.json of the run of that scheduler nearest to the advice) with the advised
setting and the asked rate. The advice, and the verification, go to <fit>/advice-<slo>.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from hvbench_analysis import model as perf_model
from hvbench_analysis import results as results_contract
from hvbench_analysis.load import load_runs
from hvbench_analysis.model import advice as advisor

from hvbench_harness import rerun, spec
from hvbench_harness import run as harness

# What the confirming run takes from the advice rather than from the model's runs.
ADVISED = ("sched", "budget", "cap", "weight", "period", "extratime", "noise", "send_ms")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvbench advise", description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", required=True, help="the model's folder (make model): <results>/model")
    p.add_argument("--slo", required=True, help="e.g. 'p99 <= 20' or 'max <= 50 ms'")
    p.add_argument("--sched", required=True)
    p.add_argument("--rate", type=float, help="records/s over the six producers")
    p.add_argument("--target", help="where the runs had several targets")
    p.add_argument("--period", type=int, help="µs, where the runs had several periods")
    p.add_argument("--noise", help="neighbours as NOISE= (default none)")
    p.add_argument("--knob", choices=advisor.KNOBS, help="default: what the runs varied")
    p.add_argument("--verify", action="store_true", help="make the confirming run and check")
    return p.parse_args(argv)


def asked_of(args: argparse.Namespace) -> dict:
    asked = {k: getattr(args, k) for k in ("sched", "rate", "target", "period", "noise", "knob")}
    return {k: v for k, v in asked.items() if v is not None}


def nearest_run(fitted: perf_model.Model, found: advisor.Advice) -> str:
    """The model's run of the advised scheduler whose knob is nearest the advice, at the
    asked rate where one ran at it."""
    runs = fitted.table[fitted.table["sched"] == found.setting["sched"]]
    other_rate = (runs["rate"].astype(float) - float(found.setting["rate"])).abs() > 1e-6
    distance = (runs[found.knob].astype(float) - (found.value or 0)).abs()
    return str(runs.loc[(distance + other_rate * 1e12).idxmin(), "run_id"])


def confirming_values(meta: dict, found: advisor.Advice) -> dict:
    """The run request: the model's run as asked, with the advised setting and rate."""
    values = spec.from_requested(meta["requested"])
    for name in ADVISED:
        values.pop(name, None)
    values["sched"] = found.setting["sched"]
    values[found.knob] = int(found.value)
    for name in ("period", "extratime", "weight", "cap"):
        if name != found.knob and found.setting.get(name) is not None:
            values[name] = int(found.setting[name])
    network = values.get("network")
    values["send_ms"] = round(spec.send_ms_for(float(found.setting["rate"]), network), 6)
    if found.setting.get("noise"):
        values["noise"] = found.setting["noise"]
    return values


def make_words(values: dict) -> str:
    """The request as `make run` words; defaults left out, but the advised setting and rate."""
    words = []
    for name, value in values.items():
        field = spec.BY_NAME[name]
        if value is None or value is False or (value == field.default and name not in ADVISED):
            continue
        words.append(f"{field.make}={'1' if value is True else value}")
    return " ".join(words)


def slug(slo: advisor.Slo, found: advisor.Advice) -> str:
    text = f"{found.setting['sched']}-r{found.setting['rate']:g}-{slo.statistic}-{slo.limit_ms:g}"
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text)


def verify(values: dict, meta: dict, results: Path, run_id: str, slo: advisor.Slo) -> dict:
    """The confirming run, here or on the model's testbed, and whether the SLO held in it."""
    argv = [*spec.to_argv(values), "--run-id", run_id, "--results", str(results)]
    for key, option in rerun.INPUTS.items():
        if (meta.get("inputs") or {}).get(key):
            argv += [option, meta["inputs"][key]]
    code = harness.main(argv)
    runs = load_runs([results / run_id])
    if runs.runs.empty:
        state = runs.left_out[0].state if runs.left_out else "unreadable"
        return {"run_id": run_id, "exit": code, "state": state, "held": None}
    measured = perf_model.run_table(runs).iloc[0]
    return {
        "run_id": run_id,
        "exit": code,
        "state": "completed",
        "measured_ms": float(measured[slo.statistic]),
        "held": bool(measured[slo.statistic] <= slo.limit_ms),
    }


def advise(args: argparse.Namespace) -> int:
    fit_dir = Path(args.fit)
    slo = advisor.parse_slo(args.slo)
    fitted, doc = perf_model.load(fit_dir)
    found = advisor.advise(fitted, asked_of(args), slo)
    print(advisor.advice_text(found))
    record = {"asked": asked_of(args), "slo": str(slo), "advice": found.as_dict(), "model": doc}
    if found.value is None:
        write(fit_dir, slo, found, record)
        return 3
    results = Path(doc["source"]["results"])
    source = nearest_run(fitted, found)
    meta = results_contract.read_meta(results / source)
    values = confirming_values(meta, found)
    run_id = f"advice-{slug(slo, found)}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    record["confirm"] = {
        "from_run": source,
        "make": f"make run {make_words(values)} RESULTS={results} RUN_ID={run_id}",
    }
    print(f"To confirm it: {record['confirm']['make']}")
    if args.verify:
        record["verification"] = verify(values, meta, results, run_id, slo)
        print(verification_text(record["verification"], slo))
    write(fit_dir, slo, found, record)
    held = record.get("verification", {}).get("held", True)
    return 0 if held else 3


def verification_text(checked: dict, slo: advisor.Slo) -> str:
    if checked["held"] is None:
        return f"verification {checked['run_id']}: the run {checked['state']}; nothing to check"
    verdict = "held" if checked["held"] else "did NOT hold"
    return (
        f"verification {checked['run_id']}: {slo.statistic} {checked['measured_ms']:.2f} ms: "
        f"the SLO {slo} {verdict}"
    )


def write(fit_dir: Path, slo: advisor.Slo, found: advisor.Advice, record: dict) -> None:
    path = fit_dir / f"advice-{slug(slo, found)}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"advice → {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return advise(args)
    except (perf_model.ModelError, OSError, KeyError) as e:
        print(f"hvbench advise: {e}", file=sys.stderr)
        return 1
