"""SRE replay of pools (R-61): nodes and allocations as they were at a point of the log.

    GET /v1/pools/replay?at=P[&pool=ID]      (`runyard pools --at P [--pool ID]`)

Each pool's stream (`pool-<id>`) is cut at the point (`runyard.domain.replay`:
a global position, or an ISO 8601 time with a zone) and folded with the
scheduler's pure pool fold (`fold_pool`): node health and faults, who held
which GPUs, capacity then. Nothing else is read: not the read model, not the
queue (what waited is in the task streams: `runyard show ID --at P`).

Without `pool`, every pool the scheduler has a read-model row for is replayed;
one that had no event yet then is listed under `absent`. With `pool`, a pool
that did not exist yet then is a 400 `replay.before_start`, an unknown pool a
404 `pool.not_found`.

Who may read: any caller; the sre and platform_admin roles see every task id,
other roles see the ids of their own tenant's tasks only (another tenant's
allocation is shown as `(another tenant)`, its GPUs still counted).

Reads: each pool stream through the `(stream_id, stream_version)` unique index
of `events`, the log's last position through its primary key, and the
tenants of the allocated tasks from the first event of each task stream (the
same index). Listings are capped as in the read model (`NODE_LIMIT`,
`TASK_LIMIT`; totals stay exact).

(No `from __future__ import annotations` here: FastAPI must see the route's
`caller_dependency(...)` when it reads the handler's signature.)
"""

from collections.abc import Iterable
from typing import Annotated, Any, Final

import asyncpg
from fastapi import APIRouter, Query
from runyard.api.auth import Principal
from runyard.api.errors import NotFound
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.contracts import http as wire
from runyard.domain.replay import Point, check_in_log, parse_point, prefix, stream_prefix
from runyard.eventstore import PostgresEventStore
from runyard.scheduler.config import pool_stream
from runyard.scheduler.domain import PoolState, fold_pool
from runyard.scheduler.views import _capacity, _health, _nodes, _occupancy

#: How another tenant's task id is shown to a role that reads only its own tenant.
HIDDEN: Final = "(another tenant)"
POINT_DOC: Final = (
    "a global position of the log (1234) or an ISO 8601 time with a zone (2026-12-01T10:00:00Z)"
)


async def task_tenants(db: asyncpg.Pool, task_ids: Iterable[str]) -> dict[str, str]:
    """Each task's tenant, from the first event of its stream (its submission)."""
    ids = list(task_ids)
    if not ids:
        return {}
    rows = await db.fetch(
        "SELECT stream_id, data ->> 'tenant' AS tenant FROM events"
        " WHERE stream_id = ANY($1::text[]) AND stream_version = 1",
        [f"task-{task}" for task in ids],
    )
    return {row["stream_id"].removeprefix("task-"): row["tenant"] for row in rows}


def pool_at(pool: PoolState) -> dict[str, Any]:
    """A folded pool as the replay answers it (the read model's shapes, no queue)."""
    return {
        "pool_id": pool.pool_id,
        "zone": pool.zone,
        "resource_type": pool.resource_type,
        "gpu_model": pool.gpu_model,
        "network": pool.network,
        "capacity": _capacity(pool),
        "health": _health(pool),
        "nodes": _nodes(pool),
        "occupancy": _occupancy(pool),
    }


def hide_tasks(view: dict[str, Any], visible: set[str]) -> dict[str, Any]:
    """`view` with every task id outside `visible` replaced by `HIDDEN`."""

    def shown(task_id: str | None) -> str | None:
        return task_id if task_id is None or task_id in visible else HIDDEN

    for node in view["nodes"]["items"]:
        node["owners"] = [shown(owner) for owner in node["owners"]]
    for item in view["occupancy"]["items"]:
        item["task_id"] = shown(item["task_id"])
    return view


class PoolReplay:
    """Pools folded from their streams' prefixes, as a caller may see them."""

    def __init__(self, store: PostgresEventStore) -> None:
        self.store = store

    async def pools_at(self, caller: Principal, at: str, pool_id: str | None) -> dict[str, Any]:
        point = parse_point(at, "at")
        if isinstance(point, int):
            check_in_log(point, await self.store.head_position(), "at")
        ids = [pool_id] if pool_id is not None else await self._pool_ids()
        pools, absent = [], []
        for one in ids:
            view = await self._pool_at(one, point, required=pool_id is not None)
            if view is None:
                absent.append(one)
            else:
                pools.append(view)
        await self._mask(caller, pools)
        return {"point": _point_text(point), "pools": pools, "absent": absent}

    async def _pool_at(
        self, pool_id: str, point: Point, *, required: bool
    ) -> dict[str, Any] | None:
        events = await self.store.read_stream(pool_stream(pool_id))
        if not events:
            if required:
                raise NotFound(
                    "pool.not_found",
                    f"pool {pool_id!r} does not exist",
                    "choose a pool listed by `runyard pools`",
                    "pool",
                )
            return None
        if not required and not prefix(events, point):
            return None  # no event yet then: listed under `absent`
        cut, as_of = stream_prefix(events, point, what=f"pool {pool_id}")
        view = pool_at(fold_pool(e.event for e in cut))
        return {**view, "as_of": as_of.to_dict()}

    async def _pool_ids(self) -> list[str]:
        rows = await self.store.pool.fetch("SELECT pool_id FROM scheduler_pool_views ORDER BY 1")
        return [row["pool_id"] for row in rows]

    async def _mask(self, caller: Principal, pools: list[dict[str, Any]]) -> None:
        held = {item["task_id"] for view in pools for item in view["occupancy"]["items"]}
        tenants = await task_tenants(self.store.pool, held)
        visible = {task for task, tenant in tenants.items() if caller.may_read_tenant(tenant)}
        if visible == held:
            return
        for view in pools:
            hide_tasks(view, visible)


def _point_text(point: Point) -> Any:
    return point if isinstance(point, int) else point.isoformat()


def pools_replay_router(store: PostgresEventStore, authenticator: Authenticator) -> APIRouter:
    """GET /v1/pools/replay (see the module docstring)."""
    replay = PoolReplay(store)
    Caller = Annotated[Principal, caller_dependency(authenticator)]
    router = APIRouter(tags=["replay"], route_class=AnswerRoute)

    @router.get("/v1/pools/replay", response_model=wire.PoolsReplay, responses=refusals(403))
    async def pools_at(
        caller: Caller,
        at: Annotated[str, Query(description=POINT_DOC)],
        pool: Annotated[str | None, Query(max_length=128, description="one pool only")] = None,
    ) -> dict[str, Any]:
        """Pools as they were at `at`: nodes, health, allocations (folds of their streams)."""
        return await replay.pools_at(caller, at, pool)

    return router


__all__ = ["HIDDEN", "PoolReplay", "hide_tasks", "pool_at", "pools_replay_router", "task_tenants"]
