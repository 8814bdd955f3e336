"""The task list read model: one row per task, projected from the event log.

The projector follows the whole log with the store's gap-safe reader and,
for every task stream touched by a batch, folds that stream up to the last
event of the batch and upserts the task's row. Rows and the checkpoint are
written in one transaction, so a crash never skips or double-applies a
batch; a row depends only on the events up to the checkpoint, so applying a
batch twice, or rebuilding from position 0, gives identical rows.

It keeps the tasks it folded last (`KeptTasks`), so a task is brought up from
its kept version with the batch's own events, not folded again from its first
event for every batch (a long task has thousands of events); a fold is pure,
so that is the same state.

A batch that fails to apply is read again from the checkpoint on the next
call (the reader is dropped), so no event is ever passed over. A row the
database refuses (text too long for the index, a value out of range: events
written before today's limits) is written with its text fields clipped, so
one task can neither vanish from the list nor stop the projection for all.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from runyard.api.tasks import KeptTasks
from runyard.contracts import Event, RecordedEvent
from runyard.contracts.spec import TaskSpec, split_custom_gpus
from runyard.domain import TaskNotFound, TaskState, evolve
from runyard.eventstore import EVENT_COLUMNS, PostgresEventStore, retrying

log = logging.getLogger(__name__)
Upsert = Callable[[asyncpg.Connection, tuple[Any, ...]], Awaitable[None]]
#: A task folded up to some version, and the time of that version's event.
Folded = tuple[TaskState, datetime]

NAME = "task_list"
#: Clipped lengths of a row's text when the full row does not fit (see the docstring).
_CLIP = {"name": 200, "group_id": 128, "tag": 64, "tags": 32}
_ROW_REFUSALS = (asyncpg.DataError, asyncpg.ProgramLimitExceededError)
_UPSERT = """
INSERT INTO {table} (task_id, tenant, creator, name, status, stage, pool, tags, group_id,
                     cloned_from, run, version, created_at, updated_at, workers, restarts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (task_id) DO UPDATE SET
    tenant = EXCLUDED.tenant, creator = EXCLUDED.creator, name = EXCLUDED.name,
    status = EXCLUDED.status, stage = EXCLUDED.stage, pool = EXCLUDED.pool,
    tags = EXCLUDED.tags, group_id = EXCLUDED.group_id, cloned_from = EXCLUDED.cloned_from,
    run = EXCLUDED.run, version = EXCLUDED.version, created_at = EXCLUDED.created_at,
    updated_at = EXCLUDED.updated_at, workers = EXCLUDED.workers, restarts = EXCLUDED.restarts
"""
_CHECKPOINT = """
INSERT INTO checkpoints (name, position) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET position = EXCLUDED.position, updated_at = now()
"""
# The events of each stream $1[i] after version $2[i] up to version $3[i].
_STREAMS_AFTER = f"""
SELECT e.* FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS w(stream, after, upto),
LATERAL (
    SELECT {EVENT_COLUMNS} FROM events
    WHERE stream_id = w.stream AND stream_version > w.after AND stream_version <= w.upto
) e
ORDER BY e.stream_id, e.stream_version
"""
_RANGE = (
    "SELECT global_position, stream_id, stream_version FROM events"
    " WHERE global_position > $1 AND global_position <= $2 ORDER BY global_position LIMIT $3"
)


class TaskListProjector:
    """Keeps `task_list` up to date; `catch_up` is safe to call from several tasks.

    `table` and `checkpoint` name where the rows and the position go: the live
    read model by default, a shadow of it for a rebuild (`runyard.gateway.rebuild`),
    with the same code."""

    def __init__(
        self,
        store: PostgresEventStore,
        *,
        batch_size: int = 500,
        table: str = NAME,
        checkpoint: str = NAME,
    ) -> None:
        self.store = store
        self.batch_size = batch_size
        self.table = table
        self.checkpoint = checkpoint
        self._upsert_sql = _UPSERT.format(table=table)
        self._lock = asyncio.Lock()
        self._reader: Any = None
        #: The tasks folded last, each with the time of its last event folded.
        self._kept: KeptTasks[Folded] = KeptTasks(_spec_of)

    async def catch_up(self) -> int:
        """Apply every event safe to read now; return how many were read."""
        async with self._lock:
            if self._reader is None:
                self._reader = self.store.all_reader(await self.position())
            total = 0
            while batch := await self._reader.read(self.batch_size):
                try:
                    await self._apply(batch)
                except BaseException:
                    self._reader = None  # read this batch again from the checkpoint
                    raise
                total += len(batch)
            return total

    async def apply_range(
        self, after: int, upto: int, conn: asyncpg.Connection | None = None
    ) -> int:
        """Apply the events after position `after` up to `upto` (all committed: a
        range another reader has passed), in batches; on `conn`, inside its transaction,
        else each batch in its own. Returns how many were applied."""
        total = 0
        while after < upto:
            rows = await (conn or self.store.pool).fetch(_RANGE, after, upto, self.batch_size)
            if not rows:
                break
            after = rows[-1]["global_position"]
            marks = [(r["stream_id"], r["stream_version"]) for r in rows]
            await self._apply_marks(marks, after, conn)
            total += len(rows)
        return total

    async def rebuild(self) -> int:
        """Drop the rows and the checkpoint and project the whole log again."""
        async with self._lock, self.store.transaction() as conn:
            await conn.execute(f"DELETE FROM {self.table}")
            await conn.execute("DELETE FROM checkpoints WHERE name = $1", self.checkpoint)
            self._reader = None
            self._kept = KeptTasks(_spec_of)
        return await self.catch_up()

    def forget_position(self) -> None:
        """Read from the stored checkpoint next time (it was moved by a swap)."""
        self._reader = None

    async def follow(self, poll_interval: float = 0.2) -> None:
        """Catch up forever (until cancelled); a database outage is waited out."""
        while True:
            await retrying(self.catch_up, component="task list projector")
            await asyncio.sleep(poll_interval)

    async def position(self, conn: asyncpg.Connection | None = None) -> int:
        """The stored checkpoint: the last position whose events the rows hold."""
        sql = "SELECT position FROM checkpoints WHERE name = $1"
        return int(await (conn or self.store.pool).fetchval(sql, self.checkpoint) or 0)

    async def _apply(self, batch: Sequence[RecordedEvent[Event]]) -> None:
        marks = [(e.stream_id, e.stream_version) for e in batch]
        await self._apply_marks(marks, batch[-1].global_position, delivered=batch)

    async def _apply_marks(
        self,
        marks: Sequence[tuple[str, int]],
        position: int,
        conn: asyncpg.Connection | None = None,
        delivered: Sequence[RecordedEvent[Event]] = (),
    ) -> None:
        """Write the rows of the task streams among `marks` ((stream, version) of each
        event of a batch ending at `position`), each folded up to its last version;
        `delivered`: the batch's events, when the caller has them."""
        last_version: dict[str, int] = {}
        for stream_id, version in marks:
            if stream_id.startswith("task-"):
                last_version[stream_id] = version
        states = await self._states(last_version, delivered)
        rows = [_row(state, updated_at) for state, updated_at in states]
        if conn is not None:
            try:
                async with conn.transaction():  # a savepoint: a refused row is retried clipped
                    return await self._write_on(conn, rows, position, self._upsert)
            except _ROW_REFUSALS:
                return await self._write_on(conn, rows, position, self._upsert_or_clip)
        try:
            await self._write(rows, position, self._upsert)
        except _ROW_REFUSALS:
            # Rare (events from before the limits): again, row by row, each in a savepoint.
            await self._write(rows, position, self._upsert_or_clip)

    async def _write(self, rows: list[tuple[Any, ...]], position: int, upsert: Upsert) -> None:
        async with self.store.transaction() as conn:
            await self._write_on(conn, rows, position, upsert)

    async def _write_on(
        self, conn: asyncpg.Connection, rows: list[tuple[Any, ...]], position: int, upsert: Upsert
    ) -> None:
        if upsert == self._upsert:
            await conn.executemany(self._upsert_sql, rows)  # one round trip
        else:
            for row in rows:
                await upsert(conn, row)
        await conn.execute(_CHECKPOINT, self.checkpoint, position)

    async def _states(
        self, last_version: dict[str, int], delivered: Sequence[RecordedEvent[Event]]
    ) -> list[Folded]:
        """Each stream folded up to its version in the batch, with the time of that
        version's event. A stream kept here (see the class) is brought up from its
        kept version with the batch's own events when they follow it, else with one
        query for every stream that needs reading (only what lies after what is kept)."""
        if not last_version:
            return []
        new: dict[str, list[RecordedEvent[Event]]] = {}
        for event in delivered:
            if event.stream_id in last_version:
                new.setdefault(event.stream_id, []).append(event)
        folded: dict[str, Folded] = {}
        unread: dict[str, Folded | None] = {}  # stream -> what is kept of it (None: nothing)
        for stream_id, upto in last_version.items():
            task_id = stream_id.removeprefix("task-")
            kept = self._kept.get(task_id)
            after = kept[0].version if kept is not None else 0
            if after == upto and kept is not None:
                folded[stream_id] = kept
                continue
            if after > upto:  # kept past this batch (it is applied again): fold anew
                kept, after = None, 0
            events = new.get(stream_id, [])
            if after and events and events[0].stream_version == after + 1:
                folded[stream_id] = self._fold(task_id, kept, events)
            else:
                unread[stream_id] = kept
        if unread:
            rows = await self.store.pool.fetch(
                _STREAMS_AFTER,
                list(unread),
                [kept[0].version if kept is not None else 0 for kept in unread.values()],
                [last_version[s] for s in unread],
            )
            streams: dict[str, list[RecordedEvent[Event]]] = {}
            for row in rows:
                streams.setdefault(row["stream_id"], []).append(self.store.decode(row))
            for stream_id, events in streams.items():
                task_id = stream_id.removeprefix("task-")
                folded[stream_id] = self._fold(task_id, unread[stream_id], events)
        # In one order, so projectors of several gateways upserting the same rows
        # take their locks in the same order (no deadlock between them).
        return [folded[stream_id] for stream_id in sorted(folded)]

    def _fold(
        self, task_id: str, kept: Folded | None, events: Sequence[RecordedEvent[Event]]
    ) -> Folded:
        """`kept` (None: nothing yet) with `events` folded on, kept for the next batch."""
        state = kept[0] if kept is not None else None
        for event in events:
            state = evolve(state, event)
        if state is None:
            raise TaskNotFound(task_id)
        result = (state, events[-1].occurred_at)
        self._kept.keep(task_id, result)
        return result

    async def _upsert(self, conn: asyncpg.Connection, row: tuple[Any, ...]) -> None:
        await conn.execute(self._upsert_sql, *row)

    async def _upsert_or_clip(self, conn: asyncpg.Connection, row: tuple[Any, ...]) -> None:
        try:
            async with conn.transaction():  # a savepoint: a refused row leaves the batch intact
                await conn.execute(self._upsert_sql, *row)
        except _ROW_REFUSALS as exc:
            # %r: the error may quote the row's values, which come from users
            log.error("task %r: its list row does not fit (%r); writing it clipped", row[0], exc)
            await conn.execute(self._upsert_sql, *_clipped(row))


def _clipped(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The row with name, tags and group id cut to lengths the table and index take."""
    clipped = list(row)
    clipped[3] = row[3][: _CLIP["name"]]
    clipped[7] = [tag[: _CLIP["tag"]] for tag in row[7][: _CLIP["tags"]]]
    clipped[8] = row[8][: _CLIP["group_id"]] if row[8] is not None else None
    return tuple(clipped)


def _spec_of(folded: Folded) -> TaskSpec:
    return folded[0].spec


def _row(state: TaskState, updated_at: datetime) -> tuple[Any, ...]:
    spec = state.spec
    return (
        state.task_id,
        state.tenant,
        state.creator,
        spec.name,
        state.status,
        state.stage,
        spec.pool,
        list(spec.tags),
        state.group_id,
        state.cloned_from,
        state.run,
        state.version,
        state.submitted_at,
        updated_at,
        _workers(spec),
        state.restarts,
    )


def _workers(spec: TaskSpec) -> int:
    """How many workers the spec asks for (a custom GPU count is split as R-04 says)."""
    if spec.custom_gpus is not None:
        return len(split_custom_gpus(spec.custom_gpus))
    return int(spec.worker_count)


# --- queries ------------------------------------------------------------------

_COLUMNS = (
    "task_id, tenant, creator, name, status, stage, pool, tags, group_id, cloned_from, "
    "run, created_at, updated_at, workers, restarts"
)


async def list_rows(
    conn: asyncpg.Pool | asyncpg.Connection,
    tenant: str,
    filters: dict[str, str | None],
    limit: int,
    cursor: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the tenant's tasks, newest first, and the cursor of the next page."""
    where: list[str] = ["tenant = $1"]
    args: list[Any] = [tenant]
    for column, value in filters.items():
        if value is None:
            continue
        args.append(value)
        where.append(_FILTERS[column].format(n=len(args)))
    if cursor:
        created_at, task_id = decode_cursor(cursor)
        args.extend([created_at, task_id])
        where.append(f"(created_at, task_id) < (${len(args) - 1}, ${len(args)})")
    args.append(limit + 1)
    sql = (
        f"SELECT {_COLUMNS} FROM task_list WHERE {' AND '.join(where)} "
        f"ORDER BY created_at DESC, task_id DESC LIMIT ${len(args)}"
    )
    rows = [_json_row(r) for r in await conn.fetch(sql, *args)]
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], encode_cursor(last["created_at"], last["task_id"])


_FILTERS = {
    "status": "status = ${n}",
    "name": "strpos(lower(name), lower(${n})) > 0",  # contains, as typed: no wildcards
    # The console's search box: a name, or the start of a task id (its short id).
    "name_or_id": (
        "(strpos(lower(name), lower(${n})) > 0 OR starts_with(task_id, lower(${n}))"
        " OR right(task_id, length(${n})) = lower(${n}))"
    ),
    "tag": "tags @> ARRAY[${n}]::text[]",
    "pool": "pool = ${n}",
    "creator": "creator = ${n}",
    "group_id": "group_id = ${n}",
}


async def group_tenants(
    conn: asyncpg.Pool | asyncpg.Connection, group_id: str, besides: str, limit: int = 3
) -> list[str]:
    """Tenants other than `besides` that have a task group `group_id` (at most `limit`)."""
    rows = await conn.fetch(
        "SELECT DISTINCT tenant FROM task_list WHERE group_id = $1 AND tenant <> $2"
        " ORDER BY tenant LIMIT $3",
        group_id,
        besides,
        limit,
    )
    return [r["tenant"] for r in rows]


async def group_rows(
    conn: asyncpg.Pool | asyncpg.Connection, tenant: str, limit: int, cursor: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the tenant's task groups, newest first (task count, count per status,
    times), and the cursor of the next page; ValueError for a cursor not ours."""
    args: list[Any] = [tenant, limit + 1]
    after = ""
    if cursor:
        args.extend(decode_cursor(cursor))
        after = "HAVING (min(created_at), group_id) < ($3, $4)"
    sql = f"""
        SELECT group_id, min(created_at) AS created_at,
               max(updated_at) AS updated_at,
               jsonb_object_agg(status, n) AS status_counts
        FROM (
            SELECT group_id, status, count(*) AS n,
                   min(created_at) AS created_at, max(updated_at) AS updated_at
            FROM task_list WHERE tenant = $1 AND group_id IS NOT NULL
            GROUP BY group_id, status
        ) per_status
        GROUP BY group_id {after}
        ORDER BY min(created_at) DESC, group_id DESC LIMIT $2
    """  # only the HAVING clause above is put in; its values are arguments
    groups = []
    for r in await conn.fetch(sql, *args):
        counts = r["status_counts"]
        counts = json.loads(counts) if isinstance(counts, str) else dict(counts)
        status_counts = {k: int(v) for k, v in sorted(counts.items())}
        groups.append(
            {
                "group_id": r["group_id"],
                "tasks": sum(status_counts.values()),
                "status_counts": status_counts,
                "created_at": r["created_at"].isoformat(),
                "updated_at": r["updated_at"].isoformat(),
            }
        )
    if len(groups) <= limit:
        return groups, None
    last = groups[limit - 1]
    return groups[:limit], encode_cursor(last["created_at"], last["group_id"])


async def all_rows(conn: asyncpg.Pool | asyncpg.Connection) -> list[dict[str, Any]]:
    """Every row, in task id order (for comparing a rebuild with the live projection)."""
    rows = await conn.fetch(f"SELECT {_COLUMNS}, version FROM task_list ORDER BY task_id")
    return [_json_row(r) for r in rows]


def _json_row(record: asyncpg.Record) -> dict[str, Any]:
    row = dict(record)
    row["tags"] = list(row["tags"])
    for key in ("created_at", "updated_at"):
        row[key] = row[key].isoformat()
    return row


def encode_cursor(created_at: str, task_id: str) -> str:
    """An opaque cursor: the sort key of the last row of a page."""
    return base64.urlsafe_b64encode(f"{created_at}|{task_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The sort key in a cursor; ValueError if it is not one of ours."""
    try:
        created_at, _, task_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        when = datetime.fromisoformat(created_at)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"bad cursor {cursor!r}") from exc
    # Ours hold a time in UTC, as the task list stores it, and a task id: anything else
    # (another offset, a NUL) would reach the database and be refused there, unnamed.
    if when.utcoffset() != timedelta(0) or "\x00" in task_id:
        raise ValueError(f"bad cursor {cursor!r}")
    return when, task_id
