"""Rebuilding the scheduler's read models beside the live ones (`runyard rebuild NAME`).

    POST   /v1/admin/scheduler/read-models/{name}/rebuild  rebuild both shadows
    GET    /v1/admin/scheduler/read-models/{name}/diff     the shadow against the live rows
    POST   /v1/admin/scheduler/read-models/{name}/swap     the shadow's rows become live
    DELETE /v1/admin/scheduler/read-models/{name}/rebuild  drop the shadows

`name` is `scheduler_pool_views` or `scheduler_queue`. Both come from one fold:
a `SchedulerApp` of its own, over a store that refuses appends, loads memory
as a start of the scheduler does (`SchedulerApp.load_from_log`: every pool
stream and every task stream from version 1, the queues filled, each pool's
plan made) and the rows are built by the code that writes the live ones
(`build_view`, `queue_row`, `write_view`, `write_queue_rows` into
`<table>__shadow`). The fold is one pass over the streams, not a walk of the
log by position, so it has nothing to resume: a step is the whole rebuild,
its position (the log's end when it read) kept under `shadow:<name>`.

A diff and a swap lock both live tables (in the order the scheduler writes
them: queue, then pool views; SHARE for a diff, EXCLUSIVE for a swap:
readers go on, the scheduler's writes wait) and fold again under the lock,
so the shadow holds every event the live rows could hold. What depends on
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
from fastapi import APIRouter, Path
from runyard.api.auth import Principal
from runyard.api.security import Authenticator, caller_dependency
from runyard.eventstore import PostgresEventStore
from runyard.eventstore.shadow import (
    create_shadow,
    diff_table,
    drop_shadow,
    lock_tables,
    require_shadow,
    set_shadow_position,
    shadow_of,
    swap_in,
)
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.errors import AppendRefused
from runyard.scheduler.views import POOL_VIEWS, QUEUE, write_queue_rows, write_view

#: The read models, in the order the scheduler writes them (and the lock takes them).
TABLES: Final = (QUEUE, POOL_VIEWS)
KEYS: Final = {QUEUE: ("task_id",), POOL_VIEWS: ("pool_id",)}


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
    """Shadow rebuilds of the scheduler's read models over `store`."""

    def __init__(self, store: PostgresEventStore) -> None:
        self.store = store

    async def step(self, name: str) -> dict[str, Any]:
        """Rebuild both shadows now (one pass; see the module docstring)."""
        async with self.store.transaction() as conn:
            folded = await self._rebuild(conn)
        return {"name": name, **folded, "done": True}

    async def diff(self, name: str) -> dict[str, Any]:
        async with self.store.transaction() as conn:
            await require_shadow(conn, name)
            await lock_tables(conn, TABLES, "SHARE")
            folded = await self._rebuild(conn)
            found = await diff_table(conn, name, KEYS[name], comparable=comparable(name))
        return {"name": name, **folded, "tables": [found.as_json()]}

    async def swap(self, name: str) -> dict[str, Any]:
        async with self.store.transaction() as conn:
            await require_shadow(conn, name)
            await lock_tables(conn, TABLES, "EXCLUSIVE")
            folded = await self._rebuild(conn)
            swapped = await swap_in(conn, name, KEYS[name], comparable=comparable(name))
        return {"name": name, **folded, **swapped}

    async def discard(self, name: str) -> dict[str, Any]:
        async with self.store.transaction() as conn:
            for table in TABLES:
                await drop_shadow(conn, table, [table])
        return {"name": name, "dropped": True}

    async def _rebuild(self, conn: asyncpg.Connection) -> dict[str, Any]:
        """Fold the log with the scheduler's code and write both shadows on `conn`."""
        position = int(await conn.fetchval("SELECT coalesce(max(global_position), 0) FROM events"))
        pools = await conn.fetch(
            "SELECT substr(stream_id, 6) AS pool_id FROM streams"
            " WHERE stream_id LIKE 'pool-%' ORDER BY 1"
        )
        app = SchedulerApp(_ReadOnlyStore(self.store), [], write_views=False)  # type: ignore[arg-type]
        pending = await app.load_from_log(r["pool_id"] for r in pools)
        for table in TABLES:
            await create_shadow(conn, table, fresh=True)
            await set_shadow_position(conn, table, position)
        for pool_id in app.pools:
            await write_view(conn, app.view(pool_id), table=shadow_of(POOL_VIEWS))
            await write_queue_rows(conn, app.queue_rows(pool_id), table=shadow_of(QUEUE))
        return {
            "position": position,
            "target": position,
            "log_end": position,
            "pools": len(app.pools),
            "open_tasks": len(app.tasks),
            "pending": pending,
        }


Name = Annotated[str, Path(pattern=f"^({QUEUE}|{POOL_VIEWS})$", description=" or ".join(TABLES))]


def rebuild_router(store: PostgresEventStore, authenticator: Authenticator) -> APIRouter:
    """The scheduler's read-model rebuild routes (sre, platform_admin)."""
    rebuild = SchedulerRebuild(store)
    Caller = Annotated[Principal, caller_dependency(authenticator, operator=True)]
    router = APIRouter(tags=["read models"])
    base = "/v1/admin/scheduler/read-models/{name}"

    @router.post(f"{base}/rebuild")
    async def step(caller: Caller, name: Name) -> dict[str, Any]:
        """Rebuild the scheduler's read models into their shadows, from the log."""
        return await rebuild.step(name)

    @router.get(f"{base}/diff")
    async def diff(caller: Caller, name: Name) -> dict[str, Any]:
        """The differences between the rebuilt read model and the live one."""
        return await rebuild.diff(name)

    @router.post(f"{base}/swap")
    async def swap(caller: Caller, name: Name) -> dict[str, Any]:
        """Replace the live read model with its rebuild, without stopping the scheduler."""
        return await rebuild.swap(name)

    @router.delete(f"{base}/rebuild")
    async def discard(caller: Caller, name: Name) -> dict[str, Any]:
        """Drop the shadows."""
        return await rebuild.discard(name)

    return router


__all__ = ["KEYS", "TABLES", "SchedulerRebuild", "comparable", "rebuild_router"]
