"""The causation view on the whole platform (R-62): `runyard trace` over real chains.

A task submitted with its request id runs on dev-a100; its trace is one tree
rooted at the submission, the scheduler's placement and the pool allocation
under the same task event. Then a platform admin marks the task's node faulty
(with a request id of its own): fault tolerance asks for the task's
reschedule, and the fault's trace holds that reschedule under the
`NodeMarkedFaulty` event, across the pool and the task streams. Every event
of the database keeps its chain (conftest checks it after the test).
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest
from runyard.api.auth import create_token

from tests.e2e.conftest import Platform
from tests.e2e.test_fault_tolerance import wait_events

pytestmark = [pytest.mark.slow, pytest.mark.integration]
RESCHEDULE = "TaskRescheduleRequested"


async def tokens(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            "sre": await create_token(conn, "ops", "sam", "sre"),
            "root": await create_token(conn, "ops", "root", "platform_admin"),
        }
    finally:
        await conn.close()


def auth(token: str, request_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    return {**headers, "X-Request-Id": request_id} if request_id else headers


def children(tree: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in tree if n["parent"] == parent["event_id"]]


async def test_trace_follows_a_placement_and_a_node_fault_across_streams(
    platform: Platform, dsn: str
) -> None:
    who = await tokens(dsn)
    submit_id = f"submit-{uuid.uuid4()}"
    body = {"pool": "dev-a100", "worker_spec": "1gpu", "image": "bash-only",
            "name": "traced", "command": "sleep 120"}  # fmt: skip
    created = await platform.http.post("/v1/tasks", json=body, headers={"X-Request-Id": submit_id})
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    await platform.wait_status(task_id, "running", within=60)

    answer = await platform.http.get(f"/v1/tasks/{task_id}/trace", headers=auth(who["sre"]))
    assert answer.status_code == 200, answer.text
    trace = answer.json()
    assert trace["correlation_ids"] == [submit_id]
    tree = trace["tree"]
    root = tree[0]
    assert (root["type"], root["causation_id"], root["depth"]) == ("TaskSubmitted", submit_id, 0)
    [placed] = [n for n in tree if n["type"] == "TaskPlaced"]
    [allocated] = [n for n in tree if n["type"] == "WorkersAllocated"]
    assert allocated["stream_id"] == "pool-dev-a100"
    assert allocated["parent"] == placed["parent"], "both caused by the same task event"
    assert {n["correlation_id"] for n in tree} == {submit_id}
    traced = {n["trace_id"] for n in tree if n["trace_id"]}
    assert set(trace["trace_ids"]) == traced

    # a node fault: fault tolerance asks for the reschedule of the task on it
    node = next(e for e in await platform.events(task_id) if e["type"] == "TaskPlaced")["data"][
        "workers"
    ][0]["node"]
    fault_id = f"fault-{uuid.uuid4()}"
    marked = await platform.http.post(
        f"/v1/admin/pools/dev-a100/nodes/{node}/fault",
        json={"reason": "GPU 0 fell off the bus"},
        headers=auth(who["root"], fault_id),
    )
    assert marked.status_code < 300, marked.text
    await wait_events(
        platform, task_id, lambda es: any(e["type"] == RESCHEDULE for e in es), within=60
    )

    task_trace = (
        await platform.http.get(f"/v1/tasks/{task_id}/trace", headers=auth(who["sre"]))
    ).json()
    assert task_trace["correlation_ids"] == [submit_id, fault_id]
    [fault] = [n for n in task_trace["tree"] if n["type"] == "NodeMarkedFaulty"]
    assert (fault["stream_id"], fault["depth"], fault["causation_id"]) == (
        "pool-dev-a100",
        0,
        fault_id,
    )
    of_fault = (
        await platform.http.get(f"/v1/events/{fault['event_id']}/trace", headers=auth(who["sre"]))
    ).json()
    rescheduled = [n for n in children(of_fault["tree"], fault) if n["type"] == RESCHEDULE]
    assert [n["stream_id"] for n in rescheduled] == [f"task-{task_id}"]
    assert {n["correlation_id"] for n in of_fault["tree"]} == {fault_id}
    await platform.http.post(f"/v1/tasks/{task_id}/stop")
