"""The support bundle of a task that really ran, crashed, restarted and failed (R-70).

The whole platform runs in-process (conftest.py), its restart after at most 0.5 s;
the task's launch command prints its own creator-only token, then raises. The
bundle, fetched through the gateway, tells the story without the token.
"""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runyard.messaging import KafkaSettings

from tests.e2e.conftest import Platform, restarts_capped, running_platform

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SECRET = "e2e-token-7f3a9c1d5b"
COMMAND = """set -o pipefail
echo "step 1 loss=2.30"
echo "logging in with $HF_TOKEN"
python -c 'raise RuntimeError("injected crash")'
"""


@pytest.fixture
async def platform(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Platform]:
    async with running_platform(dsn, kafka, tmp_path, configure=restarts_capped(0.5)) as running:
        yield running


async def test_the_bundle_of_a_real_failed_task(platform: Platform) -> None:
    created = await platform.submit(
        name="bundle-e2e",
        image="pytorch:2.3-cuda12",
        command=COMMAND,
        env=f"HF_TOKEN={SECRET}",
        creator_only=["HF_TOKEN"],
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    task_id = created["task_id"]
    await platform.wait_status(task_id, "failed", within=120)
    # The scheduler's release may land after `failed`: bundle the settled stream.
    for _ in range(200):
        if (await platform.events(task_id))[-1]["type"] == "ResourcesReleased":
            break
        await asyncio.sleep(0.05)

    answer = await platform.http.get(f"/v1/tasks/{task_id}/bundle")
    assert answer.status_code == 200, answer.text
    with zipfile.ZipFile(io.BytesIO(answer.content)) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    for name, data in files.items():
        assert SECRET.encode() not in data, name

    summary = files["summary.md"].decode()
    assert "- State: failed" in summary
    assert "restart scheduled after failure: attempt 2" in summary
    assert "RuntimeError: injected crash" in summary
    assert "Layer: **training_code**" in summary
    assert "| 1 | 2 | env_init |" in summary  # the stages of the second attempt, timed

    events = [json.loads(line) for line in files["events.jsonl"].splitlines()]
    timeline = await platform.events(task_id)
    assert [e["position"] for e in events] == [e["position"] for e in timeline]
    assert all(e["correlation_id"] for e in events)

    tail = files["logs/run-1-attempt-2/worker-0.log"].decode().splitlines()
    assert tail[0].startswith("1 ") and tail[0].endswith("| step 1 loss=2.30")
    assert tail[1].endswith("| logging in with ******")  # masked before it was published
    assert tail[-1].endswith("RuntimeError: injected crash")
