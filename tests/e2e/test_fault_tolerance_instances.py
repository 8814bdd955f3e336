"""Two fault-tolerance processes share the tasks; one is killed, the other takes over.

The platform runs in the processes layout with a second fault-tolerance process
(instance `b`, its own port). Both read task events and worker lines in one
consumer group, each holding the same partition numbers of both topics. Tasks
that hang (a line, then silence) are submitted until both instances hold some
of them; then instance `b` is killed with SIGKILL while every task runs. The
survivor takes `b`'s partitions over and, with them, the watches of its silent
tasks (from the `ft_watched_tasks` rows, not from a line that never comes).
Every task's hang is detected exactly once, restarts it (after at most 0.5 s), and
the restarted attempt succeeds.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.messaging import KafkaSettings
from runyard.messaging.copartition import HELD_GAUGE
from runyard.messaging.progress import partition_of
from runyard.messaging.topics import PARTITIONS, TASK_EVENTS
from runyard.stack.ports import free_port
from runyard.stack.supervisor import ChildSpec, Supervisor, service_specs

from tests.e2e.conftest import Platform, restarts_capped, running_platform

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 10  # the spec's minimum
MAX_TASKS = 16
#: Attempt 1 prints a line and goes silent; attempt 2 succeeds.
HANG_ONCE = (
    'if [ "$RUNYARD_ATTEMPT" = 1 ]; then echo "step 1 done"; sleep 100000; fi; echo recovered'
)


async def held(url: str, topic: str) -> set[int]:
    """The partitions of `topic` the fault-tolerance process at `url` holds (its
    /metrics: runyard_consumer_partitions_held)."""
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        text = (await http.get("/metrics")).text
    found = set()
    for line in text.splitlines():
        if line.startswith(HELD_GAUGE + "{") and f'topic="{topic}"' in line:
            found.add(int(line.partition('partition="')[2].partition('"')[0]))
    return found


async def second_instance(platform: Platform) -> tuple[Supervisor, str]:
    """Fault tolerance instance `b` as a child process of its own, ready."""
    (spec,) = service_specs(platform.ctx, ["faulttolerance"])
    port = free_port()
    settings = json.loads(spec.env["RUNYARD_SETTINGS"])
    settings.update(faulttolerance_port=port, faulttolerance_instance="b")
    env = {**spec.env, "RUNYARD_SETTINGS": json.dumps(settings)}
    env["RUNYARD_SERVICE_PORT"] = str(port)
    url = f"http://127.0.0.1:{port}"
    supervisor = Supervisor([ChildSpec("faulttolerance-b", spec.argv, env, url)], restart=False)
    await supervisor.start()
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        deadline = time.monotonic() + 60
        while True:
            assert not supervisor.exited(), "instance b exited"
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return supervisor, url
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "instance b not ready in 60 s"
            await asyncio.sleep(0.2)


async def events_of(platform: Platform, task_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in await platform.events(task_id) if e["type"] == kind]


@pytest.mark.processes
async def test_two_instances_share_hung_tasks_and_one_takes_over_when_the_other_dies(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    async with running_platform(
        dsn, kafka, tmp_path, layout="processes", configure=restarts_capped(0.5)
    ) as platform:
        second, second_url = await second_instance(platform)
        try:
            urls = [platform.ctx.endpoints["faulttolerance"], second_url]
            topic = platform.kafka.topics.task_events
            deadline = time.monotonic() + 60
            while True:
                split = [await held(url, topic) for url in urls]
                if all(split) and len(split[0] | split[1]) == PARTITIONS[TASK_EVENTS]:
                    break
                assert time.monotonic() < deadline, f"partitions not split in two: {split}"
                await asyncio.sleep(0.5)
            assert not split[0] & split[1]
            count = PARTITIONS[TASK_EVENTS]
            tasks: list[str] = []
            owners: set[int] = set()
            while owners != {0, 1}:  # until both instances hold some of the tasks
                assert len(tasks) < MAX_TASKS, f"{MAX_TASKS} tasks, all in {split}"
                created = await platform.submit(
                    name="hang",
                    command=HANG_ONCE,
                    fault_tolerance={
                        "auto_restart": True,
                        "max_restarts": 1,
                        "hang_timeout_s": HANG_TIMEOUT_S,
                    },
                )
                tasks.append(created["task_id"])
                partition = partition_of(f"task-{created['task_id']}", count)
                owners |= {i for i, numbers in enumerate(split) if partition in numbers}
            for task_id in tasks:
                await platform.wait_status(task_id, "running", within=30)
            # Kill instance b while every task runs and before any hang timer fires.
            second.kill_groups()
            for task_id in tasks:
                await platform.wait_status(task_id, "succeeded", within=HANG_TIMEOUT_S + 40)
            platform.check()
        finally:
            await second.stop()
            second.kill_groups()
        for task_id in tasks:
            (hang,) = await events_of(platform, task_id, "HangDetected")
            assert hang["attempt"] == 1
            (restart,) = await events_of(platform, task_id, "TaskRestartScheduled")
            assert (restart["reason"], restart["attempt"]) == ("hang", 2)
        # The survivor holds every partition now.
        survivor = await held(platform.ctx.endpoints["faulttolerance"], topic)
        assert survivor == set(range(PARTITIONS[TASK_EVENTS]))
