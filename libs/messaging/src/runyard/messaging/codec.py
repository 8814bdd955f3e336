"""How a recorded event travels on Kafka.

Value: the envelope and payload as one JSON object (readable with any Kafka
tool). Key: the stream id, so one stream's events stay in one partition, in
order. Headers repeat the envelope fields and carry the W3C trace context, so
a consumer can route, dedupe and trace without parsing the value.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import ValidationError
from runyard.contracts import Event, EventMapper, Metadata, RecordedEvent, UnknownEventType
from runyard.eventstore import StoredEvent

Headers = list[tuple[str, bytes]]


class UndecodableMessage(ValueError):
    """A message that is not a Runyard event this code can read; goes to dead letter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(recorded: RecordedEvent[Event]) -> tuple[bytes, bytes, Headers]:
    """(key, value, headers) for one recorded event."""
    meta = recorded.metadata.model_dump(mode="json")
    value = {
        "event_id": str(recorded.event_id),
        "stream_id": recorded.stream_id,
        "stream_version": recorded.stream_version,
        "global_position": recorded.global_position,
        "occurred_at": recorded.occurred_at.isoformat(),
        "type": recorded.type,
        "schema_version": recorded.event.schema_version,
        "data": recorded.event.payload(),
        "metadata": meta,
    }
    headers = _headers(
        str(recorded.event_id),
        recorded.type,
        recorded.event.schema_version,
        recorded.stream_version,
        recorded.global_position,
        recorded.occurred_at.isoformat(),
        meta,
    )
    key = recorded.stream_id.encode()
    return key, json.dumps(value, separators=(",", ":")).encode(), headers


def encode_stored(stored: StoredEvent) -> tuple[bytes, bytes, Headers]:
    """The same message as `encode`, built from the stored JSON without a model:
    the relay forwards events and never needs them decoded."""
    occurred_at = stored.occurred_at.isoformat()
    value = (
        f'{{"event_id":"{stored.event_id}","stream_id":{json.dumps(stored.stream_id)},'
        f'"stream_version":{stored.stream_version},"global_position":{stored.global_position},'
        f'"occurred_at":"{occurred_at}","type":{json.dumps(stored.event_type)},'
        f'"schema_version":{stored.schema_version},'
        f'"data":{stored.data},"metadata":{stored.metadata}}}'
    )
    headers = _headers(
        str(stored.event_id),
        stored.event_type,
        stored.schema_version,
        stored.stream_version,
        stored.global_position,
        occurred_at,
        json.loads(stored.metadata),
    )
    return stored.stream_id.encode(), value.encode(), headers


def _headers(
    event_id: str,
    event_type: str,
    schema_version: int,
    stream_version: int,
    global_position: int,
    occurred_at: str,
    meta: dict[str, Any],
) -> Headers:
    headers: Headers = [
        ("event_id", event_id.encode()),
        ("event_type", event_type.encode()),
        ("schema_version", str(schema_version).encode()),
        ("stream_version", str(stream_version).encode()),
        ("global_position", str(global_position).encode()),
        ("occurred_at", occurred_at.encode()),
        ("actor", str(meta["actor"]).encode()),
    ]
    for name in ("causation_id", "correlation_id"):
        if meta.get(name):
            headers.append((name, str(meta[name]).encode()))
    headers.extend((k, str(v).encode()) for k, v in (meta.get("trace_context") or {}).items())
    return headers


def decode(value: bytes | None, mapper: EventMapper) -> RecordedEvent[Event]:
    """The recorded event in a message value, or UndecodableMessage saying why not."""
    if not value:
        raise UndecodableMessage("empty message value")
    try:
        raw: dict[str, Any] = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UndecodableMessage(f"value is not JSON: {exc}") from exc
    try:
        data = mapper.upcast(raw["type"], int(raw["schema_version"]), raw["data"])
        return RecordedEvent(
            event_id=UUID(raw["event_id"]),
            stream_id=raw["stream_id"],
            stream_version=int(raw["stream_version"]),
            global_position=int(raw["global_position"]),
            occurred_at=datetime.fromisoformat(raw["occurred_at"]),
            event=mapper.model(raw["type"]).model_validate(data),
            metadata=Metadata.model_validate(raw["metadata"]),
        )
    except UnknownEventType as exc:
        raise UndecodableMessage(str(exc)) from exc
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise UndecodableMessage(f"not a Runyard event: {type(exc).__name__}: {exc}") from exc
