"""Every edge answers an error the same way: one root (`runyard.errors.RunyardError`),
translated once per edge (`runyard.api.service.install_error_handlers` for HTTP,
`runyard.api.grpc_errors` for gRPC).

- A store outage in the middle of a request is a 503 with Retry-After over HTTP
  and UNAVAILABLE over gRPC, whichever store it hit (the gateway's own, or the
  submission service's behind the gateway's internal gRPC call), never a 500;
  its answer names no host, user or password; the same request is answered
  again once the store is back.
- A refusal of the task domain keeps its code and hint on both edges, raised in
  the gateway or in the submission service.
- An unexpected exception is a bare 500 over HTTP and INTERNAL over gRPC, whose
  text says nothing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import APIRouter
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from runyard.api.auth import create_token
from runyard.api.errors import BadRequest
from runyard.api.grpc_errors import abort, error_info, error_of_rpc, status_of_rpc
from runyard.api.service import service_app
from runyard.contracts.spec import TaskSpec
from runyard.domain import DomainError, TaskAlreadyFinished, TaskNotFound
from runyard.errors import RunyardError
from runyard.eventstore import (
    ConcurrencyError,
    DuplicateEventError,
    EventStoreError,
    EventTooLarge,
    StoreUnavailable,
)
from runyard.gateway import grpc_convert as convert
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.http import create_app
from runyard.logs.errors import ExportNotFound, InvalidQuery, LogError
from runyard.notification.subscriptions import SubscriptionError, SubscriptionNotFound
from runyard.scheduler.domain import NoCapacity, SchedulerError
from runyard.scheduler.errors import ConflictPersisted, SchedulerServiceError, UnknownPool
from runyard.submission.errors import ErrorCode, GroupItemError, SubmissionError

from tests.integration.test_deployer_faults import Proxy
from tests.integration.test_gateway import BASE, config_dir
from tests.submission_beside import submission_beside

pytestmark = pytest.mark.integration

#: What an outage's driver error may say, which no answer may repeat.
SECRET = "s3cret"
DRIVER_TEXT = f"cannot reach Postgres at postgres://runyard:{SECRET}@db.internal:5432/runyard"


# --- the root -----------------------------------------------------------------------------


def test_every_error_family_derives_from_the_root() -> None:
    for family in (
        DomainError,
        EventStoreError,
        BadRequest,
        LogError,
        SchedulerError,
        SchedulerServiceError,
        SubmissionError,
        SubscriptionError,
    ):
        assert issubclass(family, RunyardError), family
    assert issubclass(SubmissionError, ValueError)  # callers that catch ValueError still do
    assert issubclass(UnknownPool, KeyError)


def test_errors_say_how_each_edge_answers_them() -> None:
    outage = StoreUnavailable(DRIVER_TEXT)
    assert (outage.code, outage.http_status, outage.grpc_status, outage.retryable) == (
        "service.unavailable",
        503,
        "UNAVAILABLE",
        True,
    )
    assert outage.headers == {"Retry-After": "2"}
    assert str(outage) == DRIVER_TEXT  # for the log; the answer is `to_dict()`
    assert SECRET not in json.dumps(outage.to_dict())
    conflict = ConcurrencyError("task-1", 3, 4)
    assert (conflict.code, conflict.http_status, conflict.grpc_status, conflict.retryable) == (
        "conflict",
        409,
        "ABORTED",
        True,
    )
    too_large = EventTooLarge("task-1", "TaskSubmitted", 10, 5)
    assert (too_large.code, too_large.http_status) == ("event.too_large", 413)
    missing = TaskNotFound("t-1")
    assert (missing.http_status, missing.grpc_status, missing.field) == (
        404,
        "NOT_FOUND",
        "task_id",
    )
    finished = TaskAlreadyFinished("t-1", "succeeded", "stop")
    assert (finished.http_status, finished.grpc_status) == (409, "FAILED_PRECONDITION")
    assert (
        ExportNotFound("logs.export_not_found", "no").http_status,
        InvalidQuery("x", "y").http_status,
    ) == (
        404,
        400,
    )
    assert SubscriptionNotFound("s-1").to_dict()["code"] == "alerts.subscription_not_found"
    assert ConflictPersisted("gave up").retryable and NoCapacity("t", (8,), 0).retryable
    item = GroupItemError(ErrorCode.IMAGE_NOT_FOUND, "items[1].image", "item 1: no", "import", 1)
    assert item.to_dict() == {
        "code": "image.not_found",
        "field": "items[1].image",
        "message": "item 1: no",
        "hint": "import",
        "item": 1,
    }
    assert DuplicateEventError("task-1", ["e"]).http_status == 500  # a fault, not a refusal


# --- the HTTP edge ------------------------------------------------------------------------


def raising(error: Exception) -> Callable[[], Awaitable[None]]:
    async def handler() -> None:
        raise error

    return handler


@pytest.fixture
async def face() -> AsyncIterator[httpx.AsyncClient]:
    """A service's HTTP face whose routes raise one error each."""
    router = APIRouter()
    errors: dict[str, Exception] = {
        "outage": StoreUnavailable(DRIVER_TEXT),
        "refused": TaskAlreadyFinished("t-1", "succeeded", "stop"),
        "query": InvalidQuery("logs.bad_regex", "bad regex", "escape it", "regex"),
        "bug": ValueError(DRIVER_TEXT),
        "fault": DuplicateEventError("task-1", [SECRET]),
    }
    for path, error in errors.items():
        router.add_api_route(f"/{path}", raising(error))
    app = service_app("edges", routers=[router])
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://edges") as client:
        yield client


async def test_http_an_outage_is_503_with_retry_after(face: httpx.AsyncClient) -> None:
    answer = await face.get("/outage")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "2"
    body = answer.json()
    assert (body["code"], body["field"]) == ("service.unavailable", "")
    assert "StoreUnavailable" in body["message"] and body["hint"]
    assert SECRET not in answer.text and "db.internal" not in answer.text


async def test_http_refusals_keep_their_code_field_and_hint(face: httpx.AsyncClient) -> None:
    refused = await face.get("/refused")
    assert refused.status_code == 409
    assert refused.json() == TaskAlreadyFinished("t-1", "succeeded", "stop").to_dict()
    assert "Retry-After" not in refused.headers
    query = await face.get("/query")
    assert (query.status_code, query.json()["code"], query.json()["field"]) == (
        400,
        "logs.bad_regex",
        "regex",
    )


@pytest.mark.parametrize("path", ["/bug", "/fault"])
async def test_http_an_unexpected_error_is_a_bare_500(face: httpx.AsyncClient, path: str) -> None:
    answer = await face.get(path)
    assert answer.status_code == 500
    assert answer.text == "Internal Server Error"
    assert SECRET not in answer.text


# --- the gRPC edge ------------------------------------------------------------------------


class Raising(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # generated, untyped
    """A server whose one method raises `error`, answered by the shared gRPC edge."""

    def __init__(self) -> None:
        self.error: Exception = ValueError("unset")

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            raise self.error
        except Exception as exc:
            await abort(context, exc, "edges")


@pytest.fixture
async def rpc() -> AsyncIterator[tuple[Raising, Callable[[], Awaitable[grpc.aio.AioRpcError]]]]:
    servicer = Raising()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def call() -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.Check(health_pb2.HealthCheckRequest())
            return raised.value

        yield servicer, call
    await server.stop(grace=None)


Rpc = tuple[Raising, Callable[[], Awaitable[grpc.aio.AioRpcError]]]


async def test_grpc_an_outage_is_unavailable(rpc: Rpc) -> None:
    servicer, call = rpc
    servicer.error = StoreUnavailable(DRIVER_TEXT)
    failed = await call()
    assert failed.code() == grpc.StatusCode.UNAVAILABLE
    trailing = dict(failed.trailing_metadata() or ())
    assert (trailing["runyard-code"], trailing["runyard-status"]) == ("service.unavailable", "503")
    assert SECRET not in repr(trailing) and SECRET not in (failed.details() or "")
    again = error_of_rpc(failed)  # what a client of this server raises again
    assert again is not None and (again.http_status, again.code) == (503, "service.unavailable")
    assert again.headers == {"Retry-After": "2"}


async def test_grpc_refusals_keep_their_code_hint_and_extra(rpc: Rpc) -> None:
    servicer, call = rpc
    servicer.error = TaskAlreadyFinished("t-1", "succeeded", "stop")
    failed = await call()
    assert failed.code() == grpc.StatusCode.FAILED_PRECONDITION
    trailing = dict(failed.trailing_metadata() or ())
    assert (trailing["runyard-code"], trailing["runyard-hint"]) == (
        "task_already_finished",
        "rerun or clone the task to run it again",
    )
    assert json.loads(trailing["runyard-error-bin"]) == servicer.error.to_dict()
    servicer.error = GroupItemError(ErrorCode.IMAGE_NOT_FOUND, "items[1].image", "no", "fix", 1)
    again = error_of_rpc(await call())
    assert again is not None and (again.http_status, again.extra) == (400, {"item": 1})
    servicer.error = ConcurrencyError("task-1", 3, 4)
    failed = await call()
    assert failed.code() == grpc.StatusCode.ABORTED
    again = error_of_rpc(failed)
    assert again is not None and again.grpc_status == "ABORTED"  # answered again as it came


@pytest.mark.parametrize("error", [ValueError(DRIVER_TEXT), DuplicateEventError("s", [SECRET])])
async def test_grpc_an_unexpected_error_is_internal(rpc: Rpc, error: Exception) -> None:
    servicer, call = rpc
    servicer.error = error
    failed = await call()
    assert (failed.code(), failed.details()) == (
        grpc.StatusCode.INTERNAL,
        "internal error of edges",
    )
    assert SECRET not in repr(failed.trailing_metadata())
    assert error_of_rpc(failed) is None


# --- the platform: a gateway and a submission service, each store behind a proxy -------


@dataclass
class Edges:
    gateway: Gateway
    http: httpx.AsyncClient
    stub: pb_grpc.TasksStub
    token: str
    gateway_db: Proxy
    submission_db: Proxy

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return await self.http.post(path, json=body, headers=headers)

    async def grpc_error(self, call: Awaitable[Any]) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        return raised.value


@pytest.fixture
async def edges(dsn: str, tmp_path: Path) -> AsyncIterator[Edges]:
    gateway_db, submission_db = Proxy(dsn), Proxy(dsn)
    await gateway_db.restore()
    await submission_db.restore()
    folder = config_dir(tmp_path)
    submission, _ = await submission_beside(submission_db.dsn, folder)
    gateway = await Gateway.connect(gateway_db.dsn, folder, submission=submission)
    token = await create_token(gateway.db, "t1", "alice", "member")
    app = create_app(gateway, {})
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=app.state.owners)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            stub = pb_grpc.TasksStub(channel)
            yield Edges(gateway, client, stub, token, gateway_db, submission_db)
    finally:
        await server.stop(grace=None)
        await app.state.owners.aclose()
        await gateway.close()
        for proxy in (gateway_db, submission_db):
            with contextlib.suppress(Exception):
                await proxy.cut()


@asynccontextmanager
async def outage(proxy: Proxy) -> AsyncIterator[None]:
    """The store behind `proxy` away while the block runs, back after it."""
    await proxy.cut()
    try:
        yield
    finally:
        await proxy.restore()


def assert_outage(answer: httpx.Response, failed: grpc.aio.AioRpcError) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "2"
    assert answer.json()["code"] == "service.unavailable" and answer.json()["hint"]
    assert failed.code() == grpc.StatusCode.UNAVAILABLE, failed
    trailing = dict(failed.trailing_metadata() or ())
    assert (trailing["runyard-code"], trailing["runyard-status"]) == ("service.unavailable", "503")
    for text in (answer.text, failed.details() or "", repr(trailing)):
        assert "127.0.0.1:" not in text and "postgres" not in text.lower()
    status = status_of_rpc(failed)  # the standard details: retry after Retry-After
    assert status is not None
    (retry,) = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    delay = error_details_pb2.RetryInfo()
    retry.Unpack(delay)
    assert delay.retry_delay.seconds == int(answer.headers["Retry-After"])


async def until_answered(edges: Edges, request: Callable[[], Awaitable[httpx.Response]]) -> int:
    """The status of `request` once it is no longer a 503 (the store is back)."""
    for _ in range(100):
        answer = await request()
        if answer.status_code != 503:
            return answer.status_code
        await asyncio.sleep(0.1)
    raise AssertionError("still unavailable 10 s after the store came back")


async def test_an_outage_of_the_submission_services_store_is_503_and_unavailable(
    edges: Edges,
) -> None:
    async with outage(edges.submission_db):
        answer = await edges.post("/v1/tasks", BASE)
        request = pb.CreateTaskRequest(spec=convert.spec_message(TaskSpec.model_validate(BASE)))
        failed = await edges.grpc_error(edges.stub.CreateTask(request, metadata=edges.metadata))
    assert_outage(answer, failed)
    # the submission service answered the outage itself (its store, not its absence)
    assert answer.json()["message"].startswith("the database or the broker cannot be reached")
    assert await until_answered(edges, lambda: edges.post("/v1/tasks", BASE)) == 201


async def test_an_outage_of_the_gateways_store_is_503_and_unavailable(edges: Edges) -> None:
    created = await edges.post("/v1/tasks", BASE)
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    headers = {"Authorization": f"Bearer {edges.token}"}
    async with outage(edges.gateway_db):
        answer = await edges.http.get(f"/v1/tasks/{task_id}", headers=headers)
        failed = await edges.grpc_error(
            edges.stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=edges.metadata)
        )
    assert_outage(answer, failed)
    again = await until_answered(
        edges, lambda: edges.http.get(f"/v1/tasks/{task_id}", headers=headers)
    )
    assert again == 200


async def test_a_domain_refusal_keeps_its_code_and_hint_on_both_edges(edges: Edges) -> None:
    created = await edges.post("/v1/tasks", BASE)
    task_id = created.json()["task_id"]
    # decided by the gateway itself: stopping a task that has stopped
    assert (await edges.post(f"/v1/tasks/{task_id}/stop", {})).status_code == 200
    stop = await edges.post(f"/v1/tasks/{task_id}/stop", {})
    failed = await edges.grpc_error(
        edges.stub.StopTask(pb.StopTaskRequest(task_id=task_id), metadata=edges.metadata)
    )
    assert_same_refusal(stop, failed, 409, grpc.StatusCode.FAILED_PRECONDITION)
    assert stop.json()["code"] == "task_already_finished"
    # decided by the submission service, behind the gateway: rerunning a queued task
    queued = (await edges.post("/v1/tasks", BASE)).json()["task_id"]
    rerun = await edges.post(f"/v1/tasks/{queued}/rerun", {})
    request = pb.RerunTaskRequest(task_id=queued)
    failed = await edges.grpc_error(edges.stub.RerunTask(request, metadata=edges.metadata))
    assert_same_refusal(rerun, failed, 409, grpc.StatusCode.FAILED_PRECONDITION)
    assert (rerun.json()["code"], rerun.json()["hint"]) == (
        "invalid_transition",
        "stop it first, or wait until it finishes",
    )


def assert_same_refusal(
    answer: httpx.Response, failed: grpc.aio.AioRpcError, status: int, code: grpc.StatusCode
) -> None:
    assert answer.status_code == status, answer.text
    assert failed.code() == code, failed
    trailing = dict(failed.trailing_metadata() or ())
    body = answer.json()
    assert (trailing["runyard-code"], trailing["runyard-hint"]) == (body["code"], body["hint"])
    assert json.loads(trailing["runyard-error-bin"]) == body
    assert body["hint"]
    rich = status_of_rpc(failed)
    info = error_info(rich) if rich is not None else None
    assert info is not None and (info.metadata["code"], info.metadata["hint"]) == (
        body["code"],
        body["hint"],
    )


async def test_an_unexpected_error_says_nothing_of_itself_on_either_edge(
    edges: Edges, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError(DRIVER_TEXT)

    monkeypatch.setattr(edges.gateway, "get_task", broken)
    headers = {"Authorization": f"Bearer {edges.token}"}
    answer = await edges.http.get("/v1/tasks/t-1", headers=headers)
    assert (answer.status_code, answer.text) == (500, "Internal Server Error")
    failed = await edges.grpc_error(
        edges.stub.GetTask(pb.GetTaskRequest(task_id="t-1"), metadata=edges.metadata)
    )
    assert (failed.code(), failed.details()) == (
        grpc.StatusCode.INTERNAL,
        "internal error of gateway",
    )
    assert SECRET not in repr(failed.trailing_metadata())
