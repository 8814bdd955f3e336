"""Scheduler benchmark: a 10,000-node pool with 100,000 queued tasks.

Measures, on a real Postgres (DATABASE_URL, or an embedded one started here):

- capacity_query_us: one capacity query (launchable count per GPU size, custom
  maximum, free GPUs) on the occupied pool; baseline: a scan over every node.
- place_per_s: 1-GPU placements WRITTEN to the event store per second by the
  scheduler app (plan + task decide + one append_many per batch of
  placements, `WorkersAllocated` + `TaskPlaced` each); baseline: the same with
  one placement per transaction.
- gang64_place_per_s: the same for gangs of 64 x 8-GPU workers.
- replan_ms: a running task succeeds; time for the scheduler to handle the
  event: release (pool + task), a placement pass over the 100,000-task queue
  that starts the next task, and the queue reports; median of several.
  Baseline: the in-memory `plan_queue` alone.

`--quick` uses 1,000 nodes and 10,000 tasks (under a minute on 2 cores).
The last line is exactly
`scheduler: capacity_query_us=<a> place_per_s=<b> gang64_place_per_s=<c> replan_ms=<d>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import TaskSubmitted, TaskSucceeded
from runyard.eventstore import NO_STREAM, AppendRequest, PostgresEventStore
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.config import parse_pools
from runyard.scheduler.domain import capacity, plan_queue
from runyard.stack.embedded import EmbeddedPostgres

SPECS = [
    {"name": f"{g}gpu", "gpus": g, "cpus": 12 * g, "memory_gib": 100 * g} for g in (1, 2, 4, 8)
]


def pools_document(nodes: int, gang_nodes: int) -> dict[str, object]:
    def pool(pool_id: str, count: int) -> dict[str, object]:
        return {
            "id": pool_id,
            "zone": "bench-zone",
            "network": "roce",
            "specs": SPECS,
            "nodes": {"prefix": f"{pool_id}-n", "count": count},
        }

    return {"pools": [pool("bench", nodes), pool("gang", gang_nodes)]}


def task_spec(pool: str, worker_spec: str, count: int) -> TaskSpec:
    return TaskSpec(
        name="bench",
        pool=pool,
        worker_spec=worker_spec,
        worker_count=count,
        image="img",
        command="true",
    )


async def submit_all(store: PostgresEventStore, tasks: list[tuple[str, TaskSpec]]) -> None:
    """Append one TaskSubmitted per task, in batches over a few connections."""
    meta = Metadata(actor="user:bench/b")
    now = datetime.now(UTC)

    def request(task_id: str, spec: TaskSpec) -> AppendRequest:
        event = TaskSubmitted(task_id=task_id, tenant="bench", creator="b", spec=spec)
        return AppendRequest(f"task-{task_id}", [NewEvent(event, meta, now)], NO_STREAM)

    batches = [tasks[i : i + 1000] for i in range(0, len(tasks), 1000)]
    semaphore = asyncio.Semaphore(4)

    async def one(batch: list[tuple[str, TaskSpec]]) -> None:
        async with semaphore:
            await store.append_many([request(t, s) for t, s in batch])

    await asyncio.gather(*(one(b) for b in batches))


def capacity_query_us(app: SchedulerApp, rounds: int) -> tuple[float, float]:
    """(capacity query, node-scan baseline) in microseconds per query."""
    pool = app.pools["bench"].state
    start = time.perf_counter()
    for _ in range(rounds):
        capacity(pool)
    fast = (time.perf_counter() - start) / rounds * 1e6
    scan_rounds = max(1, rounds // 100)
    start = time.perf_counter()
    for _ in range(scan_rounds):
        nodes = [n for n in pool.nodes.values() if n.schedulable]
        {k: sum(n.free // k for n in nodes) for k in (1, 2, 4, 8)}
        sum(n.free for n in nodes)
    scan = (time.perf_counter() - start) / scan_rounds * 1e6
    return fast, scan


async def place_rate(app: SchedulerApp, pool_id: str, limit: int, batch: int) -> tuple[int, float]:
    """(placements written, per second) with `batch` placements per transaction."""
    app.batch_size = batch
    start = time.perf_counter()
    placed = await app.place(pool_id, limit=limit)
    return placed, placed / (time.perf_counter() - start)


async def replan_ms(app: SchedulerApp, store: PostgresEventStore, rounds: int) -> float:
    """Median time to handle a success event: release, re-plan, place the next task."""
    runtime = app.pools["bench"]
    meta = Metadata(actor="service:deployer")
    times = []
    for _ in range(rounds):
        task_id = next(iter(runtime.state.allocations))
        state = app.tasks[task_id]
        done = TaskSucceeded(run=state.run, attempt=state.attempt)
        stream = f"task-{task_id}"
        await store.append(stream, [NewEvent(done, meta, datetime.now(UTC))], state.version)
        recorded = (await store.read_stream(stream, state.version + 1))[0]
        before = len(runtime.queue)
        start = time.perf_counter()
        await app.handle(recorded)
        times.append((time.perf_counter() - start) * 1000)
        assert len(runtime.queue) == before - 1, "the release started the next task"
    return statistics.median(times)


def plan_only_ms(app: SchedulerApp, rounds: int = 20) -> float:
    runtime = app.pools["bench"]
    start = time.perf_counter()
    for _ in range(rounds):
        plan_queue(runtime.state, runtime.queue)
    return (time.perf_counter() - start) / rounds * 1000


async def bench(dsn: str, nodes: int, tasks: int, quick: bool) -> str:
    gang_nodes = nodes
    gangs = gang_nodes // 64 + 5
    store = await PostgresEventStore.connect(dsn, default_mapper(), max_size=8)
    config = parse_pools(pools_document(nodes, gang_nodes))
    app = SchedulerApp(store, config, write_views=False, max_reports=0)
    t = time.perf_counter()
    await app.start()
    print(f"registered 2 pools of {nodes} nodes in {time.perf_counter() - t:.1f} s")

    one_gpu = [(f"b{i:06d}", task_spec("bench", "1gpu", 1)) for i in range(tasks)]
    gang = [(f"g{i:04d}", task_spec("gang", "8gpu", 64)) for i in range(gangs)]
    t = time.perf_counter()
    await submit_all(store, one_gpu + gang)
    print(
        f"submitted {tasks} 1-GPU tasks and {gangs} 64-worker gangs in "
        f"{time.perf_counter() - t:.1f} s"
    )
    t = time.perf_counter()
    await app.rebuild(plan=False)
    queued = len(app.pools["bench"].queue)
    print(
        f"rebuilt the scheduler from the log ({queued} queued) in {time.perf_counter() - t:.1f} s"
    )

    base_n, base_rate = await place_rate(app, "bench", 200 if quick else 500, batch=1)
    limit = nodes * 8 if quick else 20_000
    placed, rate = await place_rate(app, "bench", limit, batch=500)
    print(
        f"place 1-GPU: {placed} written at {rate:,.0f}/s in batches of 500; "
        f"one per transaction: {base_rate:,.0f}/s ({base_n}); ratio {rate / base_rate:.1f}x"
    )
    await app.place("bench")  # fill the pool: a release must start a waiting task
    left = len(app.pools["bench"].queue)
    gang_base_n, gang_base = await place_rate(app, "gang", 2, batch=1)
    gang_n, gang_rate = await place_rate(app, "gang", gangs, batch=50)
    print(
        f"place 64x8-GPU gangs: {gang_n} written at {gang_rate:,.1f}/s in batches of 50; "
        f"one per transaction: {gang_base:,.1f}/s ({gang_base_n}); "
        f"ratio {gang_rate / gang_base:.1f}x"
    )

    fast, scan = capacity_query_us(app, 20_000 if quick else 50_000)
    print(
        f"capacity query on {nodes} nodes: {fast:.1f} us; node scan baseline {scan:,.0f} us; "
        f"ratio {scan / fast:,.0f}x"
    )
    app.max_reports = left  # steady state: every waiting task has had its TaskQueued
    t = time.perf_counter()
    await app.place("bench")
    print(f"first queue reports: {left} TaskQueued written in {time.perf_counter() - t:.1f} s")
    app.max_reports = 1000
    replan = await replan_ms(app, store, 20)
    plan = plan_only_ms(app)
    print(
        f"re-plan after a release with {left} queued: {replan:.1f} ms (release + placement "
        f"+ up to {app.status_window} queue reports written); "
        f"in-memory plan_queue on the full pool alone {plan:.2f} ms"
    )
    await store.close()
    return (
        f"scheduler: capacity_query_us={fast:.1f} place_per_s={rate:.0f} "
        f"gang64_place_per_s={gang_rate:.1f} replan_ms={replan:.1f}"
    )


async def with_database(args: argparse.Namespace) -> str:
    nodes, tasks = (1000, 10_000) if args.quick else (10_000, 100_000)
    base = os.environ.get("DATABASE_URL")
    server = root = None
    if base is None:
        root = Path(tempfile.mkdtemp(prefix="runyard-bench-pg-"))
        server = EmbeddedPostgres(
            root / "data", settings={"fsync": "off", "synchronous_commit": "off"}
        )
        base = server.start()
    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(base)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    try:
        return await bench(f"{base.rpartition('/')[0]}/{name}", nodes, tasks, args.quick)
    finally:
        admin = await asyncpg.connect(base)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if server is not None:
            server.stop()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 10,000 tasks")
    summary = asyncio.run(with_database(parser.parse_args()))
    print(summary)


if __name__ == "__main__":
    main()
