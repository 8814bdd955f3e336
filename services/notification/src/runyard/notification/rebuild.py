"""Rebuilding `queue_waits` beside the live one (`runyard rebuild queue_waits`).

    POST   /v1/admin/notification/read-models/queue_waits/rebuild?max_events=N[&restart=true]
                                                           advance the shadow one step
    GET    /v1/admin/notification/read-models/queue_waits/diff     the shadow against the live rows
    POST   /v1/admin/notification/read-models/queue_waits/swap     the shadow's rows become live
    DELETE /v1/admin/notification/read-models/queue_waits/rebuild  drop the shadow

The live rows are kept by `NotificationApp.handle`, one event at a time as the
consumer hands them over: each event of `EVENT_TYPES` on a task stream puts
the task's row (`queue_wait` of the task folded up to that event, that event
as the cause) or deletes it. So a row is a function of its task stream alone:
the task folded up to its last event of `EVENT_TYPES`, and that event. The
rebuild walks the log in steps of at most `max_events` positions: a step
refolds every task stream with an event in its range, whole, with the task
domain's `evolve`, and writes those rows afresh with the code that writes the
live ones (`queue_wait`, `put_queue_wait`) into `queue_waits__shadow`; the
rows and the step's position (`shadow:queue_waits`) commit together, so an
interrupted rebuild resumes from its last step. It decodes only what a row
uses: each payload for the fold, the metadata (the correlation id) of the one
event a row names.

A diff and a swap lock the live table (SHARE for a diff, EXCLUSIVE for a
swap: the queue timer reads on, the consumer's inbox transactions wait) and
step to the log's end under the lock. No column depends on when a row was written, so
rows are compared whole. Compare when the consumer is caught up
(`runyard projections`, lag 0 for `notification`): events it has not handled
yet are in the rebuild and not yet in the live rows. The steps, locks
included, are `runyard.eventstore.shadow.SteppedRebuild`'s; this module
gives it the fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import asyncpg
from fastapi import APIRouter
from runyard.api.responses import NO_BODY, AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.contracts import Metadata
from runyard.contracts import http as wire
from runyard.domain import TaskState, evolve
from runyard.eventstore.shadow import SteppedRebuild, shadow_of
from runyard.notification.app import EVENT_TYPES, NotificationApp
from runyard.notification.store import QUEUE_WAITS, Cause, QueueWait, put_queue_wait

KEY: Final = ("task_id",)
#: Task streams read per query of a rebuild step.
STREAMS_PER_READ: Final = 500
_EVENTS = (
    "SELECT stream_id, event_id, event_type, schema_version, data::text AS data,"
    " metadata::text AS metadata, occurred_at FROM events"
    " WHERE stream_id = ANY($1::text[]) ORDER BY stream_id, stream_version"
)


class QueueWaitsRebuild(SteppedRebuild):
    """The shadow rebuild of `queue_waits`, with the notification service's own code."""

    def __init__(self, app: NotificationApp) -> None:
        super().__init__(app.store, QUEUE_WAITS, [QUEUE_WAITS], KEY)
        self.app = app

    async def refold(self, conn: asyncpg.Connection, streams: Sequence[str]) -> dict[str, int]:
        """Fold each task stream of `streams` whole and write its shadow row afresh."""
        shadow = shadow_of(QUEUE_WAITS)
        waiting = 0
        for start in range(0, len(streams), STREAMS_PER_READ):
            page = list(streams[start : start + STREAMS_PER_READ])
            tasks = [s.removeprefix("task-") for s in page]
            await conn.execute(f"DELETE FROM {shadow} WHERE task_id = ANY($1::text[])", tasks)
            rows = await conn.fetch(_EVENTS, page)
            for wait in self._waits(rows):
                await put_queue_wait(conn, wait, table=shadow)
                waiting += 1
        return {"tasks": len(streams), "waiting": waiting}

    def _waits(self, rows: Sequence[asyncpg.Record]) -> list[QueueWait]:
        """The rows of the waiting tasks among the streams of `rows` (ordered by stream)."""
        waits: list[QueueWait] = []
        start = 0
        for end in range(1, len(rows) + 1):
            if end == len(rows) or rows[end]["stream_id"] != rows[start]["stream_id"]:
                wait = self._wait(rows[start:end])
                if wait is not None:
                    waits.append(wait)
                start = end
        return waits

    def _wait(self, stream: Sequence[asyncpg.Record]) -> QueueWait | None:
        """The row `handle` left for one task stream: that of its last handled event."""
        decode = self.app.store.mapper.decode
        state: TaskState | None = None
        last: tuple[TaskState, asyncpg.Record] | None = None
        for row in stream:
            event = decode(row["event_type"], row["schema_version"], row["data"])
            state = evolve(state, (event, row["occurred_at"]))
            if event.type_name() in EVENT_TYPES:
                last = (state, row)
        if last is None:
            return None
        state, row = last
        event_id = str(row["event_id"])
        correlation = Metadata.model_validate_json(row["metadata"]).correlation_id
        return self.app.queue_wait(state, Cause(event_id, correlation or event_id))


def rebuild_router(app: NotificationApp, authenticator: Authenticator) -> APIRouter:
    """The `queue_waits` rebuild routes (sre, platform_admin; see the module docstring)."""
    rebuild = QueueWaitsRebuild(app)
    operator = caller_dependency(authenticator, operator=True)
    router = APIRouter(tags=["read models"], dependencies=[operator], route_class=AnswerRoute)
    base = f"/v1/admin/notification/read-models/{QUEUE_WAITS}"
    for method, path, action in (
        ("POST", "rebuild", rebuild.step),
        ("GET", "diff", rebuild.diff),
        ("POST", "swap", rebuild.swap),
        ("DELETE", "rebuild", rebuild.discard),
    ):
        router.add_api_route(
            f"{base}/{path}",
            action,
            methods=[method],
            response_model=wire.ReadModelAnswer,
            responses=refusals(403, 409),
            openapi_extra=NO_BODY if method == "POST" else None,
        )
    return router


__all__ = ["KEY", "STREAMS_PER_READ", "QueueWaitsRebuild", "rebuild_router"]
