"""A campaign replayed over the runs of a recorded one (`make campaign ... REPLAY=<folder>`).

Each run the campaign asks for is the recorded run of the same settings and repetition, copied
under the new run's id, instead of a new run; its meta.json names the run it copies
(`replayed_from`). Nothing runs and no machine is touched. An adaptive search replayed over a
full grid sees exactly the runs the grid measured, so its advice and its number of runs can be
set beside the grid's in seconds, and come out the same every time (docs/simulate.md).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hvbench_agent.names import BadName, check_name
from hvbench_analysis import results as results_contract

from hvbench_harness.campaign.file import Campaign, CampaignError, Point


def settings_key(settings: dict) -> str:
    """The settings a run was asked with, without the unset ones, in one order."""
    return json.dumps({k: v for k, v in settings.items() if v is not None}, sort_keys=True)


@dataclass(frozen=True)
class Recorded:
    """A recorded campaign's finished runs: (settings, repetition) → run id."""

    folder: Path
    runs: dict[tuple[str, int], str]

    @classmethod
    def of(cls, folder: str | Path, campaign: Campaign, into: Path) -> Recorded:
        """The recorded campaign in folder; CampaignError, before anything is written, if it
        is none, runs on another target, or is the folder the replay would write to."""
        folder = Path(folder)
        if folder.resolve() == into.resolve():
            raise CampaignError(f"REPLAY={folder} is where this campaign writes its runs")
        try:
            doc = results_contract.read_campaign_index(folder)
        except results_contract.ResultsError as e:
            raise CampaignError(f"REPLAY={folder}: {e}") from None
        if doc is None:
            raise CampaignError(
                f"REPLAY={folder} holds no campaign ({results_contract.CAMPAIGN_FILE})"
            )
        if doc.get("target") != campaign.target:
            raise CampaignError(
                f"REPLAY={folder} ran on {doc.get('target')}; {campaign.file} runs on "
                f"{campaign.target}"
            )
        return cls(folder, finished_runs(folder, doc))

    def replay(self, point: Point, rep: int, results: Path, log_file: Path) -> tuple[int, float]:
        """The recorded run of point's settings and repetition rep, copied to results (its
        meta.json with the new run id and the run it copies); (exit code, seconds) as a run's
        child gives them. Without one, exit 1 and the reason in the run's log."""
        started = time.monotonic()
        log_file.parent.mkdir(exist_ok=True)
        recorded = self.runs.get((settings_key(point.settings), rep))
        if recorded is None:
            log_file.write_text(f"make run: {self.folder} has no finished run of "
                                f"{point.shown()}, repetition {rep}\n")  # fmt: skip
            return 1, time.monotonic() - started
        source = self.folder / recorded
        try:
            shutil.copytree(source, results, symlinks=True)
            meta = results_contract.read_meta(results)
            meta.update(run_id=results.name, replayed_from=str(source))
            results_contract.rewrite_meta(results, meta)
        except (OSError, results_contract.ResultsError) as e:  # what was copied is set aside
            log_file.write_text(f"make run: {source} could not be replayed: {e}\n")
            return 1, time.monotonic() - started
        log_file.write_text(f"replayed: a copy of {source}\n")
        return 0, time.monotonic() - started


def finished_runs(folder: Path, doc: dict) -> dict[tuple[str, int], str]:
    """The index's finished runs, (settings, repetition) → run id; CampaignError for an entry
    that is not one, or whose run id is not a name (it becomes a path: `../x` would copy a
    folder outside the campaign)."""
    runs = {}
    for entry in doc.get("runs") or []:
        if not isinstance(entry, dict) or entry.get("status") != "done":
            continue
        settings, rep, run_id = entry.get("settings"), entry.get("rep"), entry.get("run_id")
        try:
            if not isinstance(settings, dict) or not isinstance(rep, int):
                raise BadName(f"a finished run without its settings or repetition: {entry}")
            check_name(run_id, "a run's id")
        except BadName as e:
            raise CampaignError(f"REPLAY={folder}: {e}") from None
        runs[(settings_key(settings), rep)] = run_id
    return runs
