"""Min–max scaling of flows to [0, 1], fitted on the training split only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MinMaxScaler:
    low: float
    high: float

    @classmethod
    def fit(cls, values: np.ndarray) -> MinMaxScaler:
        values = np.asarray(values, dtype=float)
        if values.size == 0 or not np.isfinite(values).all():
            raise ValueError("the scaler needs a non-empty set of finite values")
        low, high = float(values.min()), float(values.max())
        if high <= low:
            raise ValueError(f"cannot scale a constant series (all values {low})")
        return cls(low, high)

    def transform(self, values):
        return (np.asarray(values, dtype=float) - self.low) / (self.high - self.low)

    def inverse(self, scaled):
        return np.asarray(scaled, dtype=float) * (self.high - self.low) + self.low

    def to_dict(self) -> dict:
        return {"kind": "min-max", "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, d: dict) -> MinMaxScaler:
        if d.get("kind") != "min-max":
            raise ValueError(f"not a min-max scaler: {d!r}")
        return cls(float(d["low"]), float(d["high"]))
