"""Shadow tables: a read model rebuilt beside the live one, compared, and swapped in.

`runyard rebuild NAME` rebuilds a read model from position 0 into
`runyard_shadow.<table>__shadow` (created `LIKE` the live table, its keys and
indexes included, in the schema where the services' roles may create tables:
eventstore migration 0006, `runyard.stack.roles.apply_grants`) with the owner's
own projection code, keeping its position in `checkpoints` under
`shadow:<name>` so that an interrupted rebuild resumes where it stopped.
`diff_table` compares it with the live table row by row (0 differences is the
healthy answer); `replace_from_shadow` makes the live table's rows the
shadow's, in the caller's transaction, under the lock the caller took
(`lock_tables`), so readers never see a half-swapped table and the live table
keeps its name, indexes and grants.

Which service rebuilds: the owner of the read model (the gateway for
`task_list`, the scheduler for its views, the notification service for
`queue_waits`), behind its admin routes; this module is the part they share
(docs/operations.md, "Rebuilding a read model"), `SteppedRebuild` the steps
of a rebuild whose rows are each a function of one stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

import asyncpg
from runyard.eventstore.audit import settled_head
from runyard.eventstore.errors import EventStoreError

if TYPE_CHECKING:
    from runyard.eventstore.postgres import PostgresEventStore

#: The most differing rows one diff lists (all are counted).
MAX_DIFF_ROWS: Final = 1000
SHADOW_SUFFIX: Final = "__shadow"
#: The schema of the shadow tables (the service roles may not create tables in `public`).
SHADOW_SCHEMA: Final = "runyard_shadow"
SHADOW_PREFIX: Final = "shadow:"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")

Row = dict[str, Any]


class RebuildNotStarted(EventStoreError):
    """A diff or swap asked of a read model with no shadow rebuild under way."""

    code = "rebuild.not_started"
    http_status = 404

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no rebuild of {name} under way",
            hint=f"start one: runyard rebuild {name}",
            field="name",
        )


def _checked(table: str) -> str:
    """`table`, if it is a plain table name (it is put into SQL text)."""
    if not _NAME.match(table):
        raise ValueError(f"not a table name: {table!r}")
    return table


def shadow_of(table: str) -> str:
    """The shadow table of `table` (`task_list` -> `runyard_shadow.task_list__shadow`)."""
    return f"{SHADOW_SCHEMA}.{_checked(table)}{SHADOW_SUFFIX}"


def shadow_checkpoint(name: str) -> str:
    """The name of a shadow rebuild's position in `checkpoints`."""
    return SHADOW_PREFIX + name


async def create_shadow(conn: asyncpg.Connection, table: str, *, fresh: bool = False) -> str:
    """The shadow table of `table`, created if missing (emptied with `fresh`)."""
    shadow = shadow_of(table)
    if fresh:
        await conn.execute(f"DROP TABLE IF EXISTS {shadow}")
    await conn.execute(f"CREATE TABLE IF NOT EXISTS {shadow} (LIKE {table} INCLUDING ALL)")
    return shadow


async def drop_shadow(conn: asyncpg.Connection, name: str, tables: Sequence[str]) -> None:
    """Drop the shadow tables and forget the shadow rebuild's position."""
    for table in tables:
        await conn.execute(f"DROP TABLE IF EXISTS {shadow_of(table)}")
    await conn.execute("DELETE FROM checkpoints WHERE name = $1", shadow_checkpoint(name))


async def shadow_position(conn: asyncpg.Connection | asyncpg.Pool, name: str) -> int | None:
    """Where the shadow rebuild of `name` stands (None: no rebuild under way)."""
    sql = "SELECT position FROM checkpoints WHERE name = $1"
    found = await conn.fetchval(sql, shadow_checkpoint(name))
    return None if found is None else int(found)


async def require_shadow(conn: asyncpg.Connection, name: str) -> int:
    """The shadow rebuild's position; `RebuildNotStarted` when there is none."""
    position = await shadow_position(conn, name)
    if position is None:
        raise RebuildNotStarted(name)
    return position


async def set_shadow_position(conn: asyncpg.Connection, name: str, position: int) -> None:
    await conn.execute(
        "INSERT INTO checkpoints (name, position) VALUES ($1, $2) ON CONFLICT (name)"
        " DO UPDATE SET position = EXCLUDED.position, updated_at = now()",
        shadow_checkpoint(name),
        position,
    )


async def lock_tables(conn: asyncpg.Connection, tables: Sequence[str], mode: str) -> None:
    """Lock the live tables, in the order given (the order their writer writes them,
    so that a writer's transaction and this one cannot wait for each other)."""
    if mode not in ("SHARE", "EXCLUSIVE"):
        raise ValueError(mode)
    names = ", ".join(_checked(t) for t in tables)
    await conn.execute(f"LOCK TABLE {names} IN {mode} MODE")


@dataclass(frozen=True, slots=True)
class RowDiff:
    """One row that differs: only in the live table, only in the rebuild, or changed."""

    key: str
    kind: str  # "changed", "only_live", "only_rebuilt"
    #: column -> {"live": ..., "rebuilt": ...} for a changed row; every column else.
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TableDiff:
    """The comparison of a live table with its rebuild."""

    table: str
    live_rows: int
    rebuilt_rows: int
    differences: int
    items: list[RowDiff]
    truncated: bool

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def diff_table(
    conn: asyncpg.Connection,
    table: str,
    key: Sequence[str],
    *,
    comparable: Callable[[Row], Row] = lambda row: row,
    limit: int = MAX_DIFF_ROWS,
) -> TableDiff:
    """Compare `table` with its shadow, row by row on `key`, each row as
    `comparable` shapes it (to leave out what depends on when it was written)."""
    live = await _rows(conn, _checked(table), key)
    rebuilt = await _rows(conn, shadow_of(table), key)
    items: list[RowDiff] = []
    count = 0
    for row_key in sorted(live.keys() | rebuilt.keys()):
        one = _row_diff(row_key, live.get(row_key), rebuilt.get(row_key), comparable)
        if one is not None:
            count += 1
            if len(items) < limit:
                items.append(one)
    return TableDiff(table, len(live), len(rebuilt), count, items, count > len(items))


async def _rows(conn: asyncpg.Connection, table: str, key: Sequence[str]) -> dict[str, Row]:
    records = await conn.fetch(f"SELECT to_jsonb(t)::text AS row FROM {table} t")
    rows = (json.loads(r["row"]) for r in records)
    return {"/".join(str(row[k]) for k in key): row for row in rows}


def _row_diff(
    key: str, live: Row | None, rebuilt: Row | None, comparable: Callable[[Row], Row]
) -> RowDiff | None:
    if rebuilt is None:
        assert live is not None
        row = comparable(live)
        return RowDiff(key, "only_live", {c: {"live": v, "rebuilt": None} for c, v in row.items()})
    if live is None:
        row = comparable(rebuilt)
        return RowDiff(
            key, "only_rebuilt", {c: {"live": None, "rebuilt": v} for c, v in row.items()}
        )
    a, b = comparable(live), comparable(rebuilt)
    differ = [c for c in a.keys() | b.keys() if a.get(c) != b.get(c)]
    columns = {c: {"live": a.get(c), "rebuilt": b.get(c)} for c in differ}
    return RowDiff(key, "changed", dict(sorted(columns.items()))) if columns else None


async def swap_in(
    conn: asyncpg.Connection,
    table: str,
    key: Sequence[str],
    *,
    comparable: Callable[[Row], Row] = lambda row: row,
) -> dict[str, Any]:
    """The swap of a rebuild, in the caller's transaction, under the lock it took: the
    differences it repairs, the live rows replaced by the shadow's, the shadow dropped.
    Answers `{rows, repaired, tables}` (rows now live, differences removed, the diff)."""
    found = await diff_table(conn, table, key, comparable=comparable)
    rows = await replace_from_shadow(conn, table)
    await drop_shadow(conn, table, [table])
    return {"rows": rows, "repaired": found.differences, "tables": [found.as_json()]}


class SteppedRebuild:
    """A rebuild whose rows are each a function of one stream (the notification
    service's queue waits), folded in bounded steps by global position: the
    owner's `refold` writes, on the connection it is given, the shadow rows of
    the streams it is handed, each folded whole from the log as it is now.

    A step from the shadow's position `p` (kept under `shadow:<name>`) to
    `q = min(p + max_events, log end)` refolds every stream with an event in
    `(p, q]` and moves the position to `q`, in one transaction: the shadow rows
    and the position commit together, so a rebuild cut off after step k goes on
    from step k's position. Every stream with an event at or below the position
    was folded after that event was written, so the shadow holds the log up to
    the position at least; a stream that moved on since is refolded when the
    position passes its new events. A diff and a swap lock `tables` (the order
    their writer writes them; SHARE for a diff, EXCLUSIVE for a swap: readers go
    on, the writer waits) and step to the log's end under the lock, so the
    shadow holds every event the live rows could hold."""

    #: Streams refolded (ids under this prefix; rows of other streams are not kept).
    prefix: str = "task-"

    def __init__(
        self,
        store: PostgresEventStore,
        name: str,
        tables: Sequence[str],
        key: Sequence[str],
        *,
        comparable: Callable[[Row], Row] = lambda row: row,
    ) -> None:
        self.store = store
        self.name = name
        self.tables = tuple(tables)
        self.key = tuple(key)
        self.comparable = comparable

    async def refold(self, conn: asyncpg.Connection, streams: Sequence[str]) -> dict[str, int]:
        """Write the shadow rows of `streams` afresh (each folded whole); counts to report."""
        raise NotImplementedError

    async def step(self, max_events: int = 50_000, *, restart: bool = False) -> dict[str, Any]:
        """Advance the shadow by at most `max_events` positions of the log (a transaction)."""
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        async with self.store.transaction() as conn:
            log_end = await settled_head(conn)  # before this transaction writes
            position = None if restart else await shadow_position(conn, self.name)
            if position is None:  # a rebuild from 0 (again)
                for table in self.tables:
                    await create_shadow(conn, table, fresh=True)
                position = 0
            return await self._advance(conn, position, log_end, max_events)

    async def diff(self) -> dict[str, Any]:
        """The shadow, brought to the log's end under a SHARE lock, against the live rows."""
        return await self._under_lock("SHARE", self._diff)

    async def swap(self) -> dict[str, Any]:
        """The live rows replaced by the shadow's, brought to the log's end under an
        EXCLUSIVE lock."""
        return await self._under_lock("EXCLUSIVE", self._swap)

    async def _diff(self, conn: asyncpg.Connection) -> dict[str, Any]:
        found = await diff_table(conn, self.name, self.key, comparable=self.comparable)
        return {"tables": [found.as_json()]}

    async def _swap(self, conn: asyncpg.Connection) -> dict[str, Any]:
        return await swap_in(conn, self.name, self.key, comparable=self.comparable)

    async def _under_lock(
        self, mode: str, then: Callable[[asyncpg.Connection], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Lock the tables, step to the log's end, then `then`, in one transaction."""
        async with self.store.transaction() as conn:
            position = await require_shadow(conn, self.name)
            await lock_tables(conn, self.tables, mode)
            log_end = await settled_head(conn)
            folded = await self._advance(conn, position, log_end, None)
            done = await then(conn)
        return {**folded, **done}

    async def discard(self) -> dict[str, Any]:
        """Drop the shadows and their position."""
        async with self.store.transaction() as conn:
            await drop_shadow(conn, self.name, self.tables)
        return {"name": self.name, "dropped": True}

    async def _advance(
        self, conn: asyncpg.Connection, position: int, log_end: int, max_events: int | None
    ) -> dict[str, Any]:
        """Refold the streams with events in `(position, reached]`; the new position kept.
        `log_end` is a settled head (`settled_head`): no event at or below it can still
        commit, so none is passed over."""
        reached = log_end if max_events is None else min(log_end, position + max_events)
        rows = await conn.fetch(
            "SELECT DISTINCT stream_id FROM events WHERE global_position > $1"
            " AND global_position <= $2 AND stream_id LIKE $3 ORDER BY 1",
            position,
            reached,
            self.prefix + "%",
        )
        folded = await self.refold(conn, [r["stream_id"] for r in rows])
        await set_shadow_position(conn, self.name, reached)
        return {
            "name": self.name,
            "position": reached,
            "target": log_end,
            "log_end": log_end,
            "applied": reached - position,
            **folded,
            "done": reached >= log_end,
        }


async def replace_from_shadow(conn: asyncpg.Connection, table: str) -> int:
    """Make `table`'s rows its shadow's (in the caller's transaction, under its lock);
    the number of rows now live."""
    shadow = shadow_of(table)
    await conn.execute(f"DELETE FROM {_checked(table)}")
    status = await conn.execute(f"INSERT INTO {table} SELECT * FROM {shadow}")
    return int(status.split()[-1])


__all__ = [
    "MAX_DIFF_ROWS",
    "SHADOW_PREFIX",
    "RebuildNotStarted",
    "RowDiff",
    "SteppedRebuild",
    "TableDiff",
    "create_shadow",
    "diff_table",
    "drop_shadow",
    "lock_tables",
    "replace_from_shadow",
    "require_shadow",
    "set_shadow_position",
    "shadow_checkpoint",
    "shadow_of",
    "shadow_position",
    "swap_in",
]
