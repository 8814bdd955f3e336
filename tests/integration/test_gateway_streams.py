"""Each tenant's share of the gateway's long-lived streams (`streams_per_tenant`):
watches of a task (HTTP server-sent events, gRPC `WatchTask`), live tails of its
logs routed to the log service (HTTP `logs/follow`, gRPC `FollowLogs`) and the
console's live task list, over a real Postgres, the log service on a real port and
the gateway served by uvicorn and gRPC, as in production."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc

from tests.integration.test_gateway import BASE
from tests.integration.test_gateway_routing import Stack, ingest, stack  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


async def _open_count(on: Stack, tenant: str, count: int) -> None:
    """Wait until the gateway counts `count` open streams of `tenant`."""
    while on.gateway.streams.open.get(tenant, 0) != count:  # noqa: ASYNC110
        await asyncio.sleep(0.02)


async def test_a_tenant_keeps_at_most_its_streams_open_and_others_keep_theirs(
    stack: Stack,  # noqa: F811  (the fixture)
) -> None:
    """Past its share, a tenant's next stream of any kind is refused before it starts
    (429 `streams.too_many`, Retry-After; gRPC `RESOURCE_EXHAUSTED`), the log service
    never asked; another tenant opens its own meanwhile. A stream its reader closed,
    one that ended with its task, and one never started (a 404) count closed, so the
    tenant may open one again."""
    stack.gateway.streams.per_tenant = 4
    await ingest(stack.logs.store, stack.task_id, "a line")
    url = str(stack.http.base_url)
    alice = stack.auth("alice")
    watch = f"/v1/tasks/{stack.task_id}/watch"
    follow = f"/v1/tasks/{stack.task_id}/logs/follow"
    metadata = (("authorization", f"Bearer {stack.tokens['alice']}"),)
    other = await stack.http.post("/v1/tasks", json=BASE, headers=alice)
    ending = other.json()["task_id"]
    carols = await stack.http.post("/v1/tasks", json=BASE, headers=stack.auth("carol"))
    readers: list[AsyncIterator[str]] = []  # kept: a reader dropped closes its stream

    async def opened(streams: contextlib.AsyncExitStack, path: str, who: str) -> None:
        answer = await streams.enter_async_context(
            stack.http.stream("GET", path, headers=stack.auth(who))
        )
        assert answer.status_code == 200, await answer.aread()
        readers.append(answer.aiter_lines())
        assert await anext(readers[-1])  # its first event or page came

    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel,
        httpx.AsyncClient(base_url=url) as console,
        asyncio.timeout(60),
    ):
        tasks = pb_grpc.TasksStub(channel)
        signed = await console.post("/console/sign-in", data={"token": stack.tokens["alice"]})
        assert signed.status_code == 303, signed.text
        async with contextlib.AsyncExitStack() as carol, contextlib.AsyncExitStack() as http:
            await opened(http, watch, "alice")
            grpc_watch = tasks.WatchTask(
                pb.WatchTaskRequest(task_id=stack.task_id), metadata=metadata
            )
            assert (await grpc_watch.read()).type == "TaskSubmitted"
            grpc_follow = tasks.FollowLogs(
                pb.FollowLogsRequest(task_id=stack.task_id), metadata=metadata
            )
            assert [ln.line for ln in (await grpc_follow.read()).lines] == ["a line"]
            async with contextlib.AsyncExitStack() as follows:
                await opened(follows, follow, "alice")
                assert stack.gateway.streams.open["t1"] == 4
                asked = len(stack.logs.calls)

                refusals: list[httpx.Response] = [
                    await stack.http.get(watch, headers=alice),
                    await stack.http.get(follow, headers=alice),
                ]
                for answer in refusals:
                    assert answer.status_code == 429, answer.text
                    assert answer.headers["retry-after"] == "2"
                    body: dict[str, Any] = answer.json()
                    assert body["code"] == "streams.too_many", body
                    assert "4 streams open" in body["message"] and body["hint"], body
                assert len(stack.logs.calls) == asked, "the log service was not asked"
                for call in (
                    tasks.WatchTask(pb.WatchTaskRequest(task_id=stack.task_id), metadata=metadata),
                    tasks.FollowLogs(
                        pb.FollowLogsRequest(task_id=stack.task_id), metadata=metadata
                    ),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call.read()
                    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert "4 streams open" in (refused.value.details() or "")
                live = await console.get("/console/tasks/stream")
                assert live.status_code == 429, live.text
                assert live.headers["retry-after"] == "2"
                assert stack.gateway.streams.open["t1"] == 4, "a refusal holds none"

                # another tenant, at the same time: its own share
                await opened(carol, f"/v1/tasks/{carols.json()['task_id']}/watch", "carol")
                assert stack.gateway.streams.open["t2"] == 1
                theirs = await stack.http.get(follow, headers=stack.auth("carol"))
                assert theirs.status_code == 404, theirs.text  # the owner's: never started
                await _open_count(stack, "t2", 1)

                # a reader gone (a gRPC call cancelled): the tenant opens one again
                grpc_follow.cancel()
                await _open_count(stack, "t1", 3)
                async with console.stream("GET", "/console/tasks/stream") as answer:
                    assert answer.status_code == 200, await answer.aread()
                    assert await anext(answer.aiter_lines()) == "retry: 2000"
                    assert stack.gateway.streams.open["t1"] == 4
                await _open_count(stack, "t1", 3)  # the browser left
            await _open_count(stack, "t1", 2)  # the follow's reader left

            # a watch that ends with its task, and one of no task, count closed
            ended = asyncio.ensure_future(
                stack.http.get(f"/v1/tasks/{ending}/watch", headers=alice)
            )
            await _open_count(stack, "t1", 3)
            stopped = await stack.http.post(f"/v1/tasks/{ending}/stop", headers=alice)
            assert stopped.status_code == 200, stopped.text
            assert (await ended).text.endswith("event: end\ndata: {}\n\n")
            await _open_count(stack, "t1", 2)
            missing = await stack.http.get("/v1/tasks/no-such-task/watch", headers=alice)
            assert missing.status_code == 404, missing.text
            assert stack.gateway.streams.open["t1"] == 2
            grpc_watch.cancel()
        await _open_count(stack, "t1", 0)
        await _open_count(stack, "t2", 0)
    assert stack.gateway.streams.open == {}
