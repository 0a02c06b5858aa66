"""What the Flink job does to one record, as a plain class: parse → forecast → route.

The Flink operator (`hvbench_job.job`) only wires this into a stream; keeping it here lets it be
tested and benchmarked without Flink.

The router keeps, per detector, the latest measured speed and flow forecast; each record
updates its detector and then routes over the whole network with what is known: from the
network's origin to its destination, or, for a record that names a destination (city-scale
loads), from the record's own detector to that one. Detectors not heard from yet count as
free-flowing. A record whose destination cannot be reached is dead-lettered with the reason.

A message that carries a group's records (a JSON array, hvbench_job.records) is forecast in
one batch and answered with one array of outputs; each bad element is a dead letter of its own.

Whatever the message (None for a Kafka tombstone, any bytes, any JSON), process_message gives
an output or dead letters; it raises only where the job itself is broken (its model, say).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import tsc_timer
from hvbench_job import networks
from hvbench_job.forecast.serving import Forecaster
from hvbench_job.records import (
    OUTPUT_MAX_BYTES,
    InputRecord,
    RecordError,
    dead_letter,
    decode,
    parse,
    parse_message,
)
from hvbench_job.routing.astar import NoRoute
from hvbench_job.routing.router import Router


@dataclass(frozen=True)
class Outcome:
    """Exactly one of `output` and `dead_letter` is set."""

    output: str | None = None
    dead_letter: str | None = None
    detector: str | None = None  # the output's


@dataclass
class MessageOutcome:
    """What one message gives: at most one output message, and a dead letter per refusal."""

    output: str | None = None
    dead_letters: list[str] = field(default_factory=list)
    detector: str | None = None  # of the output's (first) record: whose client it answers


class Pipeline:
    def __init__(
        self,
        model_dir: Path | str,
        origin: str | None = None,
        destination: str | None = None,
        heuristic: str = "distance",
        network: str = "freeway",
        force_tsc: bool = False,
        calibration: dict | None = None,
    ) -> None:
        # With the run's calibration (the job on the machine that stamps send and receipt),
        # the job's stamps are on that clock; else on this machine's own (see docs/results.md)
        if calibration is not None:
            tsc_timer.adopt(calibration)
        elif tsc_timer.calibration() is None:
            tsc_timer.calibrate(force=force_tsc)
        self.forecaster = Forecaster(model_dir)
        net = networks.network(network)
        self.network = net.name
        self.router = Router.for_network(net, heuristic)
        self.origin, self.destination = origin or net.origin, destination or net.destination
        for key in (self.origin, self.destination):
            self.router.graph.node(key)  # refuses an unknown detector now, not per record
        self.processed = 0
        self.refused = 0

    def process(self, raw: str | bytes) -> Outcome:
        start = tsc_timer.now_ns()
        try:
            record = parse(raw, self.network)
            predicted = self.forecaster.predict(record.flows)
            predicted_at = tsc_timer.now_ns()
            expected_speed = self.router.observe(record.detector, record.speed_mph, predicted)
            route = self._route(record)
        except (RecordError, ValueError, NoRoute) as e:
            self.refused += 1
            return Outcome(dead_letter=dead_letter(raw, str(e), getattr(e, "key", None)))
        done = tsc_timer.now_ns()
        self.processed += 1
        output = self._output(record, predicted, expected_speed, route, start, predicted_at, done)
        return Outcome(output=output, detector=record.detector)

    def process_message(self, raw: str | bytes | None) -> MessageOutcome:
        """One message as the source reads it (bytes; None for a tombstone): a record (as
        process()) or an array of records, answered with one array of outputs in order."""
        try:
            text = decode(raw)
        except RecordError as e:
            self.refused += 1
            return MessageOutcome(dead_letters=[dead_letter(raw, str(e))])
        if text.lstrip()[:1] != "[":
            one = self.process(text)
            letters = [one.dead_letter] if one.dead_letter else []
            return MessageOutcome(one.output, letters, one.detector)
        start = tsc_timer.now_ns()
        try:
            items = parse_message(text, self.network)
        except RecordError as e:
            self.refused += 1
            return MessageOutcome(dead_letters=[dead_letter(text, str(e), e.key)])
        records = [r for r in items if isinstance(r, InputRecord)]
        predicted = self.forecaster.predict_many([r.flows for r in records])
        predicted_at = tsc_timer.now_ns()
        outputs, routed, no_route = self._routed(records, predicted)
        refusals = [e for e in items if isinstance(e, RecordError)] + no_route
        letters = [dead_letter(e.element, str(e), getattr(e, "key", None)) for e in refusals]
        self.refused += len(refusals)
        if not outputs:
            return MessageOutcome(dead_letters=letters)
        out_ns = tsc_timer.now_ns()
        for fields in outputs:
            # the batch's forecast time is shared by its records; each routes on its own
            fields.update(predict_ns=predicted_at - start, job_in_ns=start, job_out_ns=out_ns)
        answer = json.dumps(outputs, separators=(",", ":"))
        if len(answer) > OUTPUT_MAX_BYTES:  # ASCII (json.dumps escapes the rest): chars = bytes
            return MessageOutcome(dead_letters=letters + self._too_large(routed, len(answer)))
        self.processed += len(outputs)
        return MessageOutcome(answer, letters, outputs[0]["detector"])

    def _too_large(self, records: list[InputRecord], size: int) -> list[str]:
        """A dead letter for each record of an answer the output topic would refuse."""
        self.refused += len(records)
        reason = f"its message's answer would be {size} bytes, more than {OUTPUT_MAX_BYTES}"
        return [dead_letter(r.to_json(), reason, _key(r)) for r in records]

    def _routed(self, records: list[InputRecord], predicted: list[float]):
        """Each routed record's output fields and the record, in order; and the records with
        no route."""
        outputs, routed, no_route = [], [], []
        for record, forecast in zip(records, predicted, strict=True):
            routed_from = tsc_timer.now_ns()
            try:
                expected = self.router.observe(record.detector, record.speed_mph, forecast)
                route = self._route(record)
            except NoRoute as e:
                e.element = record.to_json()
                no_route.append(e)
                continue
            fields = self._fields(record, forecast, expected, route)
            fields["route_ns"] = tsc_timer.now_ns() - routed_from
            outputs.append(fields)
            routed.append(record)
        return outputs, routed, no_route

    def _route(self, record: InputRecord):
        if record.destination is None:
            return self.router.route(self.origin, self.destination)
        try:
            return self.router.route(record.detector, record.destination)
        except NoRoute as e:
            e.key = _key(record)
            raise

    def _output(
        self,
        record: InputRecord,
        predicted: float,
        expected_speed: float,
        route,
        start: int,
        predicted_at: int,
        done: int,
    ) -> str:
        return json.dumps(
            {
                **self._fields(record, predicted, expected_speed, route),
                # durations inside the job (parse+predict, route), TSC ns of the job's machine
                "predict_ns": predicted_at - start,
                "route_ns": done - predicted_at,
                # when the record reached the job and when its result left for the sink: the
                # stage legs (input: producer → job, output: job → consumer) are taken from these
                "job_in_ns": start,
                "job_out_ns": tsc_timer.now_ns(),
            },
            separators=(",", ":"),
        )

    def _fields(self, record: InputRecord, predicted: float, expected_speed: float, route) -> dict:
        return {
            "run": record.run,
            "detector": record.detector,
            "seq": record.seq,
            "speed_mph": record.speed_mph,
            "flows": list(record.flows),
            "intended_ns": record.intended_ns,
            "sent_ns": record.sent_ns,
            "predicted_flow": round(predicted, 3),
            "expected_speed_mph": round(expected_speed, 3),
            "route": self.router.path_ids(route),
            "route_cost_s": round(route.cost, 3),
        }


def _key(record: InputRecord) -> dict:
    """A valid record's identity, as its dead letter's `key`."""
    return {"run": record.run, "detector": record.detector, "seq": record.seq,
            "sent_ns": record.sent_ns}  # fmt: skip
