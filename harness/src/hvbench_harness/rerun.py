"""`make rerun RUN=<run-id>`: repeat a run from its results directory alone.

The run's meta.json holds everything the harness was given: the requested settings (target,
scheduler and its parameters, rate, records, warm-up, ...), its inputs (data and model here, or
the testbed's inventory) and the commit it ran. The rerun goes through `make run`'s path with
those, as `results/<run-id>-rerun<n>`, and then compares the two bundles: the
settings requested and read back, the model, the commit and the software versions. The
comparison is printed and kept in the rerun's directory as rerun.json.

    python -m hvbench_harness.rerun --run 20261122T101500Z-xen-rtds-b77500-p100000-e0

`make account RUN=...` (`--account`) repeats no run: it accounts one again from its raw files
(hvbench_harness.rawfiles), where the run's results could not be made from them. RUN is
results/<run-id> (a run written as failed with raw/: that folder is updated, its status the
one the sending left, `accounted_again` says when and what it replaced) or work/<run-id> (a run
whose results could not be written, e.g. on a full disk: written into RESULTS, and the work
folder goes).

    python -m hvbench_harness.rerun --account results/20261122T101500Z-bare-none
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path

from hvbench_analysis import results as results_contract

from hvbench_harness import rawfiles, spec
from hvbench_harness import run as harness
from hvbench_harness.finish import exit_code, run_logs, summary_lines
from hvbench_harness.targets.kinds import kind

INPUTS = {
    "inventory": "--inventory",
    "data": "--data",
    "model": "--model",
    "kafka_libs": "--kafka-libs",
    "connector_dir": "--connector-dir",
}
# Requested keys that name the run rather than set it up.
NOT_SETTINGS = {"rep", "campaign"}
# Keys of a scheduler readback that are settings (the rest, such as thread ids, thread counts
# and CPU time used, differ from run to run by nature).
SETTING_KEYS = {
    "sched",
    "scheduler",
    "policy",
    "policies",
    "runtime_ns",
    "deadline_ns",
    "period_ns",
    "quota_us",
    "period_us",
    "budget_us",
    "cpu_max",
    "priority",
    "extratime",
    "weight",
    "cap",
    "pool",
    "pool_params",
}


class RerunError(RuntimeError):
    pass


def find_run(results: Path, run: str) -> Path:
    """RUN as a directory, a run id in results/, or a run id in a campaign's folder."""
    for candidate in (Path(run), results / run):
        if (candidate / "meta.json").exists():
            return candidate
    found = sorted(results.glob(f"*/{run}/meta.json"))
    if len(found) == 1:
        return found[0].parent
    if found:
        raise RerunError(f"{run} is in several folders: {', '.join(str(f.parent) for f in found)}")
    raise RerunError(f"no run {run} (no meta.json in {run} or under {results})")


def harness_argv(meta: dict) -> list[str]:
    """The harness's options that repeat the run: its requested settings and inputs."""
    requested = meta.get("requested")
    if not isinstance(requested, dict) or "target" not in requested:
        raise RerunError("meta.json has no requested settings to repeat")
    argv = spec.to_argv(spec.from_requested(requested))
    inputs = meta.get("inputs") or {}
    if kind(requested["target"]).testbed and not inputs.get("inventory"):
        raise RerunError("meta.json does not say the testbed's inventory (a run before 2026-11)")
    for key, option in INPUTS.items():
        if inputs.get(key):
            argv += [option, inputs[key]]
    return argv


def next_run_id(folder: Path, run_id: str) -> str:
    n = 1
    while (folder / f"{run_id}-rerun{n}").exists():
        n += 1
    return f"{run_id}-rerun{n}"


def applied_settings(readback) -> set[tuple[str, str]]:
    """The (key, value) pairs of a readback that are settings, wherever they are in it (for
    a count by policy, the policies only)."""
    found: set[tuple[str, str]] = set()
    if isinstance(readback, dict):
        for key, value in readback.items():
            if key == "policies" and isinstance(value, dict):
                found |= {("policy", name) for name in value}
            elif key in SETTING_KEYS and not isinstance(value, dict | list):
                found.add((key, json.dumps(value)))
            else:
                found |= applied_settings(value)
    elif isinstance(readback, list):
        for item in readback:
            found |= applied_settings(item)
    return found


def power_policy(meta: dict) -> dict:
    """Each host's governor, deepest idle state and turbo as read back at the start (meta.json
    `power`, schema 10); {} for runs before it."""
    readback = (meta.get("power") or {}).get("readback") or {}
    keys = ("governor", "max_cstate", "turbo")
    return {host: {k: found.get(k) for k in keys} for host, found in readback.items()}


def compare(original: dict, rerun: dict) -> dict:
    """What the two bundles agree on, and what differs."""

    def settings(meta: dict) -> dict:
        # None is "not set": runs written before every setting had every field compare equal
        requested = meta["requested"].items()
        return {k: v for k, v in requested if k not in NOT_SETTINGS and v is not None}

    def packages(meta: dict) -> dict:
        return (meta.get("versions") or {}).get("packages") or {}

    old, new = packages(original), packages(rerun)
    return {
        "original": original.get("run_id"),
        "rerun": rerun.get("run_id"),
        "settings_equal": settings(original) == settings(rerun),
        "readback_equal": applied_settings(original.get("sched"))
        == applied_settings(rerun.get("sched"))
        and power_policy(original) == power_policy(rerun),
        "model_equal": original.get("model") == rerun.get("model"),
        "commit": {
            "original": (original.get("git") or {}).get("commit"),
            "rerun": (rerun.get("git") or {}).get("commit"),
            "rerun_dirty": (rerun.get("git") or {}).get("dirty"),
        },
        "packages_changed": {
            name: [old.get(name), new.get(name)]
            for name in sorted(set(old) | set(new))
            if old.get(name) != new.get(name)
        },
    }


def raw_folder(run: str, results: Path, work: Path) -> Path:
    """The folder of RUN's raw files: RUN/raw or RUN itself (a work folder), or the run id's
    in results/ or work/."""
    for candidate in (Path(run), results / run, work / run):
        for folder in (candidate / results_contract.RAW, candidate):
            if (folder / rawfiles.BEFORE).exists():
                return folder
    raise RerunError(
        f"no raw files of {run}: no {results_contract.RAW}/{rawfiles.BEFORE} or {rawfiles.BEFORE} "
        f"in {run}, {results / run} or {work / run} (only a run whose results could not be made "
        "keeps them)"
    )


def account_again(source: Path, results: Path | None) -> int:
    """Account the raw files in `source` again into results/<run-id>/ (a results folder's
    raw/: that folder, unless `results` says elsewhere). The run's exit code (make run's)."""
    saved = rawfiles.load(source)
    run_id = saved["meta"]["run_id"]
    came_from = source.parent if source.name == results_contract.RAW else None
    if results is None:
        results = came_from.parent if came_from is not None else Path("results")
    target = results / run_id
    in_place = came_from is not None and target.resolve() == came_from.resolve()
    if target.exists() and not in_place:
        raise RerunError(f"{target} exists already; account the run into another RESULTS=")
    try:
        accounted = rawfiles.account(source, saved)
    except Exception as e:  # what failed in the run may fail again: said, nothing touched
        traceback.print_exc()
        raise RerunError(f"accounting {source}/ failed again: {type(e).__name__}: {e}") from None
    replaced = replaced_status(came_from)
    accounted.meta["accounted_again"] = {
        "at": datetime.now(UTC).isoformat(),
        "from": str(source.resolve()),
        "status_replaced": replaced,
    }
    if came_from is not None and (came_from / results_contract.LOGS).is_dir():
        logs = sorted((came_from / results_contract.LOGS).iterdir())
    else:
        logs = run_logs(source, saved["how"]["pairs"])
    summary = summary_lines(target, accounted.counts, accounted.meta)
    try:
        rawfiles.write(target, accounted.meta, accounted.samples, source, logs, keep_raw=True)
    except OSError as e:
        raise RerunError(
            f"writing {target}/ failed: {e}; nothing was left there. The raw files are still in "
            f"{source}/: account them again with {rawfiles.again(source, results)}"
        ) from None
    if came_from is None:
        shutil.rmtree(source)  # a work folder: its raw files are in the results' raw/ now
    print(f"make account: {run_id} accounted again from {source}/" + "\n".join(summary))
    return exit_code(accounted.meta, accounted.counts)


def replaced_status(folder: Path | None) -> dict | None:
    """The status of the results an accounting replaces (None: none, or unreadable)."""
    try:
        return results_contract.read_meta(folder)["status"] if folder is not None else None
    except results_contract.ResultsError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvbench rerun", description=__doc__)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="run id or directory: repeat the run")
    which.add_argument(
        "--account",
        metavar="RUN",
        help="results/<run-id> (with raw/) or work/<run-id>: account the run again from its "
        "raw files (make account)",
    )
    p.add_argument(
        "--results",
        default=None,
        help="where results go (default results; with --account of a results folder, its own)",
    )
    p.add_argument("--work", default="work")
    args = p.parse_args(argv)
    if args.account is not None:
        return account(args.account, args.results, args.work)
    return rerun(args.run, args.results or "results", args.work)


def account(run: str, results_given: str | None, work: str) -> int:
    """make account: a run accounted again from its raw files."""
    results = Path(results_given) if results_given else None
    try:
        source = raw_folder(run, results or Path("results"), Path(work))
        return account_again(source, results)
    except (RerunError, rawfiles.RawError, results_contract.ResultsError) as e:
        print(f"make account: {e}", file=sys.stderr)
        return 1


def rerun(run: str, results: str, work: str) -> int:
    """make rerun: the run repeated from its meta.json, and the two compared."""
    try:
        original_dir = find_run(Path(results), run)
        original = results_contract.read_meta(original_dir)
        run_id = next_run_id(Path(results), original_dir.name)
        options = [
            *harness_argv(original),
            *("--results", results),  # a campaign's run too: its folder keeps its runs only
            *("--work", work, "--run-id", run_id, "--rerun-of", str(original_dir.resolve())),
        ]
    except (RerunError, results_contract.ResultsError) as e:
        print(f"make rerun: {e}", file=sys.stderr)
        return 1
    print(
        f"make rerun: {original_dir.name} as {run_id}: python -m hvbench_harness.run "
        + " ".join(options)
    )
    code = harness.main(options)
    rerun_dir = Path(results) / run_id
    if not (rerun_dir / "meta.json").exists():
        return code or 1
    comparison = compare(original, results_contract.read_meta(rerun_dir))
    (rerun_dir / "rerun.json").write_text(json.dumps(comparison, indent=1) + "\n")
    print(
        f"make rerun: settings requested {'equal' if comparison['settings_equal'] else 'DIFFER'}, "
        f"read back {'equal' if comparison['readback_equal'] else 'DIFFER'}, model "
        f"{'equal' if comparison['model_equal'] else 'DIFFERS'}; commit "
        f"{comparison['commit']['original']} → {comparison['commit']['rerun']}"
        + (" (dirty)" if comparison["commit"]["rerun_dirty"] else "")
        + f"; {len(comparison['packages_changed'])} package version(s) changed"
    )
    same = comparison["settings_equal"] and comparison["readback_equal"]
    return code if same else (code or 3)


if __name__ == "__main__":
    sys.exit(main())
