"""HTTP and gRPC give the same result: one table of scenarios, run through both APIs.

Each scenario gets a `Via` (HTTP or gRPC) and returns an `Outcome`: the gRPC
status name (HTTP statuses mapped: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED,
403 PERMISSION_DENIED, 404 NOT_FOUND, 409 FAILED_PRECONDITION) and the answer
(an error's `{code, field, message, hint}`). Ids and times differ between the
two runs, so they are left out of the comparison.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import httpx
import pytest
from runyard.gateway.app import Gateway
from runyard.gateway.auth import create_token
from runyard.gateway.errors import Conflict, PermissionDenied
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import error_metadata, start_server, status_of
from runyard.gateway.http import create_app

from tests.integration.test_gateway import BASE, config_dir

HTTP_STATUS = {
    200: "OK",
    201: "OK",
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
    async def group_get(self, who: str, group_id: str) -> Outcome: ...
    async def group_stop(self, who: str, group_id: str) -> Outcome: ...
    async def group_rerun(self, who: str, group_id: str, changes: dict[str, Any]) -> Outcome: ...
    async def group_ls(self, who: str) -> Outcome: ...


class HttpVia:
    def __init__(self, client: httpx.AsyncClient, tokens: dict[str, str | None]) -> None:
        self.client, self.tokens = client, tokens

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

    async def group_get(self, who: str, group_id: str) -> Outcome:
        return await self._call(who, "GET", f"/v1/groups/{group_id}")

    async def group_stop(self, who: str, group_id: str) -> Outcome:
        return await self._call(who, "POST", f"/v1/groups/{group_id}/stop")

    async def group_rerun(self, who: str, group_id: str, changes: dict[str, Any]) -> Outcome:
        return await self._call(who, "POST", f"/v1/groups/{group_id}/rerun", json=changes)

    async def group_ls(self, who: str) -> Outcome:
        return await self._call(who, "GET", "/v1/groups")


class GrpcVia:
    def __init__(self, stub: pb_grpc.TasksStub, tokens: dict[str, str | None]) -> None:
        self.stub, self.tokens = stub, tokens

    async def _call(
        self, who: str, method: str, message: Any, answer: Callable[[Any], Any]
    ) -> Outcome:
        token = self.tokens[who]
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        try:
            reply = await getattr(self.stub, method)(message, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            return refusal(exc)
        return Outcome("OK", answer(reply))

    async def create(self, who: str, spec: dict[str, Any]) -> Outcome:
        request = pb.CreateTaskRequest(spec_json=json.dumps(spec))
        return await self._call(who, "CreateTask", request, _json)

    async def get(self, who: str, task_id: str) -> Outcome:
        return await self._call(who, "GetTask", pb.TaskRef(task_id=task_id), _json)

    async def ls(self, who: str, **filters: Any) -> Outcome:
        def page(reply: pb.TaskPage) -> dict[str, Any]:
            items = [json.loads(i.json) for i in reply.items]
            return {"items": items, "next_cursor": reply.next_cursor or None}

        return await self._call(who, "ListTasks", pb.ListTasksRequest(**filters), page)

    async def stop(self, who: str, task_id: str) -> Outcome:
        return await self._call(who, "StopTask", pb.TaskRef(task_id=task_id), _json)

    async def rerun(self, who: str, task_id: str, changes: dict[str, Any]) -> Outcome:
        request = pb.RerunTaskRequest(task_id=task_id, changes_json=json.dumps(changes))
        return await self._call(who, "RerunTask", request, _json)

    async def clone(self, who: str, task_id: str, overrides: dict[str, Any]) -> Outcome:
        request = pb.CloneTaskRequest(task_id=task_id, overrides_json=json.dumps(overrides))
        return await self._call(who, "CloneTask", request, _json)

    async def events(self, who: str, task_id: str) -> Outcome:
        def events(reply: pb.EventList) -> list[Any]:
            return [json.loads(e.json) for e in reply.events]

        return await self._call(who, "ListTaskEvents", pb.TaskRef(task_id=task_id), events)

    async def watch(self, who: str, task_id: str) -> Outcome:
        token = self.tokens[who]
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        try:
            stream = self.stub.WatchTask(pb.TaskRef(task_id=task_id), metadata=metadata)
            return Outcome("OK", [json.loads(e.json) async for e in stream])
        except grpc.aio.AioRpcError as exc:
            return refusal(exc)

    async def capacity(self, who: str, pool_id: str) -> Outcome:
        return await self._call(who, "GetPoolCapacity", pb.PoolRef(pool_id=pool_id), _json)

    async def group_create(self, who: str, template: Any, items: list[Any]) -> Outcome:
        request = pb.CreateGroupRequest(
            template_json=json.dumps(template), items_json=[json.dumps(i) for i in items]
        )
        return await self._call(who, "CreateGroup", request, _json)

    async def group_get(self, who: str, group_id: str) -> Outcome:
        return await self._call(who, "GetGroup", pb.GroupRef(group_id=group_id), _json)

    async def group_stop(self, who: str, group_id: str) -> Outcome:
        return await self._call(who, "StopGroup", pb.GroupRef(group_id=group_id), _json)

    async def group_rerun(self, who: str, group_id: str, changes: dict[str, Any]) -> Outcome:
        request = pb.RerunGroupRequest(group_id=group_id, changes_json=json.dumps(changes))
        return await self._call(who, "RerunGroup", request, _json)

    async def group_ls(self, who: str) -> Outcome:
        def groups(reply: pb.GroupList) -> dict[str, Any]:
            return {"items": [json.loads(g.json) for g in reply.groups]}

        return await self._call(who, "ListGroups", pb.ListGroupsRequest(), groups)


def _json(reply: Any) -> Any:
    return json.loads(reply.json)


def refusal(exc: grpc.aio.AioRpcError) -> Outcome:
    """A gRPC error as an Outcome; its plain trailing metadata must agree with the body."""
    trailing = dict(exc.trailing_metadata() or ())
    body = json.loads(trailing["runyard-error-bin"])
    assert (trailing["runyard-code"], trailing["runyard-field"]) == (body["code"], body["field"])
    assert trailing["runyard-hint"] == body["hint"]
    assert exc.details() == body["message"]
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
async def both(dsn: str, tmp_path: Path) -> AsyncIterator[Both]:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens: dict[str, str | None] = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "bob": await create_token(gateway.db, "t1", "bob", "member"),
        "carol": await create_token(gateway.db, "t2", "carol", "member"),
        "nobody": None,
        "forged": "ry_not-a-token",
    }
    server, port = await start_server(gateway, "127.0.0.1", 0)
    transport = httpx.ASGITransport(app=create_app(gateway))
    try:
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            http = HttpVia(client, tokens)
            seeded = await http.create("alice", {**BASE, "name": "seed", "env": "K=v"})
            assert seeded.status == "OK", seeded
            group = await http.group_create("alice", BASE, [{"name": "g1"}, {"name": "g2"}])
            assert group.status == "OK", group
            stub = pb_grpc.TasksStub(channel)
            yield Both(gateway, http, GrpcVia(stub, tokens), seeded.body["task_id"])
    finally:
        await server.stop(grace=None)
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


def _spec(**changes: Any) -> Scenario:
    return lambda via, _: via.create("alice", {**BASE, **changes})


# name -> scenario; each runs once through HTTP and once through gRPC.
TABLE: dict[str, Scenario] = {
    "create": _spec(env="API_KEY=s3cret;MODE=x", creator_only=["API_KEY"]),
    "create with warnings": _spec(command="python train.py | tee log.txt"),
    "create refused: unknown image": _spec(image="nope:1"),
    "create refused: wrong zone": _spec(pool="pool-east", worker_spec="8gpu"),
    "create refused: unknown field": _spec(colour="red"),
    "create refused: bad env": _spec(env="1A=x"),
    "create refused: rdma": _spec(rdma=True),
    "get": lambda via, seed: via.get("alice", seed),
    "get as another user (masked)": lambda via, seed: via.get("bob", seed),
    "get unknown": lambda via, _: via.get("alice", "no-such-task"),
    "get other tenant": lambda via, seed: via.get("carol", seed),
    "list": lambda via, _: via.ls("alice"),
    "list filtered": lambda via, _: via.ls("alice", name="seed", status="new", limit=1),
    "list other tenant": lambda via, _: via.ls("carol"),
    "list bad cursor": lambda via, _: via.ls("alice", cursor="zzz"),
    "list bad limit": lambda via, _: via.ls("alice", limit=1000),
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
    "group list": group_list,
    "group unknown": lambda via, _: via.group_get("alice", "nope"),
}


@pytest.mark.parametrize("name", list(TABLE))
async def test_http_and_grpc_agree(both: Both, name: str) -> None:
    scenario = TABLE[name]
    by_http = await scenario(both.http, both.seed_task)
    by_grpc = await scenario(both.grpc, both.seed_task)
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
        (await via.get("carol", both.seed_task), "NOT_FOUND", "task_not_found", ""),
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


async def test_grpc_only_bad_json_is_invalid_argument(both: Both) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await both.grpc.stub.CreateTask(
            pb.CreateTaskRequest(spec_json="{not json"),
            metadata=(("authorization", f"Bearer {both.grpc.tokens['alice']}"),),
        )
    outcome = refusal(raised.value)
    assert (outcome.status, outcome.body["code"], outcome.body["field"]) == (
        "INVALID_ARGUMENT",
        "request.invalid",
        "spec_json",
    )


async def test_grpc_request_id_becomes_correlation_id(both: Both) -> None:
    token = both.grpc.tokens["alice"]
    task = await both.grpc.stub.CreateTask(
        pb.CreateTaskRequest(spec_json=json.dumps(BASE)),
        metadata=(("authorization", f"Bearer {token}"), ("x-request-id", "req-grpc-1")),
    )
    events = await both.grpc.stub.ListTaskEvents(
        pb.TaskRef(task_id=task.task_id), metadata=(("authorization", f"Bearer {token}"),)
    )
    assert [(e.type, e.actor, e.correlation_id) for e in events.events] == [
        ("TaskSubmitted", "user:t1/alice", "req-grpc-1")
    ]


def test_status_mapping_of_other_refusals() -> None:
    denied = PermissionDenied("auth.admin_only", "needs admin", "ask an admin")
    assert status_of(denied) == grpc.StatusCode.PERMISSION_DENIED
    assert status_of(Conflict("conflict", "changed", "retry")) == grpc.StatusCode.ABORTED
    assert status_of(Conflict("invalid_transition", "no", "")) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    odd = Conflict("x", "m", "Zone 区\nnext")
    assert dict(error_metadata(odd))["runyard-hint"] == "Zone \\u533a next"


async def test_grpc_nul_in_a_field_is_invalid_argument(both: Both) -> None:
    metadata = (("authorization", f"Bearer {both.grpc.tokens['alice']}"),)
    requests = [
        ("GetTask", pb.TaskRef(task_id="a\x00b"), "task_id"),
        (
            "CreateTask",
            pb.CreateTaskRequest(spec_json=json.dumps({**BASE, "name": "\x00"})),
            "spec_json.name",
        ),
        (
            "CreateGroup",
            pb.CreateGroupRequest(template_json="{}", items_json=["{}", "\x00"]),
            "items_json[1]",
        ),
    ]
    for method, request, field in requests:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await getattr(both.grpc.stub, method)(request, metadata=metadata)
        outcome = refusal(raised.value)
        assert (outcome.status, outcome.body["field"]) == ("INVALID_ARGUMENT", field), outcome
    stream = both.grpc.stub.WatchTask(pb.TaskRef(task_id="\x00"), metadata=metadata)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        [e async for e in stream]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_values_the_database_cannot_take_are_invalid_argument() -> None:
    from asyncpg.exceptions import NumericValueOutOfRangeError
    from asyncpg.exceptions import _base as asyncpg_base
    from runyard.gateway.errors import translate

    for raised in (NumericValueOutOfRangeError("out of range"), asyncpg_base.DataError("$2")):
        error = translate(raised)
        assert error is not None and (error.status, error.code) == (400, "request.invalid")
        assert status_of(error) == grpc.StatusCode.INVALID_ARGUMENT
