"""The two encoders of an event message (from a model, from stored JSON) agree."""

from __future__ import annotations

import json

from runyard.contracts import Metadata, RecordedEvent, default_mapper, new_event_id, utcnow
from runyard.contracts.task_events import TaskQueued
from runyard.eventstore import StoredEvent
from runyard.messaging import codec


def test_stored_and_model_encodings_give_the_same_message() -> None:
    mapper = default_mapper()
    event = TaskQueued(
        run=1,
        reason="needs 4 x 8-GPU workers, pool can start 2",
        position=3,
        gpus_needed=32,
        launchable=2,
    )
    meta = Metadata(
        actor="service:scheduler",
        causation_id="c-1",
        correlation_id="k-1",
        trace_context={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    )
    recorded = RecordedEvent(new_event_id(), "task-t1", 4, 42, utcnow(), event, meta)
    _, data = mapper.encode(event)[1:]
    # Postgres gives jsonb back with its own spacing: the stored text need not be ours.
    stored = StoredEvent(
        recorded.event_id,
        "task-t1",
        4,
        42,
        recorded.occurred_at,
        "TaskQueued",
        event.schema_version,
        json.dumps(json.loads(data)),
        json.dumps(meta.model_dump()),
    )
    key_a, value_a, headers_a = codec.encode(recorded)
    key_b, value_b, headers_b = codec.encode_stored(stored)
    assert key_a == key_b == b"task-t1"
    assert headers_a == headers_b
    assert json.loads(value_a) == json.loads(value_b)
    assert codec.decode(value_b, mapper) == recorded


def test_an_event_read_from_a_row_builds_its_payload_on_first_use_and_equals_the_model() -> None:
    event = TaskQueued(run=2, reason="pool can start 0", position=0, gpus_needed=8, launchable=0)
    meta = Metadata(actor="service:scheduler", correlation_id="k-1")
    recorded = RecordedEvent(new_event_id(), "task-t1", 3, 17, utcnow(), event, meta)
    # A store row: the envelope in `RecordedEvent.stored`'s order, then columns it ignores.
    row = (
        recorded.event_id,
        "task-t1",
        3,
        17,
        recorded.occurred_at,
        "TaskQueued",
        TaskQueued.schema_version,
        json.dumps(json.loads(event.model_dump_json())),
        json.dumps(meta.model_dump()),
        "xmin",
        "xmax",
    )
    stored = RecordedEvent.stored(row, TaskQueued)

    assert stored.type == "TaskQueued"
    assert (stored.stream_id, stored.stream_version, stored.global_position) == ("task-t1", 3, 17)
    assert stored.event == event and stored.event is stored.event  # built once, then kept
    assert stored.metadata == meta
    assert stored == recorded
    assert stored.replace(global_position=18).global_position == 18
