"""The gateway routes the log and notification services' routes to them: each
service a uvicorn app on a real port (real Postgres), as in production.

The gateway authenticates first (no token: 401, the owner never called), then
forwards the request unchanged and streams the answer back; the owner checks
the tenant itself (another tenant's task: its 404). An owner that is down is a
503 with Retry-After naming it. The gateway's OpenAPI document lists the
routed routes, and its gRPC server answers the standard health and reflection
services.

The helpers here (`serving`, `log_service`, `notification_service`) are what
the other tests of these routes start their owners with.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import pytest
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from runyard.api.auth import authenticate, create_token, mark_revoked
from runyard.api.inputs import MAX_BODY_BYTES
from runyard.api.service import serve_service
from runyard.contracts import default_mapper
from runyard.eventstore import PostgresEventStore
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.http import create_app
from runyard.logs import LogStore
from runyard.logs.http import LogApi
from runyard.logs.main import http_app as logs_app
from runyard.notification.app import NotificationApp, NotificationConfig
from runyard.notification.main import http_app as notification_app
from runyard.stack.ports import free_port

from tests.integration.test_gateway import BASE, config_dir
from tests.log_records import log_record

pytestmark = pytest.mark.integration

HOOK = "https://open.feishu.cn/open-apis/bot/v2/hook/0123456789abcdef"


# --- helpers: owners on real ports ---------------------------------------------------


@asynccontextmanager
async def serving(name: str, app: FastAPI, endpoints: dict[str, str]) -> AsyncIterator[str]:
    """`app` served as service `name` on an ephemeral port (its URL in `endpoints`)."""
    task = asyncio.create_task(serve_service(name, app, settings={}, endpoints=endpoints))
    try:
        while name not in endpoints:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield endpoints[name]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def count_requests(app: FastAPI) -> list[str]:
    """The paths `app` is asked for, in order (a middleware added before it serves)."""
    seen: list[str] = []

    @app.middleware("http")
    async def count(request: HttpRequest, call_next: Any) -> Any:
        seen.append(request.url.path)
        return await call_next(request)

    return seen


@dataclass
class LogService:
    api: LogApi
    store: LogStore
    url: str
    calls: list[str] = field(default_factory=list)


#: The platform's service credential as the log service of these tests knows it.
SERVICE_TOKEN = "runyard-tests-service-credential"


@asynccontextmanager
async def log_service(
    dsn: str,
    export_dir: Path,
    endpoints: dict[str, str],
    *,
    follow_poll_s: float = 0.05,
    follow_auth_every_s: float = 0.5,
) -> AsyncIterator[LogService]:
    """The log service's HTTP face on a real port (its tables migrated, as at its start);
    a live tail looks its token up again every `follow_auth_every_s`."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    store = LogStore(pool)
    await store.migrate()
    events = PostgresEventStore(pool, default_mapper())
    api = LogApi(
        events,
        store,
        export_dir,
        follow_poll_s=follow_poll_s,
        follow_auth_every_s=follow_auth_every_s,
    )
    await api.recover()
    app = logs_app(api, pool, SERVICE_TOKEN)
    calls = count_requests(app)
    try:
        async with serving("logs", app, endpoints) as url:
            yield LogService(api, store, url, calls)
    finally:
        await api.close()
        await pool.close()


@asynccontextmanager
async def notification_service(
    dsn: str, config: Path, endpoints: dict[str, str]
) -> AsyncIterator[list[str]]:
    """The notification service's HTTP face on a real port; yields the paths it was asked."""
    store = await PostgresEventStore.connect(dsn, default_mapper(), min_size=1, max_size=4)
    service = NotificationApp(store, NotificationConfig())
    try:
        await service.start()
        app = notification_app(service, config)
        calls = count_requests(app)
        async with serving("notification", app, endpoints):
            yield calls
    finally:
        await service.close()
        await store.close()


def closed_port_url() -> str:
    """A URL nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


# --- the stack of this test ----------------------------------------------------------


@dataclass
class Stack:
    gateway: Gateway
    http: httpx.AsyncClient
    tokens: dict[str, str]
    endpoints: dict[str, str]
    logs: LogService
    notification_calls: list[str]
    task_id: str
    grpc_port: int

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


@pytest.fixture
async def stack(dsn: str, tmp_path: Path) -> AsyncIterator[Stack]:
    config = config_dir(tmp_path)
    gateway = await Gateway.connect(dsn, config)
    tokens = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "carol": await create_token(gateway.db, "t2", "carol", "member"),
    }
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    server, grpc_port = await start_server(gateway, "127.0.0.1", 0, owners=app.state.owners)
    try:
        async with (
            log_service(dsn, tmp_path / "exports", endpoints) as logs,
            notification_service(dsn, config, endpoints) as notified,
            serving("gateway", app, {}) as url,
            httpx.AsyncClient(base_url=url) as http,
        ):
            created = await http.post("/v1/tasks", json=BASE, headers=auth(tokens["alice"]))
            assert created.status_code == 201, created.text
            task_id = created.json()["task_id"]
            yield Stack(gateway, http, tokens, endpoints, logs, notified, task_id, grpc_port)
    finally:
        await server.stop(grace=None)
        await app.state.owners.aclose()
        await gateway.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


#: Line numbers as the deployer gives them: each line of a worker's file its own.
_SEQ = itertools.count()


async def ingest(store: LogStore, task_id: str, *texts: str) -> None:
    now = datetime.now(UTC)
    await store.ingest([log_record(now, task_id, text, seq=next(_SEQ)) for text in texts])


# --- routing -------------------------------------------------------------------------


async def test_a_routed_search_answers_as_the_log_service_does(stack: Stack) -> None:
    await ingest(stack.logs.store, stack.task_id, "epoch 1 loss=2.3", "epoch 2 loss=1.9")
    path = f"/v1/tasks/{stack.task_id}/logs"
    routed = await stack.http.get(path, params={"words": "loss"}, headers=stack.auth("alice"))
    assert routed.status_code == 200, routed.text
    assert [ln["line"] for ln in routed.json()["lines"]] == ["epoch 1 loss=2.3", "epoch 2 loss=1.9"]
    async with httpx.AsyncClient(base_url=stack.logs.url) as direct:
        owner = await direct.get(path, params={"words": "loss"}, headers=stack.auth("alice"))
    assert routed.json() == owner.json()
    request_id = {"X-Request-Id": "req-routed-1"}
    refused = await stack.http.get(
        path, params={"regex": "("}, headers=stack.auth("alice") | request_id
    )
    assert refused.status_code == 400 and refused.json()["field"] == "regex", refused.text


async def test_another_tenants_token_gets_the_owners_404(stack: Stack) -> None:
    answer = await stack.http.get(f"/v1/tasks/{stack.task_id}/logs", headers=stack.auth("carol"))
    assert answer.status_code == 404, answer.text
    assert answer.json()["code"] == "task_not_found"
    assert stack.logs.calls == [f"/v1/tasks/{stack.task_id}/logs"]  # the owner said so


async def test_no_token_is_refused_at_the_gateway(stack: Stack) -> None:
    for path in (f"/v1/tasks/{stack.task_id}/logs", "/v1/exports", "/v1/alert-subscriptions"):
        answer = await stack.http.get(path)
        assert answer.status_code == 401, answer.text
        assert answer.json()["code"] == "auth.missing_token"
        forged = await stack.http.get(path, headers=auth("ry_not-a-token"))
        assert forged.status_code == 401, forged.text
    assert stack.logs.calls == [] and stack.notification_calls == []


async def test_a_body_over_the_limit_is_refused_at_the_gateway(stack: Stack) -> None:
    body = {"webhook_url": HOOK, "secret": "x" * (MAX_BODY_BYTES + 1)}
    answer = await stack.http.post(
        "/v1/alert-subscriptions", json=body, headers=stack.auth("alice")
    )
    assert answer.status_code == 413, answer.text
    assert stack.notification_calls == []


async def test_subscriptions_are_routed_to_the_notification_service(stack: Stack) -> None:
    body = {"webhook_url": HOOK, "alerts": ["failed"], "secret": "top-secret-42"}
    created = await stack.http.post(
        "/v1/alert-subscriptions", json=body, headers=stack.auth("alice")
    )
    assert created.status_code == 201, created.text
    listed = await stack.http.get("/v1/alert-subscriptions", headers=stack.auth("alice"))
    assert [s["id"] for s in listed.json()["items"]] == [created.json()["id"]]
    others = await stack.http.get("/v1/alert-subscriptions", headers=stack.auth("carol"))
    assert others.json()["items"] == []
    assert stack.notification_calls == ["/v1/alert-subscriptions"] * 3


async def test_an_owner_that_is_down_is_a_503_naming_it(stack: Stack) -> None:
    stack.endpoints["notification"] = closed_port_url()
    answer = await stack.http.get("/v1/alert-subscriptions", headers=stack.auth("alice"))
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "2"
    body = answer.json()
    assert body["code"] == "service.unavailable"
    assert body["message"].startswith("the notification service is not reachable: "), body
    assert "notification service" in body["hint"]
    # an owner not known at all (not started yet)
    del stack.endpoints["notification"]
    unknown = await stack.http.get("/v1/alert-subscriptions", headers=stack.auth("alice"))
    assert unknown.status_code == 503 and "Retry-After" in unknown.headers
    # the rest of the API answers meanwhile
    logs = await stack.http.get(f"/v1/tasks/{stack.task_id}/logs", headers=stack.auth("alice"))
    assert logs.status_code == 200
    task = await stack.http.get(f"/v1/tasks/{stack.task_id}", headers=stack.auth("alice"))
    assert task.status_code == 200


async def test_follow_streams_lines_through_the_gateway(stack: Stack) -> None:
    await ingest(stack.logs.store, stack.task_id, "first line")
    path = f"/v1/tasks/{stack.task_id}/logs/follow"
    pages: list[dict[str, Any]] = []
    async with stack.http.stream("GET", path, headers=stack.auth("alice")) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        lines = answer.aiter_lines()
        pages.append(json.loads(await anext(lines)))
        await ingest(stack.logs.store, stack.task_id, "second line")
        pages.append(json.loads(await anext(lines)))
        stopped = await stack.http.post(
            f"/v1/tasks/{stack.task_id}/stop", headers=stack.auth("alice")
        )
        assert stopped.json()["status"] == "stopped", stopped.text
        async for rest in lines:  # the stream ends once the task has ended
            if rest.strip():
                pages.append(json.loads(rest))
    assert [ln["line"] for page in pages for ln in page["lines"]] == ["first line", "second line"]


async def test_a_follow_ends_with_the_refusal_once_its_token_is_revoked(stack: Stack) -> None:
    """A live tail of a task that goes on, over HTTP through the gateway and over gRPC
    `FollowLogs`: its token revoked once the first page came, the tail looks the token
    up again as it goes and ends with the refusal the next request would get (HTTP: a
    last line `{error, status}`; gRPC: `UNAUTHENTICATED`), and is counted closed."""
    await ingest(stack.logs.store, stack.task_id, "first line")
    path = f"/v1/tasks/{stack.task_id}/logs/follow"
    over_http = await create_token(stack.gateway.db, "t1", "dave", "member")
    over_grpc = await create_token(stack.gateway.db, "t1", "erin", "member")
    metadata = (("authorization", f"Bearer {over_grpc}"),)
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel,
        stack.http.stream("GET", path, headers=auth(over_http)) as answer,
        asyncio.timeout(30),
    ):
        assert answer.status_code == 200
        lines = answer.aiter_lines()
        first = json.loads(await anext(lines))
        assert [ln["line"] for ln in first["lines"]] == ["first line"]
        follow = pb_grpc.TasksStub(channel).FollowLogs(
            pb.FollowLogsRequest(task_id=stack.task_id), metadata=metadata
        )
        assert [ln.line for ln in (await follow.read()).lines] == ["first line"]
        for token in (over_http, over_grpc):
            principal = await authenticate(stack.gateway.db, token)
            async with stack.gateway.db.acquire() as conn:
                assert await mark_revoked(conn, principal.token_id, "user:t1/admin")
        rest = [json.loads(line) async for line in lines if line.strip()]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while await follow.read() is not grpc.aio.EOF:
                pass
    assert rest[-1]["status"] == 401, rest
    assert rest[-1]["error"]["code"] == "auth.token_revoked", rest
    assert rest[-1]["error"]["hint"] == "ask an admin for a new token"
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ended.value.details() == "this token was revoked"
    async with asyncio.timeout(30):
        while stack.logs.api.follows.open or stack.gateway.streams.open:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_grpc_follow_and_search_call_the_log_service(stack: Stack) -> None:
    await ingest(stack.logs.store, stack.task_id, "hello over grpc")
    metadata = (("authorization", f"Bearer {stack.tokens['alice']}"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        tasks = pb_grpc.TasksStub(channel)
        page = await tasks.SearchLogs(
            pb.SearchLogsRequest(task_id=stack.task_id), metadata=metadata
        )
        assert [ln.line for ln in page.lines] == ["hello over grpc"]
        follow = tasks.FollowLogs(pb.FollowLogsRequest(task_id=stack.task_id), metadata=metadata)
        first = await follow.read()
        assert [ln.line for ln in first.lines] == ["hello over grpc"]
        follow.cancel()
        carol = (("authorization", f"Bearer {stack.tokens['carol']}"),)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await tasks.SearchLogs(pb.SearchLogsRequest(task_id=stack.task_id), metadata=carol)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        stack.endpoints["logs"] = closed_port_url()
        with pytest.raises(grpc.aio.AioRpcError) as down:
            await tasks.SearchLogs(pb.SearchLogsRequest(task_id=stack.task_id), metadata=metadata)
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the log service is not reachable" in (down.value.details() or "")


async def test_the_openapi_document_lists_the_routed_routes(stack: Stack) -> None:
    document = (await stack.http.get("/openapi.json")).json()
    paths = document["paths"]
    for path in (
        "/v1/tasks/{task_id}/logs",
        "/v1/tasks/{task_id}/logs/follow",
        "/v1/tasks/{task_id}/first-error",
        "/v1/tasks/{task_id}/logs/exports",
        "/v1/exports/{export_id}/file",
        "/v1/alert-subscriptions",
        "/v1/alert-subscriptions/{sub_id}",
        "/v1/tasks/{task_id}",  # the gateway's own
    ):
        assert path in paths, sorted(paths)
    assert "/healthz" not in paths
    body = paths["/v1/alert-subscriptions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].split("/")[-1] in document["components"]["schemas"]


async def test_openapi_adds_an_owner_once_it_answers(dsn: str, tmp_path: Path) -> None:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    endpoints = {"logs": closed_port_url()}
    app = create_app(gateway, endpoints)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            before = (await http.get("/openapi.json")).json()["paths"]
            assert "/v1/tasks/{task_id}/logs" not in before and "/v1/tasks" in before
            async with log_service(dsn, tmp_path / "exports", endpoints):
                after = (await http.get("/openapi.json")).json()["paths"]
            assert "/v1/tasks/{task_id}/logs" in after
    finally:
        await app.state.owners.aclose()
        await gateway.close()


# --- gRPC health and reflection ----------------------------------------------------


async def test_grpc_health_and_reflection(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        checks = health_pb2_grpc.HealthStub(channel)
        for service in ("", "runyard.v1.Tasks"):
            answer = await checks.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await checks.Check(health_pb2.HealthCheckRequest(service="no.Such"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        names: list[str] = []
        async for reply in stub.ServerReflectionInfo(iter([request])):
            names += [s.name for s in reply.list_services_response.service]
        assert {"runyard.v1.Tasks", "grpc.health.v1.Health"} <= set(names), names
        symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol="runyard.v1.Tasks")
        async for reply in stub.ServerReflectionInfo(iter([symbol])):
            assert reply.file_descriptor_response.file_descriptor_proto
