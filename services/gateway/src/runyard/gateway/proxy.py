"""The routes of other services, routed by the gateway (the edge) to their owner.

The log service, the notification service, fault tolerance and the scheduler
(its pool administration) serve the routes of the data they own (`ROUTES`).
For each of them the gateway authenticates the bearer token first (401 before
any owner is called, 403 for a change asked by a read-only role: the answers
the gateway always gave), then forwards the request unchanged (method, path,
query, body, Authorization, X-Request-Id; the trace context continued from the
gateway's span, same trace) to the owner's base URL, looked up in
`endpoints[<owner>]` at each request (in one process the owners publish their
URLs after the gateway has started), and streams the answer back as it comes
(status, headers, body: a log follow stream or an export download is never
held whole). The owner authorises the request again with the same token. A
live stream (a log follow) is one of the caller's tenant's open streams at the
gateway (`runyard.gateway.limits`): past them it is refused before the owner is
called, and it counts until its answer ends, however it ends.
Bodies over the gateway's limit are refused by its `BodyLimit` before they
get here.

An owner that is not known, refuses the connection or does not answer in time
is a 503 with Retry-After, and a hint naming the service (`the log service is
not reachable: ...`): the rest of the API goes on answering.

`Owners` is also the client the gateway's gRPC log methods and its support
bundle call the owners' APIs with, passing the caller's token: one pool of
connections (`httpx.AsyncClient`) per gateway.

The OpenAPI document: the owners' own documents are merged in (their paths of
`ROUTES` and the component schemas these use), fetched from each owner's
/openapi.json when the gateway's document is asked for and kept; an owner that
could not be reached is asked again next time. Merging, rather than declaring
stub routes here, keeps one description of each route (its parameters, bounds
and body are the owner's, who checks them), so the two cannot drift apart;
and a route whose owner has never been reached is not advertised (schemathesis
runs over the document would otherwise only meet 503s).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse
from runyard.api.auth import Principal
from runyard.api.errors import GatewayError, Unavailable, error_of
from runyard.api.responses import refusals
from runyard.api.slots import OpenStreams
from runyard.gateway.limits import CountedStream
from runyard.telemetry import current_trace_context

#: How each owner is named in a hint.
SERVICE_NAMES = {
    "logs": "the log service",
    "notification": "the notification service",
    "faulttolerance": "the fault-tolerance service",
    "scheduler": "the scheduler",
}
#: Seconds to connect to an owner, and to wait for its answer (not for a stream's
#: next part: a live tail may be quiet for long).
CONNECT_TIMEOUT_S = 3.0
ANSWER_TIMEOUT_S = 60.0
#: Headers that describe one connection, not the request or the answer (RFC 9110 7.6.1),
#: and those the server sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
ANSWER_SET_BY_SERVER = frozenset({"date", "server"})


@dataclass(frozen=True)
class Route:
    """A route the gateway routes to `owner` (its path and methods as served there)."""

    path: str
    methods: tuple[str, ...]
    owner: str
    #: A stream (follow, download): no answer timeout.
    stream: bool = False
    #: Changes nothing though it is not a GET (a query with a body): read-only roles may call it.
    reads: bool = False
    #: For operators only (sre, platform_admin), whatever the method (read-model rebuilds).
    operator: bool = False
    #: A live stream that lasts as long as its reader keeps it (a log follow): counted
    #: among the caller's tenant's open streams (`Gateway.streams`).
    live: bool = False


ROUTES: tuple[Route, ...] = (
    Route("/v1/tasks/{task_id}/logs", ("GET",), "logs"),
    Route("/v1/tasks/{task_id}/logs/follow", ("GET",), "logs", stream=True, live=True),
    Route("/v1/tasks/{task_id}/logs/tails", ("GET",), "logs"),
    Route("/v1/tasks/{task_id}/logs/tails/{worker}", ("GET",), "logs"),
    Route("/v1/tasks/{task_id}/first-error", ("GET",), "logs"),
    Route("/v1/tasks/{task_id}/logs/exports", ("POST",), "logs"),
    Route("/v1/exports", ("GET",), "logs"),
    Route("/v1/exports/{export_id}", ("GET",), "logs"),
    Route("/v1/exports/{export_id}/file", ("GET",), "logs", stream=True),
    Route("/v1/alert-subscriptions", ("GET", "POST"), "notification"),
    Route("/v1/alert-subscriptions/{sub_id}", ("DELETE",), "notification"),
    Route("/v1/tasks/{task_id}/ft-log", ("GET",), "faulttolerance"),
    Route("/v1/tasks/{task_id}/stacks", ("GET", "POST"), "faulttolerance"),
    Route("/v1/tasks/{task_id}/stacks/{report_id}", ("GET",), "faulttolerance"),
    Route("/v1/admin/pools/{pool_id}/nodes", ("POST",), "scheduler"),
    Route("/v1/admin/pools/{pool_id}/nodes/{node}", ("DELETE",), "scheduler"),
    Route("/v1/admin/pools/{pool_id}/nodes/{node}/cordon", ("POST",), "scheduler"),
    Route("/v1/admin/pools/{pool_id}/nodes/{node}/uncordon", ("POST",), "scheduler"),
    Route("/v1/admin/pools/{pool_id}/nodes/{node}/fault", ("POST",), "scheduler"),
    Route("/v1/admin/pools/{pool_id}/nodes/{node}/heal", ("POST",), "scheduler"),
    Route("/v1/admin/pools/{pool_id}/spot-capacity", ("POST",), "scheduler"),
    Route("/v1/pools/replay", ("GET",), "scheduler"),
    Route("/v1/pools/whatif", ("POST",), "scheduler", reads=True),
    Route(
        "/v1/admin/scheduler/read-models/{name}/rebuild",
        ("POST", "DELETE"),
        "scheduler",
        operator=True,
    ),
    Route("/v1/admin/scheduler/read-models/{name}/diff", ("GET",), "scheduler", operator=True),
    Route("/v1/admin/scheduler/read-models/{name}/swap", ("POST",), "scheduler", operator=True),
    Route(
        "/v1/admin/notification/read-models/{name}/{action}",
        ("GET", "POST", "DELETE"),
        "notification",
        operator=True,
    ),
)


def _open() -> None:
    """The `close` of an answer that is not counted among the open streams."""


def unreachable(owner: str, reason: str) -> Unavailable:
    """The 503 of an owner the gateway cannot reach now."""
    name = SERVICE_NAMES.get(owner, f"the {owner} service")
    return Unavailable(
        "service.unavailable",
        f"{name} is not reachable: {reason}",
        f"{name} may be restarting: send the request again in {Unavailable.retry_after_s} s;"
        " the rest of the API answers meanwhile",
    )


def why(exc: Exception) -> str:
    """A transport error in a few words: its kind, and its text when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def owner_error(status: int, body: bytes) -> GatewayError:
    """An owner's refusal `{code, field, message, hint}` as a gateway error of its status
    (gRPC answers it by that status)."""
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    fallback = body[:200].decode(errors="replace")
    return error_of(status, {**data, "message": data.get("message") or fallback})


class Owners:
    """The owners' base URLs (read from `endpoints` at each call: it may be filled
    after the gateway starts) and one pooled HTTP client to call them."""

    def __init__(
        self, endpoints: Mapping[str, str], *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.endpoints = endpoints
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:  # made on first use, on the loop that serves
            timeout = httpx.Timeout(ANSWER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
            self._client = httpx.AsyncClient(
                timeout=timeout, transport=self._transport, follow_redirects=False
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def url(self, owner: str) -> str:
        """The owner's base URL; a 503 naming it when none is known."""
        base = self.endpoints.get(owner)
        if not base:
            raise unreachable(owner, "no address is known for it yet")
        return base.rstrip("/")

    async def send(
        self,
        owner: str,
        method: str,
        path: str,
        *,
        params: Any = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """The owner's answer, its body not read yet (close it); a 503 naming the owner
        when it cannot be reached or does not answer in time."""
        timeout = httpx.Timeout(ANSWER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        if stream:
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        request = self.client.build_request(
            method,
            self.url(owner) + path,
            params=params,
            headers=headers,
            content=content,
            timeout=timeout,
        )
        try:
            return await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise unreachable(
                owner, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            ) from exc

    async def call(
        self,
        owner: str,
        method: str,
        path: str,
        *,
        token: str | None,
        params: Any = None,
        body: Any = None,
        request_id: str | None = None,
    ) -> Any:
        """The owner's JSON answer to a call made with the caller's `token`; its
        refusal raised as the gateway's error of the same status and code."""
        headers = caller_headers(token, request_id)
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        answer = await self.send(
            owner, method, path, params=params, headers=headers, content=content
        )
        try:
            data = await answer.aread()
        except httpx.TransportError as exc:
            raise unreachable(owner, type(exc).__name__) from exc
        finally:
            await answer.aclose()
        if answer.status_code >= 400:
            error = owner_error(answer.status_code, data)
            if (wait := answer.headers.get("retry-after", "").strip()).isdigit():
                error.retry_after_s = int(wait)  # as the owner said (`logs.busy`: 429)
            raise error
        return json.loads(data) if data else None

    async def lines(
        self, owner: str, path: str, *, token: str | None, params: Any = None
    ) -> AsyncGenerator[Any, None]:
        """The JSON items of an owner's NDJSON stream, each as it comes (the call is
        made, and a refusal raised, before the first item); a refusal that ended the
        stream once begun, its last item `{error, status}` (a token revoked meanwhile),
        is raised as the gateway's error of that status."""
        answer = await self.send(
            owner, "GET", path, params=params, headers=caller_headers(token), stream=True
        )
        if answer.status_code >= 400:
            try:
                raise owner_error(answer.status_code, await answer.aread())
            finally:
                await answer.aclose()
        return _json_lines(owner, answer)


async def _json_lines(owner: str, answer: httpx.Response) -> AsyncGenerator[Any, None]:
    try:
        async for line in answer.aiter_lines():
            if line.strip():
                item = json.loads(line)
                if isinstance(item, dict) and isinstance(item.get("error"), dict):
                    raise error_of(int(item.get("status") or 400), item["error"])
                yield item
    except httpx.TransportError as exc:
        raise unreachable(owner, f"the stream broke ({type(exc).__name__})") from exc
    finally:
        await answer.aclose()


def caller_headers(token: str | None, request_id: str | None = None) -> dict[str, str]:
    """Headers of a call made for the caller: its token, request id and trace."""
    headers = dict(current_trace_context())
    if token:
        headers["authorization"] = f"Bearer {token}"
    if request_id:
        headers["x-request-id"] = request_id
    return headers


def forwarded_headers(request: HttpRequest) -> dict[str, str]:
    """The request's headers as the owner gets them: all but the connection's, the
    trace continued from the gateway's span (same trace as the caller's)."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    headers.update(current_trace_context())
    return headers


def answer_headers(answer: httpx.Response) -> dict[str, str]:
    drop = HOP_BY_HOP - {"content-length"} | ANSWER_SET_BY_SERVER
    return {k: v for k, v in answer.headers.items() if k.lower() not in drop}


async def forward(
    owners: Owners, route: Route, request: HttpRequest, close: Callable[[], None] = _open
) -> StreamingResponse:
    """Send `request` unchanged to the owner of `route`; stream its answer back. `close`:
    what counts the stream closed once its answer has ended (`OpenStreams.take`)."""
    # The path as sent, still percent-encoded: decoded (`request.url.path`), an id
    # `a%2Fb` sent as `a%252Fb` would reach the owner as `a/b`, another route.
    raw = request.scope.get("raw_path")
    target = raw.decode("latin-1") if raw else request.url.path
    query = request.url.query
    try:
        answer = await owners.send(
            route.owner,
            request.method,
            target + (f"?{query}" if query else ""),
            headers=forwarded_headers(request),
            content=await request.body(),
            stream=route.stream,
        )
    except BaseException:
        close()
        raise
    return OwnerAnswer(answer, route.owner, close)


class OwnerAnswer(CountedStream):
    """An owner's answer streamed back as it comes. The owner's response is closed when
    this one ends, however it ends: sent whole, cut short, or the client gone (and then
    `close` is called: a live stream counted closed)."""

    def __init__(
        self, answer: httpx.Response, owner: str, close: Callable[[], None] = _open
    ) -> None:
        super().__init__(
            _raw(owner, answer),
            close,
            status_code=answer.status_code,
            headers=answer_headers(answer),
        )
        self.answer = answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.answer.aclose()


async def _raw(owner: str, answer: httpx.Response) -> AsyncIterator[bytes]:
    """The answer's bytes as they come (encoded as the owner sent them)."""
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    except httpx.TransportError:
        return  # the owner went away mid-answer: the client sees the answer cut short
    finally:
        await answer.aclose()


def install_routes(
    app: FastAPI,
    owners: Owners,
    authenticate: Any,
    routes: Iterable[Route] = ROUTES,
    *,
    authenticate_reads: Any = None,
    operator: Any = None,
    streams: OpenStreams | None = None,
) -> None:
    """Route each of `routes` to its owner once the caller is authenticated
    (`authenticate`: the gateway's `caller_dependency`; `authenticate_reads`, if given,
    for the routes that only read whatever their method; `operator`, its operator
    variant, for the operator routes). A live route's stream is counted among its
    caller's tenant's `streams` (429 past the limit, before the owner is called).
    `install_openapi` adds their description to the document."""
    for route in routes:
        check = authenticate
        if route.operator and operator is not None:
            check = operator
        elif route.reads and authenticate_reads is not None:
            check = authenticate_reads
        if route.live and streams is not None:
            handler, dependencies = _live_handler(owners, route, streams, check), []
        else:
            handler, dependencies = _handler(owners, route), [check]
        app.add_api_route(
            route.path,
            handler,
            methods=list(route.methods),
            dependencies=dependencies,
            include_in_schema=False,
            name=f"{route.owner}:{route.path}",
        )


def _handler(owners: Owners, route: Route) -> Callable[..., Any]:
    async def routed(request: HttpRequest) -> StreamingResponse:
        return await forward(owners, route, request)

    routed.__doc__ = f"Routed to {SERVICE_NAMES.get(route.owner, route.owner)}."
    return routed


def _live_handler(
    owners: Owners, route: Route, streams: OpenStreams, check: Any
) -> Callable[..., Any]:
    """A routed live stream: the caller's (`check`) tenant takes one of its open streams
    first, counted closed once the answer has ended."""

    async def routed(request: HttpRequest, caller: Principal = check) -> StreamingResponse:
        return await forward(owners, route, request, streams.take(caller.tenant))

    routed.__doc__ = f"Routed to {SERVICE_NAMES.get(route.owner, route.owner)}."
    return routed


# --- the OpenAPI document -----------------------------------------------------------


class OwnerDocuments:
    """The owners' OpenAPI paths of `routes` and the schemas they use, fetched once
    each owner answers."""

    def __init__(self, owners: Owners, routes: Iterable[Route]) -> None:
        self.owners = owners
        self.paths: dict[str, set[str]] = {}
        for route in routes:
            self.paths.setdefault(route.owner, set()).add(route.path)
        self.documents: dict[str, dict[str, Any]] = {}
        self._lock = asyncio.Lock()

    @property
    def missing(self) -> list[str]:
        return [owner for owner in self.paths if owner not in self.documents]

    async def refresh(self) -> bool:
        """Fetch the documents of the owners not fetched yet; whether one was added."""
        async with self._lock:
            fetched = await asyncio.gather(*(self._fetch(o) for o in self.missing))
            return any(fetched)

    async def _fetch(self, owner: str) -> bool:
        try:
            document = await self.owners.call(owner, "GET", "/openapi.json", token=None)
        except GatewayError:
            return False  # not reachable now: asked again next time
        if isinstance(document, dict):
            self.documents[owner] = document
            return True
        return False

    def merge(self, into: dict[str, Any]) -> dict[str, Any]:
        """`into` with the routed paths and their schemas added (the gateway's own win)."""
        merged = copy.deepcopy(into)
        paths = merged.setdefault("paths", {})
        schemas = merged.setdefault("components", {}).setdefault("schemas", {})
        for owner, document in self.documents.items():
            for path, operations in document.get("paths", {}).items():
                if path in self.paths[owner]:
                    paths.setdefault(path, operations)
            for name, schema in document.get("components", {}).get("schemas", {}).items():
                schemas.setdefault(name, schema)
        for path, operations in paths.items():
            routed = any(path in owned for owned in self.paths.values())
            for operation in operations.values():
                declare_refusals(operation, routed=routed)
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        return merged


#: What the gateway itself may answer on a routed route, before or instead of its owner.
EDGE_REFUSALS = refusals(403, 404)
_ERROR_REF = {"$ref": "#/components/schemas/Error"}


def declare_refusals(operation: dict[str, Any], *, routed: bool) -> None:
    """Every refusal of `operation` with the one error body: a routed route's are its
    owner's and the gateway's (401 and 403 before the owner is called, 503 when it
    cannot be reached). FastAPI's 422 is dropped: every service answers a request it
    cannot parse with a 400 of that body (`runyard.api.service`)."""
    responses = operation.setdefault("responses", {})
    if "HTTPValidationError" in json.dumps(responses.get("422", {})):
        del responses["422"]
    if routed:
        for status, answer in EDGE_REFUSALS.items():
            responses.setdefault(str(status), {"description": answer["description"]})
    for status, answer in responses.items():
        if status[0] in "45" and not answer.get("content"):
            answer["content"] = {"application/json": {"schema": _ERROR_REF}}


def install_openapi(app: FastAPI, owners: Owners, routes: Iterable[Route] = ROUTES) -> None:
    """/openapi.json answers the gateway's document with the owners' routed paths
    (install it last: it wraps `app.openapi` as it is then)."""
    documents = OwnerDocuments(owners, routes)
    build: Callable[[], dict[str, Any]] = app.openapi
    merged: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not merged or merged["owners"] != sorted(documents.documents):
            merged["document"] = documents.merge(build())
            merged["owners"] = sorted(documents.documents)
        document: dict[str, Any] = merged["document"]
        return document

    app.openapi = openapi  # type: ignore[method-assign]
    url = app.openapi_url or "/openapi.json"
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != url]

    @app.get(url, include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        if documents.missing:
            await documents.refresh()
        return JSONResponse(app.openapi())
