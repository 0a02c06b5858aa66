import gzip
from datetime import date

import numpy as np
import pytest
from hvbench_job import detectors, generate, pems

STATIONS = [d.station for d in detectors.DETECTORS]


@pytest.fixture(scope="module")
def frame(small_data):
    data_dir, _ = small_data
    frame = pems.load(data_dir, STATIONS).frame
    frame["hour"] = frame.timestamp.dt.hour
    frame["weekday"] = frame.timestamp.dt.weekday < 5
    return frame


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    a = generate.generate(tmp_path / "a", date(2024, 3, 1), 1, seed=3)
    generate.generate(tmp_path / "b", date(2024, 3, 1), 1, seed=3)
    generate.generate(tmp_path / "c", date(2024, 3, 1), 1, seed=4)
    name = a.files[0]
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_exact_pems_layout(small_data):
    data_dir, summary = small_data
    assert len(summary.files) == 6
    assert summary.files[0] == "d07_text_station_5min_2024_03_04.txt.gz"
    with gzip.open(data_dir / summary.files[0], "rt") as f:
        rows = [line.rstrip("\n").split(",") for line in f]
    by_station = {d.station: d for d in detectors.DETECTORS}
    for fields in rows:
        d = by_station[int(fields[1])]
        assert len(fields) == 12 + 5 * d.lanes
        assert fields[2:6] == ["7", str(d.freeway), d.direction, "ML"]
    # PeMS order: by time, then station
    stamps = [r[0] for r in rows]
    assert stamps == sorted(stamps, key=lambda s: (s[6:10], s[:5], s[11:]))


def test_missing_rows_have_empty_measurements(small_data):
    data_dir, summary = small_data
    assert sum(summary.missing_rows.values()) > 0
    frame = pems.load(data_dir, STATIONS).frame
    missing = frame[frame.total_flow.isna()]
    assert len(missing) == sum(summary.missing_rows.values())
    assert (missing.pct_observed == 0).all() and missing.avg_speed.isna().all()


def test_weekday_peaks_and_quieter_weekends(frame):
    weekday = frame[frame.weekday].groupby("hour").total_flow.mean()
    weekend = frame[~frame.weekday].groupby("hour").total_flow.mean()
    assert weekday[7:9].mean() > 1.2 * weekday[10:12].mean()  # morning peak
    assert weekday[7:9].mean() > 2 * weekend[7:9].mean()
    assert weekday[16:19].mean() > weekday[20:23].mean()
    assert weekday[2:4].mean() < 0.2 * weekday[7:9].mean()  # quiet night
    assert weekend[12:16].mean() > weekend[7:9].mean()  # weekend peak is in the afternoon


def test_speed_flow_relation_with_congestion(frame, small_data):
    _, summary = small_data
    assert max(summary.congested_share.values()) > 0.02
    for d in detectors.DETECTORS:
        rows = frame[frame.station == d.station].dropna(subset=["total_flow", "avg_speed"])
        free = rows[rows.avg_speed >= d.free_flow_mph / 2]
        # on the free-flow branch speed falls as flow rises
        assert np.corrcoef(free.total_flow, free.avg_speed)[0, 1] < -0.5
        assert rows.avg_speed.max() <= d.free_flow_mph + 4
        assert rows.total_flow.max() <= 1.2 * d.capacity_per_5min
    # congestion comes mostly with the weekday peaks (incidents add some at other times)
    jammed = frame[frame.avg_speed < 30]
    assert len(jammed) > 0
    assert jammed.weekday.mean() > 0.8
    assert (jammed.hour.between(6, 9) | jammed.hour.between(14, 19)).mean() > 0.8


def test_detectors_differ(frame):
    peak = frame[frame.weekday & frame.hour.between(7, 8)].groupby("station").total_flow.mean()
    assert peak.max() > 1.2 * peak.min()


def test_cli_writes_files_and_summary(tmp_path, capsys):
    generate.main(["--out", str(tmp_path), "--days", "1", "--start", "2024-03-02", "--seed", "1"])
    assert (tmp_path / "d07_text_station_5min_2024_03_02.txt.gz").exists()
    assert (tmp_path / "generated.json").exists()
    assert "wrote 1 files" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        generate.main(["--out", str(tmp_path), "--days", "0"])
