"""Each tenant's share of the submissions the gateway has in flight at once
(`submissions_per_tenant`), over a real Postgres, the submission service beside the
gateway, the gateway served by uvicorn and gRPC, as in production."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import grpc
import httpx
import pytest
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc

from tests.integration.test_gateway import BASE
from tests.integration.test_gateway_routing import Stack, stack  # noqa: F401  (fixture)
from tests.integration.test_grpc import spec_of

pytestmark = pytest.mark.integration

#: The submission service's statements waiting for a row lock (here: the group's row).
LOCKED = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE wait_event_type = 'Lock' AND query LIKE '%task_groups%'"
)


#: A submission to alice's group `g1` (made by `group_row_held`): it waits for the row.
MORE = {"template": BASE, "items": [{"name": "more"}], "group_id": "g1"}


@asynccontextmanager
async def group_row_held(stack: Stack, dsn: str) -> AsyncIterator[None]:  # noqa: F811
    """Alice's group `g1` made, then its row held by an open transaction of our own
    while the block runs: every submission to it waits in the submission service,
    holding its slot and its connection, as behind a large group."""
    grouped = {"template": BASE, "items": [{"name": "first"}], "group_id": "g1"}
    first = await stack.http.post("/v1/groups", json=grouped, headers=stack.auth("alice"))
    assert first.status_code == 201, first.text
    held = await asyncpg.connect(dsn)
    holding = held.transaction()
    await holding.start()
    try:
        await held.execute("UPDATE task_groups SET tasks = tasks WHERE group_id = 'g1'")
        yield
    finally:
        await holding.rollback()
        await held.close()


def send_more(stack: Stack, **kw: Any) -> asyncio.Future[httpx.Response]:  # noqa: F811
    return asyncio.ensure_future(
        stack.http.post("/v1/groups", json=MORE, headers=stack.auth("alice"), **kw)
    )


async def test_a_tenants_flood_of_submissions_waits_behind_itself(
    stack: Stack,  # noqa: F811  (the fixture)
    dsn: str,
) -> None:
    """Past its submissions in flight, a tenant's next one waits its turn and, none
    ending in time, is refused (429 `submission.busy`, Retry-After; gRPC
    `RESOURCE_EXHAUSTED`); another tenant's submission goes through meanwhile; once
    the tenant's own end, the one waiting gets its turn."""
    slots = stack.gateway.submissions
    slots.per_tenant, slots.wait_s = 2, 0.3
    alice = stack.auth("alice")
    async with group_row_held(stack, dsn):
        # Two submissions to the group wait in the submission service for its row.
        flood = [send_more(stack) for _ in range(2)]
        async with asyncio.timeout(30):
            while await stack.gateway.db.fetchval(LOCKED) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert slots.busy("t1") == 2

        refused = await stack.http.post("/v1/tasks", json=BASE, headers=alice)
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "2"
        body = refused.json()
        assert body["code"] == "submission.busy", body
        assert "2 submissions in flight" in body["message"] and body["hint"], body
        metadata = (("authorization", f"Bearer {stack.tokens['alice']}"),)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
                await pb_grpc.TasksStub(channel).CreateTask(
                    pb.CreateTaskRequest(spec=spec_of(BASE)), metadata=metadata
                )
        assert over_grpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 submissions in flight" in (over_grpc.value.details() or "")

        theirs = await stack.http.post("/v1/tasks", json=BASE, headers=stack.auth("carol"))
        assert theirs.status_code == 201, theirs.text  # another tenant: not behind t1's

        slots.wait_s = 60.0
        waiting = asyncio.ensure_future(stack.http.post("/v1/tasks", json=BASE, headers=alice))
        async with asyncio.timeout(30):
            while slots.busy("t1") < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert not waiting.done()
    answers: list[httpx.Response] = await asyncio.gather(*flood, waiting)
    assert [a.status_code for a in answers] == [201, 201, 201], [a.text for a in answers]
    assert slots.busy("t1") == 0 and slots._tenants == {}


async def test_a_tenants_submissions_never_take_every_connection_of_the_submission_service(
    stack: Stack,  # noqa: F811  (the fixture)
    dsn: str,
) -> None:
    """The gateway lets a tenant have 16 submissions in flight, the submission service
    has 10 connections: each of the tenant's calls held one for its whole transaction
    (here waiting for its group's row, as behind a large group), so another tenant's
    submission waited for them all. Now at most 4 of one tenant's calls hold one; the
    rest wait their turn behind their own, and another tenant's goes through."""
    async with group_row_held(stack, dsn):
        flood = [send_more(stack, timeout=120) for _ in range(stack.gateway.submissions.per_tenant)]
        async with asyncio.timeout(60):
            while stack.gateway.submissions.busy("t1") < len(flood):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            while await stack.gateway.db.fetchval(LOCKED) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        theirs = await stack.http.post(
            "/v1/tasks", json=BASE, headers=stack.auth("carol"), timeout=30
        )
        assert theirs.status_code == 201, theirs.text
        assert await stack.gateway.db.fetchval(LOCKED) == 4, "4 of t1's calls hold one"
        assert not any(f.done() for f in flood)
    answers: list[httpx.Response] = await asyncio.gather(*flood)
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
