"""A task write that loses a race is decided again, not answered with 409.

A finished task may still get an event (the scheduler's `ResourcesReleased`)
between the submission service's read and its append (a rerun, a clone). The
service then folds what is new and decides again. Here the race is made
certain: another writer appends to the task's stream right after the
service's first read of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.contracts import Metadata, NewEvent
from runyard.contracts.envelope import utcnow
from runyard.contracts.task_events import AlertDelivered
from runyard.eventstore import PostgresEventStore
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.submission.service import Submissions

from tests.integration.test_gateway import BASE, config_dir
from tests.submission_beside import submission_beside

pytestmark = pytest.mark.integration


@pytest.fixture
async def services(dsn: str, tmp_path: Path) -> AsyncIterator[tuple[Gateway, Submissions]]:
    folder = config_dir(tmp_path)
    client, submissions = await submission_beside(dsn, folder)
    gateway = await Gateway.connect(dsn, folder, submission=client)
    try:
        yield gateway, submissions
    finally:
        await gateway.close()


@pytest.fixture
def gateway(services: tuple[Gateway, Submissions]) -> Gateway:
    return services[0]


@pytest.fixture
def submissions(services: tuple[Gateway, Submissions]) -> Submissions:
    return services[1]


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    token = await create_token(gateway.db, "t1", "alice", "member")
    transport = httpx.ASGITransport(app=create_app(gateway))
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as c:
        yield c


def race_after_next_read(store: PostgresEventStore, task_id: str) -> list[int]:
    """Right after the next read of the task's stream through `store`, another writer
    appends to it (an alert delivered: it changes no decision). Returns the count of
    reads."""
    real = store.read_stream
    calls = [0]

    async def read_stream(stream_id: str, *args: Any, **kwargs: Any) -> Any:
        events = await real(stream_id, *args, **kwargs)
        if stream_id == f"task-{task_id}":
            calls[0] += 1
            if calls[0] == 1:
                delivered = AlertDelivered(alert="stopped", channel="feishu:sub-1", attempt=1)
                meta = Metadata(actor="service:notification")
                await store.append(
                    stream_id, [NewEvent(event=delivered, metadata=meta, occurred_at=utcnow())]
                )
        return events

    store.read_stream = read_stream  # type: ignore[method-assign]
    return calls


async def stopped_task(http: httpx.AsyncClient) -> tuple[str, int]:
    created = await http.post("/v1/tasks", json=BASE)
    assert created.status_code == 201, created.text
    task_id = str(created.json()["task_id"])
    stopped = await http.post(f"/v1/tasks/{task_id}/stop")
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["status"] == "stopped"
    events = await http.get(f"/v1/tasks/{task_id}/events")
    return task_id, len(events.json())


async def test_a_clone_that_loses_a_race_is_decided_again(
    submissions: Submissions, http: httpx.AsyncClient
) -> None:
    task_id, before = await stopped_task(http)
    assert before >= 2
    calls = race_after_next_read(submissions.store, task_id)
    clone = await http.post(f"/v1/tasks/{task_id}/clone", json={})
    assert clone.status_code == 201, clone.text
    assert calls[0] >= 2  # the raced read, then the reload after the conflict
    events = (await http.get(f"/v1/tasks/{task_id}/events")).json()
    assert [e["type"] for e in events[before:]] == ["AlertDelivered", "TaskCloned"]


async def test_a_rerun_that_loses_a_race_is_decided_again(
    submissions: Submissions, http: httpx.AsyncClient
) -> None:
    task_id, _ = await stopped_task(http)
    calls = race_after_next_read(submissions.store, task_id)
    rerun = await http.post(f"/v1/tasks/{task_id}/rerun", json={})
    assert rerun.status_code == 200, rerun.text
    assert calls[0] >= 2
    assert rerun.json()["run"] == 2
