"""The deployer with the Slurm runtime, on a real slurmctld and two slurmd (n1, n2).

As tests/integration/test_deployer.py does for the local runtime: tests append
`TaskSubmitted` and `TaskPlaced` (workers on Slurm's nodes), hand the events to
`DeployerApp.handle`, and read the stream back; Slurm runs the workers as steps
of one job per attempt. Skipped, with the reason, where Slurm cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    DeployStageCompleted,
    DeployStageFailed,
    DeployStageStarted,
    TaskFailed,
    TaskPlaced,
    WorkerExited,
    WorkerPlacement,
)
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import OutputLine
from runyard.deployer.slurm import SlurmRuntime, SlurmRuntimeConfig
from runyard.domain.task import RequestStop, Submit, decide, fold
from runyard.eventstore import PostgresEventStore
from runyard.stack.slurm import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: Generous: two cores shared with other work; Slurm polls and schedules in between.
WITHIN_S = 90.0


def make_spec(command: str, *, workers: int = 1, image: str = "python", **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="slurm",
        worker_spec="1gpu",
        worker_count=workers,
        image=image,
        command=command,
        **kw,
    )


class Harness:
    def __init__(
        self,
        store: PostgresEventStore,
        app: DeployerApp,
        runtime: SlurmRuntime,
        cluster: SlurmCluster,
    ) -> None:
        self.store = store
        self.app = app
        self.runtime = runtime
        self.cluster = cluster
        self.lines: list[OutputLine] = []

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def types(self, task_id: str) -> list[str]:
        return [e.type for e in await self.events(task_id)]

    async def append(self, task_id: str, events: list[Event]) -> list[RecordedEvent[Event]]:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="service:test")
        now = datetime.now(UTC)
        await self.store.append(stream, [NewEvent(e, meta, now) for e in events], version)
        return await self.store.read_stream(stream, version + 1)

    async def deliver(self, recorded: list[RecordedEvent[Event]]) -> None:
        for event in recorded:
            await self.app.handle(event)

    async def launch(self, task_id: str, spec: TaskSpec, *, wait: bool = True) -> None:
        """Submit and place the task (worker i on node n<i+1>, GPU 0), hand the placement over."""
        submitted = decide(
            None, Submit(task_id, "acme", "alice", spec), now=datetime.now(UTC), ids=lambda: "x"
        )
        await self.append(task_id, submitted)
        nodes = self.cluster.nodes
        workers = tuple(
            WorkerPlacement(index=i, node=nodes[i % len(nodes)], gpus=(0,))
            for i in range(spec.worker_count)
        )
        placed = TaskPlaced(run=1, attempt=1, pool="slurm", workers=workers)
        await self.deliver(await self.append(task_id, [placed]))
        if wait:
            await asyncio.wait_for(self.app.drain(), WITHIN_S)

    async def state(self, task_id: str) -> Any:
        return fold(await self.events(task_id))

    async def wait_for(self, task_id: str, type_name: str, within: float = WITHIN_S) -> None:
        async def poll() -> None:
            while type_name not in await self.types(task_id):  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        await asyncio.wait_for(poll(), within)

    def output(self, task_id: str) -> list[str]:
        return [f"{x.worker}:{x.line}" for x in self.lines if x.task_id == task_id]

    def jobs(self) -> list[str]:
        """Every job Slurm holds now (squeue)."""
        return self.cluster.run("squeue", "-h", "-o", "%i %j %T").splitlines()


@pytest.fixture
async def h(dsn: str, tmp_path: Path, slurm_cluster: SlurmCluster) -> AsyncIterator[Harness]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    config = SlurmRuntimeConfig(
        scratch_root=tmp_path / "scratch",
        volumes_root=tmp_path / "volumes",
        images={"python": Path(sys.prefix)},
        grace_s=2.0,
        partition=slurm_cluster.partition,
        slurm_conf=slurm_cluster.conf,
    )
    runtime = SlurmRuntime(config)
    harness: Harness

    async def sink(line: OutputLine) -> None:
        harness.lines.append(line)

    app = DeployerApp(store, runtime, on_output=sink, stop_grace_s=2.0)
    harness = Harness(store, app, runtime, slurm_cluster)
    try:
        yield harness
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.close(), 60)
        await store.close()


def task_processes(task_id: str) -> list[int]:
    """Live processes whose environment names the task (workers and what they left)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :][:1] in ("Z", "X"):
            continue
        if f"RUNYARD_TASK_ID={task_id}".encode() in env:
            found.append(int(entry))
    return found


async def test_true_succeeds_with_every_stage_timed(h: Harness) -> None:
    await h.launch("ok", make_spec("true"))
    events = [e.event for e in await h.events("ok")]
    started = [e.stage for e in events if isinstance(e, DeployStageStarted)]
    completed = [e for e in events if isinstance(e, DeployStageCompleted)]
    assert started == list(DEPLOY_STAGES)
    assert [e.stage for e in completed] == list(DEPLOY_STAGES)
    assert all(isinstance(e.duration_ms, int) and e.duration_ms >= 0 for e in completed)
    assert (await h.types("ok"))[-4:] == [
        "WorkerStarted",
        "TaskRunning",
        "WorkerExited",
        "TaskSucceeded",
    ]
    assert not [j for j in h.jobs() if "runyard-ok-" in j]
