"""Supervised windows from PeMS flows and the chronological train/test split.

A window is 12 consecutive five-minute flows of one detector and the flow that follows. Any
window that touches a missing value or an absent interval is dropped, never filled, and the
drops are counted. Windows of all detectors are pooled and split by the time of their target:
the earliest 80% of target times train, the rest test.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from hvbench_job.forecast import LOOKBACK
from hvbench_job.pems import PemsData


@dataclass
class Windows:
    x: np.ndarray  # (n, LOOKBACK) flows, vehicles per 5 minutes
    y: np.ndarray  # (n,) the next flow
    station: np.ndarray  # (n,) station id
    target_time: np.ndarray  # (n,) datetime64 of y

    def __len__(self) -> int:
        return len(self.y)

    def take(self, mask: np.ndarray) -> Windows:
        return Windows(self.x[mask], self.y[mask], self.station[mask], self.target_time[mask])


@dataclass
class Split:
    train: Windows
    test: Windows
    cut: pd.Timestamp  # first target time of the test split
    dropped: dict[int, int]  # windows dropped per station for missing data or gaps

    def summary(self) -> dict:
        return {
            "train_windows": len(self.train),
            "test_windows": len(self.test),
            "test_from": str(self.cut),
            "dropped_windows": {str(k): v for k, v in self.dropped.items()},
        }


def make_windows(data: PemsData, stations: list[int]) -> tuple[Windows, dict[int, int]]:
    parts, dropped = [], {}
    for station in stations:
        flow = data.series(station, "total_flow")
        values = flow.to_numpy(dtype=float)
        if len(values) <= LOOKBACK:
            dropped[station] = 0
            continue
        frames = np.lib.stride_tricks.sliding_window_view(values, LOOKBACK + 1)
        complete = np.isfinite(frames).all(axis=1)
        dropped[station] = int((~complete).sum())
        frames = frames[complete]
        times = flow.index.to_numpy()[LOOKBACK:][complete]
        parts.append((frames, np.full(len(frames), station), times))
    if not parts:
        raise ValueError("no complete windows: not enough data")
    frames = np.concatenate([p[0] for p in parts])
    windows = Windows(
        x=frames[:, :LOOKBACK].astype(np.float32),
        y=frames[:, LOOKBACK].astype(np.float32),
        station=np.concatenate([p[1] for p in parts]),
        target_time=np.concatenate([p[2] for p in parts]),
    )
    # chronological order across stations (stable, so ties keep station order)
    order = np.argsort(windows.target_time, kind="stable")
    return windows.take(order), dropped


def chronological_split(data: PemsData, stations: list[int], train_fraction: float = 0.8) -> Split:
    windows, dropped = make_windows(data, stations)
    times = np.unique(windows.target_time)
    if len(times) < 2:
        raise ValueError("need windows at two or more times to split")
    cut = times[min(len(times) - 1, max(1, int(len(times) * train_fraction)))]
    in_train = windows.target_time < cut
    return Split(windows.take(in_train), windows.take(~in_train), pd.Timestamp(cut), dropped)
