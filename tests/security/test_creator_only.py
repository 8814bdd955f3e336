"""Creator-only variables reach the creator's workers, and only theirs (local runtime).

The whole platform runs in-process. Carol, a member of tenant `e2e`, submits a
task with a creator-only `WANDB_API_KEY`; Bob, another member, reruns it (as
it is: changing its command is Carol's) and clones it. The worker prints
`${WANDB_API_KEY:-EMPTY}` and the value's md5: the creator's runs get her value,
runs Bob started get nothing (or the value Bob gave his clone), as the md5s
show. The value is never in an event, never in a platform log record and never
in the log store: the line the worker printed reaches the logs (anyone's
reading, searching or exporting them) with `******` in its place.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.messaging import KafkaSettings

from tests.e2e.conftest import Platform, running_platform

pytestmark = pytest.mark.integration

SECRET = "wandb-carol-5f1c9e0a7d"
BOBS = "wandb-bob-77aa01"
COMMAND = 'echo "key ${WANDB_API_KEY:-EMPTY} $(printf %s "$WANDB_API_KEY" | md5sum | cut -c1-12)"'


def printed(value: str | None) -> str:
    """The line the worker prints, as its task's logs show it: the value masked."""
    md5 = hashlib.md5((value or "").encode()).hexdigest()[:12]
    return f"key {'******' if value else 'EMPTY'} {md5}"


@pytest.fixture
async def platform(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Platform]:
    async with running_platform(dsn, kafka, tmp_path, layout="processes") as running:
        yield running


async def member(platform: Platform, dsn: str, user: str) -> httpx.AsyncClient:
    conn = await asyncpg.connect(dsn)
    try:
        token = await create_token(conn, "e2e", user, "member")
    finally:
        await conn.close()
    return httpx.AsyncClient(
        base_url=str(platform.http.base_url),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


async def wait_finished(http: httpx.AsyncClient, task_id: str, run: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        task: dict[str, Any] = (await http.get(f"/v1/tasks/{task_id}")).json()
        if task["run"] == run and task["status"] in ("succeeded", "failed", "stopped"):
            return task
        assert time.monotonic() < deadline, f"run {run} of {task_id} is {task['status']}"
        await asyncio.sleep(0.1)


async def key_line(http: httpx.AsyncClient, task_id: str, run: int) -> str:
    """The `key ...` line the worker of run `run` printed."""
    deadline = time.monotonic() + 30
    while True:
        answer = await http.get(f"/v1/tasks/{task_id}/logs", params={"run": run})
        assert answer.status_code == 200, answer.text
        lines = [ln["line"] for ln in answer.json()["lines"] if ln["line"].startswith("key ")]
        if lines:
            assert len(lines) == 1, lines
            return str(lines[0])
        assert time.monotonic() < deadline, f"no output of run {run} of {task_id}"
        await asyncio.sleep(0.2)


async def rerun(http: httpx.AsyncClient, task_id: str, run: int, **changes: Any) -> str:
    # A finished run may still get an event (the scheduler's ResourcesReleased): a 409
    # then says "try again", as its hint does.
    for _ in range(50):
        answer = await http.post(f"/v1/tasks/{task_id}/rerun", json=changes)
        if answer.status_code != 409:
            break
        await asyncio.sleep(0.1)
    assert answer.status_code == 200, answer.text
    await wait_finished(http, task_id, run)
    return await key_line(http, task_id, run)


async def test_creator_only_values_reach_the_creators_runs_only(
    platform: Platform, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    carol = await member(platform, dsn, "carol")
    bob = await member(platform, dsn, "bob")
    try:
        body = {
            "name": "wandb",
            "pool": "dev-a100",
            "worker_spec": "1gpu",
            "image": "bash-only",
            "command": COMMAND,
            "env": f"WANDB_API_KEY={SECRET}",
            "creator_only": ["WANDB_API_KEY"],
        }
        created = await carol.post("/v1/tasks", json=body)
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]
        assert (await wait_finished(carol, task_id, 1))["status"] == "succeeded"
        assert await key_line(carol, task_id, 1) == printed(SECRET)

        # the creator's rerun: her value again
        assert await rerun(carol, task_id, 2) == printed(SECRET)
        # another member's rerun as it is: no value; what it runs only she changes (her
        # next rerun would run his command with her value)
        assert await rerun(bob, task_id, 3) == printed(None)
        changed = 'echo "key ${WANDB_API_KEY:-EMPTY} (changed)"'
        refused = await bob.post(f"/v1/tasks/{task_id}/rerun", json={"command": changed})
        assert (refused.status_code, refused.json()["code"]) == (403, "rerun.creator_only")
        assert await rerun(carol, task_id, 4) == printed(SECRET)

        # another member's clone runs with the value he gives, never hers
        clone = await bob.post(
            f"/v1/tasks/{task_id}/clone",
            json={"env": f"WANDB_API_KEY={BOBS}", "command": COMMAND},
        )
        assert clone.status_code in (200, 201), clone.text
        clone_id = clone.json()["task_id"]
        await wait_finished(bob, clone_id, 1)
        assert await key_line(bob, clone_id, 1) == printed(BOBS)
        # searching the logs for the value finds nothing, for its creator too
        for who, task in ((carol, task_id), (bob, clone_id)):
            found = await who.get(f"/v1/tasks/{task}/logs", params={"phrase": "wandb-"})
            assert found.status_code == 200, found.text
            assert found.json()["lines"] == []
    finally:
        await carol.aclose()
        await bob.aclose()

    conn = await asyncpg.connect(dsn)
    try:
        in_events = await conn.fetchval(
            "SELECT count(*) FROM events WHERE data::text LIKE $1", f"%{SECRET}%"
        )
        in_logs = await conn.fetch(
            "SELECT run, line FROM log_lines WHERE line LIKE $1 OR line LIKE $2",
            f"%{SECRET}%",
            f"%{BOBS}%",
        )
    finally:
        await conn.close()
    assert in_events == 0
    assert [dict(r) for r in in_logs] == []
    # Runyard's own records at any level, and every library's from INFO up (a Kafka
    # client's DEBUG record of the payload it sends carries the worker's own line).
    records = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("runyard") or r.levelno >= logging.INFO
    ]
    assert records and not [m for m in records if SECRET in m]
