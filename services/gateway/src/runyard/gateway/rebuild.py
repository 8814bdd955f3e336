"""Rebuilding the task list read model beside the live one (`runyard rebuild task_list`).

    POST   /v1/admin/read-models/task_list/rebuild?max_events=N[&restart=true]
                    advance the shadow rebuild by at most N events (resumes from its
                    checkpoint `shadow:task_list`; `restart` starts again from 0)
    GET    /v1/admin/read-models/task_list/diff      the shadow against the live rows
    POST   /v1/admin/read-models/task_list/swap      the shadow's rows become the live ones
    DELETE /v1/admin/read-models/task_list/rebuild   drop the shadow and its checkpoint

The shadow (`task_list__shadow`) is written by the live projector's own code
(`TaskListProjector` with another table and checkpoint), from position 0 up
to the live projector's checkpoint, never past it, so that the two can be
compared at one position. A diff and a swap lock the live table (SHARE for a
diff: readers go on, the projector waits; EXCLUSIVE for a swap: readers go
on too), read the live checkpoint P, bring the shadow to exactly P in the same
transaction, then compare, or replace the live rows with the shadow's. The
live checkpoint stays P, and is then right for the new rows: the projector
goes on after P, with the shadow's rows. The gateway is not stopped; its
projector waits for the lock, a few seconds for a large table.

Who may: the sre and platform_admin roles (403 `auth.operator_only` else).
The scheduler's read models have the same routes under
`/v1/admin/scheduler/read-models/{name}`, served by the scheduler.

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(gateway)` when it reads the handlers' signatures.)
"""

import time
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query
from runyard.api.auth import Principal
from runyard.api.responses import NO_BODY, AnswerRoute, refusals
from runyard.api.security import caller_dependency
from runyard.contracts import http as wire
from runyard.eventstore.shadow import (
    create_shadow,
    diff_table,
    drop_shadow,
    lock_tables,
    require_shadow,
    set_shadow_position,
    shadow_checkpoint,
    shadow_of,
    shadow_position,
    swap_in,
)
from runyard.gateway.app import Gateway
from runyard.gateway.projection import NAME, TaskListProjector

#: The most events one rebuild step applies (a step is one request; the CLI loops).
MAX_STEP_EVENTS: Final = 200_000
#: Events per batch of a rebuild (one transaction each: rows and shadow checkpoint).
REBUILD_BATCH: Final = 2000


class TaskListRebuild:
    """The shadow rebuild of `task_list`, next to the gateway's live projector."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.live = gateway.projector
        self.shadow = TaskListProjector(
            gateway.store,
            batch_size=REBUILD_BATCH,
            table=shadow_of(NAME),
            checkpoint=shadow_checkpoint(NAME),
        )

    async def step(self, max_events: int, *, restart: bool = False) -> dict[str, Any]:
        """Advance the shadow by at most `max_events` events, toward the live checkpoint."""
        started = time.monotonic()
        async with self.gateway.store.transaction() as conn:
            if restart:
                await drop_shadow(conn, NAME, [NAME])
            await create_shadow(conn, NAME)
            if await shadow_position(conn, NAME) is None:
                await set_shadow_position(conn, NAME, 0)  # under way, from position 0
        target = await self.live.position()
        position = await self.shadow.position()
        applied = await self.shadow.apply_range(position, min(target, position + max_events))
        reached = await self.shadow.position()
        return {
            "name": NAME,
            "position": reached,
            "target": target,
            "log_end": await self.gateway.store.head_position(),
            "applied": applied,
            "done": reached >= target,
            "seconds": round(time.monotonic() - started, 3),
        }

    async def diff(self) -> dict[str, Any]:
        """The shadow brought to the live checkpoint, compared with the live rows."""
        async with self.gateway.store.transaction() as conn:
            await require_shadow(conn, NAME)
            position = await self._align(conn, "SHARE")
            found = await diff_table(conn, NAME, ("task_id",))
        return {"name": NAME, "position": position, "tables": [found.as_json()]}

    async def swap(self) -> dict[str, Any]:
        """The live rows replaced by the shadow's, in one transaction; the shadow dropped."""
        async with self.gateway.store.transaction() as conn:
            await require_shadow(conn, NAME)
            position = await self._align(conn, "EXCLUSIVE")
            swapped = await swap_in(conn, NAME, ("task_id",))
        self.live.forget_position()  # its checkpoint is unchanged; read it again anyway
        return {"name": NAME, "position": position, **swapped}

    async def discard(self) -> dict[str, Any]:
        async with self.gateway.store.transaction() as conn:
            await drop_shadow(conn, NAME, [NAME])
        return {"name": NAME, "dropped": True}

    async def _align(self, conn: Any, mode: str) -> int:
        """Lock the live table, and bring the shadow to the live checkpoint in `conn`."""
        await lock_tables(conn, [NAME], mode)
        target = await self.live.position(conn)
        await self.shadow.apply_range(await self.shadow.position(conn), target, conn)
        return target


def rebuild_router(gateway: Gateway) -> APIRouter:
    """The task list rebuild routes (see the module docstring)."""
    rebuild = TaskListRebuild(gateway)
    Caller = Annotated[Principal, caller_dependency(gateway, operator=True)]
    router = APIRouter(tags=["read models"], route_class=AnswerRoute)
    base = f"/v1/admin/read-models/{NAME}"
    OPERATOR = refusals(403, 409)

    @router.post(
        f"{base}/rebuild",
        response_model=wire.ReadModelAnswer,
        responses=OPERATOR,
        openapi_extra=NO_BODY,
    )
    async def step(
        caller: Caller,
        max_events: Annotated[
            int, Query(ge=1, le=MAX_STEP_EVENTS, description="events to apply in this step")
        ] = 50_000,
        restart: Annotated[bool, Query(description="drop the shadow, start from 0")] = False,
    ) -> dict[str, Any]:
        """Advance the shadow rebuild of the task list (sre, platform_admin)."""
        return await rebuild.step(max_events, restart=restart)

    @router.get(f"{base}/diff", response_model=wire.ReadModelAnswer, responses=OPERATOR)
    async def diff(caller: Caller) -> dict[str, Any]:
        """The differences between the rebuilt task list and the live one."""
        return await rebuild.diff()

    @router.post(
        f"{base}/swap",
        response_model=wire.ReadModelAnswer,
        responses=OPERATOR,
        openapi_extra=NO_BODY,
    )
    async def swap(caller: Caller) -> dict[str, Any]:
        """Replace the live task list with the rebuilt one, without stopping the gateway."""
        return await rebuild.swap()

    @router.delete(f"{base}/rebuild", response_model=wire.ReadModelAnswer, responses=OPERATOR)
    async def discard(caller: Caller) -> dict[str, Any]:
        """Drop the shadow rebuild."""
        return await rebuild.discard()

    return router


__all__ = ["MAX_STEP_EVENTS", "REBUILD_BATCH", "TaskListRebuild", "rebuild_router"]
