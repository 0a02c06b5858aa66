"""Single-record flow inference: the served LiteRT model next to Keras, in one run.

Goal: LiteRT p50 ≤ 0.5 ms per record. Keras baselines: `model.predict` (what the paper's job
would call), a direct eager call and a `tf.function`. Beside them, what a group's message
costs per record: `predict_many` over 6 windows (the freeway detectors as one group) and
over 54 (a PEMS-BAY group), served by the batch export where the model has it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import report, summary, time_calls
from hvbench_job.forecast import LOOKBACK
from hvbench_job.forecast.serving import Forecaster


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
    litert = rows["LiteRT Forecaster.predict"]["p50_us"]
    ratios = {k: round(v["p50_us"] / litert, 2) for k, v in rows.items()}
    report(
        "inference",
        rows,
        [("LiteRT p50 <= 500 us", litert <= 500)],
        {"p50 ratio to LiteRT": ratios, "model checksum": served.checksum[:16]},
    )


if __name__ == "__main__":
    main()
