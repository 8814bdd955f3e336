"""Tasks really run, end to end.

Every test goes through the gateway's HTTP API to the whole platform (relay,
scheduler, deployer with the local runtime, ...), on a Postgres database and Kafka
topic prefix of its own; see conftest.py. The tests share the module's platforms
(one per layout, `SHARED_PLATFORM`): each submits tasks of its own and waits for
every one it started to end.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from runyard.contracts.task_events import DEPLOY_STAGES
from runyard.deployer.runtime import group_members

from tests.e2e.conftest import Platform, SharedPlatform, platform_for_test

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SHARED_PLATFORM = True


@pytest.fixture
async def platform(
    shared_platform: SharedPlatform, request: pytest.FixtureRequest
) -> AsyncIterator[Platform]:
    async with platform_for_test(shared_platform, request) as running:
        yield running


PIPE_WARNING = "command.pipe_without_pipefail"


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["occurred_at"])


@pytest.mark.processes
async def test_echo_hello_succeeds_with_every_stage_timed_and_attributed(
    platform: Platform,
) -> None:
    created = await platform.submit(name="hello", command="echo hello")
    assert created["status"] == "new"
    task = await platform.wait_status(created["task_id"], "succeeded")

    stages = task["stages"]
    assert [s["stage"] for s in stages] == list(DEPLOY_STAGES)
    assert all(s["result"] == "completed" for s in stages)
    assert all(isinstance(s["duration_ms"], int) and s["duration_ms"] >= 0 for s in stages)

    events = await platform.events(created["task_id"])
    names = types(events)
    assert names[0] == "TaskSubmitted"
    assert "TaskPlaced" in names
    for stage in DEPLOY_STAGES:
        started = [e for e in events if e["type"] == "DeployStageStarted"]
        completed = [e for e in events if e["type"] == "DeployStageCompleted"]
        assert stage in [e["data"]["stage"] for e in started]
        (done,) = [e for e in completed if e["data"]["stage"] == stage]
        assert done["data"]["duration_ms"] >= 0
    order = ["TaskPlaced", "WorkerStarted", "TaskRunning", "WorkerExited", "TaskSucceeded"]
    assert [n for n in names if n in order] == order
    assert names.index("TaskSucceeded") >= len(names) - 2, names  # ResourcesReleased may follow
    # Every event says who did it and which request it belongs to.
    request_id = events[0]["correlation_id"]
    assert events[0]["actor"] == "user:e2e/alice"
    for event in events:
        assert event["actor"], event
        assert event["correlation_id"] == request_id, event
    actors = {e["type"]: e["actor"] for e in events}
    assert actors["TaskPlaced"] == "service:scheduler"
    assert actors["TaskSucceeded"] == "service:deployer"
    assert [at(e) for e in events] == sorted(at(e) for e in events)


async def test_failing_command_fails_with_its_exit_code(platform: Platform) -> None:
    created = await platform.submit(name="bad", command="echo about to fail; exit 3")
    task = await platform.wait_status(created["task_id"], "failed")
    events = await platform.events(created["task_id"])
    failed = [e for e in events if e["type"] == "TaskFailed"]
    assert len(failed) == 1
    assert failed[0]["data"]["exit_code"] == 3
    assert failed[0]["data"]["worker"] == 0
    assert "3" in (task["last_failure_reason"] or ""), task["last_failure_reason"]


async def test_pipe_without_pipefail_succeeds_with_a_warning_and_with_pipefail_fails(
    platform: Platform,
) -> None:
    pipe = "echo 'import sys; sys.exit(1)' > fail.py; python3 fail.py | tee out.log"
    plain = await platform.submit(name="pipe", image="pytorch:2.3-cuda12", command=pipe)
    strict = await platform.submit(
        name="pipefail", image="pytorch:2.3-cuda12", command="set -o pipefail; " + pipe
    )
    assert PIPE_WARNING in [w["code"] for w in plain["warnings"]]
    assert PIPE_WARNING not in [w["code"] for w in strict["warnings"]]
    submitted = (await platform.events(plain["task_id"]))[0]
    assert PIPE_WARNING in [w["code"] for w in submitted["data"]["warnings"]]

    await platform.wait_status(plain["task_id"], "succeeded")
    await platform.wait_status(strict["task_id"], "failed")
    exited = [e for e in await platform.events(strict["task_id"]) if e["type"] == "WorkerExited"]
    assert [e["data"]["exit_code"] for e in exited] == [1]


async def test_stop_ends_every_process_frees_the_gpus_and_the_queued_task_starts(
    platform: Platform,
) -> None:
    # 4 x 8 GPUs: the whole dev-a100 pool. Each worker leaves a child in its group.
    gang = await platform.submit(
        name="gang",
        worker_spec="8gpu",
        worker_count=4,
        framework="pytorch_ddp",
        command="sleep 60 & sleep 60; wait",
    )
    running = await platform.wait_status(gang["task_id"], "running")
    key = (gang["task_id"], running["run"], running["attempt"])
    pids = platform.worker_pids(key)
    assert len(pids) == 4
    assert all(group_members(pid) for pid in pids.values())

    # Submitted while the pool is full: it queues.
    waiting = await platform.submit(name="next", command="echo next")
    queued = await platform.wait_for(waiting["task_id"], lambda t: t["status"] != "new")
    assert queued["status"] == "queued", queued

    stop = await platform.http.post(f"/v1/tasks/{gang['task_id']}/stop")
    assert stop.status_code == 200, stop.text
    await platform.wait_status(gang["task_id"], "stopped")
    left = {i: group_members(pid) for i, pid in pids.items()}
    assert not any(left.values()), f"worker processes left: {left}"

    await platform.wait_status(waiting["task_id"], "succeeded")
    events = types(await platform.events(gang["task_id"]))
    assert "TaskStopRequested" in events and events[-1] in ("TaskStopped", "ResourcesReleased")


async def test_missing_image_fails_in_image_pull_with_a_clear_reason(platform: Platform) -> None:
    # Known to the submission rules (catalogue), unknown to the local runtime.
    image = {"name": "ghost:1.0", "zones": ["cn-north-1"], "services": ["training"]}
    added = await platform.http.post("/v1/admin/images", json=image)
    assert added.status_code == 201, added.text
    created = await platform.submit(name="ghost", image="ghost:1.0", command="true")
    task = await platform.wait_status(created["task_id"], "failed")
    failed = [s for s in task["stages"] if s["result"] == "failed"]
    assert [s["stage"] for s in failed] == ["image_pull"]
    assert "ghost:1.0" in failed[0]["reason"] and "catalogue" in failed[0]["reason"]
    assert "storage_mount" not in [s["stage"] for s in task["stages"]]
    assert "image_pull" in (task["last_failure_reason"] or "")


ALLREDUCE = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// from MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank {rank} of {world}: all_reduce sum {value.item():.0f}", flush=True)
assert value.item() == world * (world + 1) / 2
dist.destroy_process_group()
"""


@pytest.mark.processes
async def test_pytorch_ddp_gloo_all_reduce_on_two_workers(platform: Platform) -> None:
    pytest.importorskip("torch")
    logs = AIOKafkaConsumer(
        platform.kafka.topics.logs,
        bootstrap_servers=platform.kafka.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await logs.start()
    try:
        created = await platform.submit(
            name="ddp",
            image="pytorch:2.3-cuda12",
            framework="pytorch_ddp",
            worker_count=2,
            command=f"set -o pipefail\npython - <<'EOF'\n{ALLREDUCE}\nEOF",
        )
        task = await platform.wait_status(created["task_id"], "succeeded", within=60)
        assert task["status"] == "succeeded"
        wanted = {f"rank {r} of 2: all_reduce sum 3" for r in (0, 1)}
        seen: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 20
        while not wanted <= set(seen) and time.monotonic() < deadline:
            batches = await logs.getmany(timeout_ms=200)
            for messages in batches.values():
                for message in messages:
                    record = json.loads(message.value)
                    if record["task_id"] == created["task_id"]:
                        seen[record["line"]] = record
            await asyncio.sleep(0)
    finally:
        await logs.stop()
    assert wanted <= set(seen), sorted(seen)
    workers = {seen[line]["worker"] for line in wanted}
    assert workers == {0, 1}
    assert all(seen[line]["stream"] == "stdout" for line in wanted)


async def test_volume_files_stay_and_worker_local_files_are_gone(platform: Platform) -> None:
    """R-13/R-22 through the gateway: what a worker writes on a mounted volume is
    there after the task; what it writes to /tmp or its working copy is not."""
    import uuid
    from pathlib import Path

    mark = uuid.uuid4().hex
    command = (
        f"echo kept > /mnt/ckpt/{mark}.pt && echo gone > /tmp/{mark}.tmp"
        f" && echo gone > ./{mark}.work && ls /mnt/ckpt/{mark}.pt /tmp/{mark}.tmp ./{mark}.work"
    )
    created = await platform.submit(
        name="volumes",
        command=command,
        mounts=[{"file_system": "fs-main", "volume": "checkpoints", "mount_path": "/mnt/ckpt"}],
        output_dirs=["/mnt/ckpt"],
    )
    assert not created.get("warnings"), "an output dir on a mounted volume gets no R-13 warning"
    await platform.wait_status(created["task_id"], "succeeded")
    volume = Path(platform.ctx.data_dir) / "volumes" / "fs-main" / "checkpoints"
    assert (volume / f"{mark}.pt").read_text() == "kept\n"

    def leftovers() -> list[Path]:
        # The cleanup may remove folders while the walk is in them: walk again then.
        for _ in range(50):
            try:
                found = Path(platform.ctx.data_dir).rglob(f"{mark}*")
                return [p for p in found if p.parent != volume]
            except FileNotFoundError:
                continue
        raise AssertionError("the data folder kept changing under the walk")

    # The scratch goes right after the final event; give the cleanup a moment.
    for _ in range(100):
        if not leftovers():
            break
        await asyncio.sleep(0.1)
    assert leftovers() == [], "worker-local files outlive the task"
    assert not Path(f"/tmp/{mark}.tmp").exists(), "the worker's /tmp is its own"
