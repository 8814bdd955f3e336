"""The Postgres event store (asyncpg).

Appends go through the `runyard_append` SQL function: one round trip per
stream, optimistic concurrency on the `streams` row, positions from an
identity column. The all-stream reader handles the classic trap of such a
design, positions that commit out of order, without serialising writers:

A transaction takes its xid (by writing its `streams` row) before its events
take positions. So when a reader sees position p visible but p-1 missing, the
writer of p-1 had an xid below the reader's snapshot `xmax`. The reader stops
at the gap and remembers that `xmax`; once the oldest running transaction is
past it (`pg_snapshot_xmin` of a later snapshot >= that xmax), every possible
owner of p-1 has finished, and a position still missing was rolled back and
can be skipped for good. No committed event is ever passed over.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from runyard.contracts import (
    Event,
    EventMapper,
    Metadata,
    NewEvent,
    RecordedEvent,
    stream_category,
)
from runyard.eventstore.appended import NOTIFY_AFTER_QUIET_S, notify_appended
from runyard.eventstore.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventTooLarge,
    StoreUnavailable,
)
from runyard.eventstore.migrate import apply_migrations, eventstore_migrations
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
from runyard.telemetry.metrics import count_appended

_APPEND = "SELECT o_version, o_positions FROM runyard_append($1, $2, $3, $4, $5, $6, $7, $8)"
_WRONG_VERSION = "RY001"  # raised by runyard_append
#: The columns `PostgresEventStore.decode` reads, in the order it reads them
#: (`RecordedEvent.stored`'s): `SELECT {EVENT_COLUMNS} FROM events ...`.
EVENT_COLUMNS = (
    "event_id, stream_id, stream_version, global_position, occurred_at, event_type,"
    " schema_version, data::text AS data, metadata::text AS metadata"
)
_READ_STREAM = (
    f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = $1 AND stream_version >= $2"
    " ORDER BY stream_version LIMIT $3"
)
# The all-stream reader's usual read: rows only. When they leave a position out, it
# reads again with `_READ_ALL_BOUNDED`, whose statement snapshot's bounds come with
# every row: each is an uncorrelated subquery, so Postgres works it out once (an
# InitPlan), and every part of one statement sees the one snapshot its scan of
# `events` sees. (A join of the bounds with the rows costs about 15% more per fetched
# row; the two columns on every read cost about 4% of a read with payloads built.)
# No rows, no bounds: the reader needs them only beside a row.
_READ_ALL = (
    f"SELECT {EVENT_COLUMNS} FROM events WHERE global_position > $1"
    " ORDER BY global_position LIMIT $2"
)
_READ_ALL_BOUNDED = f"""
SELECT {EVENT_COLUMNS},
       (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint) AS xmin,
       (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint) AS xmax
FROM events WHERE global_position > $1 ORDER BY global_position LIMIT $2
"""
#: What `PostgresAllReader.heads` reads of a row: where and what, not the payload.
HEAD_COLUMNS = "stream_id, stream_version, global_position, occurred_at, event_type"
_READ_HEADS = _READ_ALL.replace(EVENT_COLUMNS, HEAD_COLUMNS)
_READ_HEADS_BOUNDED = _READ_ALL_BOUNDED.replace(EVENT_COLUMNS, HEAD_COLUMNS)

_CONNECTION_ERRORS = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    ConnectionError,
    OSError,
)


def _result(stream_id: str, row: asyncpg.Record) -> AppendResult:
    return AppendResult(stream_id, row["o_version"], tuple(row["o_positions"]))


async def _light_reset(conn: asyncpg.Connection) -> None:
    """What a connection needs when it goes back to the pool.

    asyncpg's default reset is a round trip (`RESET ALL; UNLISTEN *; ...`) on
    every release, which costs a single-event append about a third of its rate.
    Nothing here leaves session state behind (no LISTEN, no session settings;
    the migration lock is released explicitly), so only an interrupted
    transaction needs undoing.
    """
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def _expected_code(expected: ExpectedVersion) -> int:
    if expected == ANY:
        return -2
    if expected == NO_STREAM:
        return -1
    if isinstance(expected, int) and expected >= 0:
        return expected
    raise ValueError(
        f"expected version must be 'any', 'no_stream' or an int >= 0, not {expected!r}"
    )


class PostgresEventStore(EventStore):
    """Event store over an asyncpg pool; see the module docstring for ordering.

    An append whose event encodes to more than `max_event_bytes` (payload and
    metadata JSON) raises `EventTooLarge` and writes nothing."""

    def __init__(
        self, pool: asyncpg.Pool, mapper: EventMapper, *, max_event_bytes: int = MAX_EVENT_BYTES
    ) -> None:
        self.pool = pool
        self.mapper = mapper
        self.max_event_bytes = max_event_bytes
        #: An append committed after this long without one from this store tells the
        #: log's followers (`runyard.eventstore.appended`), in a statement of its own
        #: after the commit: a follower that slowed its polls on a quiet log reads the
        #: event now. Appends closer together tell no one (followers poll often then).
        self.notify_after_quiet_s = NOTIFY_AFTER_QUIET_S
        self._last_append = -math.inf

    @classmethod
    async def connect(
        cls,
        dsn: str,
        mapper: EventMapper,
        *,
        min_size: int = 1,
        max_size: int = 10,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> PostgresEventStore:
        """Open a pool on `dsn` and apply the store's migrations."""
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, reset=_light_reset
            )
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailable(f"cannot reach Postgres at {dsn}: {exc}") from exc
        async with pool.acquire() as conn:
            await apply_migrations(conn, eventstore_migrations())
        return cls(pool, mapper, max_event_bytes=max_event_bytes)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection in a transaction, for appends that go with other writes
        (a consumer's inbox row, a projection) and must commit together."""
        try:
            async with self.pool.acquire() as conn:
                quiet_at = self._quiet_at()
                async with conn.transaction():
                    yield conn
                if quiet_at is not None and self._last_append > quiet_at:
                    await notify_appended(conn)  # it appended, after a quiet spell
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailable(str(exc)) from exc

    def _quiet_at(self) -> float | None:
        """The time now if this store has not appended for `notify_after_quiet_s`."""
        now = time.monotonic()
        return now if now - self._last_append >= self.notify_after_quiet_s else None

    # -- writing ---------------------------------------------------------------

    async def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent[Event]],
        expected: ExpectedVersion = ANY,
    ) -> AppendResult:
        async with self._connection() as conn:
            quiet_at = self._quiet_at()
            result = await self.append_in(conn, stream_id, events, expected)
            if quiet_at is not None:
                await notify_appended(conn)
            return result

    async def append_many(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        try:
            async with self.transaction() as conn:
                return [
                    await self.append_in(conn, r.stream_id, r.events, r.expected) for r in requests
                ]
        except DuplicateEventError:
            # The transaction is rolled back; the same appends again are still fine.
            return [await self._replayed(r.stream_id, r.events) for r in requests]

    async def append_in(
        self,
        conn: asyncpg.Connection,
        stream_id: str,
        events: Sequence[NewEvent[Event]],
        expected: ExpectedVersion = ANY,
    ) -> AppendResult:
        """Append on a given connection (inside the caller's transaction, if any)."""
        if not events:
            raise ValueError("append needs at least one event")
        args = self._append_args(stream_id, events, expected)
        try:
            row = await conn.fetchrow(_APPEND, *args)
        except asyncpg.UniqueViolationError as exc:
            if conn.is_in_transaction():
                # The caller's transaction is aborted: it cannot go on as if this
                # append had succeeded, even when it is a replay (append_many checks).
                raise DuplicateEventError(stream_id, [str(e.event_id) for e in events]) from exc
            return await self._replayed(stream_id, events, exc)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate != _WRONG_VERSION:
                raise
            actual = int(getattr(exc, "detail", None) or -1)
            raise ConcurrencyError(stream_id, expected, None if actual < 0 else actual) from exc
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailable(str(exc)) from exc
        count_appended(args[3])
        self._last_append = time.monotonic()
        return _result(stream_id, row)

    def _append_args(
        self, stream_id: str, events: Sequence[NewEvent[Event]], expected: ExpectedVersion
    ) -> tuple[Any, ...]:
        encode = self.mapper.encode
        encoded = [encode(e.event) for e in events]
        metadata = [e.metadata.model_dump_json() for e in events]
        for (event_type, _, data), meta in zip(encoded, metadata, strict=True):
            if 4 * (len(data) + len(meta)) <= self.max_event_bytes:
                continue  # fits even at 4 bytes a character: no need to encode
            size = len(data.encode()) + len(meta.encode())
            if size > self.max_event_bytes:
                raise EventTooLarge(stream_id, event_type, size, self.max_event_bytes)
        return (
            stream_id,
            _expected_code(expected),
            [e.event_id for e in events],
            [t for t, _, _ in encoded],
            [v for _, v, _ in encoded],
            [d for _, _, d in encoded],
            metadata,
            [e.occurred_at for e in events],
        )

    async def _replayed(
        self, stream_id: str, events: Sequence[NewEvent[Event]], exc: Exception | None = None
    ) -> AppendResult:
        """An event id clashed: the same append again is fine, anything else is not."""
        ids = [e.event_id for e in events]
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT o_version, o_positions FROM runyard_existing_positions($1, $2)",
                stream_id,
                ids,
            )
        if row is None or row["o_positions"] is None:
            raise DuplicateEventError(stream_id, [str(i) for i in ids]) from exc
        return _result(stream_id, row)

    # -- reading ---------------------------------------------------------------

    async def read_stream(
        self, stream_id: str, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent[Event]]:
        async with self._connection() as conn:  # LIMIT NULL: every event
            rows = await conn.fetch(_READ_STREAM, stream_id, from_version, limit)
        return self.decode_rows(rows)

    async def stream_version(self, stream_id: str) -> int:
        async with self._connection() as conn:
            version = await conn.fetchval(
                "SELECT version FROM streams WHERE stream_id = $1", stream_id
            )
        return int(version or 0)

    async def head_position(self) -> int:
        async with self._connection() as conn:
            return int(await conn.fetchval("SELECT coalesce(max(global_position), 0) FROM events"))

    def all_reader(self, after: int = 0) -> PostgresAllReader:
        return PostgresAllReader(self, after)

    def decode(self, row: Sequence[Any]) -> RecordedEvent[Event]:
        """The event in a row of `EVENT_COLUMNS` (by position: any further columns
        are ignored). An unknown type, or a payload that needs upcasting (or is
        newer than this code), is dealt with now; a current payload is built when
        first used, and the row itself is the event's envelope."""
        event_type, schema_version = row[5], row[6]
        model = self.mapper.model(event_type)
        if schema_version == model.schema_version:
            return RecordedEvent.stored(row, model)
        return RecordedEvent(
            event_id=row[0],
            stream_id=row[1],
            stream_version=row[2],
            global_position=row[3],
            occurred_at=row[4],
            event=self.mapper.decode(event_type, schema_version, row[7]),
            metadata=Metadata.model_validate_json(row[8]),
        )

    def decode_rows(self, rows: Sequence[Sequence[Any]]) -> list[RecordedEvent[Event]]:
        """`decode` of every row, with the common case (a current payload) inline:
        a fold reads thousands, and a call per row is a tenth of the read."""
        current = self.mapper.current
        stored = RecordedEvent.stored
        decode = self.decode
        events: list[RecordedEvent[Event]] = []
        append = events.append
        for row in rows:
            known = current.get(row[5])
            if known is not None and known[1] == row[6]:
                append(stored(row, known[0]))
            else:
                append(decode(row))
        return events

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            async with self.pool.acquire() as conn:
                yield conn
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailable(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event exactly as stored: envelope fields, and payload/metadata as JSON text."""

    event_id: UUID
    stream_id: str
    stream_version: int
    global_position: int
    occurred_at: datetime
    event_type: str
    schema_version: int
    data: str
    metadata: str

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> StoredEvent:
        return cls(
            event_id=row["event_id"],
            stream_id=row["stream_id"],
            stream_version=row["stream_version"],
            global_position=row["global_position"],
            occurred_at=row["occurred_at"],
            event_type=row["event_type"],
            schema_version=row["schema_version"],
            data=row["data"],
            metadata=row["metadata"],
        )

    @property
    def category(self) -> str:
        return stream_category(self.stream_id)


def _contiguous(rows: Sequence[asyncpg.Record], after: int) -> bool:
    """True when `rows` (ordered by position) hold every position from `after` + 1 on."""
    first, last = rows[0]["global_position"], rows[-1]["global_position"]
    return bool(first == after + 1 and last - first == len(rows) - 1)


@dataclass
class _Gap:
    """A missing position and the snapshot xmax at the time it was first seen."""

    position: int
    xmax: int


class PostgresAllReader(AllReader):
    """Global-order reader that waits out gaps instead of skipping them."""

    def __init__(self, store: PostgresEventStore, after: int) -> None:
        self.store = store
        self.position = after
        self._gap: _Gap | None = None

    async def read(self, limit: int = 500) -> list[RecordedEvent[Event]]:
        return self.store.decode_rows(await self.read_rows(limit))

    async def read_stored(self, limit: int = 500) -> list[StoredEvent]:
        """Like `read`, but as stored: payload and metadata left as JSON text.

        For readers that only forward events (the relay): no model is built."""
        return [StoredEvent.from_row(row) for row in await self.read_rows(limit)]

    async def read_rows(self, limit: int) -> list[asyncpg.Record]:
        """The next rows, whole (`EVENT_COLUMNS`), gap-safe."""
        return await self._read(limit, _READ_ALL, _READ_ALL_BOUNDED)

    async def heads(self, batch: int) -> AsyncIterator[list[asyncpg.Record]]:
        """The rows from here up to the log's head, gap-safe, in batches of `batch`
        until a short one; of each only `HEAD_COLUMNS` (no payload, no metadata).

        For sweeps that look for events of some types since they last looked: each
        batch is yielded as read, so one cut short (an outage) keeps what came
        before it, and the position stays at the last row yielded."""
        while True:
            rows = await self._read(batch, _READ_HEADS, _READ_HEADS_BOUNDED)
            if rows:
                yield rows
            if len(rows) < batch:
                return

    async def _read(self, limit: int, query: str, bounded: str) -> list[asyncpg.Record]:
        async with self.store._connection() as conn:
            rows: list[asyncpg.Record] = await conn.fetch(query, self.position, limit)
            if rows and not _contiguous(rows, self.position):
                # A position is missing: read again, with the snapshot bounds that say
                # whether it can still appear (the rows may differ by now; only this
                # second read's rows and bounds are used).
                rows = await conn.fetch(bounded, self.position, limit)
        if not rows:
            return []
        if _contiguous(rows, self.position):
            safe = rows  # positions are unique and ordered: none missing in between
            self.position = rows[-1]["global_position"]
        else:
            xmin, xmax = rows[0]["xmin"], rows[0]["xmax"]
            safe = []
            for row in rows:
                position = row["global_position"]
                if position != self.position + 1 and not self._gap_closed(xmin, xmax):
                    break
                safe.append(row)
                self.position = position
        if self._gap is not None and self.position >= self._gap.position:
            self._gap = None  # the missing position came, or was given up on
        return safe

    def _gap_closed(self, xmin: int, xmax: int) -> bool:
        """True when the positions before the next visible event can never appear."""
        missing = self.position + 1
        if self._gap is not None and self._gap.position == missing and xmin >= self._gap.xmax:
            self._gap = None
            return True
        if self._gap is None or self._gap.position != missing:
            self._gap = _Gap(missing, xmax)
        return False

    def idle_delay(self, poll_interval: float) -> float:
        # A pending gap is usually a transaction about to commit: look again soon.
        return min(poll_interval, 0.001) if self._gap is not None else poll_interval
