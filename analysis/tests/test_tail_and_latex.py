"""Tail-first figures (exceedance curves, ECDFs on a log axis) and the tables as LaTeX."""

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import figures, tables
from hvbench_analysis.stats import exceedance_points

MS = 1_000_000


def test_write_makes_a_booktabs_latex_table_with_special_characters_escaped(tmp_path):
    table = pd.DataFrame(
        {
            "configuration": ["xen/rtds P100000 B77500", "bare/none_2 & 50% #1"],
            "max_ms": [1400.0, 2.5],
            "Budget (µs)": pd.array([77500, None], dtype="Int64"),
        }
    )
    tables.write(table, tmp_path, "max_x")
    assert {p.name for p in tmp_path.iterdir()} == {"max_x.md", "max_x.csv", "max_x.tex"}
    tex = (tmp_path / "max_x.tex").read_text().splitlines()
    assert tex == [
        r"\begin{tabular}{lrr}",
        r"\toprule",
        r"configuration & max\_ms & Budget (\textmu{}s) \\",
        r"\midrule",
        r"xen/rtds P100000 B77500 & 1,400.00 & 77500 \\",
        r"bare/none\_2 \& 50\% \#1 & 2.50 &  \\",
        r"\bottomrule",
        r"\end{tabular}",
    ]


def test_an_empty_table_is_still_valid_latex():
    assert tables.to_latex(pd.DataFrame()) == "% no runs of this kind\n"
    empty = tables.to_latex(pd.DataFrame(columns=["a_b"]))
    assert empty.splitlines()[2:] == [r"a\_b \\", r"\midrule", r"\bottomrule", r"\end{tabular}"]


def test_the_exceedance_curve_ends_at_the_maximum_with_one_over_n():
    values = np.array([5.0, 1.0, 3.0, 2.0, 4.0])
    x, s = exceedance_points(values)
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert s.tolist() == [1.0, 0.8, 0.6, 0.4, 0.2]  # fraction of records at x or slower
    rng = np.random.default_rng(3)
    many = rng.lognormal(1, 1, 200_000)  # thinned for plotting: the tail is kept exactly
    x, s = exceedance_points(many)
    assert len(x) < 4_000
    assert x[-1] == many.max() and s[-1] == pytest.approx(1 / len(many))
    assert np.all(np.diff(s) < 0) and s[0] == 1.0


def test_the_exceedance_figure_draws_each_curve_to_its_maximum_on_log_axes():
    latencies = np.arange(1, 1001) * MS
    fig = figures.exceedance([("a", latencies)], "t")
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    x, s = ax.lines[0].get_data()
    assert x[-1] == 1000.0 and s[-1] == pytest.approx(1 / 1000)
    assert ax.get_ylim()[0] < 1 / 1000


def test_the_ecdf_has_a_log_latency_axis_by_default_and_still_cuts_at_xlim():
    latencies = np.concatenate([np.full(99, 4 * MS), [1_400 * MS]])
    fig = figures.ecdf([("a", latencies)], "t", xlim_ms=40)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    left, right = ax.get_xlim()
    assert 0 < left < 4 and right == 40
    assert [t.get_text() for t in ax.texts] == ["max 1,400.0 ms"]  # the cut tail's arrow
    linear = figures.ecdf([("a", latencies)], "t", xlim_ms=40, log=False)
    assert linear.axes[0].get_xscale() == "linear" and linear.axes[0].get_xlim() == (0, 40)
