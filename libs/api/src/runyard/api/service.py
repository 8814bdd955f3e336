"""The HTTP face every service has: health, readiness, metrics, and its own routes.

Each service process serves one small FastAPI application on its own port:

    GET /healthz   200 while the process runs (liveness)
    GET /readyz    200 when its store and broker answer and nothing waits out an
                   outage; 503 with Retry-After and what waits otherwise
    GET /metrics   Prometheus text (OpenTelemetry metrics of this process,
                   `runyard.telemetry.metrics`; docs/metrics.md)

plus the routes of the data it owns (the log service its search and exports,
the notification service its subscriptions, ...). The gateway is the edge: it
authenticates a request and routes it here with the caller's token, and the
routes here authorise it again with the same rules (`runyard.api.security`).

`serve_service` binds the port given by whoever starts the service (a socket
already bound, `<name>_socket` in the settings; else `<name>_port`, else
RUNYARD_SERVICE_PORT, else an ephemeral port), publishes its URL in
`ctx.endpoints[name]`, and serves until cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from runyard.api.errors import DATA_ERRORS, OUTAGE_ERRORS, BadRequest, translate
from runyard.api.inputs import MAX_BODY_BYTES, BodyLimit, body_refused
from runyard.contracts.requests import RequestBody
from runyard.errors import RETRY_AFTER_S, RunyardError
from runyard.eventstore import HEALTH, is_transient
from runyard.telemetry import TracingMiddleware, metrics_text, setup_metrics
from starlette.exceptions import HTTPException as StarletteHTTPException

#: A readiness probe: returns the components that are not ready (name -> seconds
#: down, 0 when unknown); empty when ready. A transient error it raises counts as
#: the service itself not ready.
ReadyProbe = Callable[[], Awaitable[Mapping[str, float]]]

#: How long a server keeps an idle HTTP connection open, in seconds. Longer than
#: any client of Runyard keeps one idle to reuse it (httpx: 5 s), so a server
#: never closes a connection at the moment a client sends its next request on it:
#: that client would read a closed connection (`httpx.ReadError`), and could not
#: safely send a POST again. uvicorn's own default is 5 s, the same as httpx's.
KEEP_ALIVE_S = 65

#: How long a stopping server waits for the answers still being sent (a console's
#: live stream, a client that never reads its answer to the end) before it cuts
#: them, in seconds. Unbounded, one open answer keeps a service from ever stopping.
GRACEFUL_STOP_S = 5


def service_app(
    name: str,
    *,
    routers: Iterable[APIRouter] = (),
    ready: ReadyProbe | None = None,
    metrics: Callable[[], str] | None = None,
) -> FastAPI:
    """The FastAPI application of service `name`: health, readiness, metrics, `routers`.

    It installs the process's metrics (`setup_metrics(name)`, a no-op when the
    service already did) so that /metrics has them; `metrics` replaces their text."""
    setup_metrics(name)
    app = FastAPI(title=f"Runyard {name}", version="1")
    app.add_middleware(TracingMiddleware)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    install_error_handlers(app)
    health_routes(app, name, ready=ready, metrics=metrics)
    for router in routers:
        app.include_router(router)
    return app


def health_routes(
    app: FastAPI,
    name: str,
    *,
    ready: ReadyProbe | None = None,
    metrics: Callable[[], str] | None = None,
) -> None:
    """/healthz, /readyz and /metrics on `app` (no credentials needed, so no error
    texts in the answers: those are in the service's log). /metrics serves
    `metrics()`, by default the process's (`metrics_text`)."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"service": name, "alive": True, "pid": os.getpid()})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        waiting = {component: state["down_s"] for component, state in HEALTH.report().items()}
        if ready is not None:
            try:
                waiting.update(await ready())
            except Exception as exc:
                if not is_transient(exc):
                    raise
                waiting[name] = 0.0
        if not waiting:
            return JSONResponse({"service": name, "ready": True})
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        body = {"service": name, "ready": False, "waiting": waiting}
        return JSONResponse(body, status_code=503, headers=headers)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> PlainTextResponse:
        text = (metrics or metrics_text)()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def install_error_handlers(app: FastAPI) -> None:
    """The HTTP edge's one error translation, on every service's app (the gateway's
    too): a `RunyardError` as `{code, field, message, hint}` with its `http_status`
    (and Retry-After for an outage: a 503, never a 500); a driver error that is an
    outage or a value the database cannot take as `translate` says. Anything else,
    a `RunyardError` of status 500 included, is left to Starlette: a bare 500 whose
    text says nothing of it (the server logs it)."""

    async def typed(_: HttpRequest, exc: Exception) -> JSONResponse:
        error = translate(exc)
        if error is None:  # a fault, not a refusal: the bare 500
            raise exc
        headers = error.headers or None
        return JSONResponse(error.to_dict(), status_code=error.http_status, headers=headers)

    kinds: tuple[type[Exception], ...] = (RunyardError, *DATA_ERRORS, *OUTAGE_ERRORS)
    for kind in kinds:
        app.add_exception_handler(kind, typed)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: HttpRequest, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body it cannot parse; an unknown route or method)
        # in the same shape as every other error.
        code, field, hint = HTTP_ERRORS.get(
            exc.status_code, ("request.refused", "", "see /openapi.json")
        )
        message = str(exc.detail)
        if code == "route.not_found":
            message, hint = _no_route(request, hint)
        body = {"code": code, "field": field, "message": message, "hint": hint}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            return JSONResponse(_not_json(first).to_dict(), status_code=400)
        model = _body_model(request)
        if model is not None and _in_body(first):
            # A body that breaks its model: the model's own refusal (code, field, hint).
            located = [{**e, "loc": tuple(e["loc"][1:])} for e in exc.errors() if _in_body(e)]
            refused = body_refused(model, located)
            return JSONResponse(refused.to_dict(), status_code=400)
        field = ".".join(str(p) for p in first["loc"][1:])
        error = BadRequest(
            "request.invalid",
            f"{field or 'request'}: {first['msg']}",
            "fix the request (see /openapi.json)",
            field,
        )
        return JSONResponse(error.to_dict(), status_code=400)


def _not_json(error: Mapping[str, Any]) -> BadRequest:
    """A body that is not JSON: the field is the body (FastAPI locates the error by the
    character where decoding stopped, which is no field), the message says where."""
    where = error["loc"][-1] if len(error["loc"]) > 1 else None
    why = str((error.get("ctx") or {}).get("error") or "").strip()
    at = f" at character {where}" if isinstance(where, int) else ""
    return BadRequest(
        "request.invalid",
        f"body: not JSON{at}" + (f": {why}" if why else ""),
        HTTP_ERRORS[400][2],
        "body",
    )


def _body_model(request: HttpRequest) -> type[RequestBody] | None:
    """The request body model (`runyard.contracts.requests`) of the route asked, if any."""
    field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, RequestBody) else None


def _in_body(error: Mapping[str, Any]) -> bool:
    """A validation error of the body's content (not of JSON that did not parse)."""
    return tuple(error["loc"][:1]) == ("body",) and error.get("type") != "json_invalid"


def _no_route(request: HttpRequest, hint: str) -> tuple[str, str]:
    """The request no route takes, named (its path cut at 200 characters); a path with an
    empty part (an id left empty: `/v1/tasks//stop`) says so, as gRPC names an empty id."""
    path = request.url.path
    shown = path if len(path) <= 200 else f"{path[:200]}..."
    if "//" in path:
        hint = "a part of the path is empty: give the id that goes there (see /openapi.json)"
    return f"no route takes {request.method} {shown}", hint


HTTP_ERRORS = {
    400: (
        "request.invalid",
        "body",
        "send a JSON object (UTF-8, nested at most 32 levels; docs/limits.md)",
    ),
    404: ("route.not_found", "", "see /openapi.json for the routes"),
    405: ("method.not_allowed", "", "see /openapi.json for the methods of this route"),
}


def bind(name: str, settings: Mapping[str, Any], host: str = "127.0.0.1") -> socket.socket:
    """The listening socket of service `name` (see the module's docstring)."""
    given = settings.get(f"{name}_socket")
    if isinstance(given, socket.socket):
        return given
    port = int(settings.get(f"{name}_port", os.environ.get("RUNYARD_SERVICE_PORT", "0")))
    host = str(settings.get(f"{name}_host", os.environ.get("RUNYARD_SERVICE_HOST", host)))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve_service(
    name: str,
    app: FastAPI,
    *,
    settings: Mapping[str, Any],
    endpoints: dict[str, str],
    log_level: str = "warning",
) -> None:
    """Serve `app` as service `name` until cancelled; its URL is `endpoints[name]`
    meanwhile."""
    given = isinstance(settings.get(f"{name}_socket"), socket.socket)
    sock = bind(name, settings)
    url = endpoints[name] = url_of(sock)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(serving)
    finally:
        # uvicorn closes its sockets cleanly when asked to exit, not when cancelled.
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.gather(serving, return_exceptions=True)
        if endpoints.get(name) == url:
            endpoints.pop(name, None)
        if not given:  # bound here: closed here, whether uvicorn ever took it or not
            sock.close()
