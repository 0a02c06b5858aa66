"""`make campaign`: a grid of settings, each point run several times through `make run`'s path.

A campaign file (YAML, see campaigns/README.md) names the target, the settings every point
shares, a grid (every combination of its lists) and/or explicit points, the number of
repetitions and the order: sequential (each point's repetitions in a row, points in file order)
or shuffled (every run of the campaign in a seeded random order, which spreads slow drift of the
host over all points). Or, instead of repetitions at fixed rates, a sustainable-rate search: for
each point, the highest input rate whose p99 stays under an SLO (linear or binary search over a
list of rates, as Theodolite does).

Every run is `python -m hvbench_harness.run` in a child process, as `make run` starts it, with
the run id `<point>-r<rep>` and results in `results/<campaign>/<run-id>/`. The index
`results/<campaign>/campaign.json` says for every run its settings, status (done, failed with
its reason, interrupted) and headline figures; it is rewritten after each run, so an interrupted
campaign resumes (--resume) with the runs that are not done. Each run's output goes to
`results/<campaign>/logs/<run-id>.log`.

    python -m hvbench_harness.campaign validate campaigns/*.yml
    python -m hvbench_harness.campaign run campaigns/table4-rtds.yml \\
        --inventory inventory/lab/hosts.yml
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from hvbench_harness import spec
from hvbench_harness.campaign import search
from hvbench_harness.campaign.file import Campaign, CampaignError, ModelSearch, describe, load
from hvbench_harness.campaign.index import Index
from hvbench_harness.campaign.replay import Recorded
from hvbench_harness.campaign.runner import Interrupted, Runner, log
from hvbench_harness.parts import RunError
from hvbench_harness.runlocks import hold, registered_machines
from hvbench_harness.targets.kinds import kind
from hvbench_harness.testbed import TestbedError, inventory_target


@dataclass(frozen=True)
class Options:
    """How a campaign runs: where its runs read and write (the run request's inputs, spec.py),
    resumed or not, beside other runs or not."""

    results: str = "results"
    work: str = "work"
    inventory: str | None = None
    data: str = "data/pems"
    model: str = "artifacts/forecaster"
    kafka_libs: str = "build/kafka/libs"
    connector_dir: str = "build/flink/lib"
    resume: bool = False
    concurrent: bool = False
    replay: str | None = None  # a recorded campaign's folder: its runs copied, none run


def run_campaign(
    campaign: Campaign, options: Options, harness: tuple[str, ...] | None = None
) -> int:
    """Every run of the campaign (or its search), while it holds its machines; the exit code.
    Replayed, nothing runs: no machine is checked or held."""
    if options.replay:
        return run_held(campaign, options, harness, forced=False)
    if kind(campaign.target).testbed:
        if not options.inventory:
            raise CampaignError(
                f"{campaign.file} runs on {campaign.target}: HOST=<host> or INVENTORY=<dir>"
            )
        found = inventory_target(options.inventory)
        if found != campaign.target:
            raise CampaignError(
                f"{campaign.file} runs on {campaign.target}, but {options.inventory} is {found}"
            )
    machines = registered_machines(campaign.target, options.inventory)
    forced = bool(options.concurrent or campaign_settings(campaign, "concurrent"))
    with hold(campaign.name, machines, kind="campaign", forced=forced):
        return run_held(campaign, options, harness, forced)


def campaign_settings(campaign: Campaign, key: str):
    """A setting the campaign's `settings` give every point (None if they do not)."""
    return (campaign.definition.get("settings") or {}).get(key)


def run_held(
    campaign: Campaign, options: Options, harness: tuple[str, ...] | None, forced: bool
) -> int:
    """The campaign's runs, while it holds its machines in the run registry (runlocks); its
    own runs, its children, do not count it as another run. Forced, its runs are too: they
    run beside the runs the campaign was forced past."""
    folder = Path(options.results) / campaign.name
    recorded = Recorded.of(options.replay, campaign, folder) if options.replay else None
    index = Index.open(campaign, folder, options.resume)
    shutil.copy(campaign.file, folder / "campaign.yml")
    runner = Runner(
        campaign,
        index,
        folder,
        harness_args(options, campaign.target) + (["--concurrent"] if forced else []),
        Path(options.work) / campaign.name,
    )
    if harness:
        runner.harness = harness
    runner.recorded = recorded
    if recorded is not None:  # the index says its runs are copies (the report shows it)
        index.doc["replayed_from"] = str(recorded.folder)
    replayed = f"; replayed from {recorded.folder}, nothing runs" if recorded else ""
    log(f"campaign {campaign.name}: {describe(campaign)}; index {index.path}{replayed}")
    handlers = {s: signal.signal(s, runner.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if isinstance(campaign.search, ModelSearch):
            search.run_model_search(runner)
        elif campaign.search:
            search.run_rate_search(runner)
        else:
            runner.run_grid()
    except Interrupted:
        log(f"campaign {campaign.name} interrupted; make campaign ... RESUME=1 goes on from here")
        return 130
    finally:
        index.save()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    runs = index.doc["runs"]
    failed = [e for e in runs if e["status"] != "done"]
    unaccounted = [e for e in runs if e["status"] == "done" and not e["accounted"]]
    log(
        f"campaign {campaign.name}: {len(runs) - len(failed)} of {len(runs)} run(s) done"
        + (f", {len(unaccounted)} with records unaccounted for" if unaccounted else "")
        + f"; results in {folder}/"
    )
    for entry in failed:
        log(f"  {entry['run_id']} {entry['status']}: {entry['reason']}")
    return 1 if failed or unaccounted else 0


def harness_args(options: Options, target: str) -> list[str]:
    """The inputs every run of the campaign reads, as the harness's options: a testbed's
    inventory, or this machine's data, model and jars."""
    return spec.to_argv({name: getattr(options, name) for name in kind(target).inputs})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvbench campaign", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="check campaign files (nothing runs)")
    check.add_argument("files", nargs="+")
    target = sub.add_parser("target", help="print the target a campaign file names")
    target.add_argument("file")
    go = sub.add_parser("run", help="run a campaign (or resume it)")
    go.add_argument("file")
    go.add_argument("--resume", action="store_true")
    go.add_argument(
        "--concurrent",
        action="store_true",
        help="run although another run or campaign holds the machine (as CONCURRENT=1 does "
        "for a run; `concurrent: true` in the settings does both)",
    )
    go.add_argument("--inventory")
    go.add_argument("--results", default="results")
    go.add_argument("--work", default="work")
    go.add_argument("--data", default="data/pems")
    go.add_argument("--model", default="artifacts/forecaster")
    go.add_argument("--kafka-libs", default="build/kafka/libs")
    go.add_argument("--connector-dir", default="build/flink/lib")
    go.add_argument(
        "--replay",
        metavar="FOLDER",
        help="copy each run from a recorded campaign's results (same settings and repetition) "
        "instead of running it: a search set beside the full grid that recorded them",
    )
    args = p.parse_args(argv)
    try:
        if args.command == "validate":
            bad = 0
            for file in args.files:
                try:
                    print(f"{file}: {describe(load(file))}")
                except CampaignError as e:
                    print(f"make campaign: {e}", file=sys.stderr)
                    bad += 1
            return 1 if bad else 0
        if args.command == "target":
            print(load(args.file).target)
            return 0
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Options)}
        return run_campaign(load(args.file), Options(**given))
    except (CampaignError, TestbedError, RunError) as e:
        print(f"make campaign: {e}", file=sys.stderr)
        return 1
