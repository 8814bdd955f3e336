"""The causation view over HTTP: the chain of reactions a task or an event belongs to.

    GET /v1/tasks/{id}/trace          every chain the task's events belong to
                                      (`runyard trace TASK`)
    GET /v1/events/{event_id}/trace   the chain of one event (`runyard trace EVENT`)

The answer is `runyard.eventstore.trace`'s: the events of the chains as a tree
(each under the event that caused it), flattened in pre-order with each event's
depth and parent, the chains' correlation ids and the OpenTelemetry trace ids of
the spans that wrote them. At most `limit` events (`MAX_TRACE_EVENTS`);
`truncated` says when a chain had more.

Who may read: as every task read, the caller's own tenant, every tenant for the
sre and platform_admin roles. Another tenant's task, or an event about one, is a
404 as no task or no event. A chain crosses tenants when a pool event caused
reschedules of several tenants' tasks: the events about another tenant's task are
shown with their type, position and place in the tree, their identity as
`(another tenant)` (`redacted: true`).

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(gateway)` when it reads the handlers' signatures.)
"""

from typing import Annotated, Any

from fastapi import APIRouter, Query
from runyard.api.auth import Principal
from runyard.api.errors import NotFound
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import caller_dependency
from runyard.contracts import http as wire
from runyard.eventstore.trace import (
    MAX_TRACE_EVENTS,
    event_by_id,
    redact,
    root_cause,
    task_events,
    trace_chain,
)
from runyard.gateway.app import Gateway

LIMIT_DOC = f"the most events collected, 1 to {MAX_TRACE_EVENTS}"


class TraceApi:
    """The causation view over the gateway's database and its reading rule."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def task_trace(
        self, caller: Principal, task_id: str, limit: int = MAX_TRACE_EVENTS
    ) -> dict[str, Any]:
        """Every chain the task's events belong to (404 for another tenant's task)."""
        await self.gateway._load(caller, task_id)  # the one reading rule for a task
        seeds = await task_events(self.gateway.db, task_id)
        trace = await trace_chain(self.gateway.db, seeds, limit=_bounded(limit))
        redact(trace.roots, caller.may_read_tenant)
        return {"of": {"task_id": task_id}, **trace.as_json()}

    async def event_trace(
        self, caller: Principal, event_id: str, limit: int = MAX_TRACE_EVENTS
    ) -> dict[str, Any]:
        """The chain of one event (404 for no event, or one about another tenant's task)."""
        event = await event_by_id(self.gateway.db, event_id)
        if event is None or (event.tenant is not None and not caller.may_read_tenant(event.tenant)):
            raise NotFound(
                "event.not_found",
                f"no event {event_id!r}",
                "take an event id from `runyard events TASK --json` (event_id)",
                "event_id",
            )
        seeds = [event]
        if event.correlation_id is None:  # written before chains were kept: walk up causes
            seeds.append(await root_cause(self.gateway.db, event))
        trace = await trace_chain(self.gateway.db, seeds, limit=_bounded(limit))
        redact(trace.roots, caller.may_read_tenant)
        return {"of": {"event_id": event.event_id}, **trace.as_json()}


def _bounded(limit: int) -> int:
    return max(1, min(limit, MAX_TRACE_EVENTS))


def trace_router(gateway: Gateway) -> APIRouter:
    """The causation routes over `gateway` (see the module docstring)."""
    api = TraceApi(gateway)
    Caller = Annotated[Principal, caller_dependency(gateway)]
    Limit = Annotated[int, Query(description=LIMIT_DOC, ge=1, le=MAX_TRACE_EVENTS)]
    router = APIRouter(tags=["replay"], route_class=AnswerRoute)

    @router.get("/v1/tasks/{task_id}/trace", response_model=wire.Trace, responses=refusals(404))
    async def task_trace(caller: Caller, task_id: str, limit: Limit = MAX_TRACE_EVENTS) -> Any:
        """The chains of reactions the task's events belong to, as a tree (R-62)."""
        return await api.task_trace(caller, task_id, limit)

    @router.get("/v1/events/{event_id}/trace", response_model=wire.Trace, responses=refusals(404))
    async def event_trace(caller: Caller, event_id: str, limit: Limit = MAX_TRACE_EVENTS) -> Any:
        """The chain of reactions one event belongs to, as a tree (R-62)."""
        return await api.event_trace(caller, event_id, limit)

    return router


__all__ = ["TraceApi", "trace_router"]
