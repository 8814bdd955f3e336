"""HTTP and gRPC give the same result: one table of scenarios, run through both APIs.

Each scenario gets a `Via` (HTTP or gRPC) and returns an `Outcome`: the gRPC
status name (HTTP statuses mapped: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED,
403 PERMISSION_DENIED, 404 NOT_FOUND, 409 FAILED_PRECONDITION) and the answer
(an error's `{code, field, message, hint}`). Ids and times differ between the
two runs, so they are left out of the comparison.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import grpc
import httpx
import pytest
from google.protobuf import field_mask_pb2
from google.rpc import code_pb2
from runyard.api.auth import create_token
from runyard.api.errors import BadRequest, Conflict, PermissionDenied, Unavailable
from runyard.api.grpc_errors import (
    bad_request,
    error_info,
    error_metadata,
    reason_of,
    rich_status,
    status_of,
    status_of_rpc,
)
from runyard.eventstore import ConcurrencyError
from runyard.gateway import grpc_convert as convert
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.http import create_app
from runyard.logs.http import LogApi

from tests.integration.test_gateway import BASE, config_dir
from tests.integration.test_gateway_routing import log_service
from tests.integration.test_logs import CORPUS, records
from tests.integration.test_logs import T0 as CORPUS_T0

HTTP_STATUS = {
    200: "OK",
    201: "OK",
    202: "OK",
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
}
#: Keys whose values differ between two runs of the same scenario.
VOLATILE = {
    "task_id",
    "group_id",
    "submitted_at",
    "queued_at",
    "started_at",
    "finished_at",
    "occurred_at",
    "created_at",
    "updated_at",
    "position",
    "correlation_id",
    "causation_id",
    "clones",
    "cloned_from",
    "event_id",
    "secret_ref",
    "export_id",
    "message",  # error messages quote the (differing) ids; code/field/hint are compared
}


@dataclass(frozen=True)
class Outcome:
    status: str
    body: Any


class Via(Protocol):
    """One API: every operation the table uses."""

    async def create(self, who: str, spec: dict[str, Any]) -> Outcome: ...
    async def get(self, who: str, task_id: str) -> Outcome: ...
    async def ls(self, who: str, **filters: Any) -> Outcome: ...
    async def stop(self, who: str, task_id: str) -> Outcome: ...
    async def rerun(self, who: str, task_id: str, changes: dict[str, Any]) -> Outcome: ...
    async def clone(self, who: str, task_id: str, overrides: dict[str, Any]) -> Outcome: ...
    async def events(self, who: str, task_id: str) -> Outcome: ...
    async def watch(self, who: str, task_id: str) -> Outcome: ...
    async def capacity(self, who: str, pool_id: str) -> Outcome: ...
    async def group_create(self, who: str, template: Any, items: list[Any]) -> Outcome: ...
    async def group_get(self, who: str, group_id: str, **params: Any) -> Outcome: ...
    async def group_stop(self, who: str, group_id: str) -> Outcome: ...
    async def group_rerun(self, who: str, group_id: str, changes: dict[str, Any]) -> Outcome: ...
    async def group_ls(self, who: str, **params: Any) -> Outcome: ...
    async def logs(self, who: str, task_id: str, **params: Any) -> Outcome: ...
    async def follow(self, who: str, task_id: str, **params: Any) -> Outcome: ...
    async def first_error(self, who: str, task_id: str, run: int | None = None) -> Outcome: ...
    async def export_start(self, who: str, task_id: str, fmt: str, **params: Any) -> Outcome: ...
    async def export_get(self, who: str, export_id: str) -> Outcome: ...
    async def export_ls(self, who: str) -> Outcome: ...

    #: The gateway both APIs run over.
    gateway: Gateway
    #: The log service both route the log calls to (to seed logs and wait for exports).
    log_service: LogApi


#: The gRPC `LogFilter` fields of the HTTP query parameters (the rest are request fields).
FILTER = {
    "worker": "workers",
    "run": "run",
    "since": "since",
    "until": "until",
    "words": "words",
    "phrase": "phrase",
    "regex": "regex",
    "ignore_case": "ignore_case",
}
TERMINAL = {"succeeded", "failed", "stopped", "abnormal"}


class HttpVia:
    def __init__(
        self,
        client: httpx.AsyncClient,
        tokens: dict[str, str | None],
        gateway: Gateway,
        logs: LogApi,
    ) -> None:
        self.client, self.tokens, self.gateway = client, tokens, gateway
        self.log_service = logs

    async def _call(self, who: str, method: str, path: str, **kw: Any) -> Outcome:
        token = self.tokens[who]
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        answer = await self.client.request(method, path, headers=headers, **kw)
        if answer.headers["content-type"].startswith("text/event-stream"):
            lines = answer.text.splitlines()
            body = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: {}"]
            return Outcome("OK", body)
        return Outcome(HTTP_STATUS[answer.status_code], answer.json())

    async def create(self, who: str, spec: dict[str, Any]) -> Outcome:
        return await self._call(who, "POST", "/v1/tasks", json=spec)

    async def get(self, who: str, task_id: str) -> Outcome:
        return await self._call(who, "GET", f"/v1/tasks/{task_id}")

    async def ls(self, who: str, **filters: Any) -> Outcome:
        return await self._call(who, "GET", "/v1/tasks", params=filters)

    async def stop(self, who: str, task_id: str) -> Outcome:
        return await self._call(who, "POST", f"/v1/tasks/{task_id}/stop")

    async def rerun(self, who: str, task_id: str, changes: dict[str, Any]) -> Outcome:
        return await self._call(who, "POST", f"/v1/tasks/{task_id}/rerun", json=changes)

    async def clone(self, who: str, task_id: str, overrides: dict[str, Any]) -> Outcome:
        return await self._call(who, "POST", f"/v1/tasks/{task_id}/clone", json=overrides)

    async def events(self, who: str, task_id: str) -> Outcome:
        return await self._call(who, "GET", f"/v1/tasks/{task_id}/events")

    async def watch(self, who: str, task_id: str) -> Outcome:
        return await self._call(who, "GET", f"/v1/tasks/{task_id}/watch")

    async def capacity(self, who: str, pool_id: str) -> Outcome:
        return await self._call(who, "GET", f"/v1/pools/{pool_id}/capacity")

    async def group_create(self, who: str, template: Any, items: list[Any]) -> Outcome:
        body = {"template": template, "items": items}
        return await self._call(who, "POST", "/v1/groups", json=body)

    async def group_get(self, who: str, group_id: str, **params: Any) -> Outcome:
        return await self._call(who, "GET", f"/v1/groups/{group_id}", params=params)

    async def group_stop(self, who: str, group_id: str) -> Outcome:
        return await self._call(who, "POST", f"/v1/groups/{group_id}/stop")

    async def group_rerun(self, who: str, group_id: str, changes: dict[str, Any]) -> Outcome:
        return await self._call(who, "POST", f"/v1/groups/{group_id}/rerun", json=changes)

    async def group_ls(self, who: str, **params: Any) -> Outcome:
        return await self._call(who, "GET", "/v1/groups", params=params)

    async def logs(self, who: str, task_id: str, **params: Any) -> Outcome:
        return await self._call(who, "GET", f"/v1/tasks/{task_id}/logs", params=params)

    async def follow(self, who: str, task_id: str, **params: Any) -> Outcome:
        """The HTTP live tail (as `runyard logs -f`): page with `tail_cursor` until
        the task has ended; the pages' lines."""
        pages: list[Any] = []
        cursor: str | None = None
        while True:
            page = await self.logs(who, task_id, **params, **({"cursor": cursor} if cursor else {}))
            if page.status != "OK":
                return page
            if page.body["lines"]:
                pages.append(page.body["lines"])
            cursor = page.body["tail_cursor"]
            if page.body["next_cursor"] is None:
                task = await self.get(who, task_id)
                if task.body["status"] in TERMINAL:
                    last = await self.logs(who, task_id, **params, cursor=cursor)
                    if last.body["lines"]:
                        pages.append(last.body["lines"])
                    return Outcome("OK", pages)
                await asyncio.sleep(0.05)

    async def first_error(self, who: str, task_id: str, run: int | None = None) -> Outcome:
        params = {"run": run} if run is not None else {}
        return await self._call(who, "GET", f"/v1/tasks/{task_id}/first-error", params=params)

    async def export_start(self, who: str, task_id: str, fmt: str, **params: Any) -> Outcome:
        path = f"/v1/tasks/{task_id}/logs/exports"
        return await self._call(who, "POST", path, params=params, json={"format": fmt})

    async def export_get(self, who: str, export_id: str) -> Outcome:
        return await self._call(who, "GET", f"/v1/exports/{export_id}")

    async def export_ls(self, who: str) -> Outcome:
        return await self._call(who, "GET", "/v1/exports")


class Untyped(Exception):
    """A request only the HTTP API can carry (a member no typed message has)."""


def spec_of(spec: dict[str, Any]) -> pb.TaskSpec:
    """The typed spec of an HTTP body: `env` as `A=x;B=y` text and `creator_only`
    names (conveniences of the HTTP body) become `EnvVar`s."""
    body = dict(spec)
    hidden = set(body.pop("creator_only", ()))
    env = body.get("env")
    if isinstance(env, str):
        pairs = [item.partition("=") for item in env.split(";") if item]
        body["env"] = [{"name": k, "value": v} for k, _, v in pairs]
    for variable in body.get("env", ()):
        variable["creator_only"] = variable.get("creator_only") or variable["name"] in hidden
    unknown = set(body) - set(pb.TaskSpec.DESCRIPTOR.fields_by_name)
    if unknown:
        raise Untyped(f"no TaskSpec field {sorted(unknown)}")
    message = pb.TaskSpec()
    convert.to_message(message, body)
    return message


def changes_of(changes: dict[str, Any]) -> pb.TaskChanges:
    unknown = set(changes) - set(pb.TaskSpec.DESCRIPTOR.fields_by_name)
    if unknown:
        raise Untyped(f"no TaskSpec field {sorted(unknown)}")
    return convert.changes_message(changes)


def log_request(params: dict[str, Any]) -> tuple[pb.LogFilter, dict[str, Any]]:
    """HTTP query parameters as a gRPC `LogFilter` and the other request fields."""
    for name in ("since", "until"):
        if name in params and datetime.fromisoformat(params[name]).tzinfo is None:
            raise Untyped(f"{name}: a Timestamp is a point in time, never without a zone")
    where = convert.log_filter({k: v for k, v in params.items() if k in FILTER})
    return where, {k: v for k, v in params.items() if k not in FILTER}


class GrpcVia:
    def __init__(
        self,
        stub: pb_grpc.TasksStub,
        tokens: dict[str, str | None],
        gateway: Gateway,
        logs: LogApi,
    ) -> None:
        self.stub, self.tokens, self.gateway = stub, tokens, gateway
        self.log_service = logs

    def _metadata(self, who: str) -> tuple[tuple[str, str], ...]:
        token = self.tokens[who]
        return (("authorization", f"Bearer {token}"),) if token is not None else ()

    async def _call(
        self, who: str, method: str, message: Any, answer: Callable[[Any], Any]
    ) -> Outcome:
        try:
            reply = await getattr(self.stub, method)(message, metadata=self._metadata(who))
        except grpc.aio.AioRpcError as exc:
            return refusal(exc)
        return Outcome("OK", answer(reply))

    async def create(self, who: str, spec: dict[str, Any]) -> Outcome:
        request = pb.CreateTaskRequest(spec=spec_of(spec))
        return await self._call(who, "CreateTask", request, convert.task_dict)

    async def get(self, who: str, task_id: str) -> Outcome:
        request = pb.GetTaskRequest(task_id=task_id)
        return await self._call(who, "GetTask", request, convert.task_dict)

    async def ls(self, who: str, **filters: Any) -> Outcome:
        def page(reply: pb.ListTasksResponse) -> dict[str, Any]:
            return {
                "items": [convert.to_dict(t) for t in reply.tasks],
                "next_cursor": reply.next_cursor or None,
            }

        return await self._call(who, "ListTasks", pb.ListTasksRequest(**filters), page)

    async def stop(self, who: str, task_id: str) -> Outcome:
        request = pb.StopTaskRequest(task_id=task_id)
        return await self._call(who, "StopTask", request, convert.task_dict)

    async def rerun(self, who: str, task_id: str, changes: dict[str, Any]) -> Outcome:
        request = pb.RerunTaskRequest(task_id=task_id, changes=changes_of(changes))
        return await self._call(who, "RerunTask", request, convert.task_dict)

    async def clone(self, who: str, task_id: str, overrides: dict[str, Any]) -> Outcome:
        request = pb.CloneTaskRequest(task_id=task_id, overrides=changes_of(overrides))
        return await self._call(who, "CloneTask", request, convert.task_dict)

    async def events(self, who: str, task_id: str) -> Outcome:
        def events(reply: pb.ListTaskEventsResponse) -> list[Any]:
            return [convert.to_dict(e) for e in reply.events]

        request = pb.ListTaskEventsRequest(task_id=task_id)
        return await self._call(who, "ListTaskEvents", request, events)

    async def watch(self, who: str, task_id: str) -> Outcome:
        try:
            request = pb.WatchTaskRequest(task_id=task_id)
            stream = self.stub.WatchTask(request, metadata=self._metadata(who))
            return Outcome("OK", [convert.to_dict(e) async for e in stream])
        except grpc.aio.AioRpcError as exc:
            return refusal(exc)

    async def capacity(self, who: str, pool_id: str) -> Outcome:
        request = pb.GetPoolCapacityRequest(pool_id=pool_id)
        return await self._call(who, "GetPoolCapacity", request, convert.capacity_dict)

    async def group_create(self, who: str, template: Any, items: list[Any]) -> Outcome:
        request = pb.CreateGroupRequest(
            template=spec_of(template), items=[changes_of(i) for i in items]
        )
        return await self._call(who, "CreateGroup", request, convert.group_dict)

    async def group_get(self, who: str, group_id: str, **params: Any) -> Outcome:
        request = pb.GetGroupRequest(group_id=group_id, **params)
        return await self._call(who, "GetGroup", request, convert.group_dict)

    async def group_stop(self, who: str, group_id: str) -> Outcome:
        request = pb.StopGroupRequest(group_id=group_id)
        return await self._call(who, "StopGroup", request, convert.group_dict)

    async def group_rerun(self, who: str, group_id: str, changes: dict[str, Any]) -> Outcome:
        request = pb.RerunGroupRequest(group_id=group_id, changes=changes_of(changes))
        return await self._call(who, "RerunGroup", request, convert.group_dict)

    async def group_ls(self, who: str, **params: Any) -> Outcome:
        def groups(reply: pb.ListGroupsResponse) -> dict[str, Any]:
            return {
                "items": [convert.to_dict(g) for g in reply.groups],
                "next_cursor": reply.next_cursor or None,
            }

        return await self._call(who, "ListGroups", pb.ListGroupsRequest(**params), groups)

    async def logs(self, who: str, task_id: str, **params: Any) -> Outcome:
        where, rest = log_request(params)
        request = pb.SearchLogsRequest(task_id=task_id, filter=where, **rest)
        return await self._call(who, "SearchLogs", request, convert.to_dict)

    async def follow(self, who: str, task_id: str, **params: Any) -> Outcome:
        where, rest = log_request(params)
        request = pb.FollowLogsRequest(task_id=task_id, filter=where, **rest)
        try:
            stream = self.stub.FollowLogs(request, metadata=self._metadata(who))
            pages = [convert.to_dict(p) async for p in stream]
        except grpc.aio.AioRpcError as exc:
            return refusal(exc)
        return Outcome("OK", [p["lines"] for p in pages])

    async def first_error(self, who: str, task_id: str, run: int | None = None) -> Outcome:
        request = pb.GetFirstErrorRequest(task_id=task_id, run=run)
        return await self._call(who, "GetFirstError", request, convert.first_error_dict)

    async def export_start(self, who: str, task_id: str, fmt: str, **params: Any) -> Outcome:
        where, _ = log_request(params)
        request = pb.StartLogExportRequest(task_id=task_id, filter=where, format=fmt)
        return await self._call(who, "StartLogExport", request, convert.export_dict)

    async def export_get(self, who: str, export_id: str) -> Outcome:
        request = pb.GetLogExportRequest(export_id=export_id)
        return await self._call(who, "GetLogExport", request, convert.export_dict)

    async def export_ls(self, who: str) -> Outcome:
        def exports(reply: pb.ListLogExportsResponse) -> list[Any]:
            return [convert.export_dict(e) for e in reply.exports]

        return await self._call(who, "ListLogExports", pb.ListLogExportsRequest(), exports)


def refusal(exc: grpc.aio.AioRpcError) -> Outcome:
    """A gRPC error as an Outcome, read from its standard `google.rpc.Status`; the
    ErrorInfo, the BadRequest field violation and the `runyard-*` trailing metadata
    must all agree with the HTTP error body it carries."""
    trailing = dict(exc.trailing_metadata() or ())
    body = json.loads(trailing["runyard-error-bin"])
    assert (trailing["runyard-code"], trailing["runyard-field"]) == (body["code"], body["field"])
    assert trailing["runyard-hint"] == body["hint"]
    assert exc.details() == body["message"]
    status = status_of_rpc(exc)
    assert status is not None and status.message == body["message"]
    info = error_info(status)
    assert info is not None and info.domain == "runyard"
    assert info.reason == reason_of(body["code"])
    extra = {k: v for k, v in body.items() if k not in ("code", "field", "message", "hint")}
    assert dict(info.metadata) == {
        "code": body["code"],
        "field": body["field"],
        "hint": body["hint"],
        "httpStatus": trailing["runyard-status"],
        **{k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()},
    }
    violations = bad_request(status)
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        assert violations is not None
        (violation,) = violations.field_violations
        assert (violation.field, violation.description, violation.reason) == (
            body["field"],
            body["message"],
            info.reason,
        )
    else:
        assert violations is None
    return Outcome(exc.code().name, body)


def stable(value: Any) -> Any:
    """`value` without the keys whose values differ between runs."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


@dataclass
class Both:
    gateway: Gateway
    http: HttpVia
    grpc: GrpcVia
    seed_task: str


@pytest.fixture
async def both(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Both]:
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "home"))  # export files
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens: dict[str, str | None] = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "bob": await create_token(gateway.db, "t1", "bob", "member"),
        "carol": await create_token(gateway.db, "t2", "carol", "member"),
        "sam": await create_token(gateway.db, "ops", "sam", "sre"),
        "pat": await create_token(gateway.db, "ops", "pat", "platform_admin"),
        "nobody": None,
        "forged": "ry_not-a-token",
    }
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=app.state.owners)
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            log_service(dsn, tmp_path / "home" / "exports", endpoints) as logs,
            httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            http = HttpVia(client, tokens, gateway, logs.api)
            seeded = await http.create("alice", {**BASE, "name": "seed", "env": "K=v"})
            assert seeded.status == "OK", seeded
            await logs.store.ingest(records(seeded.body["task_id"], CORPUS))
            group = await http.group_create("alice", BASE, [{"name": "g1"}, {"name": "g2"}])
            assert group.status == "OK", group
            stub = pb_grpc.TasksStub(channel)
            grpc_via = GrpcVia(stub, tokens, gateway, logs.api)
            yield Both(gateway, http, grpc_via, seeded.body["task_id"])
    finally:
        await server.stop(grace=None)
        await app.state.owners.aclose()
        await gateway.close()


Scenario = Callable[[Via, str], Awaitable[Outcome]]


async def _created(via: Via, **changes: Any) -> str:
    made = await via.create("alice", {**BASE, **changes})
    assert made.status == "OK", made
    return str(made.body["task_id"])


async def create_then_stop(via: Via, _: str) -> Outcome:
    return await via.stop("alice", await _created(via))


async def stop_twice(via: Via, _: str) -> Outcome:
    task_id = await _created(via)
    await via.stop("alice", task_id)
    return await via.stop("alice", task_id)


async def rerun_running(via: Via, _: str) -> Outcome:
    return await via.rerun("alice", await _created(via), {})


async def rerun_after_stop(via: Via, _: str) -> Outcome:
    task_id = await _created(via)
    await via.stop("alice", task_id)
    return await via.rerun("alice", task_id, {"command": "echo again", "worker_spec": "4gpu"})


async def rerun_pool_change(via: Via, _: str) -> Outcome:
    task_id = await _created(via)
    await via.stop("alice", task_id)
    return await via.rerun("alice", task_id, {"pool": "pool-east"})


async def rerun_bad_image(via: Via, _: str) -> Outcome:
    task_id = await _created(via)
    await via.stop("alice", task_id)
    return await via.rerun("alice", task_id, {"image": "nope:1"})


async def clone_elsewhere(via: Via, seed: str) -> Outcome:
    overrides = {"pool": "pool-east", "worker_spec": "8gpu", "image": "bash-only"}
    return await via.clone("bob", seed, overrides)


async def group_lifecycle(via: Via, _: str) -> Outcome:
    made = await via.group_create("alice", BASE, [{"name": "a"}, {"name": "b"}])
    assert made.status == "OK", made
    group_id = made.body["group_id"]
    refused = await via.group_rerun("alice", group_id, {})
    stopped = await via.group_stop("alice", group_id)
    rerun = await via.group_rerun("alice", group_id, {"command": "echo again"})
    hidden = await via.group_get("carol", group_id)
    return Outcome("OK", [made, refused, stopped, rerun, hidden])


async def group_refused(via: Via, _: str) -> Outcome:
    return await via.group_create("alice", BASE, [{"name": "a"}, {"image": "nope:1"}])


async def group_list(via: Via, _: str) -> Outcome:
    return Outcome("OK", [await via.group_ls("alice"), await via.group_ls("carol")])


async def watch_stopped(via: Via, _: str) -> Outcome:
    task_id = await _created(via)
    await via.stop("alice", task_id)
    return await via.watch("bob", task_id)


async def logs_paged(via: Via, seed: str) -> Outcome:
    first = await via.logs("alice", seed, limit=4, order="newest")
    assert first.status == "OK", first
    second = await via.logs(
        "alice", seed, limit=4, order="newest", cursor=first.body["next_cursor"]
    )
    return Outcome("OK", [first, second])


async def follow_ended(via: Via, _: str) -> Outcome:
    """A stopped task whose lines arrived: the tail gives them all, in pages, and ends."""
    task_id = await _created(via)
    await via.stop("alice", task_id)
    await via.log_service.store.ingest(records(task_id, CORPUS))
    return Outcome(
        "OK",
        [
            await via.follow("alice", task_id, limit=4),
            await via.follow("alice", task_id, worker=[1], words="loss"),
            await via.follow("carol", task_id),
            await via.follow("alice", task_id, regex="(("),
        ],
    )


def _start_view(outcome: Outcome) -> Outcome:
    """A just-started export, without what its background work may have changed already."""
    if outcome.status != "OK":
        return outcome
    keep = ("task_id", "format", "query")
    return Outcome(outcome.status, {k: outcome.body[k] for k in keep})


async def export_lifecycle(via: Via, seed: str) -> Outcome:
    started = await via.export_start("alice", seed, "jsonl", worker=[0, 1], words="loss")
    assert started.status == "OK", started
    export_id = started.body["export_id"]
    await via.log_service.exports.wait()
    done = await via.export_get("alice", export_id)
    listed = await via.export_ls("alice")
    mine = [e for e in listed.body if e["export_id"] == export_id]
    return Outcome(
        "OK",
        [
            _start_view(started),
            done,
            Outcome(listed.status, mine),
            await via.export_get("bob", export_id),  # another user: not found
            await via.export_get("carol", export_id),  # another tenant: not found
            await via.export_ls("carol"),
        ],
    )


async def export_unfiltered(via: Via, seed: str) -> Outcome:
    started = await via.export_start("alice", seed, "text")
    await via.log_service.exports.wait()
    return Outcome(
        "OK", [_start_view(started), await via.export_get("alice", started.body["export_id"])]
    )


def _cursor(raw: str) -> str:
    """A list cursor of `raw` (`<created_at>|<task_id>`; `t` stands for a valid time)."""
    raw = raw.replace("t|", "2026-01-01T00:00:00+00:00|", 1) if raw.startswith("t|") else raw
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _spec(**changes: Any) -> Scenario:
    return lambda via, _: via.create("alice", {**BASE, **changes})


# name -> scenario; each runs once through HTTP and once through gRPC.
TABLE: dict[str, Scenario] = {
    "create": _spec(env="API_KEY=s3cret;MODE=x", creator_only=["API_KEY"]),
    "create with warnings": _spec(command="python train.py | tee log.txt"),
    "create refused: unknown image": _spec(image="nope:1"),
    "create refused: wrong zone": _spec(pool="pool-east", worker_spec="8gpu"),
    "create refused: unknown field": _spec(colour="red"),
    # (a list: the `A=x;B=y` text form names the field `env`, not the variable's name)
    "create refused: bad env": _spec(env=[{"name": "1A", "value": "x"}]),
    "create refused: rdma": _spec(rdma=True),
    # over a limit of the body's model: refused before the rules, by both APIs alike
    "create refused: tag too long": _spec(tags=["x" * 65]),
    "create refused: name too long": _spec(name="n" * 201),
    "get": lambda via, seed: via.get("alice", seed),
    "get as another user (masked)": lambda via, seed: via.get("bob", seed),
    "get unknown": lambda via, _: via.get("alice", "no-such-task"),
    "get other tenant": lambda via, seed: via.get("carol", seed),
    "list": lambda via, _: via.ls("alice"),
    "list filtered": lambda via, _: via.ls("alice", name="seed", status="new", limit=1),
    "list other tenant": lambda via, _: via.ls("carol"),
    "list of a tenant by an sre": lambda via, _: via.ls("sam", tenant="t1"),
    "list of another tenant refused to a member": lambda via, _: via.ls("carol", tenant="t1"),
    "list bad cursor": lambda via, _: via.ls("alice", cursor="zzz"),
    # well-formed base64, but no cursor the API gives: refused as such, not by the database
    "list crafted cursor: NUL": lambda via, _: via.ls("alice", cursor=_cursor("t|a\x00b")),
    "list crafted cursor: offset": lambda via, _: via.ls(
        "alice", cursor=_cursor("9999-12-31T23:59:59-23:59|a")
    ),
    "list bad limit": lambda via, _: via.ls("alice", limit=1000),
    "list bad status": lambda via, _: via.ls("alice", status="finished"),
    # `?tenant=` is not given, as gRPC's empty field: the caller's own tenant
    "list with an empty tenant": lambda via, _: via.ls("alice", tenant=""),
    "group list with an empty tenant": lambda via, _: via.group_ls("alice", tenant=""),
    "no token": lambda via, seed: via.get("nobody", seed),
    "unknown token": lambda via, _: via.ls("forged"),
    "events": lambda via, seed: via.events("alice", seed),
    "events other tenant": lambda via, seed: via.events("carol", seed),
    "stop": create_then_stop,
    "stop twice": stop_twice,
    "stop other tenant": lambda via, seed: via.stop("carol", seed),
    "rerun refused while running": rerun_running,
    "rerun after stop": rerun_after_stop,
    "rerun refused: pool change": rerun_pool_change,
    "rerun refused: unknown image": rerun_bad_image,
    "clone": clone_elsewhere,
    "clone other tenant": lambda via, seed: via.clone("carol", seed, {}),
    "watch": watch_stopped,
    "watch other tenant": lambda via, seed: via.watch("carol", seed),
    "capacity": lambda via, _: via.capacity("alice", "pool-a"),
    "capacity unknown pool": lambda via, _: via.capacity("alice", "nope"),
    "group lifecycle": group_lifecycle,
    "group refused": group_refused,
    "group refused: item over a limit": lambda via, _: via.group_create(
        "alice", BASE, [{"name": "a"}, {"priority": 10**6}]
    ),
    "group refused: template over a limit": lambda via, _: via.group_create(
        "alice", {**BASE, "command": "x" * 65537}, [{"name": "a"}]
    ),
    "group list": group_list,
    "group list of a tenant by an sre": lambda via, _: via.group_ls("sam", tenant="t1"),
    "group list of another tenant refused to a member": lambda via, _: via.group_ls(
        "carol", tenant="t1"
    ),
    "group unknown": lambda via, _: via.group_get("alice", "nope"),
    # a read-only role is refused before the group is looked for or the message read
    "group stop by an sre": lambda via, _: via.group_stop("sam", "nope"),
    "group rerun by an sre": lambda via, _: via.group_rerun("sam", "nope", {}),
    "group create by an sre": lambda via, _: via.group_create("sam", {}, [{}]),
    "create by an sre": lambda via, _: via.create("sam", {"name": "n" * 201}),
    # who may call is answered before the body's text is looked at
    "create with a NUL without a token": lambda via, _: via.create(
        "nobody", {**BASE, "name": "a\x00"}
    ),
    "create with a NUL by an sre": lambda via, _: via.create("sam", {**BASE, "name": "a\x00"}),
    # --- logs -------------------------------------------------------------------
    "logs": lambda via, seed: via.logs("alice", seed),
    "logs as another user": lambda via, seed: via.logs("bob", seed),
    "logs filtered and searched": lambda via, seed: via.logs(
        "alice", seed, worker=[0, 1], words="loss", order="newest"
    ),
    "logs phrase any case": lambda via, seed: via.logs(
        "alice", seed, phrase="LOSS", ignore_case=True
    ),
    "logs regex in a time range": lambda via, seed: via.logs(
        "alice",
        seed,
        regex="loss=[0-9.]+",
        run=1,
        since=CORPUS_T0.isoformat(),
        until=(CORPUS_T0 + timedelta(seconds=2)).isoformat(),
    ),
    "logs paged": logs_paged,
    "logs refused: bad regex": lambda via, seed: via.logs("alice", seed, regex="loss=([0-9"),
    "logs refused: no words": lambda via, seed: via.logs("alice", seed, words="--- ::"),
    "logs refused: empty phrase": lambda via, seed: via.logs("alice", seed, phrase=""),
    "logs refused: bad cursor": lambda via, seed: via.logs("alice", seed, cursor="zzz"),
    "logs refused: limit": lambda via, seed: via.logs("alice", seed, limit=5000),
    "logs refused: order": lambda via, seed: via.logs("alice", seed, order="sideways"),
    "logs refused: time without zone": lambda via, seed: via.logs(
        "alice", seed, since="2026-01-02T03:04:05"
    ),
    "logs refused: since after until": lambda via, seed: via.logs(
        "alice", seed, since="2026-01-02T03:04:05Z", until="2026-01-01T03:04:05Z"
    ),
    "logs other tenant": lambda via, seed: via.logs("carol", seed),
    "logs other tenant with a bad regex": lambda via, seed: via.logs("carol", seed, regex="(("),
    "logs unknown task": lambda via, _: via.logs("alice", "no-such-task"),
    "logs no token": lambda via, seed: via.logs("nobody", seed),
    "follow": follow_ended,
    "first error": lambda via, seed: via.first_error("alice", seed),
    "first error of a run without logs": lambda via, seed: via.first_error("alice", seed, 7),
    "first error other tenant": lambda via, seed: via.first_error("carol", seed),
    "export": export_lifecycle,
    "export without filters": export_unfiltered,
    "export refused: bad regex": lambda via, seed: via.export_start(
        "alice", seed, "text", regex="(("
    ),
    "export refused: format": lambda via, seed: via.export_start("alice", seed, "pdf"),
    "export other tenant": lambda via, seed: via.export_start("carol", seed, "text"),
    "export unknown": lambda via, _: via.export_get("alice", "nope"),
}


#: Scenarios no typed message can carry: HTTP refuses them, gRPC cannot send them.
HTTP_ONLY = {"create refused: unknown field", "logs refused: time without zone"}


@pytest.mark.parametrize("name", list(TABLE))
async def test_http_and_grpc_agree(both: Both, name: str) -> None:
    scenario = TABLE[name]
    by_http = await scenario(both.http, both.seed_task)
    try:
        by_grpc = await scenario(both.grpc, both.seed_task)
    except Untyped:
        assert name in HTTP_ONLY and by_http.status == "INVALID_ARGUMENT", (name, by_http)
        return
    assert name not in HTTP_ONLY, name
    assert stable(_plain(by_grpc)) == stable(_plain(by_http)), name
    assert by_http.body not in ([], {}, None), name  # something real was compared
    if isinstance(by_http.body, dict) and by_http.status != "OK":
        assert by_http.body["code"] and by_http.body["hint"], by_http


def _plain(outcome: Any) -> Any:
    """An Outcome (possibly holding Outcomes) as plain data."""
    if isinstance(outcome, Outcome):
        return {"status": outcome.status, "body": _plain(outcome.body)}
    if isinstance(outcome, list):
        return [_plain(v) for v in outcome]
    return outcome


async def test_expected_codes(both: Both) -> None:
    """A few of the table's answers, spelled out (both APIs agree, see above)."""
    via = both.grpc
    cases = [
        (await via.get("nobody", both.seed_task), "UNAUTHENTICATED", "auth.missing_token", ""),
        (await via.ls("forged"), "UNAUTHENTICATED", "auth.invalid_token", ""),
        (await via.get("carol", both.seed_task), "NOT_FOUND", "task_not_found", "task_id"),
        (
            await via.create("alice", {**BASE, "image": "nope:1"}),
            "INVALID_ARGUMENT",
            "image.not_found",
            "image",
        ),
        (await rerun_running(via, ""), "FAILED_PRECONDITION", "invalid_transition", ""),
        (
            await rerun_pool_change(via, ""),
            "INVALID_ARGUMENT",
            "rerun.field_not_changeable",
            "pool",
        ),
    ]
    for outcome, status, code, field in cases:
        assert (outcome.status, outcome.body["code"], outcome.body["field"]) == (
            status,
            code,
            field,
        ), outcome


async def test_an_sre_lists_another_tenants_tasks_and_groups(both: Both) -> None:
    """`tenant` on the task and group lists: the sre reads t1's, a member of t2 may not."""
    for via in (both.http, both.grpc):
        listed = await via.ls("sam", tenant="t1")
        assert listed.status == "OK", listed
        assert both.seed_task in [t["task_id"] for t in listed.body["items"]], listed
        assert (await via.ls("sam")).body["items"] == []  # its own tenant has none
        refused = await via.ls("carol", tenant="t1")
        assert refused.status != "OK" and refused.body["code"], refused
        groups = await via.group_ls("carol", tenant="t1")
        assert groups.status == refused.status and groups.body["code"], groups


async def test_groups_are_listed_a_page_at_a_time_over_both_apis(both: Both) -> None:
    """`cursor` on ListGroups as on `GET /v1/groups`: a page's `next_cursor` gives the
    next, the last has none, every group once in order; a cursor not given by the list
    is refused naming the field."""
    for name in ("p1", "p2"):
        made = await both.http.group_create("alice", BASE, [{"name": name}])
        assert made.status == "OK", made
    everything = (await both.http.group_ls("alice", limit=200)).body["items"]
    assert len(everything) >= 3
    for via in (both.http, both.grpc):
        seen, cursor = [], None
        for _ in range(len(everything)):  # a page that never ends the list fails, not hangs
            page = await via.group_ls("alice", limit=2, **({"cursor": cursor} if cursor else {}))
            assert page.status == "OK", page
            assert len(page.body["items"]) <= 2
            seen += page.body["items"]
            cursor = page.body["next_cursor"]
            if cursor is None:
                break
        assert [g["group_id"] for g in seen] == [g["group_id"] for g in everything]
        assert cursor is None
        bad = await via.group_ls("alice", cursor="not-a-cursor")
        assert bad.status != "OK" and bad.body["field"] == "cursor", bad


async def test_a_group_of_another_tenant_is_read_by_tenant_over_both_apis(both: Both) -> None:
    """`tenant` on GetGroup as on `GET /v1/groups/{id}`: the sre reads t1's group there
    (its own tenant has none of that id), a member of t2 is refused; both APIs alike."""
    listed = await both.http.group_ls("alice")
    group_id = listed.body["items"][0]["group_id"]
    answers = []
    for via in (both.http, both.grpc):
        read = await via.group_get("sam", group_id, tenant="t1")
        assert read.status == "OK", read
        assert {t["tenant"] for t in read.body["tasks"]} == {"t1"}, read
        elsewhere = await via.group_get("sam", group_id)  # its own tenant has none
        assert elsewhere.status == "NOT_FOUND" and "--tenant" in elsewhere.body["hint"]
        assert "runyard group ls" in (await via.group_get("alice", "nope")).body["hint"]
        refused = await via.group_get("carol", group_id, tenant="t1")
        assert (refused.status, refused.body["code"]) == ("PERMISSION_DENIED", "auth.other_tenant")
        answers.append(stable(_plain(Outcome("OK", [read, refused]))))
    assert answers[0] == answers[1]


async def test_a_task_and_a_group_of_another_tenant_are_refused_alike(both: Both) -> None:
    """Stopping or rerunning another tenant's task or group: a platform admin, who reads
    every tenant, is refused 403 `auth.other_tenant` for both; a member of another tenant,
    who may not read them, gets 404 for both (as for none); over HTTP and gRPC alike."""
    listed = await both.http.group_ls("alice")
    group_id = listed.body["items"][0]["group_id"]
    task = both.seed_task
    for via in (both.http, both.grpc):
        for who, status, codes in (
            ("pat", "PERMISSION_DENIED", {"auth.other_tenant"}),
            ("carol", "NOT_FOUND", {"task_not_found", "group.not_found"}),
        ):
            answers = {
                "task stop": await via.stop(who, task),
                "task rerun": await via.rerun(who, task, {}),
                "group stop": await via.group_stop(who, group_id),
                "group rerun": await via.group_rerun(who, group_id, {}),
            }
            for what, answer in answers.items():
                assert answer.status == status, (via, who, what, answer)
                assert answer.body["code"] in codes, (via, who, what, answer)
        assert (await via.get("pat", task)).status == "OK"  # it reads what it may not change


async def test_grpc_changes_name_fields_of_the_spec_only(both: Both) -> None:
    """A mask path that is no field of TaskSpec is refused at the edge, naming the mask."""
    metadata = (("authorization", f"Bearer {both.grpc.tokens['alice']}"),)
    overrides = pb.TaskChanges(update_mask=field_mask_pb2.FieldMask(paths=["colour"]))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await both.grpc.stub.CloneTask(
            pb.CloneTaskRequest(task_id=both.seed_task, overrides=overrides), metadata=metadata
        )
    outcome = refusal(raised.value)
    assert (outcome.status, outcome.body["code"], outcome.body["field"]) == (
        "INVALID_ARGUMENT",
        "request.invalid",
        "overrides.update_mask",
    )


async def test_grpc_changes_reach_into_nested_fields_and_clear_optional_ones(
    both: Both,
) -> None:
    """`fault_tolerance.auto_restart` changes that field only; a named `optional`
    field left unset is null (the spec's default)."""
    clone = await both.grpc.clone(
        "alice",
        both.seed_task,
        {"fault_tolerance": {"auto_restart": True}, "tensorboard_dir": None},
    )
    assert clone.status == "OK", clone
    assert clone.body["spec"]["fault_tolerance"]["auto_restart"] is True
    assert clone.body["spec"]["fault_tolerance"]["max_restarts"] == 3
    assert clone.body["spec"]["tensorboard_dir"] is None
    changes = pb.TaskChanges(
        update_mask=field_mask_pb2.FieldMask(paths=["fault_tolerance.env_check"])
    )
    changes.spec.fault_tolerance.env_check = True
    metadata = (("authorization", f"Bearer {both.grpc.tokens['alice']}"),)
    task = await both.grpc.stub.CloneTask(
        pb.CloneTaskRequest(task_id=both.seed_task, overrides=changes), metadata=metadata
    )
    assert task.spec.fault_tolerance.env_check and not task.spec.fault_tolerance.auto_restart
    assert task.cloned_from == both.seed_task and task.HasField("submit_time")


async def test_grpc_request_id_becomes_correlation_id(both: Both) -> None:
    token = both.grpc.tokens["alice"]
    task = await both.grpc.stub.CreateTask(
        pb.CreateTaskRequest(spec=spec_of(BASE)),
        metadata=(("authorization", f"Bearer {token}"), ("x-request-id", "req-grpc-1")),
    )
    events = await both.grpc.stub.ListTaskEvents(
        pb.ListTaskEventsRequest(task_id=task.task_id),
        metadata=(("authorization", f"Bearer {token}"),),
    )
    assert [(e.type, e.actor, e.correlation_id) for e in events.events] == [
        ("TaskSubmitted", "user:t1/alice", "req-grpc-1")
    ]


def test_status_mapping_of_other_refusals() -> None:
    denied = PermissionDenied("auth.admin_only", "needs admin", "ask an admin")
    assert status_of(denied) == grpc.StatusCode.PERMISSION_DENIED
    assert status_of(ConcurrencyError("task-x", 1, 2)) == grpc.StatusCode.ABORTED
    assert status_of(Conflict("invalid_transition", "no", "")) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    odd = Conflict("x", "m", "Zone 区\nnext")
    assert dict(error_metadata(odd))["runyard-hint"] == "Zone \\u533a next"


def test_the_rich_status_of_each_kind_of_refusal() -> None:
    """ErrorInfo always (the reason in UPPER_SNAKE, the code as HTTP spells it);
    BadRequest for INVALID_ARGUMENT only; RetryInfo for an outage only."""
    refused = BadRequest("image.not_found", "no image nope:1", "pick a listed image", "image")
    refused.extra = {"item": 1}
    status = rich_status(refused)
    assert (status.code, status.message) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "no image nope:1",
    )
    info = error_info(status)
    assert info is not None and (info.reason, info.domain) == ("IMAGE_NOT_FOUND", "runyard")
    assert dict(info.metadata) == {
        "code": "image.not_found",
        "field": "image",
        "hint": "pick a listed image",
        "httpStatus": "400",
        "item": "1",
    }
    violations = bad_request(status)
    assert violations is not None and [v.field for v in violations.field_violations] == ["image"]
    conflict = rich_status(Conflict("invalid_transition", "no", "stop it first"))
    assert bad_request(conflict) is None and len(conflict.details) == 1
    outage = rich_status(Unavailable("service.unavailable", "the database is away", "retry"))
    assert outage.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert [d.type_url.rsplit("/", 1)[1] for d in outage.details] == [
        "google.rpc.ErrorInfo",
        "google.rpc.RetryInfo",
    ]
    assert (reason_of("409"), reason_of("a.b-c d")) == ("E_409", "A_B_C_D")
    for code in grpc.StatusCode:  # a Status's code is the number of the gRPC status
        assert code_pb2.Code.Name(code.value[0]) == code.name


async def test_grpc_nul_in_a_field_is_invalid_argument(both: Both) -> None:
    metadata = (("authorization", f"Bearer {both.grpc.tokens['alice']}"),)
    requests = [
        ("GetTask", pb.GetTaskRequest(task_id="a\x00b"), "task_id"),
        (
            "CreateTask",
            pb.CreateTaskRequest(spec=spec_of({**BASE, "name": "\x00"})),
            "spec.name",
        ),
        (
            "CreateGroup",
            pb.CreateGroupRequest(
                template=spec_of(BASE),
                items=[changes_of({}), changes_of({"env": [{"name": "A", "value": "\x00"}]})],
            ),
            "items[1].spec.env[0].value",
        ),
        (
            "SearchLogs",
            pb.SearchLogsRequest(task_id="x", filter=pb.LogFilter(regex="a\x00")),
            "regex",  # a field of the nested filter: named as the HTTP query parameter
        ),
    ]
    for method, request, field in requests:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await getattr(both.grpc.stub, method)(request, metadata=metadata)
        outcome = refusal(raised.value)
        assert (outcome.status, outcome.body["field"]) == ("INVALID_ARGUMENT", field), outcome
    stream = both.grpc.stub.WatchTask(pb.WatchTaskRequest(task_id="\x00"), metadata=metadata)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        [e async for e in stream]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_values_the_database_cannot_take_are_invalid_argument() -> None:
    from asyncpg.exceptions import NumericValueOutOfRangeError
    from asyncpg.exceptions import _base as asyncpg_base
    from runyard.api.errors import translate

    for raised in (NumericValueOutOfRangeError("out of range"), asyncpg_base.DataError("$2")):
        error = translate(raised)
        assert error is not None and (error.http_status, error.code) == (400, "request.invalid")
        assert status_of(error) == grpc.StatusCode.INVALID_ARGUMENT


async def test_log_answers_spelled_out(both: Both) -> None:
    """A few of the log rows of the table, spelled out (both APIs agree, see above)."""
    for via in (both.http, both.grpc):
        bad = await via.logs("alice", both.seed_task, regex="loss=([0-9")
        assert (bad.status, bad.body["code"], bad.body["field"]) == (
            "INVALID_ARGUMENT",
            "logs.bad_regex",
            "regex",
        ), bad
        assert bad.body["hint"] and "invalid regular expression" in bad.body["message"]
        hidden = await via.logs("carol", both.seed_task, regex="((")
        assert (hidden.status, hidden.body["code"]) == ("NOT_FOUND", "task_not_found")
        hidden = await via.first_error("carol", both.seed_task)
        assert (hidden.status, hidden.body["code"]) == ("NOT_FOUND", "task_not_found")
        found = await via.first_error("alice", both.seed_task)
        assert (found.body["found"], found.body["rule"]) == (True, "training.cuda_oom")
        lines = await via.logs("alice", both.seed_task, worker=[0, 1], words="loss")
        assert len(lines.body["lines"]) == 4
        follow = await follow_ended(via, "")
        pages = follow.body[0].body
        assert [len(p) for p in pages] == [4, 4, 3], pages  # limit 4: pages of the tail
        assert [ln["line"] for p in pages for ln in p] == [c[3] for c in CORPUS]
        assert (follow.body[2].status, follow.body[3].status) == ("NOT_FOUND", "INVALID_ARGUMENT")
        made = await export_lifecycle(via, both.seed_task)
        done = made.body[1].body
        assert (done["state"], done["lines_done"], done["lines_total"]) == ("done", 4, 4)
        assert (made.body[3].status, made.body[3].body["code"]) == ("NOT_FOUND", "export.not_found")


async def test_grpc_follow_tails_a_running_task_until_it_ends(both: Both) -> None:
    """FollowLogs gives the lines there, then those written while it follows, and ends
    once the task has ended and its last lines are given."""
    task_id = await _created(both.grpc)
    store = both.http.log_service.store
    await store.ingest(records(task_id, CORPUS[:3]))
    metadata = (("authorization", f"Bearer {both.grpc.tokens['alice']}"),)
    stream = both.grpc.stub.FollowLogs(pb.FollowLogsRequest(task_id=task_id), metadata=metadata)
    got: list[str] = []

    async def read() -> None:
        async for page in stream:
            got.extend(line.line for line in page.lines)

    reading = asyncio.create_task(read())
    await _until(lambda: len(got) == 3)
    await store.ingest(records(task_id, CORPUS[3:6]))
    await _until(lambda: len(got) == 6)
    assert not reading.done()  # the task still runs: the tail goes on
    await store.ingest(records(task_id, CORPUS[6:]))  # its last words, then it ends
    await both.grpc.stop("alice", task_id)
    await asyncio.wait_for(reading, timeout=10)
    assert got == [c[3] for c in CORPUS]


async def _until(check: Callable[[], bool], within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_an_empty_id_is_invalid_argument_naming_it(both: Both) -> None:
    """Found by hand: GetStackReport and GetLogExport without their id asked the owner's
    list route and failed (INTERNAL); the log and fault-tolerance methods without a task
    id answered `Not Found`, naming nothing."""
    requests: list[tuple[str, Any, str]] = [
        ("SearchLogs", pb.SearchLogsRequest(), "task_id"),
        ("GetFirstError", pb.GetFirstErrorRequest(), "task_id"),
        ("StartLogExport", pb.StartLogExportRequest(), "task_id"),
        ("GetFaultToleranceLog", pb.GetFaultToleranceLogRequest(), "task_id"),
        ("ListStackReports", pb.ListStackReportsRequest(), "task_id"),
        ("CaptureStacks", pb.CaptureStacksRequest(), "task_id"),
        ("GetStackReport", pb.GetStackReportRequest(task_id=both.seed_task), "report_id"),
        ("GetLogExport", pb.GetLogExportRequest(), "export_id"),
        # found by hand too: these answered NOT_FOUND "task '' does not exist"
        ("GetTask", pb.GetTaskRequest(), "task_id"),
        ("StopTask", pb.StopTaskRequest(), "task_id"),
        ("RerunTask", pb.RerunTaskRequest(), "task_id"),
        ("CloneTask", pb.CloneTaskRequest(), "task_id"),
        ("ListTaskEvents", pb.ListTaskEventsRequest(), "task_id"),
        ("GetTaskAt", pb.GetTaskAtRequest(at="1"), "task_id"),
        ("DiffTask", pb.DiffTaskRequest(from_point="1", to_point="2"), "task_id"),
        ("GetPoolCapacity", pb.GetPoolCapacityRequest(), "pool_id"),
        ("GetGroup", pb.GetGroupRequest(), "group_id"),
        ("StopGroup", pb.StopGroupRequest(), "group_id"),
        ("RerunGroup", pb.RerunGroupRequest(), "group_id"),
    ]
    via = both.grpc
    for method, message, field in requests:
        outcome = await via._call("alice", method, message, lambda reply: reply)
        assert (outcome.status, outcome.body["code"], outcome.body["field"]) == (
            "INVALID_ARGUMENT",
            "request.invalid",
            field,
        ), (method, outcome)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in via.stub.FollowLogs(pb.FollowLogsRequest(), metadata=via._metadata("alice")):
            pass
    assert refusal(refused.value).body["field"] == "task_id"
    with pytest.raises(grpc.aio.AioRpcError) as unnamed:
        async for _ in via.stub.WatchTask(pb.WatchTaskRequest(), metadata=via._metadata("alice")):
            pass
    assert refusal(unnamed.value).body["field"] == "task_id"


async def test_a_crafted_list_cursor_is_cursor_invalid(both: Both) -> None:
    """Found by hand: a base64 cursor holding a NUL or a time far off UTC reached the
    database and came back as `request.invalid` with no field and the driver's words."""
    for via in (both.http, both.grpc):
        for raw in ("t|a\x00b", "9999-12-31T23:59:59-23:59|a", "2026-01-01T00:00:00|a"):
            refused = await via.ls("alice", cursor=_cursor(raw))
            assert (refused.status, refused.body["code"], refused.body["field"]) == (
                "INVALID_ARGUMENT",
                "cursor.invalid",
                "cursor",
            ), (raw, refused)
