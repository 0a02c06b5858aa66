"""`make train`: train the LSTM and the paper's baselines, export the LSTM for serving.

Writes one artifact directory: the Keras model, the SavedModel and LiteRT export, the scaler,
the score table (the paper's Table 2 layout, Markdown and CSV) and `manifest.json` with the
checksums, the data and split used, the scores, Keras/LiteRT parity and versions. Seeded:
the same data and seed give the same scores.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np

from hvbench_job import detectors, pems
from hvbench_job.forecast import LOOKBACK
from hvbench_job.forecast.dataset import Split, chronological_split
from hvbench_job.forecast.model import build_lstm, export_litert
from hvbench_job.forecast.scaling import MinMaxScaler
from hvbench_job.forecast.serving import (
    BATCH,
    BATCH_MODEL,
    MANIFEST,
    Forecaster,
    model_checksum,
    sha256_file,
)

DEFAULT_EPOCHS = 40  # at most; training stops early when validation stops improving
PARITY_LIMIT = 1e-5  # largest accepted |Keras − LiteRT| on scaled outputs
MAPE_MIN_FLOW = 1.0  # MAPE skips targets below one vehicle (division by ~0)
BASELINES = ("linear", "random_forest", "gradient_boosting", "decision_tree")
LABELS = {
    "lstm": "LSTM",
    "linear": "Linear Regression",
    "random_forest": "Random Forest",
    "gradient_boosting": "Gradient Boosting",
    "decision_tree": "Decision Tree",
}


def scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """MSE, MAPE (%) and R² on the original scale."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    error = y_pred - y_true
    counted = y_true >= MAPE_MIN_FLOW
    mse = float(np.mean(error**2))
    mape = float(100 * np.mean(np.abs(error[counted]) / y_true[counted]))
    r2 = float(1 - np.sum(error**2) / np.sum((y_true - y_true.mean()) ** 2))
    return {"mse": mse, "mape": mape, "r2": r2}


def baseline(name: str, seed: int):
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
    from sklearn.linear_model import LinearRegression
    from sklearn.tree import DecisionTreeRegressor

    return {
        "linear": lambda: LinearRegression(),
        "random_forest": lambda: RandomForestRegressor(
            n_estimators=100, random_state=seed, n_jobs=-1
        ),
        "gradient_boosting": lambda: GradientBoostingRegressor(random_state=seed),
        "decision_tree": lambda: DecisionTreeRegressor(random_state=seed),
    }[name]()


def write_table(rows: dict[str, dict[str, float]], out: Path) -> str:
    lines = ["| Model | MSE | MAPE (%) | R² |", "|---|---:|---:|---:|"]
    csv = ["model,mse,mape_percent,r2"]
    for name, s in rows.items():
        lines.append(f"| {LABELS[name]} | {s['mse']:.2f} | {s['mape']:.2f} | {s['r2']:.4f} |")
        csv.append(f"{LABELS[name]},{s['mse']:.6f},{s['mape']:.6f},{s['r2']:.6f}")
    note = (
        f"\nFlow forecast one interval (5 min) ahead from the previous {LOOKBACK}; scores on the "
        f"original scale (vehicles per 5 min) over the chronological test split. MAPE skips "
        f"targets below {MAPE_MIN_FLOW:g} vehicle.\n"
    )
    (out / "table2.md").write_text("\n".join(lines) + "\n" + note)
    (out / "table2.csv").write_text("\n".join(csv) + "\n")
    return "\n".join(lines)


def parity(model, directory: Path, x_test: np.ndarray) -> dict[str, float]:
    """Largest |Keras − LiteRT| over the test split, record by record through the server, and
    through its batch export (windows in batches of BATCH, the last one padded)."""
    keras_out = np.concatenate(
        [
            model(x_test[i : i + 2048], training=False).numpy().ravel()
            for i in range(0, len(x_test), 2048)
        ]
    )
    served = Forecaster(directory)
    litert_out = np.array([served.predict_scaled(x_test[i : i + 1]) for i in range(len(x_test))])
    batched = np.array(served.predict_scaled_many(x_test.astype(np.float32)))
    span = served.scaler.high - served.scaler.low
    diff = np.abs(keras_out - litert_out)
    diff_batch = np.abs(keras_out - batched)
    return {
        "records": len(x_test),
        "max_abs_diff_scaled": float(max(diff.max(), diff_batch.max())),
        "max_abs_diff_vehicles": float(max(diff.max(), diff_batch.max()) * span),
        "max_abs_diff_scaled_one_by_one": float(diff.max()),
        "max_abs_diff_scaled_batched": float(diff_batch.max()),
        "limit_scaled": PARITY_LIMIT,
    }


def fit_lstm(x_train, y_train, seed: int, epochs: int, batch_size: int):
    """The Table 3 LSTM fitted, seeded and deterministic: (model, history, seconds)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    model = build_lstm()
    fit_started = time.monotonic()
    # validation_split takes the last 10% of the (chronological) training windows
    history = model.fit(
        x_train,
        y_train,
        epochs=epochs,
        batch_size=batch_size,
        validation_split=0.1,
        shuffle=True,
        callbacks=[
            # halve the step size when validation stalls, stop when it stops improving
            keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=2, min_lr=1e-5),
            keras.callbacks.EarlyStopping(patience=6, restore_best_weights=True),
        ],
        verbose=2,
    )
    return model, history, time.monotonic() - fit_started


def save_served(model, scaler: MinMaxScaler, out: Path) -> dict[str, str]:
    """The Keras model, the scaler and both LiteRT exports in `out`: {file: sha256}."""
    model.save(out / "model.keras")
    (out / "scaler.json").write_text(json.dumps(scaler.to_dict(), indent=1) + "\n")
    export_litert(model, out)
    export_litert(model, out, BATCH, BATCH_MODEL)
    return {
        name: sha256_file(out / name)
        for name in ("model.tflite", BATCH_MODEL, "scaler.json", "model.keras")
    }


def training_summary(history, epochs: int, batch_size: int, fit_seconds: float) -> dict:
    return {
        "epochs_max": epochs,
        "epochs_run": len(history.history["loss"]),
        "batch_size": batch_size,
        "final_loss": float(history.history["loss"][-1]),
        "best_val_loss": float(min(history.history["val_loss"])),
        "fit_seconds": round(fit_seconds, 1),
    }


def versions() -> dict[str, str]:
    packages = ("tensorflow-cpu", "keras", "ai-edge-litert", "scikit-learn", "numpy")
    return {"python": platform.python_version(), **{p: metadata.version(p) for p in packages}}


def train(
    data_dir: Path,
    out: Path,
    seed: int = 42,
    epochs: int = DEFAULT_EPOCHS,
    batch_size: int = 128,
    baselines: tuple[str, ...] = BASELINES,
    log=print,
) -> dict:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    stations = [d.station for d in detectors.DETECTORS]
    data = pems.load(data_dir, stations)
    log(data.describe())
    split: Split = chronological_split(data, stations)
    log(f"windows: {split.summary()}")
    scaler = MinMaxScaler.fit(np.concatenate([split.train.x.ravel(), split.train.y]))
    x_train = scaler.transform(split.train.x)[..., None].astype(np.float32)
    y_train = scaler.transform(split.train.y).astype(np.float32)
    x_test = scaler.transform(split.test.x)[..., None].astype(np.float32)

    model, history, fit_seconds = fit_lstm(x_train, y_train, seed, epochs, batch_size)
    predicted = model.predict(x_test, batch_size=2048, verbose=0).ravel()
    table = {"lstm": scores(split.test.y, scaler.inverse(predicted))}
    for name in baselines:
        t = time.monotonic()
        regressor = baseline(name, seed).fit(x_train[..., 0], y_train)
        table[name] = scores(split.test.y, scaler.inverse(regressor.predict(x_test[..., 0])))
        log(f"{LABELS[name]}: {table[name]} ({time.monotonic() - t:.1f} s)")
    log(write_table(table, out))

    files = save_served(model, scaler, out)
    manifest = {
        "format": "hvbench-forecaster/1",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "lookback": LOOKBACK,
        "checksum": model_checksum(out),
        "files": files,
        "seed": seed,
        "data": {"directory": str(data_dir), "files": len(data.files), "stations": stations},
        "split": split.summary(),
        "scaler": scaler.to_dict(),
        "training": training_summary(history, epochs, batch_size, fit_seconds),
        "scores": table,
        "versions": versions(),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["parity"] = parity(model, out, x_test)
    manifest["total_seconds"] = round(time.monotonic() - started, 1)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"parity Keras vs LiteRT: {manifest['parity']}")
    if manifest["parity"]["max_abs_diff_scaled"] > PARITY_LIMIT:
        raise RuntimeError(f"LiteRT export differs from Keras by more than {PARITY_LIMIT}")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/pems", type=Path, help="PeMS files (make data)")
    parser.add_argument("--out", default="artifacts/forecaster", type=Path)
    parser.add_argument("--seed", default=42, type=int)
    parser.add_argument("--epochs", default=DEFAULT_EPOCHS, type=int)
    parser.add_argument("--batch-size", default=128, type=int)
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma-separated subset of {','.join(BASELINES)}, or empty",
    )
    args = parser.parse_args(argv)
    chosen = tuple(b for b in args.baselines.split(",") if b)
    unknown = set(chosen) - set(BASELINES)
    if unknown:
        parser.error(f"unknown baselines {sorted(unknown)}; known: {', '.join(BASELINES)}")
    try:
        manifest = train(args.data, args.out, args.seed, args.epochs, args.batch_size, chosen)
    except (pems.PemsFormatError, FileNotFoundError, ValueError, RuntimeError) as e:
        sys.exit(f"train: {e}")
    print(
        f"model {manifest['checksum'][:16]} written to {args.out} in {manifest['total_seconds']} s"
    )


if __name__ == "__main__":
    main()
