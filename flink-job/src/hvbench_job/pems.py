"""Loader for PeMS "station 5-minute" text files (`.txt` or `.txt.gz`).

The files have no header. Each row is: Timestamp, Station, District, Freeway, Direction,
Lane Type, Station Length, Samples, % Observed, Total Flow, Avg Occupancy, Avg Speed, then five
fields per lane (Samples, Flow, Avg Occ, Avg Speed, Observed). Empty fields are missing values.

Nothing is filled in: missing values stay NaN and are counted, absent 5-minute intervals are
listed as gaps, both per station in `PemsData.reports`. A malformed file is refused with a
`PemsFormatError` naming the file, line and column.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

INTERVAL = timedelta(minutes=5)
TIME_FORMAT = "%m/%d/%Y %H:%M:%S"
MAIN_COLUMNS = (
    "Timestamp",
    "Station",
    "District",
    "Freeway",
    "Direction",
    "Lane Type",
    "Station Length",
    "Samples",
    "% Observed",
    "Total Flow",
    "Avg Occupancy",
    "Avg Speed",
)
LANE_COLUMNS = ("Samples", "Flow", "Avg Occ", "Avg Speed", "Observed")
# Frame columns for the measured values, with the accepted range of each.
VALUE_COLUMNS = {
    "samples": (7, 0.0, math.inf),
    "pct_observed": (8, 0.0, 100.0),
    "total_flow": (9, 0.0, math.inf),
    "avg_occupancy": (10, 0.0, 1.0),
    "avg_speed": (11, 0.0, 200.0),
}
DIRECTIONS = frozenset("NSEW")


class PemsFormatError(ValueError):
    def __init__(self, path: Path | str, line: int, column: int | None, message: str) -> None:
        where = f"{path}:{line}" if line else str(path)  # line 0: the file as a whole
        if column is not None:
            where += f": column {column} ({column_name(column)})"
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.column = str(path), line, column


def column_name(column: int) -> str:
    """Name of a 1-based column number."""
    if column <= len(MAIN_COLUMNS):
        return MAIN_COLUMNS[column - 1]
    lane, field_no = divmod(column - len(MAIN_COLUMNS) - 1, len(LANE_COLUMNS))
    return f"Lane {lane + 1} {LANE_COLUMNS[field_no]}"


@dataclass
class Gap:
    after: pd.Timestamp  # last timestamp present before the gap
    before: pd.Timestamp  # first timestamp present after it
    intervals: int  # 5-minute intervals absent

    def __str__(self) -> str:
        return f"{self.intervals} intervals absent between {self.after} and {self.before}"


@dataclass
class StationReport:
    station: int
    rows: int
    first: pd.Timestamp
    last: pd.Timestamp
    missing: dict[str, int]  # empty fields per value column
    gaps: list[Gap] = field(default_factory=list)

    @property
    def absent_intervals(self) -> int:
        return sum(g.intervals for g in self.gaps)

    def __str__(self) -> str:
        missing = ", ".join(f"{k} {v}" for k, v in self.missing.items() if v) or "none"
        return (
            f"station {self.station}: {self.rows} rows {self.first} .. {self.last}; "
            f"missing values: {missing}; gaps: {len(self.gaps)} ({self.absent_intervals} intervals)"
        )


@dataclass
class PemsData:
    frame: pd.DataFrame  # one row per (station, timestamp), sorted
    reports: dict[int, StationReport]
    files: list[str]

    @property
    def stations(self) -> list[int]:
        return sorted(self.reports)

    def series(self, station: int, column: str = "total_flow") -> pd.Series:
        """One station's column on a regular 5-minute index from its first to last row.

        Intervals absent from the files appear as NaN, exactly like missing values: callers
        decide what to do with them (the forecaster drops every window that touches one).
        """
        rows = self.frame[self.frame["station"] == station].set_index("timestamp")[column]
        report = self.reports[station]
        index = pd.date_range(report.first, report.last, freq=INTERVAL)
        return rows.reindex(index)

    def describe(self) -> str:
        return "\n".join(str(self.reports[s]) for s in self.stations)


def data_files(directory: Path | str) -> list[Path]:
    """The PeMS text files of a directory, in name order."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir() if p.name.endswith((".txt", ".txt.gz")))
    if not files:
        raise FileNotFoundError(f"no PeMS .txt or .txt.gz files in {directory}")
    return files


def load(
    paths: Iterable[Path | str] | Path | str, stations: Iterable[int] | None = None
) -> PemsData:
    """Load files (or every file of a directory), keeping only `stations` if given."""
    if isinstance(paths, str | Path):
        paths = data_files(paths) if Path(paths).is_dir() else [Path(paths)]
    paths = [Path(p) for p in paths]
    wanted = {int(s) for s in stations} if stations is not None else None
    rows: list[tuple] = []
    seen: dict[tuple[int, datetime], tuple[Path, int]] = {}
    for path in paths:
        _read_file(path, wanted, rows, seen)
    frame = pd.DataFrame(
        rows,
        columns=[
            "timestamp",
            "station",
            "district",
            "freeway",
            "direction",
            "lane_type",
            "station_length",
            *VALUE_COLUMNS,
            "lanes",
        ],
    )
    frame["timestamp"] = pd.to_datetime(frame["timestamp"])
    frame = frame.sort_values(["station", "timestamp"], kind="stable").reset_index(drop=True)
    if wanted is not None:
        absent = sorted(wanted - set(frame["station"]))
        if absent:
            raise ValueError(f"stations not found in {len(paths)} file(s): {absent}")
    return PemsData(frame, _reports(frame), [str(p) for p in paths])


def _open(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", newline="", encoding="ascii")
    return open(path, newline="", encoding="ascii")


def _read_file(path: Path, wanted: set[int] | None, rows: list, seen: dict) -> None:
    with _open(path) as f:
        try:
            for line_no, fields in enumerate(csv.reader(f), start=1):
                row = _parse_row(path, line_no, fields, wanted)
                if row is None:
                    continue
                key = (row[1], row[0])
                if key in seen:
                    first_path, first_line = seen[key]
                    raise PemsFormatError(
                        path,
                        line_no,
                        1,
                        f"station {row[1]} at {row[0]} repeats {first_path}:{first_line}",
                    )
                seen[key] = (path, line_no)
                rows.append(row)
        except (UnicodeDecodeError, OSError, EOFError, zlib.error, csv.Error) as e:
            raise PemsFormatError(path, 0, None, f"unreadable: {e}") from e


def _parse_row(path: Path, line_no: int, fields: list[str], wanted: set[int] | None):
    n = len(fields)
    if n < len(MAIN_COLUMNS) or (n - len(MAIN_COLUMNS)) % len(LANE_COLUMNS):
        raise PemsFormatError(
            path,
            line_no,
            None,
            f"{n} fields; expected 12 plus 5 per lane (Timestamp, Station, ... Avg Speed)",
        )
    station = _integer(path, line_no, fields, 2)
    if wanted is not None and station not in wanted:
        return None
    try:
        timestamp = datetime.strptime(fields[0], TIME_FORMAT)
    except ValueError:
        raise PemsFormatError(
            path, line_no, 1, f"{fields[0]!r} is not a time like 03/01/2024 00:05:00"
        ) from None
    if timestamp.minute % 5 or timestamp.second:
        raise PemsFormatError(path, line_no, 1, f"{fields[0]!r} is not on a 5-minute boundary")
    direction = fields[4].strip()
    if direction not in DIRECTIONS:
        raise PemsFormatError(path, line_no, 5, f"{direction!r} is not one of N, S, E, W")
    values = [
        _number(path, line_no, fields, col + 1, lo, hi) for col, lo, hi in VALUE_COLUMNS.values()
    ]
    for column in range(len(MAIN_COLUMNS) + 1, n + 1):
        _number(path, line_no, fields, column, 0.0, math.inf)
    lanes = (n - len(MAIN_COLUMNS)) // len(LANE_COLUMNS)
    return (
        timestamp,
        station,
        _integer(path, line_no, fields, 3),
        _integer(path, line_no, fields, 4),
        direction,
        fields[5].strip(),
        _number(path, line_no, fields, 7, 0.0, math.inf),
        *values,
        lanes,
    )


def _integer(path: Path, line_no: int, fields: list[str], column: int) -> int:
    text = fields[column - 1].strip()
    try:
        return int(text)
    except ValueError:
        raise PemsFormatError(path, line_no, column, f"{text!r} is not an integer") from None


def _number(
    path: Path, line_no: int, fields: list[str], column: int, lo: float, hi: float
) -> float:
    text = fields[column - 1].strip()
    if not text:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise PemsFormatError(path, line_no, column, f"{text!r} is not a number") from None
    if not lo <= value <= hi:  # also refuses nan and inf written out
        raise PemsFormatError(path, line_no, column, f"{text} is outside [{lo}, {hi}]")
    return value


def _reports(frame: pd.DataFrame) -> dict[int, StationReport]:
    reports = {}
    for station, group in frame.groupby("station", sort=True):
        times = group["timestamp"].to_numpy()
        steps = np.diff(times) // np.timedelta64(5, "m")
        gaps = [
            Gap(pd.Timestamp(times[i]), pd.Timestamp(times[i + 1]), int(steps[i]) - 1)
            for i in np.flatnonzero(steps > 1)
        ]
        reports[int(station)] = StationReport(
            station=int(station),
            rows=len(group),
            first=pd.Timestamp(times[0]),
            last=pd.Timestamp(times[-1]),
            missing={c: int(group[c].isna().sum()) for c in VALUE_COLUMNS},
            gaps=gaps,
        )
    return reports
