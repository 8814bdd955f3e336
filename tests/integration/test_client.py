"""`runyard.client` against a real gateway served over HTTP (uvicorn, Postgres, the
submission service beside it): the task operations, sync and async, typed answers,
refusals as typed errors, and what is sent again after a 503 or a failed connection.

The sync client runs in a thread: the gateway serves on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import pytest
import uvicorn
from runyard.api.auth import create_token
from runyard.client import (
    ApiError,
    AsyncClient,
    Client,
    GatewayUnreachable,
    NotFound,
    Retry,
    Unavailable,
)
from runyard.contracts.http import Task
from runyard.contracts.requests import RerunChanges
from runyard.domain.errors import TASK_NOT_FOUND_HINT
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.stack.ports import free_port

from tests.integration.test_gateway import BASE, config_dir

Scope = MutableMapping[str, Any]
Asgi = Callable[[Scope, Any, Any], Awaitable[None]]


class Outage:
    """In front of the gateway: answers the next `remaining` requests with the 503 an
    outage gets (the one error body, Retry-After), and counts what reached it."""

    def __init__(self, app: Asgi) -> None:
        self.app = app
        self.remaining = 0
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.seen.append((scope["method"], scope["path"]))
        if self.remaining <= 0:
            return await self.app(scope, receive, send)
        self.remaining -= 1
        body = json.dumps(
            {
                "code": "service.unavailable",
                "field": "",
                "message": "the database or the broker cannot be reached now (test)",
                "hint": "send the request again in 2 s",
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"2")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def serving(app: Asgi) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(app, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


ADMIN_TOKENS: dict[str, str] = {}


@pytest.fixture
async def served(dsn: str, tmp_path: Any) -> AsyncIterator[tuple[str, str, Outage]]:
    """A gateway on a free port behind an `Outage`: (url, a member's token, the outage);
    a platform admin's token in ADMIN_TOKENS[url]."""
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    token = await create_token(gateway.db, "t1", "alice", "member")
    admin = await create_token(gateway.db, "ops", "root", "platform_admin")
    app = create_app(gateway)
    outage = Outage(app)
    try:
        async with serving(outage) as url:
            ADMIN_TOKENS[url] = admin
            yield url, token, outage
    finally:
        await app.state.owners.aclose()
        await gateway.close()


def task_flow(url: str, token: str) -> dict[str, Any]:
    """Create, get, list, stop and rerun with the sync client."""
    with Client(url, token) as runyard:
        created = runyard.create_task({**BASE, "name": "sync"})
        got = runyard.get_task(created.task_id)
        listed = [row.task_id for row in runyard.iter_tasks(limit=1)]
        stopped = runyard.stop_task(created.task_id)
        rerun = runyard.rerun_task(created.task_id, RerunChanges(command="echo again"))
        events = runyard.task_events(created.task_id)
    return {
        "created": created,
        "got": got,
        "listed": listed,
        "stopped": stopped,
        "rerun": rerun,
        "events": events,
    }


async def test_the_sync_client_creates_gets_lists_stops_and_reruns(
    served: tuple[str, str, Outage],
) -> None:
    url, token, _ = served
    flow = await asyncio.to_thread(task_flow, url, token)
    created: Task = flow["created"]
    assert isinstance(created, Task)
    assert created.status in ("new", "queued")
    assert created.spec["command"] == "echo hello" and created.creator == "alice"
    assert flow["got"].task_id == created.task_id
    assert flow["listed"] == [created.task_id]  # followed the cursor: one page of one
    assert flow["stopped"].status == "stopped"
    assert flow["rerun"].run == 2 and flow["rerun"].spec["command"] == "echo again"
    assert "TaskRerunRequested" in [e.type for e in flow["events"]]


async def test_the_async_client_does_the_same(served: tuple[str, str, Outage]) -> None:
    url, token, _ = served
    async with AsyncClient(url, token) as runyard:
        created = await runyard.create_task({**BASE, "name": "async"})
        assert (await runyard.get_task(created.task_id)).name == "async"
        page = await runyard.list_tasks(name="async")
        assert [row.task_id for row in page.items] == [created.task_id]
        assert [row.task_id async for row in runyard.iter_tasks(name="async")] == [created.task_id]
        stopped = await runyard.stop_task(created.task_id)
        assert stopped.status == "stopped"
        rerun = await runyard.rerun_task(created.task_id, {"image": "bash-only"})
        assert rerun.run == 2 and rerun.spec["image"] == "bash-only"


async def test_a_refusal_is_a_typed_error_with_the_api_body(
    served: tuple[str, str, Outage],
) -> None:
    url, token, _ = served
    async with AsyncClient(url, token) as runyard:
        with pytest.raises(NotFound) as found:
            await runyard.get_task("no-such-task")
    error = found.value
    assert (error.http_status, error.code) == (404, "task_not_found")
    assert error.field == "task_id" and error.hint == TASK_NOT_FOUND_HINT
    assert not error.retryable


async def test_a_read_is_sent_again_after_a_503_as_retry_after_says(
    served: tuple[str, str, Outage],
) -> None:
    url, token, outage = served
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    async with AsyncClient(url, token, sleep=wait) as runyard:
        created = await runyard.create_task({**BASE, "name": "retried"})
        outage.remaining = 2
        got = await runyard.get_task(created.task_id)
    assert got.task_id == created.task_id
    assert waits == [2.0, 2.0]  # Retry-After, twice
    assert outage.seen[-3:] == [("GET", f"/v1/tasks/{created.task_id}")] * 3


async def test_a_create_is_not_sent_again_after_a_503(served: tuple[str, str, Outage]) -> None:
    url, token, outage = served
    outage.remaining = 1
    waits: list[float] = []
    with pytest.raises(Unavailable) as refused:
        await asyncio.to_thread(create_with_sync, url, token, waits)
    assert refused.value.retry_after_s == 2 and refused.value.retryable
    assert waits == [] and outage.seen == [("POST", "/v1/tasks")]


def create_with_sync(url: str, token: str, waits: list[float]) -> Task:
    with Client(url, token, sleep=waits.append) as runyard:
        return runyard.create_task(BASE)


async def moved(scope: Scope, receive: Any, send: Any) -> None:
    """A proxy in front of a gateway that moved to https."""
    location = f"https://gateway.example.com{scope['path']}".encode()
    await send({"type": "http.response.start", "status": 301, "headers": [(b"location", location)]})
    await send({"type": "http.response.body", "body": b""})


async def test_a_redirect_is_a_refusal_saying_what_to_change(
    served: tuple[str, str, Outage],
) -> None:
    """A gateway URL that moved, or an empty id (`/v1/tasks/`, which the gateway redirects
    to the list), is an `ApiError` naming where it points, not an answer read as a model."""
    url, token, _ = served
    async with serving(moved) as proxy, AsyncClient(proxy, token) as runyard:
        with pytest.raises(ApiError) as elsewhere:
            await runyard.list_tasks()
        with pytest.raises(ApiError) as streamed:
            async with runyard.stream("GET", "/v1/tasks/t/watch"):
                pass
    for error in (elsewhere.value, streamed.value):
        assert (error.http_status, error.code) == (301, "client.redirected")
        assert (
            error.hint
            == "set the gateway's URL (--url, RUNYARD_URL) to https://gateway.example.com"
        )
    with pytest.raises(ApiError) as empty:
        await asyncio.to_thread(get_with_sync, url, token, "")
    assert (empty.value.code, empty.value.http_status) == ("client.redirected", 307)
    assert "an empty one" in empty.value.hint


def get_with_sync(url: str, token: str, task_id: str) -> Task:
    with Client(url, token) as runyard:
        return runyard.get_task(task_id)


async def test_a_refused_connection_is_tried_again_then_raised() -> None:
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    retry = Retry(attempts=3, backoff_s=0.25)
    async with AsyncClient(url, "t", retry=retry, sleep=wait) as runyard:
        with pytest.raises(GatewayUnreachable) as failed:
            await runyard.create_task(BASE)  # nothing was sent: a create too
    assert waits == [0.25, 0.5] and not failed.value.sent


async def test_tokens_audit_and_trace_read_as_their_models(
    served: tuple[str, str, Outage],
) -> None:
    url, token, _ = served
    async with AsyncClient(url, ADMIN_TOKENS[url]) as admin:
        issued = await admin.create_token({"tenant": "t1", "user": "dave", "role": "member"})
        assert issued.token and issued.state == "active" and issued.role == "member"
        listed = await admin.list_tokens(tenant="t1")
        assert issued.token_id in [t.token_id for t in listed.items]
        revoked = await admin.revoke_token(issued.token_id)
        assert revoked.state == "revoked" and "token" not in revoked.model_dump()
        async with AsyncClient(url, token) as alice:
            task = await alice.create_task({**BASE, "name": "traced"})
            trace = await alice.task_trace(task.task_id)
        assert trace.of == {"task_id": task.task_id}
        page = await admin.audit_events(task=task.task_id)
        assert [row["type"] for row in page.items][:1] == ["TaskSubmitted"]
