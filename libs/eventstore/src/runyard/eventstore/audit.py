"""Audit queries over the whole log: which events match a set of filters, paged.

An SRE asks questions of the log during incidents ("which tasks were requeued
in the last hour, and why", "who stopped task X", "which tasks did node N
run yesterday"). `audit_page` answers them from the `events` table and the
`audit_facets` side table (migration 0004, docs/adr/0005-audit-facets.md):
every filter is an index range in global-position order, none reads payloads.

Paging is by global position. The first page fixes the highest position the
query will ever return (`upto`) once every transaction that could still
commit a lower position has ended, so the pages together hold every matching
event up to `upto` exactly once, however long the reader takes between pages.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from runyard.contracts.spec import MASK

#: Largest page of an audit query (docs/limits.md).
MAX_AUDIT_LIMIT = 1000
#: Most event types one query may name.
MAX_AUDIT_TYPES = 64
#: How long the first page waits for transactions that may still commit a lower position.
SETTLE_TIMEOUT_S = 2.0

_COLUMNS = (
    "e.global_position, e.event_id, e.stream_id, e.stream_version, e.event_type,"
    " e.schema_version, e.data::text AS data, e.metadata::text AS metadata,"
    " e.occurred_at, e.recorded_at"
)


class InvalidCursor(ValueError):
    """A cursor this module did not give, or one given for other filters."""


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """What an audit query matches; every given filter must hold (AND).

    `since` is inclusive and `until` exclusive, on the event's `occurred_at`.
    `actor` ending with `*` matches actors starting with what is before it.
    `task` matches the events of the task's stream and the pool events that
    name it; `tenant`, `pool` and `node` match through `audit_facets`.
    """

    types: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    tenant: str | None = None
    pool: str | None = None
    node: str | None = None
    task: str | None = None

    def digest(self) -> str:
        """A short fingerprint, so a cursor cannot be replayed with other filters."""
        data = {
            k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(self).items()
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()[
            :16
        ]


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One event as the audit answers it: envelope, actor, and the masked payload."""

    position: int
    event_id: str
    stream_id: str
    version: int
    type: str
    schema_version: int
    occurred_at: str
    recorded_at: str
    actor: str
    causation_id: str | None
    correlation_id: str | None
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AuditPage:
    items: list[AuditRow]
    next_cursor: str | None
    upto: int


def row_of(record: asyncpg.Record) -> AuditRow:
    """An `events` row as an `AuditRow`, creator-only values and credentials masked."""
    metadata = json.loads(record["metadata"])
    return AuditRow(
        position=record["global_position"],
        event_id=str(record["event_id"]),
        stream_id=record["stream_id"],
        version=record["stream_version"],
        type=record["event_type"],
        schema_version=record["schema_version"],
        occurred_at=record["occurred_at"].isoformat(),
        recorded_at=record["recorded_at"].isoformat(),
        actor=metadata.get("actor", ""),
        causation_id=metadata.get("causation_id"),
        correlation_id=metadata.get("correlation_id"),
        data=mask_payload(json.loads(record["data"])),
        metadata=metadata,
    )


# --- masking ----------------------------------------------------------------


def mask_payload(value: Any) -> Any:
    """A payload with nothing an SRE may not see: creator-only values become `******`,
    webhook URLs keep only their scheme and host, and secret references are dropped.

    Walks the whole JSON, so a spec anywhere in any event (submission, rerun
    changes, a future event type) is masked without a list of event types."""
    if isinstance(value, list):
        return [mask_payload(v) for v in value]
    if not isinstance(value, dict):
        return value
    masked = {k: _mask_field(k, v) for k, v in value.items()}
    if masked.get("creator_only") is True and "value" in masked:
        masked["value"] = MASK
    return masked


def _mask_field(key: str, value: Any) -> Any:
    if key == "secret_ref":
        return None
    if key == "webhook_url" and isinstance(value, str):
        host = urlsplit(value).hostname
        return f"{urlsplit(value).scheme}://{host}/{MASK}" if host else MASK
    return mask_payload(value)


# --- cursors ----------------------------------------------------------------


def encode_cursor(after: int, upto: int, filters: AuditFilter) -> str:
    raw = json.dumps({"a": after, "u": upto, "f": filters.digest()})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, filters: AuditFilter) -> tuple[int, int]:
    """(after, upto) of a cursor; `InvalidCursor` if it is not one of ours for `filters`."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        after, upto, digest = int(data["a"]), int(data["u"]), str(data["f"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidCursor("not a cursor of this audit query") from exc
    if digest != filters.digest() or not 0 <= after <= upto:
        raise InvalidCursor("the cursor belongs to an audit query with other filters")
    return after, upto


# --- the query --------------------------------------------------------------


async def settled_head(conn: asyncpg.Connection, timeout_s: float = SETTLE_TIMEOUT_S) -> int:
    """The highest position now, once no transaction that could still commit a lower
    position is running (see runyard.eventstore.postgres on xids and positions)."""
    row = await conn.fetchrow(
        "SELECT coalesce(max(global_position), 0) AS head,"
        " pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax FROM events"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        xmin = await conn.fetchval("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        if xmin >= row["xmax"]:
            break
        await asyncio.sleep(0.005)
    return int(row["head"])


def audit_sql(filters: AuditFilter) -> tuple[str, list[Any]]:
    """The query of a page: $1 after, $2 upto, $3 limit, then the filters' values."""
    args: list[Any] = []
    where = ["e.global_position > $1", "e.global_position <= $2"]

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args) + 3}"

    if filters.types:
        where.append(f"e.event_type = ANY({arg(list(filters.types))}::text[])")
    if filters.since is not None:
        where.append(f"e.occurred_at >= {arg(filters.since)}")
    if filters.until is not None:
        where.append(f"e.occurred_at < {arg(filters.until)}")
    if filters.actor is not None and filters.actor.endswith("*"):
        prefix = filters.actor[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append(f"e.metadata->>'actor' LIKE {arg(prefix + '%')}")
    elif filters.actor is not None:
        where.append(f"e.metadata->>'actor' = {arg(filters.actor)}")
    if filters.task is not None:
        where.append(
            f"e.global_position IN (SELECT global_position FROM events"
            f" WHERE stream_id = {arg('task-' + filters.task)}"
            f" UNION ALL SELECT global_position FROM audit_facets"
            f" WHERE kind = 'task' AND value = {arg(filters.task)})"
        )
    for kind in ("tenant", "pool", "node"):
        value = getattr(filters, kind)
        if value is not None:
            where.append(
                f"e.global_position IN (SELECT f.global_position FROM audit_facets f"
                f" WHERE f.kind = '{kind}' AND f.value = {arg(value)}"
                f" AND f.global_position > $1 AND f.global_position <= $2)"
            )
    sql = (
        f"SELECT {_COLUMNS} FROM events e WHERE {' AND '.join(where)}"
        " ORDER BY e.global_position LIMIT $3"
    )
    return sql, args


async def audit_page(
    db: asyncpg.Pool | asyncpg.Connection,
    filters: AuditFilter,
    *,
    limit: int = 100,
    cursor: str | None = None,
) -> AuditPage:
    """One page of the events matching `filters`, oldest first, and the next cursor.

    `InvalidCursor` for a cursor not given by this query."""
    sql, args = audit_sql(filters)
    async with _connection(db) as conn:
        if cursor:
            after, upto = decode_cursor(cursor, filters)
        else:
            after, upto = 0, await settled_head(conn)
        rows = await conn.fetch(sql, after, upto, limit + 1, *args)
    items = [row_of(r) for r in rows[:limit]]
    more = len(rows) > limit
    next_cursor = encode_cursor(items[-1].position, upto, filters) if more else None
    return AuditPage(items, next_cursor, upto)


class _connection:
    """A connection of a pool, or the given connection itself."""

    def __init__(self, db: asyncpg.Pool | asyncpg.Connection) -> None:
        self.db = db
        self._held: Any = None

    async def __aenter__(self) -> asyncpg.Connection:
        if isinstance(self.db, asyncpg.Pool):
            self._held = self.db.acquire()
            return await self._held.__aenter__()
        return self.db

    async def __aexit__(self, *exc: object) -> None:
        if self._held is not None:
            await self._held.__aexit__(*exc)


def filters_of(params: Mapping[str, Any]) -> AuditFilter:
    """An `AuditFilter` from already-checked values (the edges parse and bound them)."""
    return AuditFilter(**{k: v for k, v in params.items() if v is not None})


__all__ = [
    "MAX_AUDIT_LIMIT",
    "MAX_AUDIT_TYPES",
    "AuditFilter",
    "AuditPage",
    "AuditRow",
    "InvalidCursor",
    "audit_page",
    "audit_sql",
    "decode_cursor",
    "encode_cursor",
    "mask_payload",
    "row_of",
    "settled_head",
]
