"""Logs end to end: a real worker's output, through the deployer, the
`runyard.logs` topic and the log service, read back through the gateway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from runyard.messaging import KafkaSettings

from tests.e2e.conftest import Platform, running_platform

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMAND = """echo 'starting training on 1 worker'
echo 'epoch 1 loss=2.31'
echo 'loading data' >&2
python -c 'import runyard_no_such_package'
"""


@pytest.fixture
async def platform(
    dsn: str, kafka: KafkaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Platform]:
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "home"))
    async with running_platform(dsn, kafka, tmp_path) as running:
        yield running


async def lines_of(platform: Platform, task_id: str, want: int, **params: Any) -> list[Any]:
    deadline = time.monotonic() + 30
    while True:
        answer = await platform.http.get(f"/v1/tasks/{task_id}/logs", params=params)
        assert answer.status_code == 200, answer.text
        lines = answer.json()["lines"]
        if len(lines) >= want or time.monotonic() > deadline:
            return list(lines)
        await asyncio.sleep(0.2)


async def test_a_failed_tasks_output_is_searchable_with_its_first_error(
    platform: Platform,
) -> None:
    created = await platform.submit(name="logs", image="pytorch:2.3-cuda12", command=COMMAND)
    task_id = created["task_id"]
    await platform.wait_status(task_id, "failed", within=60)
    lines = await lines_of(platform, task_id, 6)
    texts = [ln["line"] for ln in lines]
    assert texts[:3] == ["starting training on 1 worker", "epoch 1 loss=2.31", "loading data"]
    assert texts[3] == "Traceback (most recent call last):"
    assert texts[-1] == "ModuleNotFoundError: No module named 'runyard_no_such_package'"
    assert [ln["stream"] for ln in lines[:3]] == ["stdout", "stdout", "stderr"]
    assert {(ln["worker"], ln["run"]) for ln in lines} == {(0, 1)}
    assert len(lines) == 6, texts

    found = await lines_of(platform, task_id, 1, words="loss", worker=0)
    assert [ln["line"] for ln in found] == ["epoch 1 loss=2.31"]

    first = (await platform.http.get(f"/v1/tasks/{task_id}/first-error")).json()
    assert first["found"] and first["status"] == "failed"
    assert first["line"]["line"] == "Traceback (most recent call last):"
    assert (first["layer"], first["rule"]) == ("image", "image.missing_package")
    assert [ln["line"] for ln in first["before"]] == texts[:3]
