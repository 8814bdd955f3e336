"""SRE replay (R-61): a task as it was at a point of the log, and what changed between two.

    GET /v1/tasks/{id}/replay?at=P             the task as of P (`runyard show ID --at P`)
    GET /v1/tasks/{id}/replay/diff?from=A&to=B  fields that differ, events in between
                                               (`runyard diff ID --from A --to B`)

A point is a global position of the log or an ISO 8601 time with a zone
(`runyard.domain.replay`). The answer is a fold of the task stream's prefix
up to the point, with the task domain's own fold, shown as `GET /v1/tasks/{id}`
shows a task (`task_view`): status, stage, placement, run and attempt,
counters, stage timeline. The queue place is what the last `TaskQueued` said
then (`as_of: null`): the scheduler's queue read model has only the present.

Who may read: as every task read, the caller's own tenant, every tenant for the
sre and platform_admin roles; another tenant's task is a 404, as no task.

Reads: the task's stream through the `(stream_id, stream_version)` unique index
of `events` (the prefix is cut from it in order), and the log's last position
through its primary key (`max(global_position)`, one index probe). No other
table is read and nothing is written.

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(gateway)` when it reads the handlers' signatures.)
"""

from collections.abc import Sequence
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query
from runyard.api.auth import Principal
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import caller_dependency
from runyard.contracts import Event, RecordedEvent
from runyard.contracts import http as wire
from runyard.domain import TaskState, fold
from runyard.domain.replay import (
    AsOf,
    Point,
    changes,
    check_in_log,
    check_order,
    parse_point,
    stream_prefix,
)
from runyard.gateway.app import Gateway
from runyard.gateway.views import event_view, task_view

#: The most events a diff lists (all of them are counted; docs/limits.md).
MAX_DIFF_EVENTS: Final = 1000
POINT_DOC: Final = (
    "a global position of the log (1234) or an ISO 8601 time with a zone (2026-12-01T10:00:00Z)"
)


class ReplayApi:
    """The replay use cases over the gateway's store and its reading rule."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def task_at(self, caller: Principal, task_id: str, at: str) -> dict[str, Any]:
        """The task as of `at`, and where its prefix ends."""
        point = parse_point(at, "at")
        current, events = await self._readable(caller, task_id, [point])
        view, as_of = await self._view_at(caller, current, events, point, "at")
        return {"task_id": task_id, "as_of": as_of.to_dict(), "task": view}

    async def task_diff(
        self, caller: Principal, task_id: str, start: str, end: str
    ) -> dict[str, Any]:
        """Fields that differ between the task as of `start` and as of `end`, and the
        events in between (after `start`'s prefix, up to `end`'s)."""
        first, last = parse_point(start, "from"), parse_point(end, "to")
        check_order(first, last)
        current, events = await self._readable(caller, task_id, [first, last])
        before, from_as_of = await self._view_at(caller, current, events, first, "from")
        after, to_as_of = await self._view_at(caller, current, events, last, "to")
        between = [e for e in events if from_as_of.version < e.stream_version <= to_as_of.version]
        is_creator = _is_creator(caller, current)
        return {
            "task_id": task_id,
            "from": from_as_of.to_dict(),
            "to": to_as_of.to_dict(),
            "changes": [c.to_dict() for c in changes(before, after)],
            "events": [event_view(e, is_creator) for e in between[:MAX_DIFF_EVENTS]],
            "events_between": len(between),
            "truncated": len(between) > MAX_DIFF_EVENTS,
        }

    async def _readable(
        self, caller: Principal, task_id: str, points: Sequence[Point]
    ) -> tuple[TaskState, list[RecordedEvent[Event]]]:
        """The task's stream if the caller may read it (404 else); positions past the
        log's end are refused first, so the answer does not depend on the task."""
        positions = [p for p in points if isinstance(p, int)]
        if positions:
            head = await self.gateway.store.head_position()
            names = ("at",) if len(points) == 1 else ("from", "to")
            for point, name in zip(points, names, strict=True):
                check_in_log(point, head, name)
        # the gateway's one reading rule for a task (404 for another tenant's)
        return await self.gateway._load(caller, task_id)

    async def _view_at(
        self,
        caller: Principal,
        current: TaskState,
        events: Sequence[RecordedEvent[Event]],
        point: Point,
        field: str,
    ) -> tuple[dict[str, Any], AsOf]:
        cut, as_of = stream_prefix(events, point, what=f"task {current.task_id}", field=field)
        state = fold(cut, task_id=current.task_id)
        is_creator = _is_creator(caller, current)
        secrets = await self.gateway._secrets(state.tenant, state.spec) if is_creator else {}
        view = task_view(state, cut, is_creator, secrets)
        return {**view, "placement": placement_view(state)}, as_of


def placement_view(state: TaskState) -> dict[str, Any] | None:
    """Where the workers of the task's attempt were: pool, and each worker's node, GPUs,
    whether it had started and its exit code (None while waiting for a placement)."""
    if state.placement is None:
        return None
    return {
        "pool": state.placement.pool,
        "run": state.placement.run,
        "attempt": state.placement.attempt,
        "workers": [
            {
                "worker": w.index,
                "node": w.node,
                "gpus": list(w.gpus),
                "started": w.started,
                "exit_code": w.exit_code,
            }
            for w in state.workers
        ],
    }


def _is_creator(caller: Principal, state: TaskState) -> bool:
    return caller.tenant == state.tenant and caller.user == state.creator


def replay_router(gateway: Gateway) -> APIRouter:
    """The task replay routes over `gateway` (see the module docstring)."""
    api = ReplayApi(gateway)
    Caller = Annotated[Principal, caller_dependency(gateway)]
    router = APIRouter(tags=["replay"], route_class=AnswerRoute)

    @router.get(
        "/v1/tasks/{task_id}/replay", response_model=wire.TaskReplay, responses=refusals(404)
    )
    async def task_at(
        caller: Caller, task_id: str, at: Annotated[str, Query(description=POINT_DOC)]
    ) -> dict[str, Any]:
        """The task as it was at `at`: a fold of its stream up to that point (R-61)."""
        return await api.task_at(caller, task_id, at)

    @router.get(
        "/v1/tasks/{task_id}/replay/diff",
        response_model=wire.TaskReplayDiff,
        responses=refusals(404),
    )
    async def task_diff(
        caller: Caller,
        task_id: str,
        start: Annotated[str, Query(alias="from", description=POINT_DOC)],
        end: Annotated[str, Query(alias="to", description=POINT_DOC)],
    ) -> dict[str, Any]:
        """What changed in the task between `from` and `to`: fields and events."""
        return await api.task_diff(caller, task_id, start, end)

    return router


__all__ = ["MAX_DIFF_EVENTS", "ReplayApi", "placement_view", "replay_router"]
