"""Figures (matplotlib; SVG and PDF, PNG where asked): ECDF overlays (with intervals across
repetitions), exceedance curves (the tail first), latency densities, latency over time."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only, no display

import numpy as np
from matplotlib import cycler, font_manager, ticker
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hvbench_analysis import drawing
from hvbench_analysis.compare import ecdf_band
from hvbench_analysis.stats import ecdf_points, exceedance_points, nearest_rank

if TYPE_CHECKING:
    import pandas as pd

WIDTH, HEIGHT = 7.0, 4.0  # inches; a column-and-a-half figure
matplotlib.rcParams.update(
    {
        "figure.dpi": 100,
        "savefig.dpi": 130,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "font.size": 9,
        "legend.fontsize": 8,
        "svg.fonttype": "none",  # text stays text in SVG
        "svg.hashsalt": "hvbench",  # its element ids the same from one report to the next
        "axes.titley": 1.0,  # a fixed place: placing it around the axis' labels costs a layout
        "pdf.compression": 1,  # zlib's fastest: a third less time per PDF, files 15 % larger
    }
)
PNG_OPTIONS = {"compress_level": 1}  # the PNG is embedded in the page: 5 % larger, 3 × faster


def warm_up() -> None:
    """What a worker process (drawing.begin) loads before its first figure, while the report
    reads its runs: the SVG and PDF writers' modules (0.2 s) and the font."""
    for writer in ("matplotlib.backends.backend_pdf", "matplotlib.backends.backend_svg"):
        importlib.import_module(writer)
    font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))


def axes(height: float = HEIGHT) -> tuple[Figure, Axes]:
    """A figure with fixed margins (computing a tight layout costs more than drawing)."""
    fig = Figure(figsize=(WIDTH, height))  # not pyplot's: nothing keeps it once it is written
    ax = fig.subplots()
    fig.subplots_adjust(left=0.09, right=0.97, bottom=0.12 * HEIGHT / height, top=0.91)
    return fig, ax


COLOURS = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
LEGEND_INSIDE = 8  # a legend of more entries goes below the axes, in columns


def curve_styles(ax: Axes, curves: int) -> None:
    """More curves than colours (a campaign's configurations): each colour comes again with
    another line style, so that no two of up to 40 curves look alike."""
    if curves > len(COLOURS):
        ax.set_prop_cycle(cycler(linestyle=["-", "--", ":", "-."]) * cycler(color=COLOURS))


def legend(fig: Figure, ax: Axes, loc: str, handles: list | None = None) -> None:
    """The legend inside the axes at loc; with more than LEGEND_INSIDE entries, below the axes
    in columns, the figure made taller to hold it (inside, it hid the curves and ran off the
    figure)."""
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    if len(handles) <= LEGEND_INSIDE:
        ax.legend(handles=handles, loc=loc)
        return
    longest = max(len(h.get_label()) for h in handles)
    width, height = fig.get_size_inches()
    columns = max(1, min(3, int(width / (0.055 * longest + 0.55))))  # 7-point text, its handle
    rows = -(-len(handles) // columns)
    below = 0.35 + 0.15 * rows  # inches: the rows, and room for the x axis' label above them
    params = fig.subplotpars
    bottom, top, total = params.bottom, params.top, height + below
    fig.set_size_inches(width, total)
    # the axes keep their size in inches
    fig.subplots_adjust(bottom=(bottom * height + below) / total,
                        top=1 - (1 - top) * height / total)  # fmt: skip
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, (below - 0.1) / total),
               ncols=columns, fontsize=7, frameon=False)  # fmt: skip


def plain_number(value: float, _position=None) -> str:
    """A tick label as a plain number: 0.5, 20, 0.001 (a module-level function, so that a
    figure can be pickled to the process that writes it)."""
    return f"{value:g}"


def plain_log_axis(axis) -> None:
    """Log-scale ticks at 1, 2, 5 × 10^k, labelled as plain numbers (0.5, 20, 100 …), with a
    grid line each. No minor ticks: the labelled ones are dense enough, and drawing the minor
    ones took a fifth of a figure's time."""
    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(plain_number))
    axis.set_minor_locator(ticker.NullLocator())


def ecdf(
    curves: list[tuple[str, np.ndarray]],
    title: str,
    xlim_ms: float | None = None,
    log: bool = True,
) -> Figure:
    """ECDF of latency (ms, log scale unless log=False) per curve. With an x limit, a curve
    that runs past it ends in an arrow at the right edge labelled with its true maximum, so a
    cut tail is never hidden."""
    fig, ax = axes()
    curve_styles(ax, len(curves))
    for label, values_ns in curves:
        x, f = ecdf_points(np.asarray(values_ns) / 1e6)
        if len(x) == 0:
            continue
        (line,) = ax.step(x, f, where="post", label=f"{label} (n={len(values_ns):,})", lw=1.2)
        if xlim_ms is not None and x[-1] > xlim_ms:
            below = f[np.searchsorted(x, xlim_ms, side="right") - 1] if x[0] <= xlim_ms else 0.0
            ax.annotate(
                f"max {x[-1]:,.1f} ms",
                xy=(xlim_ms, below),
                xytext=(-4, -10),
                textcoords="offset points",
                ha="right",
                fontsize=7,
                color=line.get_color(),
                arrowprops={"arrowstyle": "->", "color": line.get_color()},
            )
            ax.plot([xlim_ms], [below], marker=">", ls="none", color=line.get_color(),
                    clip_on=False)  # fmt: skip
    if log:
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)
        ax.set_xlim(log_left_limit(curves, xlim_ms), xlim_ms)
    elif xlim_ms is not None:
        ax.set_xlim(0, xlim_ms)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("end-to-end latency (ms, log scale)" if log else "end-to-end latency (ms)")
    ax.set_ylabel("fraction of records ≤ x")
    ax.set_title(title)
    legend(fig, ax, "lower right")
    return fig


# A log axis has no 0: it starts just below the smallest sample, never below this.
LOG_FLOOR_MS = 0.01


def log_left_limit(curves: list[tuple[str, np.ndarray]], xlim_ms: float | None) -> float:
    """The left end of a log latency axis (ms): a little below the smallest positive sample,
    and a decade below the right limit if that is smaller."""
    values = [np.asarray(v, float) for _, v in curves]
    positive = [v[v > 0].min() for v in values if (v > 0).any()]
    left = max(0.9 * min(positive) / 1e6, LOG_FLOOR_MS) if positive else LOG_FLOOR_MS
    return min(left, xlim_ms / 10) if xlim_ms is not None else left


def exceedance(curves: list[tuple[str, np.ndarray]], title: str) -> Figure:
    """Tail first: per curve, the fraction of records at latency x or slower (1 − F, log scale)
    against x (ms, log scale). Each curve ends at its maximum (1/n), marked with a dot, so the
    last few records, which an ECDF squeezes into its top pixel, spread over decades here."""
    fig, ax = axes()
    curve_styles(ax, len(curves))
    lowest = 1.0
    for label, values_ns in curves:
        x, s = exceedance_points(np.asarray(values_ns) / 1e6)
        if len(x) == 0:
            continue
        text = f"{label} (n={len(values_ns):,}, max {x[-1]:,.1f} ms)"
        (line,) = ax.step(x, s, where="pre", lw=1.2, label=text)
        ax.plot(x[-1:], s[-1:], marker="o", ms=3.5, ls="none", color=line.get_color())
        lowest = min(lowest, s[-1])
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    ax.set_yscale("log")
    fraction_log_axis(ax.yaxis)
    ax.set_ylim(lowest / 2, 1.2)
    ax.set_xlabel("end-to-end latency x (ms, log scale)")
    ax.set_ylabel("fraction of records slower than x (log scale)")
    ax.set_title(title)
    legend(fig, ax, "upper right")  # curves fall from the upper left: that corner stays empty
    fig.subplots_adjust(left=0.11)  # room for tick labels such as 0.0001
    return fig


def fraction_log_axis(axis) -> None:
    """Log-scale ticks at each decade, labelled as plain numbers (1, 0.1, 0.001 …); no minor
    ticks (plain_log_axis)."""
    axis.set_major_locator(ticker.LogLocator(subs=(1.0,)))
    axis.set_major_formatter(ticker.FuncFormatter(plain_number))
    axis.set_minor_locator(ticker.NullLocator())


def ecdf_bands(configs: list[tuple[str, list[np.ndarray]]], title: str, seed: int = 0) -> Figure:
    """ECDF of latency (ms, log scale) per configuration, its runs pooled, each given as
    (label, [latencies of each run]). A configuration with ≥ 2 runs gets a shaded band: at each
    level F, the 95 % bootstrap interval over runs of the mean of the runs' F-quantiles
    (compare.ecdf_band), so run-to-run spread shows where the curves may really differ."""
    fig, ax = axes()
    curve_styles(ax, len(configs))
    rng = np.random.default_rng(seed)
    banded = False
    for label, runs_ns in configs:
        runs_ms = [np.asarray(v, float) / 1e6 for v in runs_ns if len(v)]
        if not runs_ms:
            continue
        pooled = np.concatenate(runs_ms)
        x, f = ecdf_points(pooled)
        runs = f"{len(runs_ms)} run" + ("s" if len(runs_ms) > 1 else "")
        (line,) = ax.step(x, f, where="post", lw=1.2, label=f"{label} ({runs}, n={len(pooled):,})")
        if len(runs_ms) > 1:
            levels, _, low, high = ecdf_band(runs_ms, rng)
            ax.fill_betweenx(levels, low, high, color=line.get_color(), alpha=0.25, lw=0)
            banded = True
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("end-to-end latency (ms, log scale)")
    ax.set_ylabel("fraction of records ≤ x")
    ax.set_title(title)
    handles, _ = ax.get_legend_handles_labels()
    if banded:
        handles.append(Patch(color="0.5", alpha=0.35, label="95 % interval over runs"))
    legend(fig, ax, "lower right", handles)
    return fig


def log_density(values_ms: np.ndarray, points: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Kernel density of log10(latency), binned (linear binning + Gaussian kernel, Scott's
    bandwidth): fast for millions of samples. Returns (x in ms, density per log10 unit)."""
    logs = np.log10(np.clip(np.asarray(values_ms, float), 1e-3, None))
    n = len(logs)
    low, high = logs.min(), logs.max()
    sd = logs.std(ddof=1) if n > 1 else 0.0
    bandwidth = max(1.06 * sd * n ** (-1 / 5), 0.01)
    low, high = low - 4 * bandwidth, high + 4 * bandwidth
    grid = np.linspace(low, high, points)
    step = grid[1] - grid[0]
    counts = np.bincount(
        np.clip(((logs - low) / step).round().astype(int), 0, points - 1), minlength=points
    )
    # the kernel spans ±4 bandwidths, never more than the grid (equal values make it 513 wide)
    half = min(int(np.ceil(4 * bandwidth / step)), (points - 1) // 2)
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) * step / bandwidth) ** 2)
    density = np.convolve(counts, kernel / (kernel.sum() * step), mode="same") / n
    return 10**grid, density


def density(curves: list[tuple[str, np.ndarray]], title: str) -> Figure:
    """Latency density per configuration, on a log latency axis."""
    fig, ax = axes()
    curve_styles(ax, len(curves))
    for label, values_ns in curves:
        if len(values_ns) < 2:
            continue
        x, d = log_density(np.asarray(values_ns) / 1e6)
        ax.plot(x, d, lw=1.2, label=f"{label} (n={len(values_ns):,})")
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    ax.set_xlabel("end-to-end latency (ms, log scale)")
    ax.set_ylabel("density per decade")
    ax.set_title(title)
    legend(fig, ax, "upper right")
    return fig


def over_time(
    time_s: np.ndarray, latency_ns: np.ndarray, warmup: np.ndarray, title: str, bins: int = 300
) -> Figure:
    """Latency against the record's scheduled send time: per time bin the median, p99 and
    maximum, and the warm-up shaded. Every sample counts; the plot stays small. Bins hold at
    least 200 samples where possible, so that their p99 is not simply their maximum."""
    fig, ax = axes(HEIGHT * 0.8)
    t = np.asarray(time_s, float)
    ms = np.asarray(latency_ns, float) / 1e6
    if len(t):
        order = np.argsort(t, kind="stable")
        t, ms = t[order], ms[order]
        edges = np.linspace(t[0], t[-1] + 1e-9, max(1, min(bins, len(t) // 200)) + 1)
        mids, p50, p99, top = per_bin(t, ms, edges)
        ax.plot(mids, top, lw=0.8, color="tab:red", label="max per bin")
        ax.plot(mids, p99, lw=0.8, color="tab:orange", label="p99 per bin")
        ax.plot(mids, p50, lw=1.2, color="tab:blue", label="median per bin")
        w = np.asarray(warmup, bool)[order]
        if w.any():
            ax.axvspan(t[0], t[w].max(), color="0.85", label="warm-up (excluded)")
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    ax.set_xlabel("scheduled send time (s from the first record)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title)
    ax.legend(loc="upper right")
    return fig


def per_bin(t: np.ndarray, values: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per time bin that holds samples (t sorted): its middle, and the nearest-rank median,
    p99 and maximum of its values, as stats.percentile gives them: each bin's values sorted
    once, all bins together."""
    index = np.searchsorted(t, edges)
    # the last bin holds its right edge (the last sample, where t[-1] + 1e-9 rounds to t[-1])
    index[-1] = np.searchsorted(t, edges[-1], side="right")
    counts = np.diff(index)
    held = counts > 0
    starts, counts = index[:-1][held] - index[0], counts[held]
    inside = values[index[0] : index[-1]]
    bin_of = np.repeat(np.arange(len(counts)), counts)
    ordered = inside[np.lexsort((inside, bin_of))]  # by bin, then by value

    mids = ((edges[:-1] + edges[1:]) / 2)[held]
    p50, p99 = (ordered[starts + nearest_rank(p, counts)] for p in (50, 99))
    return mids, p50, p99, ordered[starts + counts - 1]


# The files each figure is written to, the first shown in the report's page: SVG (text stays
# text) and PDF (for papers); with written_as("svg", "pdf", "png"), PNG too (`report --png`).
# Drawing the PNG took 45 % of a figure's time.
_formats: tuple[str, ...] = ("svg", "pdf")
SAVE_OPTIONS = {
    "svg": {"metadata": {"Date": None}},
    "pdf": {"metadata": {"CreationDate": None}},
    "png": {"pil_kwargs": PNG_OPTIONS},
}


@contextmanager
def written_as(*formats: str):
    """Figures saved inside are written to these formats (the first one shown in the page)."""
    global _formats
    unknown = set(formats) - SAVE_OPTIONS.keys()
    if unknown or not formats:
        raise ValueError(f"figure formats: {sorted(unknown) or 'none'} (known: svg, pdf, png)")
    earlier, _formats = _formats, formats
    try:
        yield
    finally:
        _formats = earlier


def save(
    directory: Path, name: str, make: Callable[..., Figure], /, *args, paper: bool = True, **kwargs
) -> drawing.Drawing:
    """Draw make(*args, **kwargs) and write it to name.svg and name.pdf (and name.png where
    asked: written_as), with no dates in them, so that the same figure is the same file, in a
    worker process (drawing.py). paper=False: a figure to look at a single run by (its latency
    over time), one of many in a campaign: no PDF. The figure is made in the worker too: what
    crosses to it is make (a module-level function) and its data, cheaper to pickle than a
    drawn figure. Returns a drawing.Drawing, whose read() is the SVG's bytes for the page."""
    directory.mkdir(parents=True, exist_ok=True)
    formats = _formats
    if not paper and len(formats) > 1:
        formats = tuple(f for f in formats if f != "pdf")
    shown = directory / f"{name}.{formats[0]}"
    return drawing.start(make_and_write, directory, name, formats, make, args, kwargs,
                         name=f"figure {name}", path=shown, formats=formats)  # fmt: skip


def make_and_write(
    directory: Path, name: str, formats: tuple[str, ...], make: Callable[..., Figure], args, kwargs
) -> None:
    fig = make(*args, **kwargs)
    for suffix in formats:
        fig.savefig(directory / f"{name}.{suffix}", format=suffix, **SAVE_OPTIONS[suffix])


STAGE_COLOURS = {"input leg": "tab:blue", "job": "tab:orange", "output leg": "tab:green"}


def stage_bands(configs: list[tuple[str, pd.DataFrame]], title: str) -> Figure:
    """Where the time went, per configuration and latency band (stages.by_band): one bar per
    band, its segments the mean input leg, job and output leg (ms), adding up to the band's
    mean latency."""
    rows = [(label, band) for label, bands in configs for band in bands.to_dict("records")]
    fig, ax = axes(max(HEIGHT * 0.6, 0.32 * len(rows) + 1.2))
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for leg, colour in STAGE_COLOURS.items():
        width = np.array([band[leg] for _, band in rows])
        # one collection of bars per leg: a Rectangle artist each took a fifth of the figure
        corners = [(left, y - 0.35), (left, y + 0.35), (left + width, y + 0.35),
                   (left + width, y - 0.35)]  # fmt: skip
        bars = PolyCollection(np.stack([np.column_stack(c) for c in corners], axis=1),
                              facecolors=colour, edgecolors="none", label=leg)  # fmt: skip
        ax.add_collection(bars)
        left += width
    ax.set_xlim(0, max(left.max(initial=0.0), 1e-9) * 1.05)
    ax.set_ylim(-0.5, len(rows) - 0.5)
    ax.set_yticks(y, [f"{label}: {band['band']} (n={band['records']:,})" for label, band in rows])
    ax.set_xlabel("mean time in each stage (ms)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.subplots_adjust(left=0.45)
    return fig


STATE_COLOURS = {"running": "tab:green", "runnable": "tab:red", "blocked": "0.85"}


def around(record: dict, spans: pd.DataFrame) -> pd.DataFrame:
    """The trace's spans that overlap the record's life, with a margin of 5 % each side: all
    that trace_timeline draws (give it these, not a whole run's trace)."""
    lo, hi = window(record)
    return spans[(spans["end_ns"] > lo) & (spans["start_ns"] < hi)]


def window(record: dict) -> tuple[float, float]:
    sent, received = record["sent_ns"], record["received_ns"]
    margin = 0.05 * (received - sent)
    return sent - margin, received + margin


def trace_timeline(record: dict, spans: pd.DataFrame, title: str) -> Figure:
    """One slow record against the scheduler trace: a lane per traced thread, coloured by its
    state (running, runnable but not running, blocked), over the record's life from send to
    receipt (ms from the send), with the moments it reached and left the job marked."""
    sent = record["sent_ns"]
    lo, hi = window(record)
    inside = around(record, spans)
    lanes = sorted(inside.groupby(["tid", "comm"]).groups, key=lambda key: key[1])
    fig, ax = axes(max(HEIGHT * 0.55, 0.45 * len(lanes) + 1.3))
    for y, (tid, _) in enumerate(lanes):
        mine = inside[inside["tid"] == tid]
        for state, colour in STATE_COLOURS.items():
            part = mine[mine["state"] == state]
            start = (np.maximum(part["start_ns"], lo) - sent) / 1e6
            width = (np.minimum(part["end_ns"], hi) - np.maximum(part["start_ns"], lo)) / 1e6
            # one collection per lane and state: a thread's thousand spans draw as one; snapped
            # and not smoothed, as single bars are, a span shorter than a pixel stays visible
            ax.broken_barh(list(zip(start, width, strict=True)), (y - 0.3, 0.6), color=colour,
                           linewidth=0, antialiased=False, snap=True)  # fmt: skip
    ax.set_yticks(range(len(lanes)), [f"{comm} ({tid})" for tid, comm in lanes])
    marks = [("sent", sent), ("reached the job", record.get("job_in_ns")),
             ("left the job", record.get("job_out_ns")),
             ("received", record["received_ns"])]  # fmt: skip
    on_x = ax.get_xaxis_transform()  # x in data, y in axes fractions
    for name, at in marks:
        if at is not None and not np.isnan(at):
            ax.axvline((at - sent) / 1e6, color="k", lw=0.8, ls=":")
            ax.text((at - sent) / 1e6, 0.97, f" {name}", transform=on_x, fontsize=7,
                    rotation=90, va="top", ha="right")  # fmt: skip
    ax.set_xlim((lo - sent) / 1e6, (hi - sent) / 1e6)
    ax.set_xlabel("ms from the record's send")
    ax.set_title(title)
    handles = [Patch(color=c, label=s) for s, c in STATE_COLOURS.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.subplots_adjust(left=0.3, right=0.84)
    return fig


def predicted_vs_measured(validation: pd.DataFrame, statistics: tuple[str, ...]) -> Figure:
    """One panel per statistic: each held-out configuration's prediction (with its 90 %
    interval) against the mean of its runs, on log axes, with the line of perfect agreement."""
    fig = Figure(figsize=(10, 6.4))
    panels = fig.subplots(2, 3)
    for axis, name in zip(panels.flat, statistics, strict=False):
        part = validation[validation["statistic"] == name]
        if part.empty:
            axis.set_visible(False)
            continue
        below = (part["predicted"] - part["lo"]).clip(lower=0)
        above = (part["hi"] - part["predicted"]).clip(lower=0)
        axis.errorbar(
            part["measured"], part["predicted"], yerr=[below, above], fmt="o", ms=4, capsize=2
        )
        ends = [min(part["measured"].min(), part["lo"].min()), max(part[["measured", "hi"]].max())]
        axis.plot(ends, ends, color="grey", lw=0.8, ls="--")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(name)
        axis.set_xlabel("measured (ms)")
        axis.set_ylabel("predicted (ms)")
    fig.suptitle("Held-out configurations: predicted vs measured")
    fig.tight_layout()
    return fig


def latency_vs_energy(points: list[tuple[str, float, float]], front: list[int]) -> Figure:
    """Each configuration at (energy per record in mJ, p99 latency in ms), the Pareto front
    (configurations no other beats on both) joined by a line."""
    fig, ax = axes(HEIGHT + 0.25 * len(points))
    for n, (label, x, y) in enumerate(points, start=1):
        ax.scatter([x], [y], s=24, label=f"{n}: {label}")
        ax.annotate(str(n), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if len(front) > 1:
        ax.plot([points[i][1] for i in front], [points[i][2] for i in front], "k--", lw=0.8,
                label="Pareto front")  # fmt: skip
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7, frameon=False)
    fig.subplots_adjust(bottom=0.12 + 0.045 * (len(points) + 1))
    ax.set_xlabel("energy per record (mJ), measured window")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("Latency against energy, per configuration (lower left is better)")
    return fig
