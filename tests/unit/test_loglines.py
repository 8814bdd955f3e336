"""The log record on `runyard.logs`: round trip, records older and newer than this
code, every way a message can be malformed, and the dedupe key the store relies on."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from runyard.contracts.catalogue import render
from runyard.contracts.loglines import (
    MAX_LINE,
    SCHEMA_VERSION,
    LogRecord,
    MalformedLogRecord,
)
from runyard.deployer import outputs
from runyard.deployer.runtime import OutputLine
from runyard.messaging.topics import LOGS

AT = datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=UTC)
#: What every deployer published before the record had a version (json.dumps of a dict).
V1_WIRE = (
    b'{"at": "2026-11-30T01:02:03.456789+00:00", "task_id": "t-1", "run": 2, "attempt": 3,'
    b' "worker": 4, "stream": "stderr", "line": "epoch 1 loss=2.31", "seq": 41}'
)


def record(**changes: Any) -> LogRecord:
    fields: dict[str, Any] = {
        "at": AT,
        "task_id": "t-1",
        "run": 2,
        "attempt": 3,
        "worker": 4,
        "stream": "stderr",
        "line": "epoch 1 loss=2.31",
        "seq": 41,
    }
    return LogRecord(**{**fields, **changes})


def wire(**changes: Any) -> bytes:
    """A valid message with some fields changed (`None`: left out)."""
    body = {**json.loads(V1_WIRE), **changes}
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


def older_reader(raw: bytes) -> tuple[Any, ...]:
    """How the log service and fault tolerance read a record before it had a version."""
    body = json.loads(raw)
    at = datetime.fromisoformat(body["at"])
    assert at.tzinfo is not None
    fields = ("task_id", "run", "attempt", "worker", "stream", "line")
    return (at, *(body[f] for f in fields), body.get("seq"))


# --- round trip and versions --------------------------------------------------------


@pytest.mark.parametrize("seq", [41, None])
def test_a_record_round_trips(seq: int | None) -> None:
    sent = record(seq=seq)
    raw = sent.to_bytes()
    assert LogRecord.from_bytes(raw) == sent
    body = json.loads(raw)
    assert body["schema_version"] == SCHEMA_VERSION == 1
    assert ("seq" in body) is (seq is not None)  # only numbered lines carry it
    assert body["at"] == "2026-11-30T01:02:03.456789+00:00"


def test_a_record_without_a_version_is_version_1() -> None:
    old = LogRecord.from_bytes(V1_WIRE)
    assert old == record()
    assert old.schema_version == 1


def test_a_record_without_an_attempt_is_attempt_1() -> None:
    assert LogRecord.from_bytes(wire(attempt=None)).attempt == 1


def test_what_this_code_writes_an_older_reader_reads() -> None:
    sent = record(line="héllo \u2603")
    assert older_reader(sent.to_bytes()) == (
        AT,
        "t-1",
        2,
        3,
        4,
        "stderr",
        "héllo \u2603",
        41,
    )


def test_fields_a_newer_writer_adds_are_ignored() -> None:
    newer = wire(host="node-7", labels={"a": "b"})
    assert LogRecord.from_bytes(newer) == record()


def test_a_time_in_another_zone_is_the_same_instant() -> None:
    there = AT.astimezone(timezone(timedelta(hours=8)))
    got = LogRecord.from_bytes(wire(at=there.isoformat()))
    assert got.at == AT
    assert got.to_bytes() == record(at=there).to_bytes()


def test_a_nul_in_the_line_becomes_a_replacement_character() -> None:
    assert LogRecord.from_bytes(wire(line="a\x00b")).line == "a\ufffdb"


def test_the_deployers_output_line_is_published_as_this_record() -> None:
    line = OutputLine("t-1", 2, 3, 4, "stderr", "epoch 1 loss=2.31", AT, 41)
    assert line.record() == record()
    assert LogRecord.from_bytes(line.record().to_bytes()) == record()


def test_the_longest_line_the_deployer_cuts_fits() -> None:
    # outputs.text() turns each byte into at most one character
    assert outputs.LINE_MAX <= MAX_LINE
    longest = outputs.text(b"\xff" * outputs.LINE_MAX)
    assert LogRecord.from_bytes(record(line=longest).to_bytes()).line == longest


# --- malformed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "reason"),
    [
        (None, "", "no value"),
        (b"", "", "Invalid JSON"),
        (b"not json", "", "Invalid JSON"),
        (b'["at"]', "", "object"),
        (b'{"line": "\xff"}', "", "Invalid JSON"),  # not UTF-8
        (b'{"at": "x", "line": "\\ud800"}', "", "Invalid JSON"),  # a lone surrogate
        (wire(schema_version=2), "schema_version", "newer than this code"),
        (wire(schema_version=0), "schema_version", "greater than or equal to 1"),
        (wire(schema_version="1"), "schema_version", "valid integer"),
        (wire(at=None), "at", "Field required"),
        (wire(at="2026-11-30T01:02:03"), "at", "timezone"),
        (wire(at="yesterday"), "at", "datetime"),
        (wire(at=1764464523), "at", "datetime"),
        (wire(task_id=None), "task_id", "Field required"),
        (wire(task_id=""), "task_id", "at least 1 character"),
        (wire(task_id="t" * 129), "task_id", "at most 128 characters"),
        (wire(task_id="t\x00"), "task_id", "pattern"),
        (wire(task_id=7), "task_id", "valid string"),
        (wire(run=None), "run", "Field required"),
        (wire(run="2"), "run", "valid integer"),
        (wire(run=2.0), "run", "valid integer"),
        (wire(run=True), "run", "valid integer"),
        (wire(run=0), "run", "greater than or equal to 1"),
        (wire(run=2**31), "run", "less than or equal to 2147483647"),
        (wire(attempt=0), "attempt", "greater than or equal to 1"),
        (wire(worker=None), "worker", "Field required"),
        (wire(worker=-1), "worker", "greater than or equal to 0"),
        (wire(worker=1024), "worker", "less than 1024"),
        (wire(stream=None), "stream", "Field required"),
        (wire(stream="stdin"), "stream", "'stdout' or 'stderr'"),
        (wire(line=None), "line", "Field required"),
        (wire(line=["a"]), "line", "valid string"),
        (wire(line="x" * (MAX_LINE + 1)), "line", "at most 65536 characters"),
        (wire(seq=-1), "seq", "greater than or equal to 0"),
        (wire(seq=2**63), "seq", "less than or equal to"),
        (wire(seq="41"), "seq", "valid integer"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_malformed_message_names_what_is_wrong(
    raw: bytes | None, field: str, reason: str
) -> None:
    with pytest.raises(MalformedLogRecord) as caught:
        LogRecord.from_bytes(raw)
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert str(caught.value) == (f"{field}: " if field else "") + caught.value.reason
    assert isinstance(caught.value, ValueError)


def test_every_problem_of_a_message_is_named() -> None:
    with pytest.raises(MalformedLogRecord) as caught:
        LogRecord.from_bytes(wire(run="2", stream="stdin"))
    assert caught.value.field == "run"
    assert "stream: Input should be 'stdout' or 'stderr'" in str(caught.value)


# --- dedupe ------------------------------------------------------------------------


def _md5_uuid(text: str | bytes) -> uuid.UUID:
    data = text.encode() if isinstance(text, str) else text
    return uuid.UUID(bytes=hashlib.md5(data, usedforsecurity=False).digest())


def test_a_numbered_line_is_known_by_its_stream_and_number() -> None:
    key = _md5_uuid("t-1\x1f2\x1f3\x1f4\x1fstderr\x1f#41")
    assert record().dedupe == key
    assert LogRecord.from_bytes(V1_WIRE).dedupe == key
    # read again by a new deployer: another time, the same line
    assert record(at=AT + timedelta(hours=1)).to_bytes() != V1_WIRE
    assert LogRecord.from_bytes(record(at=AT + timedelta(hours=1)).to_bytes()).dedupe == key
    assert record(seq=42).dedupe != key
    assert record(stream="stdout").dedupe != key


def test_an_unnumbered_message_is_known_by_its_bytes() -> None:
    raw = wire(seq=None)
    assert LogRecord.from_bytes(raw).dedupe == _md5_uuid(raw)
    assert LogRecord.from_bytes(raw).dedupe == LogRecord.from_bytes(raw).dedupe
    # the same fields in other bytes are another message
    assert LogRecord.from_bytes(record(seq=None).to_bytes()).dedupe != _md5_uuid(raw)


def test_an_unnumbered_record_built_in_code_is_known_by_its_fields() -> None:
    key = _md5_uuid(
        "t-1\x1f2\x1f3\x1f4\x1fstderr\x1f2026-11-30T01:02:03.456789+00:00\x1fepoch 1 loss=2.31"
    )
    assert record(seq=None).dedupe == key


def test_where_a_record_came_from_is_not_part_of_it() -> None:
    decoded = LogRecord.from_bytes(wire(seq=None))
    built = record(seq=None)
    assert decoded == built and hash(decoded) == hash(built)
    assert decoded.dedupe != built.dedupe
    assert len({decoded, built}) == 1


def test_a_record_is_frozen() -> None:
    with pytest.raises(ValueError):
        record().run = 3  # type: ignore[misc]


def test_the_catalogue_lists_the_record_on_its_topic() -> None:
    assert LogRecord.topic == LOGS
    text = render()
    assert "### LogRecord\n" in text
    assert f"- topic: `{LOGS}`, keyed by task id\n- schema version: {SCHEMA_VERSION}\n" in text
    for name in LogRecord.model_fields:
        assert f"| `{name}` |" in text


def test_a_copy_with_other_fields_is_known_by_them() -> None:
    decoded = LogRecord.from_bytes(wire(seq=None))
    assert decoded.dedupe == _md5_uuid(wire(seq=None))
    assert decoded.model_copy().dedupe == decoded.dedupe
    changed = decoded.model_copy(update={"line": "another line"})
    assert changed.dedupe == record(seq=None, line="another line").dedupe
    numbered = record(seq=7)
    assert numbered.dedupe != numbered.model_copy(update={"seq": 8}).dedupe
