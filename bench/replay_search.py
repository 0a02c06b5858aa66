"""An adaptive campaign replayed over a recorded full grid, in every order of the grid's
repetitions: how many runs it takes and what it advises, against the grid.

`make campaign ... REPLAY=` gives a search a setting's runs in the order the grid ran them
(its first run of a value is the grid's first repetition). Two runs of one setting may differ
a lot, so this replays the search once per assignment of repetitions: at each rate, the
recorded repetitions rotated (with two: as recorded, or swapped), every combination over the
rates. Each replay reads a copy of the grid's index with the repetitions renumbered and links
to its run folders; nothing runs. Printed: per order, the search's runs and its advice per
point, with the SLO's statistic of each run at the advice and whether they confirm it. Not a
test, nor part of `make bench` (it needs a recorded grid).

    python bench/replay_search.py campaigns/search-simulated-deadline-bare.yml \\
        results/simulate-validate-bare
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import sys
import tempfile
from pathlib import Path

from hvbench_harness.campaign import cli
from hvbench_harness.campaign.file import load
from hvbench_harness.spec import rate_per_s


def rate_of(entry: dict) -> float:
    return rate_per_s(entry["settings"]["send_ms"], entry["settings"].get("network", "freeway"))


def renumbered(index: dict, shifts: dict[float, int], repetitions: int) -> dict:
    """The index with each run's repetition rotated by its rate's shift."""
    runs = []
    for entry in index["runs"]:
        shift = shifts.get(rate_of(entry), 0) if "send_ms" in entry["settings"] else 0
        runs.append({**entry, "rep": (entry["rep"] - 1 + shift) % repetitions + 1})
    return {**index, "runs": runs}


def replayed(campaign_file: str, grid: Path, shifts: dict[float, int], scratch: Path) -> dict:
    """The search's record (campaign.json's `search`) replayed over the grid so renumbered."""
    index = json.loads((grid / "campaign.json").read_text())
    variant = scratch / "grid"
    variant.mkdir()
    for entry in index["runs"]:
        if (grid / entry["run_id"]).is_dir():
            (variant / entry["run_id"]).symlink_to((grid / entry["run_id"]).resolve())
    doc = renumbered(index, shifts, index["repetitions"])
    (variant / "campaign.json").write_text(json.dumps(doc))
    options = cli.Options(results=str(scratch / "results"), replay=str(variant))
    campaign = load(campaign_file)
    with contextlib.redirect_stdout(io.StringIO()):
        cli.run_campaign(campaign, options)
    out = scratch / "results" / campaign.name / "campaign.json"
    return json.loads(out.read_text())["search"]


def advice_of(record: dict) -> str:
    """Each point's advice and its runs' statistic at it, e.g. p01 8000 (5.60, 6.10 held)."""
    shown = []
    for point, state in record["points"].items():
        advice = state.get("advice")
        value = advice.get("value") if isinstance(advice, dict) else advice
        confirmation = state.get("confirmation") or {}
        measured = ", ".join(f"{m:.2f}" for m in confirmation.get("measured", []))
        verdict = "held" if confirmation.get("held") else "not confirmed"
        shown.append(f"{point} {value} ({measured or 'no run'} {verdict})")
    return "; ".join(shown)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("campaign", help="the adaptive campaign's file")
    p.add_argument("grid", type=Path, help="the recorded full grid's results folder")
    args = p.parse_args()
    index = json.loads((args.grid / "campaign.json").read_text())
    rates = sorted({rate_of(e) for e in index["runs"] if "send_ms" in e["settings"]})
    reps = index["repetitions"]
    print(f"{args.campaign} replayed over {args.grid} (grid runs: {len(index['runs'])})")
    for shifts in itertools.product(range(reps), repeat=len(rates)):
        by_rate = dict(zip(rates, shifts, strict=True))
        with tempfile.TemporaryDirectory() as scratch:
            record = replayed(args.campaign, args.grid, by_rate, Path(scratch))
        shown = ", ".join(f"{r:g}/s +{s}" for r, s in by_rate.items())
        print(f"repetitions rotated {shown}: {record['runs']} of {record['grid_runs']} runs, "
              f"advice {advice_of(record)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
