"""Single-record inference for the streaming job: the LiteRT export of the trained LSTM.

Keras `model.predict` costs tens of milliseconds per call; the LiteRT interpreter on the same
weights costs a fraction of a millisecond (see bench/bench_inference.py) and agrees with Keras
to within 1e-5 on the test split (checked by `make train`). A Forecaster is not thread-safe:
use one per thread.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hvbench_job.forecast import LOOKBACK
from hvbench_job.forecast.scaling import MinMaxScaler

MANIFEST = "manifest.json"
SERVED_FILES = ("model.tflite", "scaler.json")
# The same weights exported at a fixed batch of BATCH (forecast/model.py), for messages that
# carry several records. Measured here (2026-11-26): one call costs 332 µs for one window and
# 1,447 µs for eight, so a rest of PAD_FROM or more windows is padded to a batch, fewer go
# one by one.
BATCH_MODEL, BATCH, PAD_FROM = "model-b8.tflite", 8, 5


class ArtifactError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_checksum(directory: Path) -> str:
    """One checksum over what is served: the LiteRT model(s) and the scaler."""
    digest = hashlib.sha256()
    served = [*SERVED_FILES, *([BATCH_MODEL] if (directory / BATCH_MODEL).exists() else [])]
    for name in served:
        digest.update(name.encode() + b"\0" + sha256_file(directory / name).encode() + b"\n")
    return digest.hexdigest()


class Forecaster:
    def __init__(self, directory: Path | str, verify: bool = True) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.directory = Path(directory)
        try:
            self.manifest = json.loads((self.directory / MANIFEST).read_text())
        except FileNotFoundError:
            raise ArtifactError(
                f"{self.directory} holds no trained model (run `make train`)"
            ) from None
        if verify:
            for name, expected in self.manifest["files"].items():
                if sha256_file(self.directory / name) != expected:
                    raise ArtifactError(f"{self.directory / name} does not match its checksum")
        self.checksum: str = self.manifest["checksum"]
        self.scaler = MinMaxScaler.from_dict(
            json.loads((self.directory / "scaler.json").read_text())
        )
        self._single = _Served(Interpreter, self.directory / "model.tflite", 1)
        self._batch = None  # artifacts from before the batch export serve one by one
        if BATCH_MODEL in self.manifest["files"]:
            self._batch = _Served(Interpreter, self.directory / BATCH_MODEL, BATCH)
        self._low = self.scaler.low
        self._span = self.scaler.high - self.scaler.low

    def predict_scaled(self, scaled: np.ndarray) -> float:
        """Model output for one window already scaled, shape (1, 12, 1) float32."""
        return float(self._single.run(scaled)[0])

    def predict(self, flows: Sequence[float]) -> float:
        """Next five-minute flow after 12 flows (vehicles per 5 minutes, oldest first)."""
        return self.predict_many([flows])[0]

    def predict_many(self, windows: Sequence[Sequence[float]]) -> list[float]:
        """The forecast of each window, in order: in batches of BATCH where the batch export
        is there, the rest one by one or padded (PAD_FROM)."""
        for flows in windows:
            if len(flows) != LOOKBACK:
                raise ValueError(f"expected {LOOKBACK} flows, got {len(flows)}")
            if not all(math.isfinite(v) and v >= 0 for v in flows):
                raise ValueError(f"flows must be finite and non-negative: {list(flows)}")
        scaled = ((np.asarray(windows, dtype=np.float32) - self._low) / self._span).reshape(
            len(windows), LOOKBACK, 1
        )
        return [y * self._span + self._low for y in self.predict_scaled_many(scaled)]

    def predict_scaled_many(self, scaled: np.ndarray) -> list[float]:
        """Model outputs for windows already scaled, shape (n, 12, 1) float32."""
        outputs: list[float] = []
        i = 0
        while i < len(scaled):
            if self._batch is not None and len(scaled) - i >= PAD_FROM:
                chunk = scaled[i : i + BATCH]
                padded = np.zeros((BATCH, LOOKBACK, 1), np.float32)
                padded[: len(chunk)] = chunk
                outputs.extend(self._batch.run(padded)[: len(chunk)].tolist())
                i += len(chunk)
            else:
                outputs.append(float(self._single.run(scaled[i : i + 1])[0]))
                i += 1
        return outputs


class _Served:
    """One LiteRT interpreter of a fixed batch; not thread-safe."""

    def __init__(self, interpreter, path: Path, batch: int) -> None:
        self._interpreter = interpreter(model_path=str(path), num_threads=1)
        self._interpreter.allocate_tensors()
        (inp,) = self._interpreter.get_input_details()
        (out,) = self._interpreter.get_output_details()
        if tuple(inp["shape"]) != (batch, LOOKBACK, 1):
            raise ArtifactError(
                f"{path.name}: input shape {tuple(inp['shape'])}, expected ({batch}, {LOOKBACK}, 1)"
            )
        self._input_index, self._output_index = inp["index"], out["index"]

    def run(self, scaled: np.ndarray) -> np.ndarray:
        """The model's outputs (scaled), one per window of `scaled` (batch, 12, 1) float32."""
        self._interpreter.set_tensor(self._input_index, np.ascontiguousarray(scaled))
        self._interpreter.invoke()
        return self._interpreter.get_tensor(self._output_index)[:, 0]
