"""Errors of the event store. Driver errors are translated where they enter.

EventStoreError
├── ConcurrencyError        the stream is not at the expected version (retryable:
│                           reload the stream, decide again, append again)
├── DuplicateEventError     an event id is already stored, in another stream or order
├── StreamNotFound          reading a stream that has no events
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
