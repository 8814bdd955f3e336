"""SRE replay over HTTP on a real Postgres: who may replay what, and the refusals.

The gateway's task routes (`/v1/tasks/{id}/replay`, `/replay/diff`) and the
scheduler's pool route (`/v1/pools/replay`, routed by the gateway) with a token
per role: the sre and platform_admin roles replay every tenant's tasks, a member
only its own tenant's (another tenant's task is a 404, as no task), and a pool
replay shows a member only its own tenant's task ids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.contracts import Metadata, NewEvent
from runyard.domain import fold
from runyard.gateway import grpc_convert as convert
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.http import create_app
from runyard.gateway.proxy import ROUTES, Owners
from runyard.scheduler.http import http_app
from runyard.scheduler.replay import HIDDEN

from tests.integration.test_gateway import config_dir
from tests.integration.test_scheduler_http import NOW, Face, face  # noqa: F401  (fixture)
from tests.unit.test_task_domain import TASK, Story, make_spec

pytestmark = pytest.mark.integration


@dataclass
class Replay:
    gateway: Gateway
    http: httpx.AsyncClient
    stub: pb_grpc.TasksStub
    tokens: dict[str, str]

    async def get(self, who: str, path: str, **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.get(path, params=params, headers=headers)


@pytest.fixture
async def replay(dsn: str, tmp_path: Path) -> AsyncIterator[Replay]:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "sre": await create_token(gateway.db, "ops", "sam", "sre"),
        "root": await create_token(gateway.db, "ops", "root", "platform_admin"),
        "ml_alice": await create_token(gateway.db, "ml", "alice", "member"),
        "ml_bob": await create_token(gateway.db, "ml", "bob", "member"),
        "other": await create_token(gateway.db, "other", "olga", "member"),
    }
    try:
        async with served(gateway) as (http, stub):
            yield Replay(gateway, http, stub, tokens)
    finally:
        await gateway.close()


@asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[tuple[httpx.AsyncClient, pb_grpc.TasksStub]]:
    """The gateway's HTTP app (in process) and gRPC server (on a free port), clients of both."""
    app = create_app(gateway, {})
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=app.state.owners)
    try:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            yield http, pb_grpc.TasksStub(channel)
    finally:
        await server.stop(grace=None)
        await app.state.owners.aclose()


async def crashed_task(gateway: Gateway) -> list[Any]:
    """Task t-1 of tenant ml: queued, placed, running, a crash, a restart (as stored)."""
    story = Story(make_spec(workers=1, auto_restart=True, max_restarts=1)).running()
    story.exit(0, 1)
    meta = Metadata(actor="user:ml/alice")
    # an event of another stream first: the task's positions do not start at 1
    await gateway.store.append("task-unrelated", [NewEvent(story.events[0][0], meta, NOW)])
    for event, at in story.events:
        await gateway.store.append(f"task-{TASK}", [NewEvent(event, meta, at)])
    return await gateway.store.read_stream(f"task-{TASK}")


async def test_each_position_replays_the_fold_of_the_prefix_for_readers(replay: Replay) -> None:
    stream = await crashed_task(replay.gateway)
    for who in ("sre", "root", "ml_alice", "ml_bob"):
        for n, event in enumerate(stream, start=1):
            answer = await replay.get(who, f"/v1/tasks/{TASK}/replay", at=event.global_position)
            assert answer.status_code == 200, (who, answer.text)
            body = answer.json()
            folded = fold(stream[:n])
            assert body["as_of"]["version"] == n and body["as_of"]["stream_events"] == len(stream)
            task = body["task"]
            assert (task["status"], task["attempt"]) == (folded.status, folded.attempt)
            assert task["counters"]["restarts"] == folded.restarts
            assert task["version"] == n
    last = await replay.get("sre", f"/v1/tasks/{TASK}/replay", at=stream[-1].global_position)
    assert last.json()["task"]["status"] == "restarting"
    placed = await replay.get(
        "sre", f"/v1/tasks/{TASK}/replay", at=stream[2].occurred_at.isoformat()
    )
    assert placed.json()["task"]["placement"]["workers"][0]["node"] == "node-0"


async def test_another_tenants_member_gets_404_as_for_no_task(replay: Replay) -> None:
    stream = await crashed_task(replay.gateway)
    at = stream[-1].global_position
    for path, params in [
        (f"/v1/tasks/{TASK}/replay", {"at": at}),
        (f"/v1/tasks/{TASK}/replay/diff", {"from": stream[0].global_position, "to": at}),
        ("/v1/tasks/nope/replay", {"at": at}),
    ]:
        answer = await replay.get("other", path, **params)
        assert (answer.status_code, answer.json()["code"]) == (404, "task_not_found"), path
    missing = await replay.get("sre", "/v1/tasks/nope/replay", at=at)
    assert missing.status_code == 404


async def test_refusals_name_the_field_and_the_next_step(replay: Replay) -> None:
    stream = await crashed_task(replay.gateway)
    first, head = stream[0], stream[-1].global_position
    path = f"/v1/tasks/{TASK}/replay"
    for params, code, field in [
        ({"at": "last tuesday"}, "replay.bad_point", "at"),
        ({"at": "2026-12-01T10:00:00"}, "replay.bad_point", "at"),
        ({"at": head + 1}, "replay.past_end", "at"),
        ({"at": first.global_position - 1}, "replay.before_start", "at"),
        ({"at": "1999-01-01T00:00:00Z"}, "replay.before_start", "at"),
    ]:
        answer = await replay.get("sre", path, **params)
        body = answer.json()
        assert (answer.status_code, body["code"], body["field"]) == (400, code, field), params
        assert body["hint"], body
    missing = await replay.get("sre", path)
    assert missing.status_code == 400  # `at` is required
    swapped = await replay.get("sre", path + "/diff", **{"from": head, "to": 1})
    assert (swapped.status_code, swapped.json()["code"]) == (400, "replay.bad_range")


async def test_diff_lists_the_changed_fields_and_the_events_between(replay: Replay) -> None:
    stream = await crashed_task(replay.gateway)
    running = next(e for e in stream if e.type == "TaskRunning")
    answer = await replay.get(
        "sre",
        f"/v1/tasks/{TASK}/replay/diff",
        **{"from": running.global_position, "to": stream[-1].global_position},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    changed = {c["field"]: (c["from"], c["to"]) for c in body["changes"]}
    assert changed["status"] == ("running", "restarting")
    assert changed["attempt"] == (1, 2)
    assert changed["counters.restarts"] == (0, 1)
    after = [e for e in stream if e.stream_version > running.stream_version]
    assert [e["type"] for e in body["events"]] == [e.type for e in after]
    assert body["events_between"] == len(after) and body["truncated"] is False


async def test_grpc_answers_the_same_as_http_with_the_same_refusals(replay: Replay) -> None:
    stream = await crashed_task(replay.gateway)
    at, start = str(stream[-1].global_position), str(stream[0].global_position)

    def auth(who: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {replay.tokens[who]}"),)

    reply = await replay.stub.GetTaskAt(
        pb.GetTaskAtRequest(task_id=TASK, at=at), metadata=auth("sre")
    )
    over_http = await replay.get("sre", f"/v1/tasks/{TASK}/replay", at=at)
    assert convert.task_at_dict(reply) == over_http.json()
    assert reply.task.status == pb.TASK_STATUS_RESTARTING
    diff = await replay.stub.DiffTask(
        pb.DiffTaskRequest(task_id=TASK, from_point=start, to_point=at), metadata=auth("ml_bob")
    )
    assert diff.to_point.version == len(stream)
    diff_http = await replay.get(
        "ml_bob", f"/v1/tasks/{TASK}/replay/diff", **{"from": start, "to": at}
    )
    assert convert.diff_dict(diff) == diff_http.json()
    for who, request, code in [
        ("other", pb.GetTaskAtRequest(task_id=TASK, at=at), grpc.StatusCode.NOT_FOUND),
        ("sre", pb.GetTaskAtRequest(task_id=TASK, at="noon"), grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await replay.stub.GetTaskAt(request, metadata=auth(who))
        assert refused.value.code() == code
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await replay.stub.GetTaskAt(pb.GetTaskAtRequest(task_id=TASK, at=at))
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED


# --- pools (the scheduler's route) ------------------------------------------------------


async def test_pool_replay_folds_the_stream_and_hides_other_tenants_tasks(
    face: Face,  # noqa: F811  (the fixture)
) -> None:
    pools = face
    pools.tokens["sre"] = await create_token(pools.store.pool, "ops", "sam", "sre")
    assert any(r.path == "/v1/pools/replay" and r.owner == "scheduler" for r in ROUTES)
    before = await pools.store.head_position()
    await pools.submit("mine", "t1")  # takes the only node
    url = "http://scheduler/v1/pools/replay"

    async def at(who: str, point: Any) -> dict[str, Any]:
        answer = await pools.http.get(
            url, params={"at": point}, headers={"Authorization": pools.auth(who)}
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    head = await pools.store.head_position()
    (now,) = (await at("sre", head))["pools"]
    assert [a["task_id"] for a in now["occupancy"]["items"]] == ["mine"]
    assert now["capacity"]["free_gpus"] == 0
    (then,) = (await at("sre", before))["pools"]
    assert then["occupancy"]["items"] == [] and then["capacity"]["free_gpus"] == 8
    (own,) = (await at("t1", head))["pools"]
    assert own["occupancy"]["items"][0]["task_id"] == "mine"
    (hidden,) = (await at("t2", head))["pools"]
    assert hidden["occupancy"]["items"][0]["task_id"] == HIDDEN
    assert set(hidden["nodes"]["items"][0]["owners"]) == {HIDDEN}

    past = await pools.http.get(
        url, params={"at": head + 1}, headers={"Authorization": pools.auth("sre")}
    )
    assert (past.status_code, past.json()["code"]) == (400, "replay.past_end")
    unknown = await pools.http.get(
        url, params={"at": head, "pool": "nope"}, headers={"Authorization": pools.auth("sre")}
    )
    assert (unknown.status_code, unknown.json()["code"]) == (404, "pool.not_found")
    anonymous = await pools.http.get(url, params={"at": head})
    assert anonymous.status_code == 401


async def test_grpc_pools_at_answers_as_the_schedulers_route(
    face: Face,  # noqa: F811  (the fixture)
    dsn: str,
    tmp_path: Path,
) -> None:
    pools = face
    before = await pools.store.head_position()
    await pools.submit("mine", "t1")
    head = await pools.store.head_position()
    transport = httpx.ASGITransport(app=http_app(pools.store, role=lambda: "active"))
    owners = Owners({"scheduler": "http://scheduler"}, transport=transport)
    gateway = await Gateway.connect(dsn, tmp_path)
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=owners)
    url = "http://scheduler/v1/pools/replay"
    auth = (("authorization", pools.auth("t1")),)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TasksStub(channel)
            for point in (str(head), str(before)):
                reply = await stub.GetPoolsAt(pb.GetPoolsAtRequest(at=point), metadata=auth)
                over_http = await pools.http.get(
                    url, params={"at": point}, headers={"Authorization": pools.auth("t1")}
                )
                assert convert.pools_at_dict(reply) == over_http.json()
                assert reply.WhichOneof("point") == "position_point"
            (pool,) = convert.pools_at_dict(reply)["pools"]
            assert pool["occupancy"]["items"] == []  # before the task was placed
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                request = pb.GetPoolsAtRequest(at=str(head), pool_id="nope")
                await stub.GetPoolsAt(request, metadata=auth)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(grace=None)
        await owners.aclose()
        await gateway.close()


async def test_pool_capacity_hides_other_tenants_tasks_as_the_replay_does(
    face: Face,  # noqa: F811  (the fixture)
    dsn: str,
    tmp_path: Path,
) -> None:
    """The live capacity lists what runs and waits; a member sees its own tenant's task
    ids only (HTTP and gRPC), the sre and platform_admin every one."""
    pools = face
    pools.tokens["sre"] = await create_token(pools.store.pool, "ops", "sam", "sre")
    await pools.submit("mine", "t1")  # takes the only node
    await pools.submit("theirs", "t2")  # waits
    gateway = await Gateway.connect(dsn, tmp_path)
    try:
        async with served(gateway) as (http, stub):

            async def seen(who: str) -> tuple[list[str], list[str], Any]:
                headers = {"Authorization": pools.auth(who)}
                answer = await http.get("/v1/pools/dev-a100/capacity", headers=headers)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                reply = await stub.GetPoolCapacity(
                    pb.GetPoolCapacityRequest(pool_id="dev-a100"),
                    metadata=(("authorization", pools.auth(who)),),
                )
                assert convert.capacity_dict(reply) == body, who
                running = [i["task_id"] for i in body["occupancy"]["items"]]
                waiting = [i["task_id"] for i in body["queue"]["items"]]
                return running, waiting, body["queue"]["head"]

            head = (await seen("root"))[2]  # the queue's head, when one blocks it
            assert head in (None, "theirs")
            assert await seen("t1") == (["mine"], [HIDDEN], head and HIDDEN)
            assert await seen("t2") == ([HIDDEN], ["theirs"], head)
            for reader in ("sre", "root"):
                assert await seen(reader) == (["mine"], ["theirs"], head), reader
    finally:
        await gateway.close()
