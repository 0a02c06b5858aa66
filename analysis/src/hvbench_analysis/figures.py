"""Figures (matplotlib, PNG and SVG): ECDF overlays (with intervals across repetitions),
latency densities, latency over time."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker
from matplotlib.patches import Patch

from hvbench_analysis.compare import ecdf_band
from hvbench_analysis.stats import ecdf_points, percentile

WIDTH, HEIGHT = 7.0, 4.0  # inches; a column-and-a-half figure
plt.rcParams.update(
    {
        "figure.dpi": 100,
        "savefig.dpi": 130,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "font.size": 9,
        "legend.fontsize": 8,
        "svg.fonttype": "none",  # text stays text in SVG
    }
)


def axes(height: float = HEIGHT) -> tuple[plt.Figure, plt.Axes]:
    """A figure with fixed margins (computing a tight layout costs more than drawing)."""
    fig, ax = plt.subplots(figsize=(WIDTH, height))
    fig.subplots_adjust(left=0.09, right=0.97, bottom=0.12 * HEIGHT / height, top=0.91)
    return fig, ax


def plain_log_axis(axis) -> None:
    """Log-scale ticks at 1, 2, 5 × 10^k, labelled as plain numbers (0.5, 20, 100 …)."""
    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def ecdf(
    curves: list[tuple[str, np.ndarray]], title: str, xlim_ms: float | None = None
) -> plt.Figure:
    """ECDF of latency (ms) per curve. With an x limit, a curve that runs past it ends in an
    arrow at the right edge labelled with its true maximum, so a cut tail is never hidden."""
    fig, ax = axes()
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
            ax.plot([xlim_ms], [below], marker=">", color=line.get_color(), clip_on=False)
    if xlim_ms is not None:
        ax.set_xlim(0, xlim_ms)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("end-to-end latency (ms)")
    ax.set_ylabel("fraction of records ≤ x")
    ax.set_title(title)
    ax.legend(loc="lower right")
    return fig


def ecdf_bands(
    configs: list[tuple[str, list[np.ndarray]]], title: str, seed: int = 0
) -> plt.Figure:
    """ECDF of latency (ms, log scale) per configuration, its runs pooled, each given as
    (label, [latencies of each run]). A configuration with ≥ 2 runs gets a shaded band: at each
    level F, the 95 % bootstrap interval over runs of the mean of the runs' F-quantiles
    (compare.ecdf_band), so run-to-run spread shows where the curves may really differ."""
    fig, ax = axes()
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
    ax.legend(handles=handles, loc="lower right")
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


def density(curves: list[tuple[str, np.ndarray]], title: str) -> plt.Figure:
    """Latency density per configuration, on a log latency axis."""
    fig, ax = axes()
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
    ax.legend(loc="upper right")
    return fig


def over_time(
    time_s: np.ndarray, latency_ns: np.ndarray, warmup: np.ndarray, title: str, bins: int = 300
) -> plt.Figure:
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
        index = np.searchsorted(t, edges)
        mids, p50, p99, top = [], [], [], []
        for a, b, lo, hi in zip(index[:-1], index[1:], edges[:-1], edges[1:], strict=True):
            if b > a:
                chunk = ms[a:b]
                mids.append((lo + hi) / 2)
                p50.append(percentile(chunk, 50))  # nearest-rank, like every table
                p99.append(percentile(chunk, 99))
                top.append(chunk.max())
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


def save(fig: plt.Figure, directory: Path, name: str) -> bytes:
    """Write name.png and name.svg; return the PNG bytes (for embedding in the HTML page)."""
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    png = buffer.getvalue()
    (directory / f"{name}.png").write_bytes(png)
    fig.savefig(directory / f"{name}.svg", format="svg")
    plt.close(fig)
    return png
