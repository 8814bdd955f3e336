"""Rebuilding the scheduler's read models beside the live ones (`runyard rebuild NAME`).

    POST   /v1/admin/scheduler/read-models/{name}/rebuild[?restart=true]  fold the next pool
    GET    /v1/admin/scheduler/read-models/{name}/diff     the shadow against the live rows
    POST   /v1/admin/scheduler/read-models/{name}/swap     the shadow's rows become live
    DELETE /v1/admin/scheduler/read-models/{name}/rebuild  drop the shadows

`name` is `scheduler_pool_views` or `scheduler_queue`. Both come from one fold
per pool: a `SchedulerApp` of its own, over a store that refuses appends,
loads memory as a start of the scheduler does (`SchedulerApp.load_from_log`:
the pool's stream and its task streams from version 1, the queue filled, the
pool's plan made) and the rows are built by the code that writes the live
ones (`build_view`, `queue_row`, `write_view`, `write_queue_rows` into
`<table>__shadow`). A pool's rows depend on its own stream and its tasks'
alone (a task's pool is its spec's), but the fold is of streams with the
scheduler's domain, not a walk of the log by position, so the rebuild goes
pool by pool: a step folds the next pool (in pool id order) that has no row
in the pool views' shadow and writes its rows in one transaction; a rebuild
cut off after step k goes on with pool k+1. The first step (or `restart`)
empties the shadows and keeps the log's end under `shadow:<name>` (both
names; a settled head, read before the step writes: no event below it can
still commit), so every pool is folded with the log at least up to there. Progress is
pools done of pools.

A diff and a swap lock both live tables (in the order the scheduler writes
them: queue, then pool views; SHARE for a diff, EXCLUSIVE for a swap:
readers go on, the scheduler's writes wait) and under the lock fold the
pools not folded yet and every pool with an event after that position (on
its own stream, or on a task stream whose spec names it), then keep the
log's end as the position: the shadow holds every event the live rows could
hold, and a pool that did not move is not folded twice. What depends on
when a row was written is left out of the comparison (`updated_at`, the
view's `as_of`, waiting times). After a swap the scheduler goes on writing
rows from its memory as before: nothing is stopped.

Compare when the scheduler's consumer is caught up (`runyard projections`,
lag 0): events it has not handled yet are in the rebuild and not yet in the
live rows. `pending` counts tasks a start of the scheduler would act on now
(an append the read-only store refused).

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(...)` when it reads the handlers' signatures.)
"""

from collections.abc import Sequence
from typing import Annotated, Any, Final

import asyncpg
from fastapi import APIRouter, Path, Query
from runyard.api.auth import Principal
from runyard.api.responses import NO_BODY, AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.contracts import http as wire
from runyard.eventstore import PostgresEventStore
from runyard.eventstore.audit import settled_head
from runyard.eventstore.shadow import (
    create_shadow,
    diff_table,
    drop_shadow,
    lock_tables,
    require_shadow,
    set_shadow_position,
    shadow_of,
    shadow_position,
    swap_in,
)
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.errors import AppendRefused
from runyard.scheduler.views import POOL_VIEWS, QUEUE, write_queue_rows, write_view

#: The read models, in the order the scheduler writes them (and the lock takes them).
TABLES: Final = (QUEUE, POOL_VIEWS)
KEYS: Final = {QUEUE: ("task_id",), POOL_VIEWS: ("pool_id",)}

_ALL_POOLS = (
    "SELECT substr(stream_id, 6) AS pool_id FROM streams WHERE stream_id LIKE 'pool-%' ORDER BY 1"
)
#: The task streams of the pools `$1`: those whose spec names one of them (a task's
#: pool is its spec's, which a rerun cannot change).
_POOL_TASKS = (
    "SELECT DISTINCT stream_id FROM events WHERE stream_id LIKE 'task-%'"
    " AND data->'spec'->>'pool' = ANY($1::text[])"
)
#: The pools with an event after position `$1`: on their own stream or one of their tasks'.
_MOVED_POOLS = (
    "SELECT substr(stream_id, 6) AS pool_id FROM events"
    " WHERE global_position > $1 AND stream_id LIKE 'pool-%'"
    " UNION SELECT data->'spec'->>'pool' FROM events WHERE stream_id IN"
    " (SELECT stream_id FROM events WHERE global_position > $1 AND stream_id LIKE 'task-%')"
    " AND data->'spec'->>'pool' IS NOT NULL"
)


class _ReadOnlyStore:
    """The event store, but every append is refused (a rebuild decides nothing)."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, stream_id: str, *args: Any, **kw: Any) -> Any:
        raise AppendRefused(stream_id)

    async def append_many(self, requests: Sequence[Any], *args: Any, **kw: Any) -> Any:
        raise AppendRefused(requests[0].stream_id if requests else "")


def comparable(table: str) -> Any:
    """A row without what depends on when it was written."""

    def queue_row(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k != "updated_at"}

    def pool_view(row: dict[str, Any]) -> dict[str, Any]:
        view = {k: v for k, v in row["view"].items() if k != "as_of"}
        queue = {k: v for k, v in view.get("queue", {}).items() if k != "oldest_wait_s"}
        queue["items"] = [
            {k: v for k, v in item.items() if k != "waited_s"} for item in queue.get("items", [])
        ]
        return {
            "pool_id": row["pool_id"],
            "version": row["version"],
            "view": {**view, "queue": queue},
        }

    return queue_row if table == QUEUE else pool_view


class SchedulerRebuild:
    """Shadow rebuilds of the scheduler's read models over `store`, pool by pool."""

    def __init__(self, store: PostgresEventStore) -> None:
        self.store = store

    async def step(self, name: str, *, restart: bool = False) -> dict[str, Any]:
        """Fold the next pool not yet in the shadows, in one transaction with its rows
        (the first step, or `restart`, empties the shadows; see the module docstring)."""
        async with self.store.transaction() as conn:
            log_end = await settled_head(conn)  # before this transaction writes
            since = None if restart else await shadow_position(conn, name)
            if since is None:  # a rebuild from 0 (again)
                for table in TABLES:
                    await create_shadow(conn, table, fresh=True)
                    await set_shadow_position(conn, table, log_end)
                since = log_end
            pools, todo = await _pools(conn)
            folded = await self._fold(conn, todo[:1])
        left = len(todo) - len(todo[:1])
        return {
            "name": name,
            "position": since,
            "target": log_end,
            "log_end": log_end,
            "pools_done": len(pools) - left,
            "pools": len(pools),
            **folded,
            "done": left == 0,
        }

    async def diff(self, name: str) -> dict[str, Any]:
        async with self.store.transaction() as conn:
            folded = await self._catch_up(conn, name, "SHARE")
            found = await diff_table(conn, name, KEYS[name], comparable=comparable(name))
        return {"name": name, **folded, "tables": [found.as_json()]}

    async def swap(self, name: str) -> dict[str, Any]:
        async with self.store.transaction() as conn:
            folded = await self._catch_up(conn, name, "EXCLUSIVE")
            swapped = await swap_in(conn, name, KEYS[name], comparable=comparable(name))
        return {"name": name, **folded, **swapped}

    async def discard(self, name: str) -> dict[str, Any]:
        async with self.store.transaction() as conn:
            for table in TABLES:
                await drop_shadow(conn, table, [table])
        return {"name": name, "dropped": True}

    async def _catch_up(self, conn: asyncpg.Connection, name: str, mode: str) -> dict[str, Any]:
        """Lock both live tables, then fold on `conn` the pools not folded yet and those
        with events after the rebuild's position; the position becomes the log's end."""
        since = await require_shadow(conn, name)
        await lock_tables(conn, TABLES, mode)
        log_end = await settled_head(conn)
        pools, todo = await _pools(conn)
        moved = {r["pool_id"] for r in await conn.fetch(_MOVED_POOLS, since)}
        folded = await self._fold(conn, sorted(set(todo) | (moved & set(pools))))
        for table in TABLES:
            await set_shadow_position(conn, table, log_end)
        return {"position": log_end, "target": log_end, "log_end": log_end, **folded}

    async def _fold(self, conn: asyncpg.Connection, pool_ids: Sequence[str]) -> dict[str, Any]:
        """Fold `pool_ids` with the scheduler's code and write their shadow rows afresh."""
        if not pool_ids:
            return {"folded": [], "open_tasks": 0, "pending": 0}
        streams = [r["stream_id"] for r in await conn.fetch(_POOL_TASKS, list(pool_ids))]
        app = SchedulerApp(_ReadOnlyStore(self.store), [], write_views=False)  # type: ignore[arg-type]
        pending = await app.load_from_log(pool_ids, streams)
        for table in TABLES:
            await conn.execute(
                f"DELETE FROM {shadow_of(table)} WHERE pool_id = ANY($1::text[])", list(pool_ids)
            )
        for pool_id in app.pools:
            await write_view(conn, app.view(pool_id), table=shadow_of(POOL_VIEWS))
            await write_queue_rows(conn, app.queue_rows(pool_id), table=shadow_of(QUEUE))
        return {"folded": list(app.pools), "open_tasks": len(app.tasks), "pending": pending}


async def _pools(conn: asyncpg.Connection) -> tuple[list[str], list[str]]:
    """Every pool, and those not in the shadow yet (both in pool order)."""
    pools = [r["pool_id"] for r in await conn.fetch(_ALL_POOLS)]
    done = {r["pool_id"] for r in await conn.fetch(f"SELECT pool_id FROM {shadow_of(POOL_VIEWS)}")}
    return pools, [p for p in pools if p not in done]


Name = Annotated[str, Path(pattern=f"^({QUEUE}|{POOL_VIEWS})$", description=" or ".join(TABLES))]


def rebuild_router(store: PostgresEventStore, authenticator: Authenticator) -> APIRouter:
    """The scheduler's read-model rebuild routes (sre, platform_admin)."""
    rebuild = SchedulerRebuild(store)
    Caller = Annotated[Principal, caller_dependency(authenticator, operator=True)]
    router = APIRouter(tags=["read models"], route_class=AnswerRoute)
    base = "/v1/admin/scheduler/read-models/{name}"
    OPERATOR = refusals(403, 404, 409)

    @router.post(
        f"{base}/rebuild",
        openapi_extra=NO_BODY,
        response_model=wire.ReadModelAnswer,
        responses=OPERATOR,
    )
    async def step(
        caller: Caller,
        name: Name,
        restart: Annotated[bool, Query(description="drop the shadows, start again")] = False,
    ) -> dict[str, Any]:
        """Rebuild the scheduler's read models into their shadows, from the log."""
        return await rebuild.step(name, restart=restart)

    @router.get(f"{base}/diff", response_model=wire.ReadModelAnswer, responses=OPERATOR)
    async def diff(caller: Caller, name: Name) -> dict[str, Any]:
        """The differences between the rebuilt read model and the live one."""
        return await rebuild.diff(name)

    @router.post(
        f"{base}/swap",
        openapi_extra=NO_BODY,
        response_model=wire.ReadModelAnswer,
        responses=OPERATOR,
    )
    async def swap(caller: Caller, name: Name) -> dict[str, Any]:
        """Replace the live read model with its rebuild, without stopping the scheduler."""
        return await rebuild.swap(name)

    @router.delete(f"{base}/rebuild", response_model=wire.ReadModelAnswer, responses=OPERATOR)
    async def discard(caller: Caller, name: Name) -> dict[str, Any]:
        """Drop the shadows."""
        return await rebuild.discard(name)

    return router


__all__ = ["KEYS", "TABLES", "SchedulerRebuild", "comparable", "rebuild_router"]
