"""Errors of the event store. Driver errors are translated where they enter.

EventStoreError
├── ConcurrencyError        the stream is not at the expected version (retryable:
│                           reload the stream, decide again, append again)
├── DuplicateEventError     an event id is already stored, in another stream or order
├── StreamNotFound          reading a stream that has no events
├── EventTooLarge           an event's encoded size is over the store's limit (not retryable:
│                           the same event is always too large)
└── StoreUnavailable        the database cannot be reached (retryable)
"""

from __future__ import annotations


class EventStoreError(Exception):
    """Base of every event store error."""

    retryable = False


class ConcurrencyError(EventStoreError):
    """An append's expected version did not match the stream's actual version."""

    retryable = True

    def __init__(self, stream_id: str, expected: int | str, actual: int | None) -> None:
        shown = "no stream" if actual is None else f"version {actual}"
        super().__init__(
            f"stream {stream_id!r}: expected {expected}, found {shown}; reload and decide again"
        )
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual


class DuplicateEventError(EventStoreError):
    """An event id of the append already exists, but not as the same append."""

    def __init__(self, stream_id: str, event_ids: list[str]) -> None:
        super().__init__(
            f"stream {stream_id!r}: event ids already stored elsewhere: {', '.join(event_ids)}"
        )
        self.stream_id = stream_id
        self.event_ids = event_ids


class StreamNotFound(EventStoreError):
    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} has no events")
        self.stream_id = stream_id


class StoreUnavailable(EventStoreError):
    """The database could not be reached or closed the connection."""

    retryable = True


class EventTooLarge(EventStoreError):
    """An event whose encoded payload and metadata exceed the store's `max_event_bytes`.

    Every event is published to Kafka as one message; the limit keeps each one well
    under the broker's message size, so no stored event can wedge the relay."""

    def __init__(self, stream_id: str, event_type: str, size: int, limit: int) -> None:
        super().__init__(
            f"stream {stream_id!r}: a {event_type} event takes {size} bytes encoded, "
            f"at most {limit} are allowed"
        )
        self.stream_id = stream_id
        self.event_type = event_type
        self.size = size
        self.limit = limit
