"""The campaign section: a campaign's runs by status and its sustainable rates."""

from __future__ import annotations

import html
from pathlib import Path

from hvbench_analysis import (
    campaign,
    tables,
)
from hvbench_analysis.load import Runs
from hvbench_analysis.report.page import Page
from hvbench_analysis.results import CAMPAIGN_FILE


def campaign_section(page: Page, results: Path, tables_dir: Path, runs: Runs, picked: bool) -> None:
    """The campaign the results folder holds, if any: what it is, its runs by status, the runs
    that are not done and why, and the sustainable rates of a rate search. An unreadable
    campaign.json is flagged; the runs are reported without it."""
    try:
        doc = campaign.read_campaign(results)
    except campaign.CampaignFileError as e:
        page.h(2, "Campaign")
        page.raw(f'<p class="flag">{html.escape(str(e))}; the runs are reported without it.</p>')
        return
    if doc is None:
        return
    page.h(2, "Campaign")
    page.p(campaign.summary(doc))
    # A run listed as done without a run directory here is missing from every table below.
    known = set(runs.runs["run_id"]) | {name for name, _ in runs.skipped}
    known |= {run.run_id for run in runs.left_out}
    absent = [run_id for run_id in campaign.done_run_ids(doc) if run_id not in known]
    if absent and not picked:
        page.raw(
            f'<p class="flag">Done in {CAMPAIGN_FILE} but without a run directory '
            f"here: {html.escape(', '.join(absent))}</p>"
        )
    not_done = campaign.runs_not_done(doc)
    page.h(3, "Runs not done")
    if not_done.empty:
        page.p("Every run of the campaign is done.", "note")
    else:
        page.table(not_done, "campaign_runs_not_done")
    tables.write(not_done, tables_dir, "campaign_runs_not_done")
    if campaign.is_model_search(doc):
        table = campaign.model_search_table(doc)
        page.h(3, "Model search")
        page.p(campaign.model_search_summary(doc))
        page.table(table, "campaign_model_search")
        tables.write(table, tables_dir, "campaign_model_search")
    elif doc.get("search") is not None:
        rates = campaign.sustainable_rates(doc)
        page.h(3, "Sustainable rate")
        page.table(rates, "campaign_sustainable_rate")
        page.p(
            "The highest input rate (records/s over the six producers) at which every run of the "
            "trial finished, accounted for every record and kept its p99 within the SLO.",
            "note",
        )
        tables.write(rates, tables_dir, "campaign_sustainable_rate")
