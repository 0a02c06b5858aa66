"""The performance model's section: the model `make model` saved beside the runs, how well it
predicted configurations it had not seen, and the advice `make advise` gave (docs/model.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hvbench_analysis import figures
from hvbench_analysis.report.page import OutDirs, Page, table_with_note


def model_section(page: Page, results: Path, dirs: OutDirs) -> None:
    """Only where the results folder holds a model (results/<campaign>/model)."""
    folder = results / "model"
    if not folder.is_dir():
        return
    # the model's package imports scikit-learn and SciPy (a second at start): only when needed
    from hvbench_analysis import model

    if not (folder / model.MODEL_FILE).exists():
        return
    page.h(2, "Performance model")
    try:
        doc = json.loads((folder / model.MODEL_FILE).read_text())
        validation = model.read_validation(folder / model.VALIDATION_FILE)
    except (OSError, ValueError, KeyError) as e:
        page.p(f"The model in {folder} cannot be read: {e}", "flag")
        return
    page.p(
        f"Fitted to {doc['runs']} runs in {doc['configurations']} configurations; it varies "
        f"{', '.join(doc['inputs']['dimensions'])} and holds "
        f"{', '.join(f'{k} {v}' for k, v in doc['inputs']['fixed'].items())}. Each statistic "
        "(its logarithm) is an analytical part plus a Gaussian process over the settings: "
        f"{forms_text(doc)}. The model, its inputs (runs.csv) and the held-out predictions "
        f"(validation.csv) are in {folder} (docs/model.md)."
    )
    summary = model.validation_summary(validation)
    if summary.empty:
        page.p("No configuration could be held out: it takes three that share settings.", "note")
    else:
        table_with_note(
            page,
            summary,
            "model_validation",
            dirs,
            "Each configuration held out in turn, the model fitted to the others and asked for "
            "it: the absolute error of its prediction against the mean of the configuration's "
            "runs, and how many of those runs fell inside the predicted 90 % interval.",
        )
        drawn = figures.save(
            dirs.figures,
            "model_predicted_vs_measured",
            figures.predicted_vs_measured,
            validation,
            model.STATISTICS,
        )
        page.figure(drawn, "Predicted vs measured, held-out configurations", "model_predicted")
    for path in sorted(folder.glob("advice-*.json")):
        advice_paragraph(page, path)


ANALYTIC_TEXT = {
    "bound": "a line in the reservation's bound",
    "knee": "a queue's knee at {cost:.2f} ms of CPU per record",
    "none": "no analytical part",
}


def forms_text(doc: dict) -> str:
    """Per statistic, its analytical part and the kernel's smoothness."""
    parts = []
    for name, fitted in doc["fitted"].items():
        kind, params = fitted.get("analytic"), fitted.get("analytic_params") or []
        if kind == "knee" and len(params) != 3:
            kind = "none"  # nothing varied that the knee could be fitted to
        text = ANALYTIC_TEXT.get(kind, str(kind))
        if kind == "knee":
            text = text.format(cost=math.exp(params[2]))
        parts.append(f"{name}: {text}, Matérn ν {fitted.get('matern_nu')}")
    return "; ".join(parts)


def advice_paragraph(page: Page, path: Path) -> None:
    from hvbench_analysis.model.advice import Advice, advice_text  # imported once model_section ran

    try:
        record = json.loads(path.read_text())
        text = advice_text(Advice(**record["advice"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        page.p(f"{path.name} cannot be read: {e}", "flag")
        return
    checked = record.get("verification")
    if checked and checked.get("held") is not None:
        verdict = "held" if checked["held"] else "did not hold"
        text += (
            f" Verified by run {checked['run_id']}: {record['slo'].split()[0]} "
            f"{checked['measured_ms']:.2f} ms, the SLO {verdict}."
        )
    elif record.get("confirm"):
        text += f" Not verified yet: {record['confirm']['make']}"
    page.p(f"Advice ({record.get('slo')}): {text}")
