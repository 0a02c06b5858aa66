"""Every sent record accounted for: received, dead-lettered, or missing; duplicates counted.

`account()` joins what the producers sent with what the consumer received into one row per
sent record (the raw samples of the run) and counts the outcomes. Latency is receipt minus the
actual send; `latency_from_intended_ns` is receipt minus the scheduled send (it includes any
delay of the producer itself). Statistics exclude the warm-up; the rows keep it, flagged.

Attribution is exact. A record is named by the run's id, its detector, its producer's seq and
its send stamp (sent_ns), compared with their JSON types. A result counts for a sent record
only if all four match (the consumer checks the run's id and the types, counting others as
foreign results; a result with the run's id whose detector, seq and stamp were never sent
together is counted as unexpected, also foreign). A dead letter counts for a sent record only
if its `key` matches it the same way; it counts for
an injected malformed record only if it holds that record's exact text (cut to a prefix for a
long one, with the exact length). Everything else in the run's topics is foreign: counted and
reported, never a problem.

With client pairs (CLIENTS, hvbench_job.clients) each pair's producers and consumer write
files of their own (pair_file): each row keeps its pair (`client`), and a latency is two stamps
of that pair's machine.

The files are the parts' own, in the run's work directory; any of them may be absent when a
run failed or was interrupted (a part that never started writes nothing): the counts are then
those of what was written. Reading them never fails on what they hold: a row whose integers
are not integers in 0 <= value < 2**63 (hvbench_job.records' ranges), a row with the wrong
number of fields, or a line of dead letters that is not JSON is left out and counted
(`unreadable_rows`, a problem: a record may be among them).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from hvbench_analysis import sections
from hvbench_analysis.stats import summarize
from hvbench_job.dead_letters import LOST_PREFIX

SENT_COLUMNS = ["detector", "seq", "intended_ns", "sent_ns", "delivered"]
RECEIVED_COLUMNS = ["detector", "seq", "sent_ns", "received_ns"]
KEY = ["detector", "seq", "sent_ns"]  # with the run's id, which the consumer checked
# The parts' integer columns: 64-bit integers, 0 <= value < 2**63 (hvbench_job.records)
INTEGER_COLUMNS = ("seq", "intended_ns", "sent_ns", "received_ns", "delivered")
DTYPES = {"detector": "object", **dict.fromkeys(INTEGER_COLUMNS, "int64")}
DIGITS = re.compile(r"[0-9]{1,19}")  # 2**63 has 19 digits


@dataclass
class Counts:
    sent: int  # valid records the producers sent
    undelivered: int  # the producer's client reported a failure (or never an acknowledgement)
    received: int  # distinct sent records that came back as results
    dead_lettered: int  # distinct sent records the job refused (should be none)
    missing: int  # sent and delivered, neither received nor dead-lettered
    duplicated: int  # results received more than once (extra copies)
    unexpected: int  # results with the run's id that match no sent record (foreign too)
    malformed_sent: int  # injected malformed records
    malformed_dead_lettered: int  # of those, found in the dead-letter topic
    warmup: int  # received records excluded from statistics as warm-up
    measured: int  # received records in the statistics
    foreign_results: int = 0  # results in the output topic that are not the run's
    foreign_dead_letters: int = 0  # dead letters that are not of the run's records
    contradictions: int = 0  # sent records both received and dead-lettered
    dead_letters_lost: int = 0  # dead letters the job could not write (its log says)
    unreadable_rows: int = 0  # rows of the parts' files left out: out of range or malformed

    @property
    def accounted(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        checks = [
            (self.missing, f"{self.missing} sent records never came back"),
            (
                self.undelivered,
                f"{self.undelivered} records the producers could not deliver to Kafka",
            ),
            (self.dead_lettered, f"{self.dead_lettered} valid records were dead-lettered"),
            (
                self.contradictions,
                f"{self.contradictions} records were both received and dead-lettered",
            ),
            (self.dead_letters_lost, f"{self.dead_letters_lost} dead letters could not be written"),
            (
                self.unreadable_rows,
                f"{self.unreadable_rows} rows of the parts' files could not be read "
                "(out of range or malformed) and were left out",
            ),
            (
                self.malformed_sent - self.malformed_dead_lettered,
                f"{self.malformed_sent - self.malformed_dead_lettered} of {self.malformed_sent} "
                "malformed records did not reach the dead-letter topic",
            ),
        ]
        return [text for count, text in checks if count]

    def foreign(self) -> str | None:
        """What the run's topics held that was not the run's (informational)."""
        if not (self.foreign_results or self.foreign_dead_letters or self.unexpected):
            return None
        return (
            f"foreign records in the run's topics (not counted for the run): "
            f"{self.foreign_results} results of other runs (or out of range), "
            f"{self.unexpected} with the run's id but never sent, "
            f"{self.foreign_dead_letters} dead letters"
        )

    def as_dict(self) -> dict:
        """meta.json `counts` (sections.Counts)."""
        return sections.Counts(**asdict(self), accounted=self.accounted).to_json()


def pair_file(name: str, pair: int) -> str:
    """A client pair's own file: sent.csv for the first, sent-1.csv for the second, ..."""
    stem, _, suffix = name.partition(".")
    return name if pair == 0 else f"{stem}-{pair}.{suffix}"


def read_pairs(work: Path, name: str, columns: list[str], pairs: int) -> tuple[pd.DataFrame, int]:
    """Every pair's `name` (pair_file) as one table, each row with its pair (`client`); and
    the rows left out (read_csv)."""
    read = [read_csv(work / pair_file(name, k), columns) for k in range(pairs)]
    tables = [table.assign(client=k) for k, (table, _) in enumerate(read)]
    left_out = sum(n for _, n in read)
    return (pd.concat(tables, ignore_index=True) if pairs > 1 else tables[0]), left_out


def read_lines(path: Path) -> tuple[list, int]:
    """The JSON lines of `path`, and how many lines were not JSON (left out)."""
    if not path.exists():
        return [], 0
    items, left_out = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if line.strip():
            try:
                items.append(json.loads(line))
            except (ValueError, RecursionError):
                left_out += 1
    return items, left_out


def read_csv(path: Path, columns: list[str]) -> tuple[pd.DataFrame, int]:
    """A part's CSV file, its integer columns as int64; and the rows left out (none unless a
    row does not fit: then read_checked)."""
    if not path.exists() or path.stat().st_size == 0:
        empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
        return empty.astype({"detector": "object"}), 0
    try:
        return pd.read_csv(path, dtype=DTYPES), 0
    except (ValueError, OverflowError, TypeError):  # a value out of range, not an integer, ...
        return read_checked(path)


def read_checked(path: Path) -> tuple[pd.DataFrame, int]:
    """The rows of a CSV file whose integer columns hold integers in 0 <= value < 2**63, read
    as read_csv reads a good file; and how many rows were left out (those, and rows with the
    wrong number of fields)."""
    malformed: list[list[str]] = []
    text = pd.read_csv(
        path, dtype=str, keep_default_na=False, engine="python", on_bad_lines=malformed.append
    )
    fits = pd.Series(True, index=text.index)
    for column in INTEGER_COLUMNS:
        if column in text:
            fits &= text[column].map(lambda v: bool(DIGITS.fullmatch(v)) and int(v) < 2**63)
    kept = pd.read_csv(io.StringIO(text[fits].to_csv(index=False)), dtype=DTYPES)
    return kept, int((~fits).sum()) + len(malformed)


def lost_dead_letters(job_log: Path) -> int:
    if not job_log.exists():
        return 0
    lines = job_log.read_text(errors="replace").splitlines()
    return sum(line.startswith(LOST_PREFIX) for line in lines)


def join(sent: pd.DataFrame, received: pd.DataFrame, warmup_ns: int) -> pd.DataFrame:
    """One row per sent record: its first receipt, copies, latencies, warm-up flag."""
    copies = received.groupby(KEY).size().rename("copies")
    first = received.sort_values("received_ns").drop_duplicates(KEY, keep="first")
    first = first.drop(columns=["intended_ns", "client"], errors="ignore").set_index(KEY)
    samples = sent.set_index(KEY).join(first, how="left").join(copies, how="left").reset_index()
    samples["copies"] = samples["copies"].fillna(0).astype(int)
    samples["received_ns"] = samples["received_ns"].astype(float)
    samples["latency_ns"] = samples["received_ns"] - samples["sent_ns"]
    samples["latency_from_intended_ns"] = samples["received_ns"] - samples["intended_ns"]
    run_start = samples["intended_ns"].min()
    samples["warmup"] = samples["intended_ns"] < run_start + warmup_ns
    return samples


def own_key(key: object, run_id: str) -> tuple[str, int, int] | None:
    """(detector, seq, sent_ns) if a dead letter's key names a record of this run, strictly
    typed; else None."""
    if not isinstance(key, dict) or key.get("run") != run_id:
        return None
    detector, seq, sent_ns = key.get("detector"), key.get("seq"), key.get("sent_ns")
    integers = all(isinstance(v, int) and not isinstance(v, bool) for v in (seq, sent_ns))
    return (detector, seq, sent_ns) if isinstance(detector, str) and integers else None


def holds(letter: dict, text: str) -> bool:
    """The letter holds exactly `text`: all of it, or a prefix with text's exact length."""
    record = letter.get("record")
    if not isinstance(record, str) or letter.get("record_chars") != len(text):
        return False
    return record == text or (len(record) >= min(len(text), 200) and text.startswith(record))


def attribute(letters: list[dict], run_id: str, injected: list[str], probe: str | None):
    """(keys of the run's records refused, indices of injected records found, foreign count)."""
    refused: set[tuple[str, int, int]] = set()
    found: set[int] = set()
    foreign = 0
    for letter in letters:
        if probe is not None and holds(letter, probe):
            continue  # the readiness probe, expected
        match = next((i for i, text in enumerate(injected) if holds(letter, text)), None)
        if match is not None:
            found.add(match)
        elif (key := own_key(letter.get("key"), run_id)) is not None:
            refused.add(key)
        else:
            foreign += 1
    return refused, found, foreign


def account(
    work: Path, run_id: str, warmup_ns: int, probe: str | None = None, pairs: int = 1
) -> tuple[pd.DataFrame, Counts, list[dict]]:
    """(one row per sent record, counts, dead letters) from the parts' files in `work`, of
    `pairs` client pairs (the first also keeps the dead letters and the injected records)."""
    sent, sent_left_out = read_pairs(work, "sent.csv", SENT_COLUMNS, pairs)
    received, received_left_out = read_pairs(work, "received.csv", RECEIVED_COLUMNS, pairs)
    letters, letters_left_out = read_lines(work / "dead_letters.jsonl")
    injected, injected_left_out = read_lines(work / "malformed.jsonl")
    summaries = [read_text(work / pair_file("consumer.json", k)) or "{}" for k in range(pairs)]
    foreign_results = sum(json.loads(text).get("foreign_results", 0) for text in summaries)
    samples = join(sent, received, warmup_ns)
    sent_keys = set(zip(sent.detector, sent.seq, sent.sent_ns, strict=True))
    refused, found, foreign_letters = attribute(letters, run_id, injected, probe)
    foreign_letters += len(refused - sent_keys)
    keys = zip(samples.detector, samples.seq, samples.sent_ns, strict=True)
    samples["dead_lettered"] = [k in refused for k in keys]
    got = samples["copies"] > 0
    delivered = samples["delivered"] == 1
    received_keys = set(zip(received.detector, received.seq, received.sent_ns, strict=True))
    counts = Counts(
        sent=len(sent),
        undelivered=int((~delivered & ~got).sum()),
        received=int(got.sum()),
        dead_lettered=int(samples["dead_lettered"].sum()),
        missing=int((delivered & ~got & ~samples["dead_lettered"]).sum()),
        duplicated=int((samples["copies"] - 1).clip(lower=0).sum()),
        unexpected=len(received_keys - sent_keys),
        malformed_sent=len(injected),
        malformed_dead_lettered=len(found),
        warmup=int((got & samples["warmup"]).sum()),
        measured=int((got & ~samples["warmup"]).sum()),
        foreign_results=int(foreign_results),
        foreign_dead_letters=foreign_letters,
        contradictions=int((got & samples["dead_lettered"]).sum()),
        dead_letters_lost=lost_dead_letters(work / "job.out"),
        unreadable_rows=sent_left_out + received_left_out + letters_left_out + injected_left_out,
    )
    return samples, counts, letters


def read_text(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def latency_stats(samples: pd.DataFrame, column: str = "latency_ns") -> dict:
    """meta.json `latency` (sections.Latency): percentiles (nearest-rank, as in the report) and
    the raw maximum, in ms, over the measured (received, non-warm-up) records."""
    values = samples.loc[(samples["copies"] > 0) & ~samples["warmup"], column].to_numpy(float)
    if len(values) == 0:
        return sections.Latency(n=0).to_json()
    stats = summarize(values)
    stats = {"n": stats.pop("count"), "method": "nearest-rank", **stats}
    return sections.Latency.from_json(stats, "latency", strict=True).to_json()
