"""The paper's LSTM (Table 3) and its export for serving.

Input: 12 flows scaled to [0, 1], shape (batch, 12, 1).
LSTM 256 (return sequences) → LSTM 128 → Dropout 0.2 → Dense 64 ReLU → Dropout 0.4 →
Dense 1 ReLU; mean squared error.
"""

from __future__ import annotations

from pathlib import Path

from hvbench_job.forecast import LOOKBACK

SERVING_INPUT = "flows"  # name of the serving signature's input


def build_lstm():
    import keras

    model = keras.Sequential(
        [
            keras.Input(shape=(LOOKBACK, 1), name="flows"),
            keras.layers.LSTM(256, return_sequences=True, name="lstm_256"),
            keras.layers.LSTM(128, name="lstm_128"),
            keras.layers.Dropout(0.2, name="dropout_0_2"),
            keras.layers.Dense(64, activation="relu", name="dense_64"),
            keras.layers.Dropout(0.4, name="dropout_0_4"),
            keras.layers.Dense(1, activation="relu", name="flow"),
        ],
        name="flow_lstm",
    )
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3), loss="mse")
    return model


def export_litert(model, directory: Path, batch: int = 1, name: str = "model.tflite") -> Path:
    """SavedModel with a fixed (batch, 12, 1) signature, converted to a LiteRT flatbuffer.

    Each LSTM becomes a loop (WHILE) over the 12 steps, its body of fixed shapes; the absence
    of TensorFlow's per-call overhead is what makes single-record inference fast. The shapes
    cannot be resized afterwards, so each batch size is an export of its own. (The converter
    fuses an LSTM into one kernel only from tf_keras's layer, not from Keras 3's; on this
    model that kernel took 0.49 ms a call against the loop's 0.37, 2026-12-04.)
    """
    import tensorflow as tf

    saved = directory / ("saved_model" if batch == 1 else f"saved_model_b{batch}")
    model.export(
        str(saved),
        format="tf_saved_model",
        input_signature=[tf.TensorSpec((batch, LOOKBACK, 1), tf.float32, name=SERVING_INPUT)],
        verbose=False,
    )
    path = directory / name
    path.write_bytes(convert(saved))
    return path


def convert(saved: Path, int8_weights: bool = False) -> bytes:
    """The LiteRT flatbuffer of a SavedModel; with int8_weights, its weights quantised to int8
    (dynamic range: activations stay float, forecast/quantise.py)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved))
    if int8_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()
