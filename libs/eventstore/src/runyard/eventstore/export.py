"""Export events as JSON lines for a post-mortem, and import them into an empty store.

One line per event, in global order, with every field an SRE needs:
`position`, `event_id`, `stream_id`, `version`, `type`, `schema_version`,
`occurred_at`, `recorded_at`, `actor`, `causation_id`, `correlation_id`,
`data` and `metadata`. Payloads go through `mask_payload` first, so
creator-only values, secret references and webhook URLs never leave the
store; folds of the imported events give the states of the source with
those values masked.

An import keeps positions, stream versions, event ids and times, and writes
everything in one transaction: a file that does not read back whole leaves
the target store empty.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from runyard.eventstore.audit import AuditFilter, audit_page
from runyard.eventstore.errors import EventStoreError
from runyard.eventstore.migrate import apply_migrations, eventstore_migrations

#: Events read from the store per query, and written per insert.
BATCH = 1000
#: Keys every exported line has.
FIELDS = (
    "position",
    "event_id",
    "stream_id",
    "version",
    "type",
    "schema_version",
    "occurred_at",
    "recorded_at",
    "actor",
    "causation_id",
    "correlation_id",
    "data",
    "metadata",
)

_INSERT = """
INSERT INTO events (global_position, event_id, stream_id, stream_version, event_type,
                    schema_version, data, metadata, occurred_at, recorded_at)
SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::bigint[], $5::text[],
                     $6::integer[], $7::jsonb[], $8::jsonb[], $9::timestamptz[],
                     $10::timestamptz[])
"""


class StoreNotEmpty(EventStoreError):
    """An import's target store already holds events."""

    code = "import.store_not_empty"

    def __init__(self, events: int) -> None:
        super().__init__(
            f"the target store already holds events (head position {events}): an import"
            " writes only into an empty one",
            hint="create an empty database (createdb runyard_postmortem) and pass its --dsn",
        )


class BadExportLine(EventStoreError):
    """A line of the file is not an exported event."""

    code = "import.bad_line"

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}", hint="import a file runyard export-events wrote")
        self.line = line


async def export_lines(
    db: asyncpg.Pool | asyncpg.Connection, filters: AuditFilter
) -> AsyncIterator[dict[str, Any]]:
    """The events matching `filters` (time window, task), masked, oldest first."""
    cursor: str | None = None
    while True:
        page = await audit_page(db, filters, limit=BATCH, cursor=cursor)
        for row in page.items:
            yield row.as_json()
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def parse_lines(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    """Exported events from JSON lines (blank lines skipped); `BadExportLine` otherwise."""
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise BadExportLine(number, f"not JSON ({exc})") from exc
        if not isinstance(record, dict):
            raise BadExportLine(number, "not a JSON object")
        if missing := [f for f in FIELDS if f not in record]:
            raise BadExportLine(number, f"missing fields {missing}")
        yield record


async def import_lines(
    conn: asyncpg.Connection,
    records: Iterable[dict[str, Any]],
    progress: Callable[[int], None] = lambda n: None,
) -> int:
    """Write exported events into the empty store on `conn`; how many were written.

    Applies the store's migrations first; `StoreNotEmpty` when it has events."""
    await apply_migrations(conn, eventstore_migrations())
    head = await conn.fetchval("SELECT coalesce(max(global_position), 0) FROM events")
    if head or await conn.fetchval("SELECT count(*) FROM streams"):
        raise StoreNotEmpty(int(head or 0))
    written = 0
    async with conn.transaction():
        batch: list[dict[str, Any]] = []
        for record in records:
            batch.append(record)
            if len(batch) >= BATCH:
                written += await _insert(conn, batch)
                progress(written)
                batch = []
        if batch:
            written += await _insert(conn, batch)
            progress(written)
        await conn.execute(
            "INSERT INTO streams (stream_id, version)"
            " SELECT stream_id, max(stream_version) FROM events GROUP BY stream_id"
        )
        await conn.execute(
            "SELECT setval(pg_get_serial_sequence('events', 'global_position'),"
            " greatest((SELECT max(global_position) FROM events), 1))"
        )
    return written


async def _insert(conn: asyncpg.Connection, batch: list[dict[str, Any]]) -> int:
    columns: list[list[Any]] = [[] for _ in range(10)]
    for r in batch:
        values = (
            int(r["position"]),
            UUID(str(r["event_id"])),
            str(r["stream_id"]),
            int(r["version"]),
            str(r["type"]),
            int(r["schema_version"]),
            json.dumps(r["data"]),
            json.dumps(r["metadata"]),
            datetime.fromisoformat(r["occurred_at"]),
            datetime.fromisoformat(r["recorded_at"]),
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    await conn.execute(_INSERT, *columns)
    return len(batch)


__all__ = [
    "FIELDS",
    "BadExportLine",
    "StoreNotEmpty",
    "export_lines",
    "import_lines",
    "parse_lines",
]
