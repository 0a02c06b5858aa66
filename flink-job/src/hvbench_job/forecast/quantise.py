"""A trained model's served exports with int8 weights, as a model of its own:

    python -m hvbench_job.forecast.quantise --model artifacts/forecaster \\
        --out artifacts/forecaster-int8
    make run MODEL_DIR=artifacts/forecaster-int8

The forecast reads the two LSTMs' 1.8 MB of float weights at each of its 12 steps, and that,
not the arithmetic, sets its time. With the weights in int8 (dynamic range: the activations
stay float) they take a quarter of the room, and a call about half the time (bench/
bench_inference.py). The forecasts move by about a vehicle per five minutes at most, against
a test error of tens. The study's model is the float one: this is a lighter workload to
compare it with, not a replacement.

What was changed is kept with it: the manifest's `weights` ("int8"), the model it came from
(`quantised_from`: its checksum and scores) and `parity`: how far its forecasts are from that
model's over a fixed set of windows. The job records the weights it served in meta.json
(job.forecast.weights).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from hvbench_job.forecast import LOOKBACK
from hvbench_job.forecast.model import convert
from hvbench_job.forecast.serving import (
    BATCH,
    BATCH_MODEL,
    MANIFEST,
    ArtifactError,
    Forecaster,
    model_checksum,
    sha256_file,
)

PARITY_WINDOWS = 1000  # windows of flows drawn across the scaler's range, seeded
# The largest gap accepted, as a share of the scaler's range (the float model's forecasts
# moved by 0.14 % of it at most, 2026-12-04): a conversion that breaks the model is refused.
PARITY_LIMIT = 0.01


def quantise(model: Path, out: Path) -> dict:
    """Write the int8-weights model of `model` (a trained float model) to `out`, which must not
    exist; return its manifest. ArtifactError for a model that cannot be quantised."""
    source = Forecaster(model)  # its files checked against its manifest
    exports = saved_models(model, source.manifest)
    if out.exists():
        raise ArtifactError(f"{out} exists already: give a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    making.chmod(0o755)  # as a trained model's (mkdtemp makes it its owner's only)
    try:
        manifest = write_int8(source, exports, making)
        making.rename(out)
    finally:
        shutil.rmtree(making, ignore_errors=True)
    return manifest


def saved_models(model: Path, manifest: dict) -> dict[str, Path]:
    """The SavedModel of each served export of a float model: {file name: SavedModel}."""
    if manifest.get("weights", "float32") != "float32":
        raise ArtifactError(f"{model} holds {manifest['weights']} weights already")
    exports = {"model.tflite": model / "saved_model"}
    if BATCH_MODEL in manifest["files"]:
        exports[BATCH_MODEL] = model / f"saved_model_b{BATCH}"
    missing = [str(saved) for saved in exports.values() if not saved.is_dir()]
    if missing:
        raise ArtifactError(f"{model} has no SavedModel to quantise: {', '.join(missing)}")
    return exports


def write_int8(source: Forecaster, exports: dict[str, Path], folder: Path) -> dict:
    """The int8 exports, the scaler and the manifest in `folder`; ArtifactError where the
    forecasts moved by more than PARITY_LIMIT."""
    for name, saved in exports.items():
        (folder / name).write_bytes(convert(saved, int8_weights=True))
    shutil.copy2(source.directory / "scaler.json", folder / "scaler.json")
    manifest = dict(source.manifest)
    manifest.pop("total_seconds", None)
    scores = manifest.pop("scores", None)  # the float model's, kept under quantised_from
    manifest.update(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        weights="int8",
        quantised_from={
            "directory": str(source.directory),
            "checksum": source.checksum,
            "scores": scores,
        },
        files={name: sha256_file(folder / name) for name in [*exports, "scaler.json"]},
        checksum=model_checksum(folder),
    )
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["parity"] = parity(source, Forecaster(folder))  # read back through its manifest
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    gap, span = manifest["parity"]["max_abs_gap_vehicles"], source.scaler.high - source.scaler.low
    if gap > PARITY_LIMIT * span:
        raise ArtifactError(
            f"the int8 model's forecasts differ from {source.directory}'s by up to {gap} "
            f"vehicles, more than {PARITY_LIMIT:.0%} of the range it was scaled to ({span:g})"
        )
    return manifest


def parity(float_model: Forecaster, quantised: Forecaster) -> dict:
    """The largest and mean gap between the two models' forecasts (vehicles per 5 minutes)
    over PARITY_WINDOWS seeded windows, one by one and in batches."""
    low, high = float_model.scaler.low, float_model.scaler.high
    windows = np.random.default_rng(0).uniform(low, high, (PARITY_WINDOWS, LOOKBACK)).tolist()
    expected = np.array([float_model.predict(w) for w in windows])
    alone = np.abs(np.array([quantised.predict(w) for w in windows]) - expected)
    batched = np.abs(np.array(quantised.predict_many(windows)) - expected)
    return {
        "windows": PARITY_WINDOWS,
        "against": "the float model's forecasts",
        "max_abs_gap_vehicles": round(float(max(alone.max(), batched.max())), 4),
        "mean_abs_gap_vehicles": round(float(alone.mean()), 4),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="artifacts/forecaster", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        manifest = quantise(args.model, args.out)
    except (ArtifactError, OSError) as e:
        sys.exit(f"quantise: {e}")
    gap = manifest["parity"]["max_abs_gap_vehicles"]
    print(
        f"model {manifest['checksum'][:16]} (int8 weights) written to {args.out}; "
        f"forecasts within {gap} vehicles of {args.model}'s"
    )


if __name__ == "__main__":
    main()
