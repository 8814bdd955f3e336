"""The log store's identity of a line under redelivery: for a numbered line it is
worked out per batch from its stream's hash state, and must equal the record's own
(`LogRecord.dedupe`), which rows stored by earlier versions carry."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from runyard.logs.store import _StreamLines

from tests.log_records import log_record

AT = datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=UTC)
STREAMS = [
    (task, run, attempt, worker, stream)
    for task in ("t-1", "t-ü", "t\u3000x")
    for run, attempt, worker in ((1, 1, 0), (2, 3, 4), (2**31 - 1, 1, 9))
    for stream in ("stdout", "stderr")
]


def test_a_numbered_line_has_the_records_identity() -> None:
    for key in STREAMS:
        task, run, attempt, worker, stream = key
        records = [
            log_record(AT, task, "x", run=run, attempt=attempt, worker=worker, stream=stream, seq=s)
            for s in (0, 1, 41, 10, 2**63 - 1)
        ]
        lines = _StreamLines.of(key, records)
        assert lines.records == records
        assert [uuid.UUID(str(i)) for i in lines.identities] == [r.dedupe for r in records]


def test_an_unnumbered_line_has_the_records_identity_and_is_never_dropped() -> None:
    records = [log_record(AT, "t-1", "no number") for _ in range(2)]
    lines = _StreamLines.of(("t-1", 1, 1, 0, "stdout"), records)
    assert lines.records == records and lines.identities == [r.dedupe for r in records]


def test_a_number_twice_in_a_batch_keeps_the_first() -> None:
    first = log_record(AT, "t-1", "a", seq=3)
    again = first.model_copy(update={"at": AT + timedelta(seconds=1)})
    other = log_record(AT, "t-1", "b", seq=4)
    lines = _StreamLines.of(("t-1", 1, 1, 0, "stdout"), [first, again, other])
    assert lines.records == [first, other]
    assert [uuid.UUID(str(i)) for i in lines.identities] == [first.dedupe, other.dedupe]
