"""The console's own reads of the gateway's database: small indexed queries only.

- `stream_events_of_types`: a task's events of a few types (alerts, reruns),
  newest first, a page at a time, by the `(stream_id, stream_version)` key;
- `event_tail`: the newest events of every stream, or those after a position
  (the SRE event tail), filtered by type (`events_type_idx`) or task (the
  stream key), never read whole;
- `task_tenants`: the tenant of each of a few tasks (from the task list), so a
  page about pools shows a task's id only to those who may read it;
- `pool_view`: one pool's view as the scheduler last wrote it (one row).

Payloads are not read by the tail (a spec's values stay in the task's own
pages, masked there); alert and rerun rows take the few fields they show.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

#: Events read at most for one page of a task's alerts or runs.
TYPED_PAGE = 50
#: Events of the tail per page or per poll.
TAIL_PAGE = 50


async def stream_events_of_types(
    db: asyncpg.Pool, stream_id: str, types: Sequence[str], limit: int = TYPED_PAGE
) -> list[dict[str, Any]]:
    """The stream's newest events of `types` (version, time, type, data, actor)."""
    rows = await db.fetch(
        """SELECT stream_version, occurred_at, event_type, data, metadata->>'actor' AS actor
           FROM events WHERE stream_id = $1 AND event_type = ANY($2::text[])
           ORDER BY stream_version DESC LIMIT $3""",
        stream_id,
        list(types),
        limit,
    )
    return [
        {
            "version": row["stream_version"],
            "at": row["occurred_at"].isoformat(),
            "type": row["event_type"],
            "data": _json(row["data"]),
            "actor": row["actor"],
        }
        for row in rows
    ]


async def event_tail(
    db: asyncpg.Pool,
    *,
    event_type: str | None,
    stream_id: str | None,
    after: int | None = None,
    before: int | None = None,
    limit: int = TAIL_PAGE,
) -> list[dict[str, Any]]:
    """The newest events (before `before`), or the oldest after `after`, newest first;
    only the conditions given are in the query, so each uses its index."""
    where: list[str] = []
    args: list[Any] = []
    for sql, value in (
        ("event_type = ${n}", event_type),
        ("stream_id = ${n}", stream_id),
        ("global_position > ${n}", after),
        ("global_position < ${n}", before),
    ):
        if value is not None:
            args.append(value)
            where.append(sql.format(n=len(args)))
    args.append(limit)
    order = "ASC" if after is not None else "DESC"
    rows = await db.fetch(
        f"""SELECT global_position, event_id, stream_id, stream_version, event_type,
                   occurred_at, metadata->>'actor' AS actor,
                   metadata->>'correlation_id' AS correlation_id
            FROM events {"WHERE " + " AND ".join(where) if where else ""}
            ORDER BY global_position {order} LIMIT ${len(args)}""",
        *args,
    )
    items = [_tail_row(row) for row in rows]
    return items if order == "DESC" else items[::-1]


def _tail_row(row: asyncpg.Record) -> dict[str, Any]:
    stream = row["stream_id"]
    task_id = stream.removeprefix("task-") if stream.startswith("task-") else None
    return {
        "position": row["global_position"],
        "event_id": str(row["event_id"]),
        "stream_id": stream,
        "task_id": task_id,
        "version": row["stream_version"],
        "type": row["event_type"],
        "at": row["occurred_at"].isoformat(),
        "actor": row["actor"],
        "correlation_id": row["correlation_id"],
    }


async def task_tenants(db: asyncpg.Pool, task_ids: Sequence[str]) -> dict[str, str]:
    """task id -> tenant, for those of `task_ids` the task list has."""
    if not task_ids:
        return {}
    rows = await db.fetch(
        "SELECT task_id, tenant FROM task_list WHERE task_id = ANY($1::text[])",
        list(dict.fromkeys(task_ids)),
    )
    return {row["task_id"]: row["tenant"] for row in rows}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def pool_view(db: asyncpg.Pool, pool_id: str) -> dict[str, Any] | None:
    """The scheduler's view of one pool (`scheduler_pool_views`, the same document the
    gateway's pool routes read), or None when it has written none (yet)."""
    exists = await db.fetchval("SELECT to_regclass('scheduler_pool_views') IS NOT NULL")
    if not exists:
        return None
    view = await db.fetchval("SELECT view FROM scheduler_pool_views WHERE pool_id = $1", pool_id)
    found = _json(view) if view is not None else None
    return found if isinstance(found, dict) else None
