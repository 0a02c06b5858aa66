import gzip

import pandas as pd
import pytest
from hvbench_job import detectors, pems

STATIONS = [d.station for d in detectors.DETECTORS]
GOOD_ROW = (
    "03/04/2024 08:00:00,717001,7,405,S,ML,0.500,20,100,310,0.0612,58.1,"
    "10,160,0.06,59.0,1,10,150,0.06,57.2,1"
)


def write(path, rows):
    path.write_text("\n".join(rows) + "\n")
    return path


def test_loads_generated_month_and_reports_what_is_missing(small_data, small_span):
    data_dir, summary = small_data
    first_day, days = small_span
    data = pems.load(data_dir, STATIONS)
    assert data.stations == sorted(STATIONS)
    for station in STATIONS:
        report = data.reports[station]
        # every row the generator left without measurements is counted, none is filled
        assert report.missing["total_flow"] == summary.missing_rows[station]
        assert report.missing["avg_speed"] == summary.missing_rows[station]
        # every interval an outage removed is absent: inside the range as a gap, or at its ends
        start = pd.Timestamp(first_day)
        end = start + pd.Timedelta(days=days) - pems.INTERVAL
        outside = (report.first - start) // pems.INTERVAL + (end - report.last) // pems.INTERVAL
        assert report.absent_intervals + outside == sum(n for _, n in summary.outages[station])
        assert report.rows + report.absent_intervals == len(data.series(station))
    assert len(data.frame) == summary.rows


def test_series_keeps_gaps_and_missing_values_as_nan(small_data):
    data_dir, _ = small_data
    data = pems.load(data_dir, STATIONS)
    station = max(STATIONS, key=lambda s: data.reports[s].absent_intervals)
    report = data.reports[station]
    assert report.absent_intervals > 0, "the fixture should contain at least one outage"
    flow = data.series(station)
    assert flow.isna().sum() == report.absent_intervals + report.missing["total_flow"]
    gap = report.gaps[0]
    inside = flow[gap.after : gap.before].iloc[1:-1]
    assert len(inside) == gap.intervals and inside.isna().all()


def test_selects_stations_and_reads_plain_text(tmp_path):
    other = GOOD_ROW.replace("717001", "999999")
    path = write(tmp_path / "day.txt", [GOOD_ROW, other])
    data = pems.load(path, [717001])
    assert data.stations == [717001]
    row = data.frame.iloc[0]
    assert row.total_flow == 310 and row.avg_speed == 58.1 and row.lanes == 2
    assert pems.load(path).stations == [717001, 999999]


def test_reads_gzip(tmp_path):
    path = tmp_path / "day.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(GOOD_ROW + "\n")
    assert pems.load(path).frame.total_flow.tolist() == [310]


def test_unknown_station_is_refused(tmp_path):
    path = write(tmp_path / "day.txt", [GOOD_ROW])
    with pytest.raises(ValueError, match=r"stations not found.*123"):
        pems.load(path, [123])


@pytest.mark.parametrize(
    ("change", "line", "column", "message"),
    [
        (lambda r: r.replace("58.1", "fast"), 2, "column 12 (Avg Speed)", "'fast' is not a number"),
        (
            lambda r: r.replace("03/04/2024 08:05:00", "2024-03-04 08:05"),
            2,
            "column 1 (Timestamp)",
            "not a time",
        ),
        (
            lambda r: r.replace("08:05:00", "08:07:00"),
            2,
            "column 1 (Timestamp)",
            "5-minute boundary",
        ),
        (lambda r: r.replace(",S,", ",X,"), 2, "column 5 (Direction)", "not one of N, S, E, W"),
        (lambda r: r.replace(",717001,", ",A1,"), 2, "column 2 (Station)", "not an integer"),
        (lambda r: r.replace("0.0612", "1.7"), 2, "column 11 (Avg Occupancy)", "outside"),
        (lambda r: r.replace(",310,", ",-3,"), 2, "column 10 (Total Flow)", "outside"),
        (lambda r: r.replace(",310,", ",nan,"), 2, "column 10 (Total Flow)", "outside"),
        (
            lambda r: r.replace("0.06,57.2", "0.06,x"),
            2,
            "column 21 (Lane 2 Avg Speed)",
            "not a number",
        ),
        (lambda r: r + ",1,2", 2, None, "24 fields"),
        (lambda r: ",".join(r.split(",")[:9]), 2, None, "9 fields"),
    ],
)
def test_malformed_rows_name_file_line_and_column(tmp_path, change, line, column, message):
    later = GOOD_ROW.replace("08:00:00", "08:05:00")
    path = write(tmp_path / "bad.txt", [GOOD_ROW, change(later)])
    with pytest.raises(pems.PemsFormatError) as error:
        pems.load(path)
    text = str(error.value)
    assert text.startswith(f"{path}:{line}")
    if column:
        assert column in text
    assert message in text


def test_duplicate_row_is_refused_with_both_places(tmp_path):
    first = write(tmp_path / "a.txt", [GOOD_ROW])
    second = write(tmp_path / "b.txt", [GOOD_ROW])
    with pytest.raises(pems.PemsFormatError, match=r"b\.txt:1: .*repeats .*a\.txt:1"):
        pems.load([first, second])


def test_corrupt_gzip_is_refused(tmp_path):
    path = tmp_path / "broken.txt.gz"
    path.write_bytes(gzip.compress((GOOD_ROW + "\n").encode())[:-12])
    with pytest.raises(pems.PemsFormatError, match=r"broken\.txt\.gz.*unreadable"):
        pems.load(path)


def test_empty_directory_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no PeMS"):
        pems.load(tmp_path)
