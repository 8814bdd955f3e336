"""The scheduler's read models: pool capacity (`scheduler_pool_views`) and the queue
(`scheduler_queue`).

Capacity: one JSON document per pool in `scheduler_pool_views`.

The scheduler rewrites a pool's row after every change it makes to the pool
or its queue (in the consumer's transaction when it handles an event, so the
row and the inbox commit together). The gateway reads rows with
`read_pool_view` and `list_pools`; nothing here needs the scheduler running.

A view has: the pool's description and its GPUs in all, capacity (launchable
workers per spec and per GPU count, R-03; the custom-count maximum, R-04), node
health counts, occupancy (which task holds which GPUs on which node, R-05) and
queue load (waiting tasks, their GPUs, how long, first tasks with their
reasons, R-05, R-07). Listings are capped (`NODE_LIMIT`, `TASK_LIMIT`,
`QUEUE_LIMIT`) so a 10,000-node pool still writes a small row; totals are
always exact and `truncated` says when a listing was cut.

Queue: one row per waiting task in `scheduler_queue` (its queue order key,
why it waits, whether it is blocked, GPUs needed, launchable count). Where a
task stands is derived when it is read (`read_queue_entries` counts the rows
ahead of it in queue order), so a task leaving the queue rewrites no row
behind it, and the task's own event stream never records a position
(`TaskQueued` marks only the start of a wait and changes of its kind).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
from pydantic_core import to_json
from runyard.eventstore import apply_migrations, load_migrations
from runyard.scheduler.domain import (
    PoolState,
    QueuedTask,
    QueuePlan,
    QueueStatus,
    WaitingQueue,
    capacity,
    launchable,
    queue_load,
    queue_status,
    with_place,
)

NODE_LIMIT = 1000
TASK_LIMIT = 1000
QUEUE_LIMIT = 100

Queryable: TypeAlias = asyncpg.Pool | asyncpg.Connection


async def ensure_schema(conn: Queryable) -> None:
    """Create the read model's table (idempotent, under the migrations' lock)."""
    folder = Path(__file__).parent / "migrations"
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as c:
            await apply_migrations(c, load_migrations("scheduler", folder))
    else:
        await apply_migrations(conn, load_migrations("scheduler", folder))


def build_view(
    pool: PoolState, queue: WaitingQueue, plan: QueuePlan | None, *, version: int, now: datetime
) -> dict[str, Any]:
    """The JSON document of one pool at stream `version`."""
    return {
        "pool_id": pool.pool_id,
        "version": version,
        "zone": pool.zone,
        "resource_type": pool.resource_type,
        "gpu_model": pool.gpu_model,
        "network": pool.network,
        # Every GPU of every node, cordoned and faulty ones too: the submission rules
        # refuse a task that needs more (it could never start).
        "total_gpus": sum(node.gpus for node in pool.nodes.values()),
        "specs": _specs(pool),
        "capacity": _capacity(pool),
        "health": _health(pool),
        "nodes": _nodes(pool),
        "occupancy": _occupancy(pool),
        "queue": _queue(pool, queue, plan, now),
        "as_of": now.isoformat(),
    }


def _specs(pool: PoolState) -> list[dict[str, Any]]:
    cap = capacity(pool)
    return [
        {**spec.model_dump(), "launchable": cap.launchable[spec.gpus]}
        for spec in pool.specs.values()
    ]


def _capacity(pool: PoolState) -> dict[str, Any]:
    cap = capacity(pool)
    return {
        "nodes": cap.nodes,
        "schedulable_nodes": cap.schedulable_nodes,
        "schedulable_gpus": cap.schedulable_gpus,
        "free_gpus": cap.free_gpus,
        "launchable": {str(k): v for k, v in cap.launchable.items()},
        "custom_gpus_max": cap.custom_gpus_max,
    }


def _health(pool: PoolState) -> dict[str, int]:
    counts = Counter(node.health for node in pool.nodes.values())
    return {h: counts.get(h, 0) for h in ("healthy", "faulty", "cordoned")}


def _nodes(pool: PoolState) -> dict[str, Any]:
    listed = []
    for n, node in enumerate(pool.nodes.values()):
        if n >= NODE_LIMIT:
            break
        listed.append(
            {
                "node": node.name,
                "health": node.health,
                "fault": node.fault,
                "gpus": node.gpus,
                "free": node.free,
                "owners": node.owners,
            }
        )
    return {"total": len(pool.nodes), "truncated": len(pool.nodes) > NODE_LIMIT, "items": listed}


def _occupancy(pool: PoolState) -> dict[str, Any]:
    held = sorted(pool.allocations.values(), key=lambda a: a.seq)
    items = [
        {
            "task_id": a.task_id,
            "run": a.run,
            "attempt": a.attempt,
            "priority": a.priority,
            "resource_type": a.resource_type,
            "gpus": a.gpus,
            "workers": [w.model_dump() for w in a.workers],
        }
        for a in held[:TASK_LIMIT]
    ]
    allocated = sum(a.gpus for a in held)
    return {
        "tasks": len(held),
        "allocated_gpus": allocated,
        "truncated": len(held) > TASK_LIMIT,
        "items": items,
    }


def _queue(
    pool: PoolState, queue: WaitingQueue, plan: QueuePlan | None, now: datetime
) -> dict[str, Any]:
    load = queue_load(queue, now=now, limit=QUEUE_LIMIT)
    reasons = {s.task_id: s.reason for s in queue_status(pool, queue, plan, limit=QUEUE_LIMIT)}
    return {
        "waiting": load.waiting,
        "gpus": load.gpus,
        "oldest_wait_s": load.oldest_wait_s,
        "head": plan.head if plan is not None else None,
        "items": [
            {
                "task_id": t.task_id,
                "position": t.position,
                "priority": t.priority,
                "worker_gpus": list(t.worker_gpus),
                "gpus": t.gpus,
                "waited_s": t.waited_s,
                "reason": reasons.get(t.task_id, ""),
            }
            for t in load.tasks
        ],
    }


POOL_VIEWS = "scheduler_pool_views"
QUEUE = "scheduler_queue"


async def write_view(conn: Queryable, view: dict[str, Any], *, table: str = POOL_VIEWS) -> None:
    """Upsert a pool's row; an older version never overwrites a newer one. (`table`:
    the live read model, or its shadow during a rebuild.)"""
    await conn.execute(
        f"""INSERT INTO {table} AS v (pool_id, version, view, updated_at)
           VALUES ($1, $2, $3::jsonb, now())
           ON CONFLICT (pool_id) DO UPDATE
           SET version = EXCLUDED.version, view = EXCLUDED.view, updated_at = now()
           WHERE v.version <= EXCLUDED.version""",
        view["pool_id"],
        view["version"],
        # pydantic's encoder: a third of json.dumps's time on a pool with hundreds of
        # tasks, and this is written after every batch the scheduler handles
        to_json(view).decode(),
    )


async def read_pool_view(conn: Queryable, pool_id: str) -> dict[str, Any] | None:
    """The latest view of a pool (see the module docstring), or None if it has none."""
    row = await conn.fetchrow(
        "SELECT view, updated_at FROM scheduler_pool_views WHERE pool_id = $1", pool_id
    )
    if row is None:
        return None
    view: dict[str, Any] = json.loads(row["view"])
    view["updated_at"] = row["updated_at"].isoformat()
    return view


async def list_pools(conn: Queryable) -> list[dict[str, Any]]:
    """A summary row per pool: description, capacity and queue totals (no listings)."""
    rows = await conn.fetch(
        """SELECT pool_id, updated_at,
                  view - 'nodes' - 'occupancy' - 'queue' AS summary,
                  view -> 'queue' -> 'waiting' AS waiting,
                  view -> 'queue' -> 'gpus' AS queued_gpus,
                  view -> 'occupancy' -> 'tasks' AS running_tasks
           FROM scheduler_pool_views ORDER BY pool_id"""
    )
    pools = []
    for row in rows:
        summary: dict[str, Any] = json.loads(row["summary"])
        summary["queue"] = {
            "waiting": json.loads(row["waiting"]),
            "gpus": json.loads(row["queued_gpus"]),
        }
        summary["running_tasks"] = json.loads(row["running_tasks"])
        summary["updated_at"] = row["updated_at"].isoformat()
        pools.append(summary)
    return pools


# -- queue read model ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One waiting task's row of `scheduler_queue`: all but its position, which is derived."""

    task_id: str
    pool_id: str
    run: int
    rank: int
    neg_priority: int
    submitted_at: datetime
    queued_at: datetime
    why: str
    blocked: bool
    gpus_needed: int
    launchable: int


def queue_row(pool: PoolState, task: QueuedTask, status: QueueStatus) -> QueueRow:
    """The row of a waiting task as `status` explains it now."""
    rank, neg_priority, submitted_at, task_id = task.key
    return QueueRow(
        task_id=task_id,
        pool_id=pool.pool_id,
        run=task.request.run,
        rank=rank,
        neg_priority=neg_priority,
        submitted_at=submitted_at,
        queued_at=task.queued_at,
        why=status.why,
        blocked=status.blocked,
        gpus_needed=task.request.gpus,
        launchable=launchable(pool, max(task.request.worker_gpus)),
    )


_UPSERT_ROW = """
INSERT INTO {table} (task_id, pool_id, run, rank, neg_priority, submitted_at, queued_at,
                             why, blocked, gpus_needed, launchable, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
ON CONFLICT (task_id) DO UPDATE SET
    pool_id = EXCLUDED.pool_id, run = EXCLUDED.run, rank = EXCLUDED.rank,
    neg_priority = EXCLUDED.neg_priority, submitted_at = EXCLUDED.submitted_at,
    queued_at = EXCLUDED.queued_at, why = EXCLUDED.why, blocked = EXCLUDED.blocked,
    gpus_needed = EXCLUDED.gpus_needed, launchable = EXCLUDED.launchable, updated_at = now()
"""


async def write_queue_rows(
    conn: Queryable, rows: Iterable[QueueRow], gone: Sequence[str] = (), *, table: str = QUEUE
) -> None:
    """Delete the rows of tasks that left the queue, then upsert `rows` (`table`: the
    live read model, or its shadow during a rebuild)."""
    if gone:
        await conn.execute(f"DELETE FROM {table} WHERE task_id = ANY($1::text[])", list(gone))
    records = [astuple(row) for row in rows]
    if records:
        await conn.executemany(_UPSERT_ROW.format(table=table), records)


async def replace_queue_rows(
    conn: asyncpg.Connection, pool_id: str, rows: Iterable[QueueRow]
) -> None:
    """The pool's rows, rebuilt: every earlier row of the pool goes (call in a transaction)."""
    await conn.execute("DELETE FROM scheduler_queue WHERE pool_id = $1", pool_id)
    await write_queue_rows(conn, rows)


async def read_queue_rows(conn: Queryable, task_ids: Sequence[str]) -> dict[str, QueueRow]:
    """The stored rows of these tasks, by task id (the scheduler checks its writes)."""
    rows = await conn.fetch(
        """SELECT task_id, pool_id, run, rank, neg_priority, submitted_at, queued_at, why,
                  blocked, gpus_needed, launchable
           FROM scheduler_queue WHERE task_id = ANY($1::text[])""",
        list(task_ids),
    )
    return {row["task_id"]: QueueRow(**dict(row)) for row in rows}


_ENTRIES = """
SELECT q.task_id, q.pool_id, q.run, q.why, q.blocked, q.gpus_needed, q.launchable,
       q.queued_at, q.updated_at,
       (SELECT count(*) FROM scheduler_queue a
         WHERE a.pool_id = q.pool_id
           AND (a.rank, a.neg_priority, a.submitted_at, a.task_id)
             < (q.rank, q.neg_priority, q.submitted_at, q.task_id)) AS ahead
FROM scheduler_queue q
WHERE q.task_id = ANY($1::text[])
"""


async def read_queue_entries(conn: Queryable, task_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Where each of these waiting tasks stands and why (R-07), by task id.

    `position` is the number of tasks ahead of it in its pool's queue, counted
    now; `reason` is why it waits with that place (`...; 3 tasks ahead`).
    Tasks not in a queue are absent; so is everything when the scheduler has
    not created its read model yet.
    """
    if not task_ids:
        return {}
    try:
        rows = await conn.fetch(_ENTRIES, list(task_ids))
    except asyncpg.UndefinedTableError:
        return {}
    return {row["task_id"]: _entry(row) for row in rows}


def _entry(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "reason": with_place(row["why"], row["ahead"]),
        "position": row["ahead"],
        "gpus_needed": row["gpus_needed"],
        "launchable": row["launchable"],
        "blocked": row["blocked"],
        "pool": row["pool_id"],
        "run": row["run"],
        "queued_at": row["queued_at"].isoformat(),
        "as_of": row["updated_at"].isoformat(),
    }


async def read_queue(conn: Queryable, pool_id: str) -> list[dict[str, Any]]:
    """Every row of a pool's queue in queue order, with its position (rebuild checks)."""
    rows = await conn.fetch(
        """SELECT task_id, run, why, blocked, gpus_needed, launchable, queued_at,
                  row_number() OVER (ORDER BY rank, neg_priority, submitted_at, task_id) - 1
                    AS position
           FROM scheduler_queue WHERE pool_id = $1
           ORDER BY rank, neg_priority, submitted_at, task_id""",
        pool_id,
    )
    return [dict(row) for row in rows]
