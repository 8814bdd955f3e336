"""The envelope around an event: identity, position, time and causality.

`NewEvent` is what a writer hands to the event store; `RecordedEvent` is what
comes back out, with the stream version and global position the store gave it.
Ids and time are always passed in (never read from a clock here) so that
decisions stay pure and replays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
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


class RecordedEvent(Generic[E_co]):
    """An event as stored: payload plus envelope. Immutable.

    An event read from the store (`RecordedEvent.stored`) keeps its payload and
    metadata as the stored JSON until first asked for, then builds and keeps
    them: a reader that filters by type, or folds without reading who caused an
    event, builds nothing it does not use. Equal events compare equal however
    they were made.
    """

    # `_f` holds the envelope by position: event id, stream id, stream version,
    # global position, occurred at, type name, schema version, stored payload,
    # stored metadata. A reader makes one of these per row, so for an event read
    # from the store `_f` is the row itself (any sequence in that order: the
    # store's own record, not a copy). Until built, `_event` holds the payload's
    # model class and `_metadata` is None (a check, not a caught AttributeError:
    # the exception would cost more than the payload's validation).
    __slots__ = ("_event", "_f", "_metadata")
    _event: E_co
    _f: Sequence[Any]
    _metadata: Metadata

    def __init__(
        self,
        event_id: UUID,
        stream_id: str,
        stream_version: int,
        global_position: int,
        occurred_at: datetime,
        event: E_co,
        metadata: Metadata,
    ) -> None:
        _set = object.__setattr__
        _set(
            self,
            "_f",
            (event_id, stream_id, stream_version, global_position, occurred_at, None),
        )
        _set(self, "_event", event)
        _set(self, "_metadata", metadata)

    @classmethod
    def stored(cls, row: Sequence[Any], model: type[E_co]) -> RecordedEvent[E_co]:
        """An event as read from the store, built when first asked for.

        `row` holds, in order: event id, stream id, stream version, global
        position, occurred at, type name, schema version, payload JSON (in the
        current schema of `model`) and metadata JSON; further items are ignored.
        Payload and metadata are validated when first asked for."""
        recorded: RecordedEvent[E_co] = _new(cls)
        _set_f(recorded, row)
        _set_event(recorded, model)
        _set_metadata(recorded, None)
        return recorded

    @property
    def event_id(self) -> UUID:
        return self._f[0]  # type: ignore[no-any-return]

    @property
    def stream_id(self) -> str:
        return self._f[1]  # type: ignore[no-any-return]

    @property
    def stream_version(self) -> int:
        return self._f[2]  # type: ignore[no-any-return]

    @property
    def global_position(self) -> int:
        return self._f[3]  # type: ignore[no-any-return]

    @property
    def occurred_at(self) -> datetime:
        return self._f[4]  # type: ignore[no-any-return]

    @property
    def event(self) -> E_co:
        """The payload (built on first use for an event read from the store)."""
        event = self._event
        if isinstance(event, type):  # still the model: build it from the stored JSON
            # What `model_validate_json` does, less its wrapper (a fold builds many).
            event = event.__pydantic_validator__.validate_json(self._f[7])
            _set_event(self, event)
        return event

    @property
    def metadata(self) -> Metadata:
        """Who or what caused the event (built on first use, as `event`)."""
        metadata = self._metadata
        if metadata is None:
            metadata = Metadata.model_validate_json(self._f[8])
            _set_metadata(self, metadata)
        return metadata

    @property
    def type(self) -> str:
        """The event's type name (without building the payload)."""
        name = self._f[5]
        return name if name is not None else self.event.type_name()

    @property
    def category(self) -> str:
        return stream_category(self.stream_id)

    def replace(self, **changes: Any) -> RecordedEvent[E_co]:
        """A copy with some fields changed (as `dataclasses.replace` would)."""
        fields = dict(
            event_id=self.event_id,
            stream_id=self.stream_id,
            stream_version=self.stream_version,
            global_position=self.global_position,
            occurred_at=self.occurred_at,
            event=self.event,
            metadata=self.metadata,
        )
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"RecordedEvent has no fields {sorted(unknown)}")
        return RecordedEvent(**{**fields, **changes})

    def _key(self) -> tuple[object, ...]:
        return (
            self.event_id,
            self.stream_id,
            self.stream_version,
            self.global_position,
            self.occurred_at,
            self.event,
            self.metadata,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, RecordedEvent)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"RecordedEvent(event_id={self.event_id!r}, stream_id={self.stream_id!r},"
            f" stream_version={self.stream_version!r}, global_position={self.global_position!r},"
            f" occurred_at={self.occurred_at!r}, event={self.event!r},"
            f" metadata={self.metadata!r})"
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RecordedEvent is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"RecordedEvent is immutable: cannot delete {name}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_recorded, self._key())


_new = object.__new__
# The slots' own setters (the class is immutable to everyone else).
_set_f = RecordedEvent.__dict__["_f"].__set__
_set_event = RecordedEvent.__dict__["_event"].__set__
_set_metadata = RecordedEvent.__dict__["_metadata"].__set__


def _recorded(*key: Any) -> RecordedEvent[Any]:
    event_id, stream_id, stream_version, global_position, occurred_at, event, metadata = key
    return RecordedEvent(
        event_id=event_id,
        stream_id=stream_id,
        stream_version=stream_version,
        global_position=global_position,
        occurred_at=occurred_at,
        event=event,
        metadata=metadata,
    )


def stream_category(stream_id: str) -> str:
    """`task-0193...` -> `task`; the category names the Kafka topic."""
    category, sep, _ = stream_id.partition("-")
    return category if sep else stream_id
