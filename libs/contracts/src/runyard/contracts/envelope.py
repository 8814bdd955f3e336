"""The envelope around an event: identity, position, time and causality.

`NewEvent` is what a writer hands to the event store; `RecordedEvent` is what
comes back out, with the stream version and global position the store gave it.
Ids and time are always passed in (never read from a clock here) so that
decisions stay pure and replays exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar
from uuid import UUID

import uuid_utils
from pydantic import BaseModel, ConfigDict
from runyard.contracts.base import Event

# A new or recorded event of one type is one of `Event` (frozen: read, never written).
E_co = TypeVar("E_co", bound=Event, covariant=True)


def new_event_id() -> UUID:
    """A fresh UUIDv7: time-ordered, so ids sort roughly by creation."""
    return UUID(bytes=uuid_utils.uuid7().bytes)


def utcnow() -> datetime:
    return datetime.now(UTC)


_trace_context_source: Callable[[], dict[str, str]] | None = None


def set_trace_context_source(source: Callable[[], dict[str, str]] | None) -> None:
    """Where `Metadata.caused_by` reads the active trace context (set by
    runyard.telemetry; the contracts stay free of OpenTelemetry)."""
    global _trace_context_source
    _trace_context_source = source


class Metadata(BaseModel):
    """Who or what caused an event, and how it links to others (R-62)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: `user:<tenant>/<name>` for people, `service:<name>` for services.
    actor: str
    #: The event (or request) id that directly caused this event.
    causation_id: str | None = None
    #: Shared by every event of one chain of reactions (e.g. one submission).
    correlation_id: str | None = None
    #: W3C trace context (`traceparent`, `tracestate`) of the writer's span.
    trace_context: dict[str, str] = {}

    def caused_by(self, event: RecordedEvent[Event], actor: str) -> Metadata:
        """Metadata for an event written in reaction to `event`: it names `event`
        as its cause, keeps the correlation id, and carries the active trace
        context (the consumer's span) or else the cause's."""
        active = _trace_context_source() if _trace_context_source else {}
        return Metadata(
            actor=actor,
            causation_id=str(event.event_id),
            correlation_id=event.metadata.correlation_id or str(event.event_id),
            trace_context=active or dict(event.metadata.trace_context),
        )


@dataclass(frozen=True, slots=True)
class NewEvent(Generic[E_co]):
    """An event about to be appended."""

    event: E_co
    metadata: Metadata
    occurred_at: datetime
    event_id: UUID = field(default_factory=new_event_id)

    def __post_init__(self) -> None:
        if self.occurred_at.tzinfo is None:
            raise ValueError("occurred_at must be timezone-aware (UTC), e.g. utcnow()")

    def recorded(
        self, stream_id: str, stream_version: int, global_position: int
    ) -> RecordedEvent[E_co]:
        """This event as the store keeps it, at the place an append gave it."""
        return RecordedEvent(
            event_id=self.event_id,
            stream_id=stream_id,
            stream_version=stream_version,
            global_position=global_position,
            occurred_at=self.occurred_at,
            event=self.event,
            metadata=self.metadata,
        )


@dataclass(frozen=True, slots=True)
class RecordedEvent(Generic[E_co]):
    """An event as stored: payload plus envelope."""

    event_id: UUID
    stream_id: str
    stream_version: int
    global_position: int
    occurred_at: datetime
    event: E_co
    metadata: Metadata

    @property
    def type(self) -> str:
        return self.event.type_name()

    @property
    def category(self) -> str:
        return stream_category(self.stream_id)


def stream_category(stream_id: str) -> str:
    """`task-0193...` -> `task`; the category names the Kafka topic."""
    category, sep, _ = stream_id.partition("-")
    return category if sep else stream_id
