import json

import numpy as np
import pytest
from hvbench_job import detectors, pems
from hvbench_job.forecast import LOOKBACK, quantise, train
from hvbench_job.forecast.dataset import chronological_split
from hvbench_job.forecast.model import build_lstm
from hvbench_job.forecast.scaling import MinMaxScaler
from hvbench_job.forecast.serving import BATCH_MODEL, ArtifactError, Forecaster
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

STATIONS = [d.station for d in detectors.DETECTORS]

# ---------------------------------------------------------------- scaling


@given(arrays(np.float64, st.integers(2, 50), elements=st.floats(0, 5000)))
def test_scaling_round_trip_and_range(values):
    if values.min() == values.max():
        with pytest.raises(ValueError, match="constant"):
            MinMaxScaler.fit(values)
        return
    scaler = MinMaxScaler.fit(values)
    scaled = scaler.transform(values)
    assert scaled.min() == 0 and scaled.max() == pytest.approx(1)
    np.testing.assert_allclose(scaler.inverse(scaled), values, rtol=1e-9, atol=1e-9)
    assert MinMaxScaler.from_dict(json.loads(json.dumps(scaler.to_dict()))) == scaler


def test_scaler_refuses_non_finite_values():
    with pytest.raises(ValueError, match="finite"):
        MinMaxScaler.fit(np.array([1.0, np.nan]))


# ---------------------------------------------------------------- windows and split


def test_split_is_chronological_pooled_and_never_fills(small_data):
    data_dir, _ = small_data
    data = pems.load(data_dir, STATIONS)
    split = chronological_split(data, STATIONS)
    assert split.train.target_time.max() < split.cut <= split.test.target_time.min()
    total = len(split.train) + len(split.test)
    assert 0.77 < len(split.train) / total < 0.83
    assert set(split.train.station) == set(split.test.station) == set(STATIONS)
    for part in (split.train, split.test):
        assert part.x.shape == (len(part), LOOKBACK) and np.isfinite(part.x).all()
        assert np.isfinite(part.y).all()
    # every window that touches a missing value or an absent interval is dropped
    for station in STATIONS:
        flow = data.series(station).to_numpy()
        possible = len(flow) - LOOKBACK
        frames = np.lib.stride_tricks.sliding_window_view(flow, LOOKBACK + 1)
        assert split.dropped[station] == int((~np.isfinite(frames).all(axis=1)).sum())
        kept = (split.train.station == station).sum() + (split.test.station == station).sum()
        assert kept + split.dropped[station] == possible
    # targets follow their inputs: the window of one station is its consecutive flows
    first = split.train.take(split.train.station == STATIONS[0])
    flow = data.series(STATIONS[0])
    at = flow.index.get_loc(first.target_time[0])
    np.testing.assert_array_equal(first.x[0], flow.iloc[at - LOOKBACK : at].to_numpy())
    assert first.y[0] == flow.iloc[at]


# ---------------------------------------------------------------- model


def test_lstm_layers_match_table_3():
    model = build_lstm()
    layers = [(layer.name, tuple(layer.output.shape)) for layer in model.layers]
    assert layers == [
        ("lstm_256", (None, LOOKBACK, 256)),
        ("lstm_128", (None, 128)),
        ("dropout_0_2", (None, 128)),
        ("dense_64", (None, 64)),
        ("dropout_0_4", (None, 64)),
        ("flow", (None, 1)),
    ]
    assert model.layers[2].rate == 0.2 and model.layers[4].rate == 0.4
    assert (
        model.layers[3].activation.__name__ == "relu"
        and model.layers[5].activation.__name__ == "relu"
    )
    assert model.loss == "mse"
    # 4·(256·(1+256)+256) + 4·(128·(256+128)+128) + 128·64+64 + 64+1
    assert model.count_params() == 264192 + 197120 + 8256 + 65


# ---------------------------------------------------------------- artifact and serving


def test_artifact_holds_model_scaler_checksum_and_table(small_model):
    manifest = json.loads((small_model / "manifest.json").read_text())
    for name in (
        "model.tflite",
        BATCH_MODEL,
        "scaler.json",
        "model.keras",
        "table2.md",
        "table2.csv",
    ):
        assert (small_model / name).is_file()
    assert len(manifest["checksum"]) == 64
    assert set(manifest["scores"]) == {"lstm", "linear"}
    assert manifest["parity"]["max_abs_diff_scaled"] <= 1e-5
    assert manifest["parity"]["records"] == manifest["split"]["test_windows"]
    table = (small_model / "table2.csv").read_text().splitlines()
    assert table[0] == "model,mse,mape_percent,r2" and table[1].startswith("LSTM,")
    # the scaler was fitted on the training split only
    scaler = json.loads((small_model / "scaler.json").read_text())
    assert scaler["low"] >= 0 and scaler["high"] > scaler["low"]


def test_served_model_matches_keras_on_the_test_split(small_model, small_data):
    import keras

    data_dir, _ = small_data
    split = chronological_split(pems.load(data_dir, STATIONS), STATIONS)
    served = Forecaster(small_model)
    x = served.scaler.transform(split.test.x)[..., None].astype(np.float32)
    reference = (
        keras.saving.load_model(small_model / "model.keras")(x, training=False).numpy().ravel()
    )
    got = np.array([served.predict(row) for row in split.test.x])
    expected = served.scaler.inverse(reference)
    span = served.scaler.high - served.scaler.low
    assert np.max(np.abs(got - expected)) / span <= 1e-5
    assert (got >= 0).all()


def test_windows_in_batches_get_the_forecasts_they_get_one_by_one(small_model, tmp_path):
    """21 windows: two batches of eight, five padded to a batch; without the batch export
    (an artifact from before it) every window goes alone, with the same results."""
    import shutil

    manifest = json.loads((small_model / "manifest.json").read_text())
    assert BATCH_MODEL in manifest["files"]
    assert manifest["parity"]["max_abs_diff_scaled_batched"] <= 1e-5
    served = Forecaster(small_model)
    rng = np.random.default_rng(3)
    windows = rng.uniform(0, 400, size=(21, 12)).tolist()
    alone = [served.predict(w) for w in windows]
    span = served.scaler.high - served.scaler.low
    assert np.max(np.abs(np.subtract(served.predict_many(windows), alone))) / span <= 1e-5
    old = tmp_path / "old"
    shutil.copytree(small_model, old)
    (old / BATCH_MODEL).unlink()
    del manifest["files"][BATCH_MODEL]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert Forecaster(old).predict_many(windows) == pytest.approx(alone, abs=1e-6)


def test_forecaster_refuses_bad_windows(small_model):
    served = Forecaster(small_model)
    with pytest.raises(ValueError, match="expected 12 flows"):
        served.predict([100.0] * 11)
    with pytest.raises(ValueError, match="finite and non-negative"):
        served.predict([100.0] * 11 + [float("nan")])
    with pytest.raises(ValueError, match="finite and non-negative"):
        served.predict([100.0] * 11 + [-1.0])


def test_tampered_or_missing_artifact_is_refused(small_model, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(small_model, copy)
    scaler = json.loads((copy / "scaler.json").read_text())
    scaler["high"] *= 2
    (copy / "scaler.json").write_text(json.dumps(scaler))
    with pytest.raises(ArtifactError, match=r"scaler\.json does not match its checksum"):
        Forecaster(copy)
    with pytest.raises(ArtifactError, match="no trained model"):
        Forecaster(tmp_path / "empty")


def test_a_quantised_model_serves_int8_weights_close_to_its_float_model(small_model, tmp_path):
    """quantise: both exports with int8 weights, a quarter of the size, forecasts within a
    percent of the scale of the float model's; the manifest and the job say what it is."""
    from hvbench_job import job

    manifest = quantise.quantise(small_model, tmp_path / "int8")
    quantised, float_model = Forecaster(tmp_path / "int8"), Forecaster(small_model)
    assert manifest["weights"] == "int8" and quantised.checksum == manifest["checksum"]
    assert manifest["quantised_from"]["checksum"] == float_model.checksum != quantised.checksum
    assert set(manifest["files"]) == {"model.tflite", BATCH_MODEL, "scaler.json"}
    for name in ("model.tflite", BATCH_MODEL):
        assert (tmp_path / "int8" / name).stat().st_size * 3 < (small_model / name).stat().st_size
    windows = np.random.default_rng(5).uniform(0, 400, size=(21, 12)).tolist()
    span = float_model.scaler.high - float_model.scaler.low
    gaps = np.subtract(quantised.predict_many(windows), float_model.predict_many(windows))
    assert 0 < np.abs(gaps).max() <= 0.01 * span
    assert 0 < manifest["parity"]["max_abs_gap_vehicles"] <= 0.01 * span
    assert job.forecast_batches(tmp_path / "int8")["weights"] == "int8"
    assert job.forecast_batches(small_model)["weights"] == "float32"


def test_quantise_refuses_what_it_cannot_quantise_and_leaves_nothing_behind(
    small_model, tmp_path, monkeypatch
):
    import shutil

    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit, match="taken exists already"):
        quantise.main(["--model", str(small_model), "--out", str(tmp_path / "taken")])
    quantise.quantise(small_model, tmp_path / "int8")
    with pytest.raises(SystemExit, match="holds int8 weights already"):
        quantise.main(["--model", str(tmp_path / "int8"), "--out", str(tmp_path / "twice")])
    bare = tmp_path / "bare"
    shutil.copytree(small_model, bare, ignore=shutil.ignore_patterns("saved_model*"))
    with pytest.raises(SystemExit, match="has no SavedModel to quantise"):
        quantise.main(["--model", str(bare), "--out", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="no trained model"):
        quantise.main(["--model", str(tmp_path / "empty"), "--out", str(tmp_path / "none")])
    monkeypatch.setattr(quantise, "PARITY_LIMIT", 0.0)  # any gap is then too large
    with pytest.raises(SystemExit, match=r"forecasts differ from .* by up to [\d.]+ vehicles"):
        quantise.main(["--model", str(small_model), "--out", str(tmp_path / "none")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "int8", "taken"]


def test_training_is_reproducible(small_data, small_model, tmp_path):
    data_dir, _ = small_data
    again = train.train(
        data_dir, tmp_path, seed=42, epochs=1, baselines=("linear",), log=lambda _: None
    )
    first = json.loads((small_model / "manifest.json").read_text())
    assert again["scores"] == first["scores"]
    assert again["files"]["model.keras"] and again["checksum"] == first["checksum"]


def test_train_cli_reports_bad_input_clearly(tmp_path):
    (tmp_path / "bad.txt").write_text("not,a,pems,file\n")
    with pytest.raises(SystemExit, match=r"train: .*bad\.txt:1: 4 fields"):
        train.main(["--data", str(tmp_path), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        train.main(["--data", str(tmp_path), "--baselines", "nonsense"])
