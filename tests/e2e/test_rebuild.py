"""Read-model rebuilds on the whole platform: after tasks ran, were stopped and
queued, `runyard rebuild NAME --diff` finds 0 differences for every read model,
through the gateway (the scheduler's and the notification service's routed to
it), and a corrupted row of the task list is one difference that the swap
repairs while the platform runs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from runyard.api.auth import create_token

from tests.e2e.conftest import Platform

pytestmark = [pytest.mark.slow, pytest.mark.integration]

READ_MODELS = {
    "task_list": "/v1/admin/read-models/task_list",
    "scheduler_pool_views": "/v1/admin/scheduler/read-models/scheduler_pool_views",
    "scheduler_queue": "/v1/admin/scheduler/read-models/scheduler_queue",
    "queue_waits": "/v1/admin/notification/read-models/queue_waits",
}


async def diff_once(platform: Platform, headers: dict[str, str], name: str) -> Any:
    """Rebuild (every step) and diff one read model: its table's answer."""
    base = READ_MODELS[name]
    done = False
    while not done:
        step = await platform.http.post(f"{base}/rebuild", headers=headers)
        assert step.status_code == 200, step.text
        done = step.json()["done"]
    answer = await platform.http.get(f"{base}/diff", headers=headers)
    assert answer.status_code == 200, answer.text
    [table] = answer.json()["tables"]
    return table


async def diff_when_settled(platform: Platform, headers: dict[str, str], name: str) -> Any:
    """`diff_once` until the live side has caught up with the log (at most 20 s): the
    scheduler's consumer may still be handling the last events."""
    deadline = time.monotonic() + 20
    while True:
        table = await diff_once(platform, headers, name)
        if table["differences"] == 0 or time.monotonic() > deadline:
            return table
        await asyncio.sleep(0.5)


async def test_every_read_model_rebuilds_to_0_differences(platform: Platform, dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        sre = await create_token(conn, "ops", "sam", "sre")
    finally:
        await conn.close()
    headers = {"Authorization": f"Bearer {sre}"}
    done = await platform.submit(name="done", command="true")
    gang = await platform.submit(
        name="gang", worker_spec="8gpu", worker_count=4, framework="pytorch_ddp",
        command="sleep 60",
    )  # fmt: skip
    await platform.wait_status(done["task_id"], "succeeded", within=60)
    await platform.wait_status(gang["task_id"], "running", within=60)
    waiting = await platform.submit(name="waits", worker_spec="8gpu", command="sleep 1")
    stopped = await platform.submit(name="stopped", command="sleep 60")
    await platform.wait_status(waiting["task_id"], "queued")
    await platform.http.post(f"/v1/tasks/{stopped['task_id']}/stop")
    await platform.wait_for(stopped["task_id"], lambda t: t["status"] in ("stopped", "queued"))

    for name in READ_MODELS:
        table = await diff_when_settled(platform, headers, name)
        assert table["differences"] == 0, (name, table["items"])
        assert table["live_rows"] > 0, name

    # a corrupted row: one difference, repaired by the swap while everything runs
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "UPDATE task_list SET status = 'bogus' WHERE task_id = $1", done["task_id"]
        )
    finally:
        await conn.close()
    table = await diff_once(platform, headers, "task_list")
    assert [(i["key"], i["columns"]) for i in table["items"]] == [
        (done["task_id"], {"status": {"live": "bogus", "rebuilt": "succeeded"}})
    ]
    swapped = await platform.http.post(f"{READ_MODELS['task_list']}/swap", headers=headers)
    assert swapped.status_code == 200 and swapped.json()["repaired"] == 1, swapped.text
    assert (await platform.task(done["task_id"]))["status"] == "succeeded"
    table = await diff_when_settled(platform, headers, "task_list")
    assert table["differences"] == 0
    await platform.http.post(f"/v1/tasks/{gang['task_id']}/stop")
