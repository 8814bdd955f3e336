"""The event store: the system of record of Runyard.

Public surface: the `EventStore` interface with its Postgres and in-memory
implementations, expected-version markers, results, typed errors, and the
read-decide-append loop every writer uses (`decide_and_append`).
"""

from runyard.eventstore.decisions import (
    Decision,
    StreamLocks,
    TaskCommands,
    decide_and_append,
    remember_last,
)
from runyard.eventstore.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventStoreError,
    EventTooLarge,
    StoreUnavailable,
    StreamNotFound,
)
from runyard.eventstore.memory import InMemoryEventStore
from runyard.eventstore.migrate import (
    Migration,
    apply_migrations,
    eventstore_migrations,
    load_migrations,
)
from runyard.eventstore.postgres import (
    EVENT_COLUMNS,
    PostgresAllReader,
    PostgresEventStore,
    StoredEvent,
)
from runyard.eventstore.store import (
    ANY,
    MAX_EVENT_BYTES,
    NO_STREAM,
    AllReader,
    AppendRequest,
    AppendResult,
    EventStore,
    ExpectedVersion,
)
from runyard.eventstore.transient import (
    HEALTH,
    Backoff,
    Health,
    cancel_and_wait,
    is_transient,
    retrying,
)

__all__ = [
    "ANY",
    "EVENT_COLUMNS",
    "HEALTH",
    "MAX_EVENT_BYTES",
    "NO_STREAM",
    "AllReader",
    "AppendRequest",
    "AppendResult",
    "Backoff",
    "ConcurrencyError",
    "Decision",
    "DuplicateEventError",
    "EventStore",
    "EventStoreError",
    "EventTooLarge",
    "ExpectedVersion",
    "Health",
    "InMemoryEventStore",
    "Migration",
    "PostgresAllReader",
    "PostgresEventStore",
    "StoreUnavailable",
    "StoredEvent",
    "StreamLocks",
    "StreamNotFound",
    "TaskCommands",
    "apply_migrations",
    "cancel_and_wait",
    "decide_and_append",
    "eventstore_migrations",
    "is_transient",
    "load_migrations",
    "remember_last",
    "retrying",
]
