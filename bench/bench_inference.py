"""Single-record flow inference: the served LiteRT model next to Keras, in one run.

Goal: LiteRT p50 ≤ 0.5 ms per record. Keras baselines: `model.predict` (what the paper's job
would call), a direct eager call and a `tf.function`. Beside them, what a group's message
costs per record: `predict_many` over 6 windows (the freeway detectors as one group) and
over 54 (a PEMS-BAY group), served by the batch export where the model has it.

And the same model with int8 weights (`hvbench_job.forecast.quantise`, made here from the
model's SavedModel), which `make run MODEL_DIR=...` serves where asked: its time and how far
its forecasts are from the float model's. The forecast reads its 1.8 MB of float weights at
each of its 12 steps; at a quarter of the size they stay in the CPU's own cache.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from common import report, summary, time_calls
from hvbench_job.forecast import LOOKBACK
from hvbench_job.forecast.quantise import quantise
from hvbench_job.forecast.serving import ArtifactError, Forecaster


def int8_weights(model: Path, windows: np.ndarray, records: int) -> dict:
    """The model with int8 weights (forecast/quantise.py, in a folder of its own here): the
    times of its Forecaster.predict, its size and its gap to the float model's forecasts
    (vehicles per 5 minutes); {} where the model cannot be quantised (said why)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            manifest = quantise(model, Path(folder) / "int8")
        except ArtifactError as e:
            print(f"int8 weights: not measured: {e}")
            return {}
        served = Forecaster(Path(folder) / "int8")
        it = iter(range(10**9))
        times = time_calls(lambda: served.predict(windows[next(it) % len(windows)]), records, 200)
        size = (Path(folder) / "int8" / "model.tflite").stat().st_size
    return {"times": times, "model.tflite bytes": size, **manifest["parity"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="artifacts/forecaster", type=Path)
    parser.add_argument("--records", default=5000, type=int)
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    served = Forecaster(args.model)
    model = keras.saving.load_model(args.model / "model.keras")
    rng = np.random.default_rng(1)
    windows = rng.uniform(served.scaler.low, served.scaler.high, (args.records, LOOKBACK))
    scaled = served.scaler.transform(windows)[..., None].astype(np.float32)

    it = iter(range(10**9))
    rows = {
        "LiteRT Forecaster.predict": summary(
            time_calls(lambda: served.predict(windows[next(it) % len(windows)]), args.records, 200)
        ),
        "Keras model.predict": summary(
            time_calls(
                lambda: model.predict(scaled[next(it) % len(scaled)][None], verbose=0), 100, 5
            )
        ),
        "Keras eager call": summary(
            time_calls(lambda: model(scaled[next(it) % len(scaled)][None], training=False), 300, 10)
        ),
    }
    compiled = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    rows["Keras tf.function"] = summary(
        time_calls(lambda: compiled(scaled[next(it) % len(scaled)][None]), 1000, 20)
    )
    for size in (6, 54):
        calls = max(args.records // size, 50)
        per_call = time_calls(
            lambda n=size: served.predict_many(windows[(k := next(it) % 50) : k + n]), calls, 20
        )
        rows[f"LiteRT predict_many, {size} windows, per record"] = summary(per_call / size)
    extra = {}
    if quantised := int8_weights(args.model, windows, args.records):
        rows["LiteRT Forecaster.predict, int8 weights"] = summary(quantised.pop("times"))
        extra["int8 weights (gaps in vehicles / 5 min)"] = quantised
    litert = rows["LiteRT Forecaster.predict"]["p50_us"]
    ratios = {k: round(v["p50_us"] / litert, 2) for k, v in rows.items()}
    report(
        "inference",
        rows,
        [("LiteRT p50 <= 500 us", litert <= 500)],
        {"p50 ratio to LiteRT": ratios, "model checksum": served.checksum[:16], **extra},
    )


if __name__ == "__main__":
    main()
