"""The scheduler's own HTTP routes (the gateway authenticates a request, then routes
it here unchanged with the caller's token).

Pool admin (platform_admin role):

    POST   /v1/admin/pools/{pool}/nodes                 {node, gpus?}   add a node (201)
    DELETE /v1/admin/pools/{pool}/nodes/{node}                          remove an idle node
    POST   /v1/admin/pools/{pool}/nodes/{node}/cordon                   no new workers there
    POST   /v1/admin/pools/{pool}/nodes/{node}/uncordon
    POST   /v1/admin/pools/{pool}/nodes/{node}/fault    {reason}        mark faulty (tests' faults)
    POST   /v1/admin/pools/{pool}/nodes/{node}/heal                     mark healthy
    POST   /v1/admin/pools/{pool}/spot-capacity         {remove: n} | {add: [names]}, reason?

Each admin handler makes the decision itself with `runyard.scheduler.admin`
over the event store: fold the pool stream, decide, append with the stream's
expected version (plus the preempted tasks' events of a spot shrink, in the
same append). So every instance serves them, the standby too: an append that
races the active scheduler's placement conflicts and one of them decides
again; the active scheduler re-plans when it consumes the pool events.
Answers the `AdminResult` (pool version, events appended, tasks preempted).

Queue (what the gateway shows of waiting tasks, R-07):

    GET    /v1/internal/queue?task_id=a&task_id=b    {"entries": {task_id: entry}}

An entry is where a waiting task stands and why (`read_queue_entries`). Only
tasks of tenants the caller may read are answered; a task that does not wait,
or that the caller may not see, is absent (never an error, so nothing leaks).

Replay (R-61, `runyard.scheduler.replay`): pools as folds of their streams' prefixes.

    GET    /v1/pools/replay?at=P[&pool=ID]

What-if (R-61, `runyard.scheduler.whatif`, sre and platform_admin): a window of
the log replayed through the pure core on changed pools; reads only.

    POST   /v1/pools/whatif                  {from, to, pools?, policy?, pool?}

Refusals are `{code, field, message, hint}`: 401 without a valid token, 403
without the platform_admin role (what-if: sre or platform_admin), 404 unknown
pool or node, 409 a node that exists or is busy and a pool that kept changing,
400 a malformed request (including a spot change of a subscription pool or of
more nodes than the pool has, and a what-if past its bounds).

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(...)` when it reads the handlers' signatures.)
"""

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest
from runyard.api.inputs import check_request_id, reject_unstorable
from runyard.api.responses import NO_BODY, AnswerRoute, refusals
from runyard.api.security import Authenticator, TokenAuthenticator, caller_dependency
from runyard.api.service import ReadyProbe, service_app
from runyard.contracts import http as wire
from runyard.contracts.pool_events import GPUS_PER_NODE
from runyard.eventstore import EventStore, PostgresEventStore
from runyard.scheduler import admin
from runyard.scheduler.admin import AdminResult
from runyard.scheduler.rebuild import rebuild_router
from runyard.scheduler.replay import pools_replay_router, task_tenants
from runyard.scheduler.views import read_queue_entries
from runyard.scheduler.whatif import whatif_router

#: The most task ids one queue request may name (a page of the gateway's listing is 200).
MAX_QUEUE_TASKS = 500
#: Paths whose JSON answer says the instance's role ("active" or "standby").
ROLE_PATHS = frozenset({"/healthz", "/readyz"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddNode(_Body):
    """A node to add: its name and GPUs (8 unless said)."""

    node: str = Field(min_length=1, max_length=128, pattern=r"^[^/]+$")
    gpus: int = Field(default=GPUS_PER_NODE, ge=1, le=GPUS_PER_NODE)


class Fault(_Body):
    """Why the node is faulty (shown on the node and in the event)."""

    reason: str = Field(min_length=1, max_length=1000)


#: The document says what the handler checks: exactly one of `remove` and `add`.
_ONE_OF_REMOVE_ADD: JsonDict = {
    "oneOf": [
        {
            "required": ["remove"],
            "properties": {"remove": {"type": "integer"}, "add": {"type": "null"}},
        },
        {
            "required": ["add"],
            "properties": {"add": {"type": "array"}, "remove": {"type": "null"}},
        },
    ]
}


class SpotChange(_Body):
    """Either `remove` n nodes (preempting spot tasks as needed) or `add` named nodes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_ONE_OF_REMOVE_ADD)

    remove: int | None = Field(default=None, ge=1, le=10_000)
    add: list[Annotated[str, Field(max_length=128)]] | None = Field(
        default=None, min_length=1, max_length=1000
    )
    gpus_per_node: int = Field(default=GPUS_PER_NODE, ge=1, le=GPUS_PER_NODE)
    reason: str = Field(default="spot capacity changed by an admin", min_length=1, max_length=1000)


def http_app(
    store: PostgresEventStore, *, role: Callable[[], str], ready: ReadyProbe | None = None
) -> FastAPI:
    """The scheduler's HTTP face: health and readiness (with the instance's `role`),
    metrics, the pool admin routes and the queue route; callers are checked against
    the tokens table."""
    authenticator = TokenAuthenticator(store.pool)
    routers = [
        admin_pools_router(store, authenticator),
        queue_router(store.pool, authenticator),
        pools_replay_router(store, authenticator),
        whatif_router(store, authenticator),
        rebuild_router(store, authenticator),
    ]
    app = service_app("scheduler", routers=routers, ready=ready)
    app.middleware("http")(_with_role(role))
    return app


Next = Callable[[Request], Awaitable[Response]]


def _with_role(role: Callable[[], str]) -> Callable[[Request, Next], Awaitable[Response]]:
    """A middleware adding `role` to the JSON answers of /healthz and /readyz."""

    async def middleware(request: Request, call_next: Next) -> Response:
        response = await call_next(request)
        if request.url.path not in ROLE_PATHS:
            return response
        body = b"".join([chunk async for chunk in response.body_iterator])  # type: ignore[attr-defined]
        document = {**json.loads(body), "role": role()}
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return Response(
            json.dumps(document),
            status_code=response.status_code,
            headers=headers,
            media_type="application/json",
        )

    return middleware


def admin_pools_router(store: EventStore, authenticator: Authenticator) -> APIRouter:
    """The pool admin routes over `store`, callers checked by `authenticator`."""
    Caller = Annotated[Principal, caller_dependency(authenticator)]

    async def admin_caller(
        caller: Caller, x_request_id: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Who acts, as the admin decisions take it (403 unless a platform admin)."""
        caller.require_platform_admin()
        check_request_id(x_request_id)
        return {"actor": caller.actor, "request_id": x_request_id or str(uuid.uuid4())}

    Who = Annotated[dict[str, Any], Depends(admin_caller)]
    router = APIRouter(prefix="/v1/admin/pools/{pool_id}", tags=["admin"], route_class=AnswerRoute)
    ADMIN = refusals(403, 404, 409)

    @router.post("/nodes", status_code=201, response_model=wire.PoolChange, responses=ADMIN)
    async def add_node(who: Who, pool_id: str, body: AddNode) -> dict[str, Any]:
        """Admin: add a healthy node with every GPU free; the scheduler re-plans."""
        return await _answer(admin.add_node(store, pool_id, body.node, body.gpus, **who))

    @router.delete("/nodes/{node}", response_model=wire.PoolChange, responses=ADMIN)
    async def remove_node(who: Who, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: remove an idle node (409 while workers run on it)."""
        return await _answer(admin.remove_node(store, pool_id, node, **who))

    @router.post(
        "/nodes/{node}/cordon",
        openapi_extra=NO_BODY,
        response_model=wire.PoolChange,
        responses=ADMIN,
    )
    async def cordon_node(who: Who, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: no new workers go to the node; running ones stay."""
        return await _answer(admin.cordon_node(store, pool_id, node, **who))

    @router.post(
        "/nodes/{node}/uncordon",
        openapi_extra=NO_BODY,
        response_model=wire.PoolChange,
        responses=ADMIN,
    )
    async def uncordon_node(who: Who, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: the node takes new workers again."""
        return await _answer(admin.uncordon_node(store, pool_id, node, **who))

    @router.post("/nodes/{node}/fault", response_model=wire.PoolChange, responses=ADMIN)
    async def mark_faulty(who: Who, pool_id: str, node: str, body: Fault) -> dict[str, Any]:
        """Admin: the node has a hardware fault (also how tests inject faults)."""
        return await _answer(admin.mark_node_faulty(store, pool_id, node, body.reason, **who))

    @router.post(
        "/nodes/{node}/heal",
        openapi_extra=NO_BODY,
        response_model=wire.PoolChange,
        responses=ADMIN,
    )
    async def mark_healthy(who: Who, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: the node was repaired and takes new workers again."""
        return await _answer(admin.mark_node_healthy(store, pool_id, node, **who))

    @router.post("/spot-capacity", response_model=wire.PoolChange, responses=ADMIN)
    async def spot_capacity(who: Who, pool_id: str, body: SpotChange) -> dict[str, Any]:
        """Admin: shrink a spot pool by `remove` nodes (preempting and requeueing spot
        tasks, lowest priority and newest first) or grow it by the `add` nodes."""
        if (body.remove is None) == (body.add is None):
            raise BadRequest(
                "request.invalid",
                "give exactly one of `remove` (a number of nodes) and `add` (node names)",
                'e.g. {"remove": 2} or {"add": ["s-9"]}',
                "remove",
            )
        change = admin.change_spot_capacity(
            store,
            pool_id,
            remove=body.remove or 0,
            add=tuple(body.add or ()),
            gpus_per_node=body.gpus_per_node,
            reason=body.reason,
            **who,
        )
        return await _answer(change)

    return router


def queue_router(db: asyncpg.Pool, authenticator: Authenticator) -> APIRouter:
    """GET /v1/internal/queue: where waiting tasks stand (see the module docstring)."""
    Caller = Annotated[Principal, caller_dependency(authenticator)]
    router = APIRouter(tags=["internal"])

    @router.get("/v1/internal/queue")
    async def queue_entries(
        caller: Caller,
        task_id: Annotated[list[str], Query(max_length=128)] = [],  # noqa: B006 - FastAPI
    ) -> dict[str, Any]:
        """The queue entries of the named tasks the caller may read, by task id."""
        if len(task_id) > MAX_QUEUE_TASKS:
            raise BadRequest(
                "request.invalid",
                f"task_id: {len(task_id)} given, at most {MAX_QUEUE_TASKS} are allowed",
                "ask for fewer tasks at a time",
                "task_id",
            )
        for one in task_id:
            reject_unstorable(one, "task_id")
        entries = await read_queue_entries(db, task_id)
        tenants = await task_tenants(db, list(entries))
        visible = {
            task: entry
            for task, entry in entries.items()
            if task in tenants and caller.may_read_tenant(tenants[task])
        }
        return {"entries": visible}

    return router


async def _answer(operation: Awaitable[AdminResult]) -> dict[str, Any]:
    """The admin operation's result as answered (a refusal is a `RunyardError`: the
    edge answers it with its status, code, field and hint)."""
    return (await operation).to_dict()
