"""The capacity read model: one JSON document per pool in `scheduler_pool_views`.

The scheduler rewrites a pool's row after every change it makes to the pool
or its queue (in the consumer's transaction when it handles an event, so the
row and the inbox commit together). The gateway reads rows with
`read_pool_view` and `list_pools`; nothing here needs the scheduler running.

A view has: the pool's description, capacity (launchable workers per spec and
per GPU count, R-03; the custom-count maximum, R-04), node health counts,
occupancy (which task holds which GPUs on which node, R-05) and queue load
(waiting tasks, their GPUs, how long, first tasks with their reasons, R-05,
R-07). Listings are capped (`NODE_LIMIT`, `TASK_LIMIT`, `QUEUE_LIMIT`) so a
10,000-node pool still writes a small row; totals are always exact and
`truncated` says when a listing was cut.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from runyard.eventstore import apply_migrations, load_migrations
from runyard.scheduler.domain import (
    PoolState,
    QueuePlan,
    WaitingQueue,
    capacity,
    queue_load,
    queue_status,
)

NODE_LIMIT = 1000
TASK_LIMIT = 1000
QUEUE_LIMIT = 100

Queryable = asyncpg.Pool | asyncpg.Connection


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


async def write_view(conn: Queryable, view: dict[str, Any]) -> None:
    """Upsert a pool's row; an older version never overwrites a newer one."""
    await conn.execute(
        """INSERT INTO scheduler_pool_views (pool_id, version, view, updated_at)
           VALUES ($1, $2, $3::jsonb, now())
           ON CONFLICT (pool_id) DO UPDATE
           SET version = EXCLUDED.version, view = EXCLUDED.view, updated_at = now()
           WHERE scheduler_pool_views.version <= EXCLUDED.version""",
        view["pool_id"],
        view["version"],
        json.dumps(view),
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
