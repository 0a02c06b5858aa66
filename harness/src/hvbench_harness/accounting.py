"""Every sent record accounted for: received, dead-lettered, or missing; duplicates counted.

`account()` joins what the producers sent with what the consumer received into one row per
sent record (the raw samples of the run) and counts the outcomes. Latency is receipt minus the
actual send; `latency_from_intended_ns` is receipt minus the scheduled send (it includes any
delay of the producer itself). Statistics exclude the warm-up; the rows keep it, flagged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from hvbench_analysis.stats import summarize


@dataclass
class Counts:
    sent: int  # valid records the producers sent
    undelivered: int  # the producer's client reported a failure
    received: int  # distinct sent records that came back as results
    dead_lettered: int  # distinct sent records the job refused (should be none)
    missing: int  # sent, neither received nor dead-lettered
    duplicated: int  # results received more than once (extra copies)
    unexpected: int  # results that match no sent record
    malformed_sent: int  # injected malformed records
    malformed_dead_lettered: int  # of those, found in the dead-letter topic
    warmup: int  # received records excluded from statistics as warm-up
    measured: int  # received records in the statistics

    @property
    def accounted(self) -> bool:
        return (
            self.missing == 0
            and self.unexpected == 0
            and self.dead_lettered == 0
            and self.undelivered == 0
            and self.malformed_dead_lettered == self.malformed_sent
        )

    def problems(self) -> list[str]:
        out = []
        if self.missing:
            out.append(f"{self.missing} sent records never came back")
        if self.undelivered:
            out.append(f"{self.undelivered} records the producers could not deliver to Kafka")
        if self.dead_lettered:
            out.append(f"{self.dead_lettered} valid records were dead-lettered by the job")
        if self.unexpected:
            out.append(f"{self.unexpected} results match no sent record")
        if self.malformed_dead_lettered != self.malformed_sent:
            out.append(
                f"{self.malformed_sent - self.malformed_dead_lettered} of {self.malformed_sent} "
                "malformed records did not reach the dead-letter topic"
            )
        return out

    def as_dict(self) -> dict:
        return {**asdict(self), "accounted": self.accounted}


def load_dead_letters(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def account(
    sent_csv: Path,
    received_csv: Path,
    dead_letters_jsonl: Path,
    warmup_ns: int,
    malformed_sent: int = 0,
) -> tuple[pd.DataFrame, Counts, list[dict]]:
    """(one row per sent record, counts, dead letters) for a finished run."""
    sent = pd.read_csv(sent_csv)
    received = pd.read_csv(received_csv)
    letters = load_dead_letters(dead_letters_jsonl)

    key = ["detector", "seq"]
    copies = received.groupby(key).size().rename("copies")
    first = received.sort_values("received_ns").drop_duplicates(key, keep="first")
    first = first.drop(columns=["intended_ns", "sent_ns"]).set_index(key)
    samples = sent.set_index(key).join(first, how="left").join(copies, how="left").reset_index()
    samples["copies"] = samples["copies"].fillna(0).astype(int)
    samples["latency_ns"] = samples["received_ns"] - samples["sent_ns"]
    samples["latency_from_intended_ns"] = samples["received_ns"] - samples["intended_ns"]
    run_start = samples["intended_ns"].min()
    samples["warmup"] = samples["intended_ns"] < run_start + warmup_ns

    refused = set()
    malformed = set()
    for letter in letters:
        text = letter.get("record", "")
        if "malformed-" in text:
            malformed.add(text)
            continue
        try:
            r = json.loads(text)
            refused.add((r["detector"], r["seq"]))
        except (ValueError, KeyError, TypeError):
            pass
    keys = zip(samples.detector, samples.seq, strict=True)
    samples["dead_lettered"] = [key in refused for key in keys]

    got = samples["copies"] > 0
    sent_keys = set(zip(sent.detector, sent.seq, strict=True))
    unexpected = sum(1 for k in copies.index if tuple(k) not in sent_keys)
    counts = Counts(
        sent=len(sent),
        undelivered=int((sent["delivered"] == 0).sum()),
        received=int(got.sum()),
        dead_lettered=int(samples["dead_lettered"].sum()),
        missing=int((~got & ~samples["dead_lettered"]).sum()),
        duplicated=int((samples["copies"] - 1).clip(lower=0).sum()),
        unexpected=unexpected,
        malformed_sent=malformed_sent,
        malformed_dead_lettered=len(malformed),
        warmup=int((got & samples["warmup"]).sum()),
        measured=int((got & ~samples["warmup"]).sum()),
    )
    return samples, counts, letters


def latency_stats(samples: pd.DataFrame, column: str = "latency_ns") -> dict:
    """Percentiles (nearest-rank, as in the report) and the raw maximum, in ms, over the
    measured (received, non-warm-up) records."""
    values = samples.loc[(samples["copies"] > 0) & ~samples["warmup"], column].to_numpy(float)
    if len(values) == 0:
        return {"n": 0}
    stats = summarize(values)
    return {"n": stats.pop("count"), "method": "nearest-rank", **stats}
