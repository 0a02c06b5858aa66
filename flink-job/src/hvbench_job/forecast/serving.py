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


class ArtifactError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_checksum(directory: Path) -> str:
    """One checksum over what is served: the LiteRT model and the scaler."""
    digest = hashlib.sha256()
    for name in SERVED_FILES:
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
        self._interpreter = Interpreter(
            model_path=str(self.directory / "model.tflite"), num_threads=1
        )
        self._interpreter.allocate_tensors()
        (inp,) = self._interpreter.get_input_details()
        (out,) = self._interpreter.get_output_details()
        if tuple(inp["shape"]) != (1, LOOKBACK, 1):
            raise ArtifactError(
                f"model input shape {tuple(inp['shape'])}, expected (1, {LOOKBACK}, 1)"
            )
        self._input_index, self._output_index = inp["index"], out["index"]
        self._low = self.scaler.low
        self._span = self.scaler.high - self.scaler.low

    def predict_scaled(self, scaled: np.ndarray) -> float:
        """Model output for one window already scaled, shape (1, 12, 1) float32."""
        self._interpreter.set_tensor(self._input_index, scaled)
        self._interpreter.invoke()
        return float(self._interpreter.get_tensor(self._output_index)[0, 0])

    def predict(self, flows: Sequence[float]) -> float:
        """Next five-minute flow after 12 flows (vehicles per 5 minutes, oldest first)."""
        if len(flows) != LOOKBACK:
            raise ValueError(f"expected {LOOKBACK} flows, got {len(flows)}")
        if not all(math.isfinite(v) and v >= 0 for v in flows):
            raise ValueError(f"flows must be finite and non-negative: {list(flows)}")
        scaled = ((np.asarray(flows, dtype=np.float32) - self._low) / self._span).reshape(
            1, LOOKBACK, 1
        )
        return self.predict_scaled(scaled.astype(np.float32, copy=False)) * self._span + self._low
