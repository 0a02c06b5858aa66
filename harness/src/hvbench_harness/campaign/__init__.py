"""`make campaign`: a grid of settings, each point run several times through `make run`'s path
(docs: campaigns/README.md). The file and its points (file.py), the index that lets a campaign
resume (index.py), the runs one after another (runner.py), the sustainable-rate and model
searches (search.py, model_search.py), the command line (cli.py)."""

from hvbench_harness.campaign.cli import Options, main, run_campaign
from hvbench_harness.campaign.file import (
    Campaign,
    CampaignError,
    ModelSearch,
    Point,
    Search,
    check_points,
    describe,
    load,
    run_argv,
    run_id,
)
from hvbench_harness.campaign.index import Index
from hvbench_harness.campaign.runner import Interrupted, Runner, summary
from hvbench_harness.campaign.search import highest_passing

__all__ = [
    "Campaign",
    "CampaignError",
    "Index",
    "Interrupted",
    "ModelSearch",
    "Options",
    "Point",
    "Runner",
    "Search",
    "check_points",
    "describe",
    "highest_passing",
    "load",
    "main",
    "run_argv",
    "run_campaign",
    "run_id",
    "summary",
]
