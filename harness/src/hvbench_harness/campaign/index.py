"""results/<campaign>/campaign.json, the campaign's index: every run's settings, status and
headline figures, rewritten after each run, so that an interrupted campaign resumes."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from hvbench_analysis import results as results_contract

from hvbench_harness.campaign.file import (
    Campaign,
    CampaignError,
    ModelSearch,
    Point,
    run_id,
)
from hvbench_harness.targets.kinds import kind


class Index:
    """results/<campaign>/campaign.json, rewritten whole (atomically) after every change."""

    def __init__(self, path: Path, doc: dict) -> None:
        self.path = path
        self.doc = doc

    @classmethod
    def open(cls, campaign: Campaign, folder: Path, resume: bool) -> Index:
        path = folder / results_contract.CAMPAIGN_FILE
        if path.exists():
            if not resume:
                raise CampaignError(
                    f"{folder} holds a campaign already: RESUME=1 continues it; to start "
                    "again, move that folder away"
                )
            doc = results_contract.read_campaign_index(folder)
            if doc.get("definition") != campaign.definition:
                raise CampaignError(
                    f"{campaign.file} changed since the campaign in {folder} started; a changed "
                    "campaign is a new one: save it under another name"
                )
            for entry in doc["runs"]:
                if entry["status"] == "running":  # the campaign itself was killed
                    entry["status"] = "interrupted"
                    entry["reason"] = "the campaign stopped during this run"
            return cls(path, doc)
        folder.mkdir(parents=True, exist_ok=True)
        created = now()
        doc = {
            "campaign": campaign.name,
            "file": campaign.file,
            "definition": campaign.definition,
            "target": campaign.target,
            "order": campaign.order,
            "seed": campaign.seed,
            "repetitions": campaign.repetitions,
            "created_at": created,
            "updated_at": created,
            "runs": [],
            "search": None,
        }
        if isinstance(campaign.search, ModelSearch):
            doc["search"] = {**asdict(campaign.search), "points": {}, "steps": []}
        elif campaign.search:
            s = campaign.search
            doc["search"] = {
                "slo_p99_ms": s.slo_p99_ms,
                "method": s.method,
                "rates_per_s": s.rates_per_s,
                "duration_s": s.duration_s,
                "points": {},
            }
        else:
            doc["runs"] = [_entry(point, rep) for point, rep in campaign.planned()]
        index = cls(path, doc)
        index.save()
        return index

    def entry(self, point: Point, rep: int) -> dict:
        rid = run_id(point, rep)
        for entry in self.doc["runs"]:
            if entry["run_id"] == rid:
                return entry
        entry = _entry(point, rep)
        self.doc["runs"].append(entry)
        return entry

    def save(self) -> None:
        self.doc["updated_at"] = now()
        results_contract.write_campaign_index(self.path.parent, self.doc)

    def overhead_s(self, target: str) -> float:
        """Mean time a finished run took besides sending, measured in this campaign."""
        extra = [
            e["duration_s"] - e["expected_send_s"]
            for e in self.doc["runs"]
            if e["status"] == "done" and e.get("duration_s") is not None
        ]
        return sum(extra) / len(extra) if extra else kind(target).overhead_s


def _entry(point: Point, rep: int) -> dict:
    return {
        "run_id": run_id(point, rep),
        "point": point.id,
        "rep": rep,
        "settings": point.settings,
        "rate_per_s": point.rate_per_s(),
        "expected_send_s": point.expected_send_s(),
        "status": "pending",
        "reason": None,
        "exit_code": None,
        "started_at": None,
        "ended_at": None,
        "duration_s": None,
        "accounted": None,
        "p99_ms": None,
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
