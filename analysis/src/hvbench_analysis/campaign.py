"""A campaign's index, results/<campaign>/campaign.json (written by `make campaign`), as report
tables: runs by status, the runs that are not done and why, and the sustainable rate a search
found per point.

The file comes from another program and may be from an older or newer version of it: a key that
is missing or of another type is shown empty, never trusted to have a shape.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from hvbench_analysis.labels import config_label
from hvbench_analysis.results import ResultsError, read_campaign_index
from hvbench_analysis.tags import rate_per_s

NOT_DONE_COLUMNS = ["Run", "Point", "Rep", "Status", "Reason"]
RATE_COLUMNS = [
    "Point",
    "Configuration",
    "SLO p99 (ms)",
    "Method",
    "Sustainable rate (/s)",
    "Trials (rate/s: p99 ms of each run)",
]


class CampaignFileError(ValueError):
    """A campaign.json that cannot be read, with the reason."""


def read_campaign(results: Path | str) -> dict | None:
    """The campaign index in a results folder (results.read_campaign_index), or None if the
    folder holds none."""
    try:
        return read_campaign_index(Path(results))
    except ResultsError as e:
        raise CampaignFileError(str(e)) from None


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _objects(value) -> list[dict]:
    """The objects in a list (nothing if it is not a list)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def run_entries(doc: dict) -> list[dict]:
    return _objects(doc.get("runs"))


def status_counts(doc: dict) -> dict[str, int]:
    """Number of runs per status, most frequent first; a run without one counts as unknown."""
    counts = Counter(str(entry.get("status") or "unknown") for entry in run_entries(doc))
    return dict(counts.most_common())


def summary(doc: dict) -> str:
    """One sentence: name, file, target, order, repetitions and the runs by status; and, for
    a replayed campaign, the recorded one its runs are copies of."""
    counts = status_counts(doc)
    by_status = ", ".join(f"{n} {status}" for status, n in counts.items()) or "none listed"
    replayed = doc.get("replayed_from")
    return (
        f"Campaign {doc.get('campaign') or '(unnamed)'} from {doc.get('file') or '(no file)'}: "
        f"target {doc.get('target')}, order {doc.get('order')}, repetitions "
        f"{doc.get('repetitions')}, last updated {doc.get('updated_at')}. "
        f"Runs: {sum(counts.values())} ({by_status})."
        + (f" Replayed: every run is a copy of a run of {replayed}; none ran." if replayed else "")
    )


def done_run_ids(doc: dict) -> list[str]:
    """Run ids of the runs the index says are done."""
    return [
        str(e["run_id"]) for e in run_entries(doc) if e.get("status") == "done" and e.get("run_id")
    ]


def runs_not_done(doc: dict) -> pd.DataFrame:
    """Run | Point | Rep | Status | Reason for every run whose status is not done."""
    rows = [
        {
            "Run": entry.get("run_id"),
            "Point": entry.get("point"),
            "Rep": entry.get("rep"),
            "Status": entry.get("status") or "unknown",
            "Reason": one_line(entry.get("reason")),
        }
        for entry in run_entries(doc)
        if entry.get("status") != "done"
    ]
    return pd.DataFrame(rows, columns=NOT_DONE_COLUMNS)


def one_line(text) -> str:
    """A multi-line reason (the harness's message and the lines after it) on one table row."""
    if text is None:
        return ""
    return " / ".join(line.strip() for line in str(text).splitlines() if line.strip())


def sustainable_rates(doc: dict) -> pd.DataFrame:
    """Per point of a rate search: its configuration, the SLO and method, the highest rate that
    met the SLO, and every trial."""
    search = _mapping(doc.get("search"))
    rows = []
    for point, record in _mapping(search.get("points")).items():
        record = _mapping(record)
        rows.append(
            {
                "Point": point,
                "Configuration": settings_label(record.get("settings"), doc.get("target")),
                "SLO p99 (ms)": search.get("slo_p99_ms"),
                "Method": search.get("method"),
                "Sustainable rate (/s)": sustainable_text(record),
                "Trials (rate/s: p99 ms of each run)": "; ".join(
                    trial_text(trial) for trial in _objects(record.get("trials"))
                ),
            }
        )
    return pd.DataFrame(rows, columns=RATE_COLUMNS)


MODEL_SEARCH_COLUMNS = [
    "Point",
    "Configuration",
    "SLO",
    "Runs",
    "Advice",
    "Predicted at the advice (ms) [90 %]",
    "Advice after each run",
]


def is_model_search(doc: dict) -> bool:
    return _mapping(doc.get("search")).get("method") == "model"


def model_search_table(doc: dict) -> pd.DataFrame:
    """Per point of a model search: the runs it took there, the advice it ended with (the
    knob's value, the prediction there) and how the advice moved as runs came in."""
    search = _mapping(doc.get("search"))
    steps = _objects(search.get("steps"))
    rows = []
    for point, record in _mapping(search.get("points")).items():
        record = _mapping(record)
        found = _mapping(record.get("advice"))
        at = _mapping(found.get("predicted"))
        advised = advice_cell(search.get("knob"), record.get("advice"))
        confirmed = confirmation_text(search.get("slo"), record.get("confirmation"))
        rows.append(
            {
                "Point": point,
                "Configuration": settings_label(record.get("settings"), doc.get("target")),
                "SLO": search.get("slo"),
                "Runs": len(record.get("runs") or []),
                "Advice": "; ".join(filter(None, (advised, confirmed))),
                "Predicted at the advice (ms) [90 %]": (
                    f"{_number(at.get('median'), '.2f')} [{_number(at.get('lo'), '.2f')}, "
                    f"{_number(at.get('hi'), '.2f')}]"
                    if at
                    else ""
                ),
                "Advice after each run": ", ".join(
                    _number(_mapping(s.get("advice")).get(point)) for s in steps
                ),
            }
        )
    return pd.DataFrame(rows, columns=MODEL_SEARCH_COLUMNS)


def advice_cell(knob, advice) -> str:
    if isinstance(advice, dict):
        value = advice.get("value")
        return f"{knob} {_number(value)}" if value is not None else "no value meets the SLO"
    return str(advice or "search unfinished")


def confirmation_text(slo, confirmation) -> str:
    """How the runs at the advice confirm it, e.g. "confirmed: 2 runs at it met p99 <= 30
    (5.04, 13.66 ms)";
    nothing where the search asked for no run beyond the one at the advice (`confirm: 1`, or a
    search recorded before `confirm`)."""
    if not isinstance(confirmation, dict) or _whole(confirmation.get("needed")) < 2:
        return ""
    measured = confirmation.get("measured") or []
    shown = ", ".join(_number(m, ".2f") for m in measured)
    if confirmation.get("held"):
        return f"confirmed: {len(measured)} runs at it met {slo} ({shown} ms)"
    needed = _number(confirmation.get("needed"))
    at_it = f"{shown} ms" if shown else "none"
    return f"not confirmed: {needed} runs within {slo} asked for, at it: {at_it}"


def model_search_summary(doc: dict) -> str:
    search = _mapping(doc.get("search"))
    confirm = search.get("confirm")
    starts = (
        "After a traced reference at each rate, each point started at the simulator's advice "
        "and the value below it; each run after those"
        if search.get("reference")
        else "Each run after the first three per point"
    )
    return (
        f"A model search over {len(search.get('values') or [])} {search.get('knob')} values "
        f"for {search.get('slo')}: {_number(search.get('runs'))} runs, where the full grid "
        f"takes {_number(search.get('grid_runs'))}. {starts} "
        "went where the model was least certain of the advice; the search stopped once the "
        f"advice stayed the same over {_number(search.get('stable'))} more runs"
        + (" or was the simulator's own" if search.get("reference") else "")
        + (f", and {confirm} runs at each advice met the SLO" if _whole(confirm) > 1 else "")
        + f". The model is in {search.get('model')}."
    )


def _whole(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def sustainable_text(record: dict) -> str:
    """The highest rate that met the SLO, or why there is none."""
    if not record.get("finished"):
        return "search unfinished"
    rate = record.get("sustainable_rate_per_s")
    return _number(rate) if rate is not None else "none of the rates"


def trial_text(trial: dict) -> str:
    """The rate tried, each run's p99 (ms) and the verdict, e.g. 120: 31.20, 29.80 pass."""
    p99 = trial.get("p99_ms")
    values = ", ".join(_number(v, ".2f") for v in p99) if isinstance(p99, list) else _number(p99)
    passed = trial.get("passed")
    verdict = "pass" if passed is True else "fail" if passed is False else "no verdict"
    return f"{_number(trial.get('rate_per_s'))}: {values or 'no runs'} {verdict}"


def _number(value, spec: str = "g") -> str:
    """A number as text; "n/a" for a run without a figure (it failed), anything else as is."""
    if value is None:
        return "n/a"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def settings_label(settings, target) -> str:
    """A point's settings (the campaign's names: sched, budget, send_ms …) as a configuration
    label like the report's, e.g. xen/rtds P100000 B77500; unusual values as name=value."""
    settings = _mapping(settings)
    row = {
        "target": settings.get("target", target),
        "sched": settings.get("sched", "?"),
        **{key: settings.get(key) for key in ("period", "budget", "cap", "weight", "extratime")},
        "rate": rate_per_s(settings.get("send_ms")),
    }
    try:
        return config_label(row)
    except (TypeError, ValueError):
        return ", ".join(f"{key}={value}" for key, value in settings.items())
