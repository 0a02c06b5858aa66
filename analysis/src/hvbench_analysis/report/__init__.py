"""`make report` (`python -m hvbench_analysis.report`): the report of a results folder, one
module per kind of section; `build` lists them in the page's order."""

from hvbench_analysis.report.build import build, main, parse_args
from hvbench_analysis.report.explain import WORST_SHOWN

__all__ = ["WORST_SHOWN", "build", "main", "parse_args"]
