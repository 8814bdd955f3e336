"""Errors of the event store. Driver errors are translated where they enter.

Each is a `RunyardError` (runyard.errors) and says how an edge answers it when
it reaches one (a request's append that conflicted once too often, an event
too large, an outage); the others are faults, a 500 without their text.

EventStoreError
├── ConcurrencyError        the stream is not at the expected version (retryable:
│                           reload the stream, decide again, append again); 409
│                           `conflict`, gRPC ABORTED
├── DuplicateEventError     an event id is already stored, in another stream or order
├── StreamNotFound          reading a stream that has no events
├── EventTooLarge           an event's encoded size is over the store's limit (not retryable:
│                           the same event is always too large); 413 `event.too_large`
└── StoreUnavailable        the database cannot be reached (retryable); 503
                            `service.unavailable` with Retry-After, gRPC UNAVAILABLE
"""

from __future__ import annotations

from runyard.errors import (
    RETRY_AFTER_S,
    UNAVAILABLE_CODE,
    UNAVAILABLE_HINT,
    RunyardError,
    outage_message,
)


class EventStoreError(RunyardError):
    """Base of every event store error."""

    code = "eventstore.error"
    retryable = False


class ConcurrencyError(EventStoreError):
    """An append's expected version did not match the stream's actual version."""

    code = "conflict"
    retryable = True
    http_status = 409
    grpc_code = "ABORTED"

    def __init__(self, stream_id: str, expected: int | str, actual: int | None) -> None:
        shown = "no stream" if actual is None else f"version {actual}"
        super().__init__(
            f"stream {stream_id!r}: expected {expected}, found {shown}; reload and decide again",
            hint="the task changed meanwhile: try again",
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
    """The database could not be reached or closed the connection.

    `str()` is the driver's text, for logs; an answer says only the kind of error."""

    code = UNAVAILABLE_CODE
    retryable = True
    http_status = 503
    retry_after_s = RETRY_AFTER_S

    def __init__(self, detail: str = "") -> None:
        super().__init__(outage_message(type(self).__name__), hint=UNAVAILABLE_HINT, detail=detail)


class EventTooLarge(EventStoreError):
    """An event whose encoded payload and metadata exceed the store's `max_event_bytes`.

    Every event is published to Kafka as one message; the limit keeps each one well
    under the broker's message size, so no stored event can wedge the relay."""

    code = "event.too_large"
    http_status = 413

    def __init__(self, stream_id: str, event_type: str, size: int, limit: int) -> None:
        super().__init__(
            f"stream {stream_id!r}: a {event_type} event takes {size} bytes encoded, "
            f"at most {limit} are allowed",
            hint="shorten the longest texts of the request (command, description, variables)",
        )
        self.stream_id = stream_id
        self.event_type = event_type
        self.size = size
        self.limit = limit
