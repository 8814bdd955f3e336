"""The HTTP JSON API: thin FastAPI handlers over the application layer.

Each handler authenticates the bearer token, calls one `Gateway` method and
returns its answer; every typed error becomes `{code, field, message, hint}`
with its status (see docs/api.md), translated by the edge every service's app
has (`runyard.api.service.install_error_handlers`). The routes of the data other
services own (logs, alert subscriptions, fault tolerance, pool administration)
are authenticated here and routed to their owner (`runyard.gateway.proxy`).
A route's body is a model of `runyard.contracts.requests`: FastAPI reads it (a
body that breaks it is that model's refusal, a 400) and the OpenAPI document,
the routed routes included, is generated from the models; it is served at
/openapi.json.
"""

import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Body, Depends, FastAPI, Header, Query
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest
from runyard.api.inputs import (
    MAX_BODY_BYTES,
    BodyLimit,
    check_param,
    check_request_id,
    reject_unstorable,
)
from runyard.api.responses import NO_BODY, AnswerRoute, refusals
from runyard.api.security import caller_dependency
from runyard.api.service import install_error_handlers
from runyard.contracts import http as wire
from runyard.contracts import requests as bodies
from runyard.errors import RETRY_AFTER_S, RunyardError
from runyard.eventstore import HEALTH, is_transient
from runyard.gateway.app import Gateway, Request
from runyard.gateway.audit import audit_router
from runyard.gateway.bundle import bundle_router
from runyard.gateway.console import console_refusal, install_console
from runyard.gateway.limits import CountedStream
from runyard.gateway.proxy import Owners, install_openapi, install_routes
from runyard.gateway.rebuild import rebuild_router
from runyard.gateway.replay import replay_router
from runyard.gateway.trace import trace_router
from runyard.telemetry import TracingMiddleware, current_trace_context
from runyard.telemetry.metrics import metrics_text

#: The bodies a route may leave out (an empty one: no changes, no overrides).
Changes = Annotated[bodies.RerunChanges, Body(default_factory=bodies.RerunChanges)]
Overrides = Annotated[bodies.SpecOverrides, Body(default_factory=bodies.SpecOverrides)]
TENANT_QUERY = "another tenant (sre and platform_admin only); default: your own"
#: The answer of a watch: server-sent events, each `event: <type>` and `data: <TaskEvent>`.
SSE_ANSWER: dict[str, Any] = {
    "description": "server-sent events: each event of the task (data: a TaskEvent as JSON),"
    " then `event: end` when the task has ended, or `event: error` (data: the Error and its"
    " HTTP `status`) when the caller's token was revoked or expired meanwhile",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
#: From a task's answer to what may be done with it next (OpenAPI links).
TASK_LINKS = {
    name: {"operationId": operation, "parameters": {"task_id": "$response.body#/task_id"}}
    for name, operation in (
        ("GetTask", "getTask"),
        ("StopTask", "stopTask"),
        ("RerunTask", "rerunTask"),
        ("TaskEvents", "taskEvents"),
    )
}
#: Published bounds (the application refuses others with its own hint, as over gRPC).
PageLimit = Annotated[
    int, Query(description="1 to 200", json_schema_extra={"minimum": 1, "maximum": 200})
]


def create_app(gateway: Gateway, owners: Owners | Mapping[str, str] | None = None) -> FastAPI:
    """The FastAPI application over `gateway`. `owners`: where the services that own
    the routed routes answer (`runyard.gateway.proxy`): their `Owners`, or the
    endpoints mapping (name -> base URL, read at each request) to make one of; the
    app's is `app.state.owners` (close it when done)."""
    if not isinstance(owners, Owners):
        owners = Owners(owners if owners is not None else {})
    app = FastAPI(
        title="Runyard gateway",
        version="1",
        dependencies=[Depends(_no_nul_in_url)],
    )
    app.router.route_class = AnswerRoute  # the routes below answer what they built only
    app.state.gateway = gateway
    app.state.owners = owners
    app.add_middleware(TracingMiddleware)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, page=console_refusal)
    install_error_handlers(app)
    _task_routes(app, gateway)
    _group_routes(app, gateway)
    _pool_routes(app, gateway)
    _admin_routes(app, gateway)
    _readiness_route(app, gateway)
    install_routes(
        app,
        owners,
        _principal_dependency(gateway),
        authenticate_reads=caller_dependency(gateway, reads_only=True),
        operator=caller_dependency(gateway, operator=True),
        streams=gateway.streams,
    )
    app.include_router(bundle_router(gateway, owners))
    app.include_router(replay_router(gateway))
    app.include_router(audit_router(gateway))
    app.include_router(trace_router(gateway))
    app.include_router(rebuild_router(gateway))
    install_openapi(app, owners)
    install_console(app, gateway, owners)  # the web console at / (docs/console.md)
    return app


def _readiness_route(app: FastAPI, gw: Gateway) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"service": "gateway", "alive": True, "pid": os.getpid()})

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """200 when the database answers and nothing in this process is waiting out an
        outage; else 503 with Retry-After and the components that wait (no credentials
        needed, so no error texts: those are in the logs)."""
        waiting = {name: state["down_s"] for name, state in HEALTH.report().items()}
        try:
            await gw.db.fetchval("SELECT 1")
        except Exception as exc:
            if not is_transient(exc):
                raise
            waiting["gateway"] = 0.0
        if not waiting:
            return JSONResponse({"ready": True})
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse({"ready": False, "waiting": waiting}, status_code=503, headers=headers)


async def _no_nul_in_url(request: HttpRequest) -> None:
    """Path and query parameters the store cannot hold (NUL, a lone surrogate) or over
    `MAX_PARAM` characters are a 400 naming them, on every route; so is a query
    parameter of one value given more than once (`_one_value_each`)."""
    for params in (request.path_params, request.query_params):
        reject_unstorable(dict(params))
        for name, value in params.items():
            check_param(name, str(value))
    _one_value_each(request)


def _one_value_each(request: HttpRequest) -> None:
    """A query parameter an API route takes one value of, given twice
    (`?status=running&status=failed`), is a 400 naming it: it was read as its last
    value alone, silently. Parameters that take a list (`type` of the audit) may
    repeat; a routed owner's route (`runyard.gateway.proxy`) checks its own."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.url.path.startswith("/v1/"):
        return
    single = _single_query_names(dependant)
    for name in dict.fromkeys(request.query_params.keys()):
        given = request.query_params.getlist(name)
        if name in single and len(given) > 1:
            raise BadRequest(
                "request.invalid",
                f"{name} is given {len(given)} times; it takes one value",
                f"give {name} once; for several, one request for each",
                name,
            )


def _single_query_names(dependant: Any) -> set[str]:
    """The query parameters of a route (its dependencies' too) that take one value."""
    names = {
        field.alias
        for field in dependant.query_params
        if not _takes_many(field.field_info.annotation)
    }
    for inner in dependant.dependencies:
        names |= _single_query_names(inner)
    return names


def _takes_many(annotation: Any) -> bool:
    """Whether a parameter's type is a list (or a set, a tuple), alone or in a union."""
    origin = get_origin(annotation)
    if origin in (list, set, frozenset, tuple, Sequence):
        return True
    if origin is Annotated:
        return _takes_many(get_args(annotation)[0])
    return origin in (Union, UnionType) and any(_takes_many(a) for a in get_args(annotation))


def _principal_dependency(gateway: Gateway) -> Any:
    return caller_dependency(gateway)


def _request_dependency(
    gateway: Gateway, *, body: bool = False, allowed: Callable[[Principal], None] | None = None
) -> Any:
    """The caller's `Request`. `body`: the route takes a body, which is refused (400 naming
    the field) when it holds text the store cannot keep, before its model reads it;
    `allowed`: refuses a caller the route is not for (403) before the body is read."""

    async def request(
        principal: Annotated[Principal, _principal_dependency(gateway)],
        http: HttpRequest,
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> Request:
        check_request_id(x_request_id)
        if allowed is not None:
            allowed(principal)
        if body and await http.body():
            try:
                sent = await http.json()
            except ValueError:
                sent = None  # not JSON: FastAPI refuses it
            reject_unstorable(sent)
        # The request's server span (TracingMiddleware) is the events' parent.
        return Request(principal, x_request_id or str(uuid.uuid4()), current_trace_context())

    return Depends(request)


def _task_routes(app: FastAPI, gw: Gateway) -> None:
    Caller = Annotated[Principal, _principal_dependency(gw)]
    Req = Annotated[Request, _request_dependency(gw)]
    Sent = Annotated[Request, _request_dependency(gw, body=True)]

    @app.post(
        "/v1/tasks",
        operation_id="createTask",
        status_code=201,
        tags=["tasks"],
        response_model=wire.Task,
        responses={**refusals(403, 413, 429), 201: {"links": TASK_LINKS}},
    )
    async def create_task(req: Sent, spec: bodies.TaskSubmission) -> dict[str, Any]:
        """Submit a task spec; answers the task with its warnings."""
        return await gw.create_task(req, spec)

    @app.get(
        "/v1/tasks",
        operation_id="listTasks",
        tags=["tasks"],
        response_model=wire.TaskPage,
        responses=refusals(403),
    )
    async def list_tasks(
        caller: Caller,
        status: wire.TaskStatus | None = None,
        name: str | None = None,
        tag: str | None = None,
        pool: str | None = None,
        creator: str | None = None,
        limit: PageLimit = 50,
        cursor: str | None = None,
        tenant: Annotated[str | None, Query(description=TENANT_QUERY)] = None,
    ) -> dict[str, Any]:
        """The tenant's tasks, newest first; pass `next_cursor` back for the next page."""
        filters = {"status": status, "name": name, "tag": tag, "pool": pool, "creator": creator}
        return await gw.list_tasks(caller, filters, limit, cursor, tenant)

    @app.get(
        "/v1/tasks/{task_id}",
        operation_id="getTask",
        tags=["tasks"],
        response_model=wire.Task,
        responses=refusals(404),
    )
    async def get_task(caller: Caller, task_id: str) -> dict[str, Any]:
        """A task: status, current stage, stage timeline, counters, run."""
        return await gw.get_task(caller, task_id)

    @app.post(
        "/v1/tasks/{task_id}/stop",
        operation_id="stopTask",
        tags=["tasks"],
        response_model=wire.Task,
        responses=refusals(403, 404, 409),
        openapi_extra=NO_BODY,
    )
    async def stop_task(req: Req, task_id: str) -> dict[str, Any]:
        """Ask to stop the task."""
        return await gw.stop_task(req, task_id)

    @app.post(
        "/v1/tasks/{task_id}/rerun",
        operation_id="rerunTask",
        tags=["tasks"],
        response_model=wire.Task,
        responses=refusals(403, 404, 409, 413, 429),
    )
    async def rerun_task(req: Sent, task_id: str, changes: Changes) -> dict[str, Any]:
        """Rerun a finished task; body: changes of command, worker spec/count, image."""
        return await gw.rerun_task(req, task_id, changes)

    @app.post(
        "/v1/tasks/{task_id}/clone",
        operation_id="cloneTask",
        status_code=201,
        tags=["tasks"],
        response_model=wire.Task,
        responses={**refusals(403, 404, 413, 429), 201: {"links": TASK_LINKS}},
    )
    async def clone_task(req: Sent, task_id: str, overrides: Overrides) -> dict[str, Any]:
        """A new task from this one's spec; body: any field overrides, the pool too."""
        return await gw.clone_task(req, task_id, overrides)

    @app.get(
        "/v1/tasks/{task_id}/events",
        operation_id="taskEvents",
        tags=["tasks"],
        response_model=list[wire.TaskEvent],
        responses=refusals(404),
    )
    async def task_events(caller: Caller, task_id: str) -> list[dict[str, Any]]:
        """The audit timeline: each event with its actor and correlation id."""
        return await gw.task_events(caller, task_id)

    @app.get(
        "/v1/tasks/{task_id}/watch",
        tags=["tasks"],
        response_class=StreamingResponse,
        responses={**refusals(404, 429), 200: SSE_ANSWER},
    )
    async def watch_task(caller: Caller, task_id: str) -> StreamingResponse:
        """Server-sent events: the task's events, then new ones until it ends."""
        close = gw.streams.take(caller.tenant)  # 429 past the tenant's open streams
        try:
            stream = gw.watch(caller, task_id)
            first = await anext(stream)  # 404 before the stream starts
        except BaseException:
            close()
            raise
        return CountedStream(_sse(first, stream), close, media_type="text/event-stream")


async def _sse(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """The events, then `end`; a refusal once the stream has begun (the caller's token
    revoked or expired meanwhile) is its last event, `error`: the one error body and the
    HTTP `status` it would have been answered with."""
    yield f"event: {first['type']}\ndata: {json.dumps(first)}\n\n"
    try:
        async for event in rest:
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
    except RunyardError as exc:
        refusal = {**exc.to_dict(), "status": exc.http_status}
        yield f"event: error\ndata: {json.dumps(refusal)}\n\n"
        return
    yield "event: end\ndata: {}\n\n"


def _group_routes(app: FastAPI, gw: Gateway) -> None:
    Caller = Annotated[Principal, _principal_dependency(gw)]
    Req = Annotated[Request, _request_dependency(gw)]
    Sent = Annotated[Request, _request_dependency(gw, body=True)]

    @app.post(
        "/v1/groups",
        status_code=201,
        tags=["groups"],
        response_model=wire.Group,
        responses=refusals(403, 413, 429),
    )
    async def create_group(req: Sent, group: bodies.TaskGroupRequest) -> dict[str, Any]:
        """A task group: body {template: spec, items: [overrides, ...]}; all tasks or none."""
        return await gw.create_group(req, group)

    @app.get("/v1/groups", tags=["groups"], response_model=wire.GroupPage, responses=refusals(403))
    async def list_groups(
        caller: Caller,
        limit: PageLimit = 50,
        tenant: Annotated[str | None, Query(description=TENANT_QUERY)] = None,
        cursor: Annotated[str | None, Query(description="a next_cursor as given")] = None,
    ) -> dict[str, Any]:
        """A page of the tenant's task groups, newest first:
        `{items: [{group_id, tasks, status_counts}], next_cursor}`."""
        return await gw.list_groups(caller, limit, tenant, cursor)

    @app.get(
        "/v1/groups/{group_id}",
        tags=["groups"],
        response_model=wire.Group,
        responses=refusals(403, 404),
    )
    async def get_group(
        caller: Caller,
        group_id: str,
        tenant: Annotated[str | None, Query(description=TENANT_QUERY)] = None,
    ) -> dict[str, Any]:
        """The group's tasks and a count per status."""
        return await gw.get_group(caller, group_id, tenant)

    @app.post(
        "/v1/groups/{group_id}/stop",
        tags=["groups"],
        response_model=wire.Group,
        responses=refusals(403, 404, 409),
        openapi_extra=NO_BODY,
    )
    async def stop_group(req: Req, group_id: str) -> dict[str, Any]:
        """Stop every task of the group that has not ended."""
        return await gw.stop_group(req, group_id)

    @app.post(
        "/v1/groups/{group_id}/rerun",
        tags=["groups"],
        response_model=wire.Group,
        responses=refusals(403, 404, 409, 413, 429),
    )
    async def rerun_group(req: Sent, group_id: str, changes: Changes) -> dict[str, Any]:
        """Rerun every finished task of the group; body: allowed changes for each (optional)."""
        return await gw.rerun_group(req, group_id, changes)


def _pool_routes(app: FastAPI, gw: Gateway) -> None:
    Caller = Annotated[Principal, _principal_dependency(gw)]

    @app.get("/v1/pools", tags=["pools"], response_model=list[wire.Pool], responses=refusals())
    async def pools(caller: Caller) -> list[dict[str, Any]]:
        """Pools with zone, resource type, network and worker specs."""
        return await gw.pools(caller)

    @app.get(
        "/v1/pools/{pool_id}/capacity",
        tags=["pools"],
        response_model=wire.PoolCapacity,
        responses=refusals(404),
    )
    async def pool_capacity(caller: Caller, pool_id: str) -> dict[str, Any]:
        """Launchable count per spec, custom-count maximum, occupancy, queue load."""
        return await gw.pool_capacity(caller, pool_id)


def _admin_routes(app: FastAPI, gw: Gateway) -> None:
    Caller = Annotated[Principal, _principal_dependency(gw)]
    Req = Annotated[Request, _request_dependency(gw)]
    Admin = Annotated[
        Request,
        _request_dependency(gw, body=True, allowed=Principal.require_platform_admin),
    ]
    TokenAdmin = Annotated[
        Request, _request_dependency(gw, body=True, allowed=Principal.require_token_admin)
    ]

    @app.get(
        "/v1/catalogue", tags=["catalogue"], response_model=wire.Catalogue, responses=refusals()
    )
    async def catalogue(caller: Caller) -> dict[str, Any]:
        """Images, volumes and public data the submission rules use."""
        return await gw.catalogue_view(caller)

    @app.post(
        "/v1/admin/images",
        status_code=201,
        tags=["admin"],
        response_model=wire.CatalogueEntry,
        responses=refusals(403, 413),
    )
    async def add_image(req: Admin, entry: bodies.ImageEntry) -> dict[str, Any]:
        """Platform admin: add or replace an image {name, zones, services}."""
        return await gw.add_image(req, entry)

    @app.post(
        "/v1/admin/volumes",
        status_code=201,
        tags=["admin"],
        response_model=wire.CatalogueEntry,
        responses=refusals(403, 413),
    )
    async def add_volume(req: Admin, entry: bodies.VolumeEntry) -> dict[str, Any]:
        """Platform admin: add a volume {file_system, volume, zone}."""
        return await gw.add_volume(req, entry)

    @app.post(
        "/v1/admin/public-data",
        status_code=201,
        tags=["admin"],
        response_model=wire.CatalogueEntry,
        responses=refusals(403, 413),
    )
    async def add_public_data(req: Admin, entry: bodies.PublicDataEntry) -> dict[str, Any]:
        """Platform admin: offer public data in a zone {zone, path?}."""
        return await gw.add_public_data(req, entry)

    @app.post(
        "/v1/admin/tokens",
        status_code=201,
        tags=["admin"],
        response_model=wire.IssuedToken,
        responses=refusals(403, 409, 413),
    )
    async def create_token(req: TokenAdmin, request: bodies.TokenRequest) -> dict[str, Any]:
        """Tenant or platform admin: a token for {tenant, user, role, ttl?, expires_at?,
        description?}; the token is in this answer only (stored hashed)."""
        return await gw.create_token(req, request)

    @app.get(
        "/v1/admin/tokens", tags=["admin"], response_model=wire.TokenPage, responses=refusals(403)
    )
    async def list_tokens(
        caller: Caller,
        tenant: Annotated[str | None, Query(description="platform admin: one tenant")] = None,
        include_revoked: bool = False,
    ) -> dict[str, Any]:
        """Tokens (never their secrets): a tenant admin's tenant, or every tenant."""
        return await gw.list_tokens(caller, tenant, include_revoked)

    @app.delete(
        "/v1/admin/tokens/{token_id}",
        tags=["admin"],
        response_model=wire.TokenInfo,
        responses=refusals(403, 404),
    )
    async def revoke_token(req: Req, token_id: str) -> dict[str, Any]:
        """Revoke a token: refused from its next request on, over HTTP and gRPC."""
        return await gw.revoke_token(req, token_id)
