"""Two scheduler instances on one stack: one schedules, the standby takes over.

Each instance is the service's `run(ctx)` with a context of its own (as two
processes would have), on one database and broker with the relay publishing.
Tasks flow while the active instance is stopped (cancelled, as a killed one
stops) or cut off from its lease (its lock's session ended, while it keeps
running): the other takes over, and every task is placed exactly once, each
GPU held by one task at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.pool_events import WorkersAllocated, WorkersReleased
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import TaskPlaced, TaskSucceeded
from runyard.domain.task import Submit, decide, fold
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.relay import OutboxRelay
from runyard.scheduler.domain import fold_pool
from runyard.scheduler.main import run
from runyard.scheduler.views import read_pool_view
from runyard.stack.context import ServiceContext
from runyard.stack.leader import lease_key

from tests.conftest import quick_groups

pytestmark = pytest.mark.integration

POOLS = {
    "pools": [
        {
            "id": "dev-a100",
            "zone": "cn-north-1",
            "resource_type": "subscription",
            "gpu_model": "A100",
            "network": "roce",
            "specs": [
                {"name": f"{g}gpu", "gpus": g, "cpus": 12 * g, "memory_gib": 100 * g}
                for g in (1, 2, 4, 8)
            ],
            "nodes": {"prefix": "a-", "count": 4},
        }
    ]
}
TASKS = 24
DEADLINE_S = 60.0


def spec(worker_spec: str) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="dev-a100",
        worker_spec=worker_spec,
        image="img",
        command="python train.py",
        resource_type="subscription",
    )


@dataclass
class Instance:
    """One scheduler instance: its own context and the task running `run(ctx)`."""

    name: str
    ctx: ServiceContext
    task: asyncio.Task[None]

    async def role(self, http: httpx.AsyncClient) -> str | None:
        """ "active" or "standby" as its /healthz says (None before it serves)."""
        url = self.ctx.endpoints.get("scheduler")
        if url is None or self.task.done():
            return None
        answer = await http.get(url + "/healthz")
        return str(answer.json()["role"])


@pytest.fixture
def kafka(kafka: KafkaSettings) -> KafkaSettings:
    """The instances' consumer groups change hands as the lease does (`quick_groups`)."""
    return quick_groups(kafka)


@dataclass
class Stack:
    store: PostgresEventStore
    dsn: str
    kafka: KafkaSettings
    config: Path
    instances: list[Instance] = field(default_factory=list)

    def start(self, name: str) -> Instance:
        ctx = ServiceContext(
            dsn=self.dsn,
            kafka=self.kafka,
            data_dir=self.config,
            config_dir=self.config,
            mapper=default_mapper(),
            settings={"scheduler_tick_s": 0.2},
        )
        instance = Instance(name, ctx, asyncio.create_task(run(ctx), name=f"scheduler-{name}"))
        self.instances.append(instance)
        return instance

    async def submit(self, task_id: str, worker_spec: str) -> None:
        """The submission service accepts a task."""
        now = datetime.now(UTC)
        new = decide(None, Submit(task_id, "acme", "alice", spec(worker_spec)), now=now, ids=str)
        meta = Metadata(actor="user:acme/alice")
        await self.store.append(f"task-{task_id}", [NewEvent(e, meta, now) for e in new], 0)

    async def finish_placed(self, task_ids: list[str]) -> set[str]:
        """The deployer's part: each placed task succeeds (its GPUs are then released)."""
        done = set()
        for task_id in task_ids:
            stream = await self.store.read_stream(f"task-{task_id}")
            state = fold(stream)
            if state.status == "deploying":
                event = TaskSucceeded(run=state.run, attempt=state.attempt)
                meta = Metadata(actor="service:deployer")
                now = datetime.now(UTC)
                await self.store.append(
                    f"task-{task_id}", [NewEvent(event, meta, now)], state.version
                )
            if state.finished or state.status == "deploying":
                done.add(task_id)
        return done


@contextlib.asynccontextmanager
async def stack(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Stack]:
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    store = await PostgresEventStore.connect(dsn, default_mapper())
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    publishing = asyncio.create_task(relay.run())
    s = Stack(store, dsn, kafka, tmp_path)
    try:
        await asyncio.wait_for(relay.ready.wait(), 30)
        yield s
    finally:
        tasks = [publishing, *(i.task for i in s.instances)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


async def until(check: Callable[[], Any], what: str) -> Any:
    """Poll `check()` (awaited when it is a coroutine) until truthy."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def roles(s: Stack, http: httpx.AsyncClient) -> dict[str, str | None]:
    return {i.name: await i.role(http) for i in s.instances}


async def active_one(s: Stack, http: httpx.AsyncClient) -> Instance | None:
    """The one active instance once the others serve as standbys (None before)."""
    seen = await roles(s, http)
    live = {name: role for name, role in seen.items() if role is not None}
    actives = [name for name, role in live.items() if role == "active"]
    if len(actives) != 1 or set(live.values()) - {"active", "standby"}:
        return None
    return next(i for i in s.instances if i.name == actives[0])


async def flow(s: Stack, interrupt: Callable[[Instance], Any]) -> None:
    """Submit tasks while the deployer's part finishes placed ones; `interrupt` the
    active instance halfway; wait until every task succeeded; check the log."""
    async with httpx.AsyncClient() as http:
        for name in ("a", "b"):
            s.start(name)
        first = await until(lambda: active_one(s, http), "one active scheduler")

        async def queue_gauge() -> bool:
            scraped = await http.get(first.ctx.endpoints["scheduler"] + "/metrics")
            return 'runyard_scheduler_queue_length{pool="dev-a100"}' in scraped.text

        await until(queue_gauge, "the queue length gauge of the active scheduler")
        ids = [f"t{n:02d}" for n in range(TASKS)]
        sizes = ("8gpu", "4gpu", "2gpu", "1gpu")
        for n, task_id in enumerate(ids):
            await s.submit(task_id, sizes[n % len(sizes)])
            if n == TASKS // 2:
                await until(lambda: s.finish_placed(ids[:4]), "placements before the takeover")
                result = interrupt(first)
                if asyncio.iscoroutine(result):
                    await result
            await s.finish_placed(ids[: n + 1])
        other = next(i for i in s.instances if i is not first)
        await until(lambda: _is_active(other, http), "the standby to take over")

        async def all_succeeded() -> bool:
            await s.finish_placed(ids)
            states = [fold(await s.store.read_stream(f"task-{t}")) for t in ids]
            return all(state.status == "succeeded" for state in states)

        await until(all_succeeded, "every task to succeed")
        await _check_log(s, ids)


async def _is_active(instance: Instance, http: httpx.AsyncClient) -> bool:
    return await instance.role(http) == "active"


async def _check_log(s: Stack, ids: list[str]) -> None:
    """Exactly one TaskPlaced per task (each placed once), each with its WorkersAllocated;
    no GPU was ever held by two tasks, and all are free again."""

    async def released() -> bool:
        pool = fold_pool(e.event for e in await s.store.read_stream("pool-dev-a100"))
        return not pool.allocations

    await until(released, "the scheduler to release every finished task's GPUs")
    pool_events = [e.event for e in await s.store.read_stream("pool-dev-a100")]
    held: dict[tuple[str, int], str] = {}
    for event in pool_events:
        if isinstance(event, WorkersAllocated):
            for worker in event.workers:
                for gpu in worker.gpus:
                    assert (worker.node, gpu) not in held, f"GPU {worker.node}/{gpu} taken twice"
                    held[(worker.node, gpu)] = event.task_id
        elif isinstance(event, WorkersReleased):
            for key in [k for k, owner in held.items() if owner == event.task_id]:
                del held[key]
    assert not held
    allocated = sorted(e.task_id for e in pool_events if isinstance(e, WorkersAllocated))
    placed = []
    for task_id in ids:
        events = [e.event for e in await s.store.read_stream(f"task-{task_id}")]
        placements = [e for e in events if isinstance(e, TaskPlaced)]
        assert len(placements) == 1, f"{task_id} placed {len(placements)} times"
        placed.append(task_id)
    assert allocated == sorted(placed), "every placement allocated once"

    async def view_caught_up() -> bool:
        view = await read_pool_view(s.store.pool, "dev-a100")
        return view is not None and view["capacity"]["free_gpus"] == 32

    await until(view_caught_up, "the pool view to show every GPU free")


@pytest.mark.slow
async def test_standby_takes_over_when_the_active_scheduler_stops(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    async with stack(dsn, kafka, tmp_path) as s:
        await flow(s, lambda active: active.task.cancel())


@pytest.mark.slow
async def test_a_scheduler_cut_off_from_its_lease_stands_by_and_places_nothing_twice(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """The active instance keeps running but its lock's session ends (as when it is
    cut off from Postgres): it stops scheduling at once, the other takes over."""

    async def end_its_session(active: Instance) -> None:
        admin = await asyncpg.connect(dsn)
        try:
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
                " WHERE locktype = 'advisory' AND granted AND objsubid = 1"
                " AND classid::bigint = ($1::bigint >> 32) & 4294967295"
                " AND objid::bigint = $1::bigint & 4294967295",
                lease_key("scheduler", kafka.topics.prefix),
            )
            assert ended == 1
        finally:
            await admin.close()

    async with stack(dsn, kafka, tmp_path) as s:
        await flow(s, end_its_session)
        assert all(not i.task.done() for i in s.instances), "both instances still run"
