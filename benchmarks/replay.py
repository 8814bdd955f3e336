"""SRE replay benchmark: audit queries over a large log.

Builds a log of task and pool events (`--quick`: 100,000 events; otherwise
1,000,000) for 8 tenants, 6 pools and 600 nodes, over 10 days, written the
way `runyard import-events` writes (the `audit_facets` trigger included), on
Postgres: DATABASE_URL, else an embedded server in a temp dir. Then times the
questions of docs/operations.md ("SRE replay"), each the first page (100
events) and the median of 5 runs, and prints the plan's top node for each.

Then rebuilds the task list read model from position 0 with its projector
(`rebuild_events_per_s`, beside a raw read of the same rows), and times what
`runyard show ID --at P` does for one task: read its stream, cut it at a
position, fold it (`show_at_ms`, median over 50 tasks, beside a raw read of
the stream). The task streams are made by the task domain itself, so the
fold accepts them.

The last line is `replay: events=<n> rebuild_events_per_s=<x> audit_query_ms=<y>
show_at_ms=<z>`, where y is the slowest question's median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import asyncpg
from runyard.contracts import default_mapper
from runyard.contracts.pool_events import AllocatedWorker, NodeCordoned, WorkersAllocated
from runyard.contracts.spec import FaultToleranceOptions, TaskSpec
from runyard.contracts.task_events import DEPLOY_STAGES, WorkerPlacement
from runyard.domain import fold
from runyard.domain.replay import stream_prefix
from runyard.domain.task import (
    CompleteStage,
    ExitWorker,
    Place,
    Queue,
    RequestStop,
    StartStage,
    StartWorker,
    Submit,
    decide,
    evolve,
)
from runyard.eventstore import PostgresEventStore, apply_migrations, load_migrations
from runyard.eventstore.audit import AuditFilter, audit_page, audit_sql
from runyard.eventstore.export import import_lines
from runyard.gateway.projection import TaskListProjector
from runyard.gateway.rebuild import REBUILD_BATCH
from runyard.stack.embedded import EmbeddedPostgres

START = datetime(2026, 11, 20, tzinfo=UTC)
TENANTS = [f"team-{i}" for i in range(8)]
POOLS = [f"pool-{i}" for i in range(6)]
NODES_PER_POOL = 100
#: The relations a plan line reads: `Index Scan using x`, `Bitmap Index Scan on x`.
_INDEX = re.compile(r"(?:using|Scan on) (\w+)")
MAPPER = default_mapper()


def _event(
    stream: str, version: int, kind: str, at: datetime, actor: str, data: dict[str, Any]
) -> dict[str, Any]:
    return {
        "stream_id": stream, "version": version, "type": kind, "schema_version": 1,
        "occurred_at": at.isoformat(), "recorded_at": at.isoformat(), "actor": actor,
        "causation_id": None, "correlation_id": None, "event_id": str(uuid.uuid4()),
        "data": data, "metadata": {"actor": actor, "causation_id": None,
                                   "correlation_id": None, "trace_context": {}},
    }  # fmt: skip


#: Placeholders in the template streams, replaced per task in the JSON text.
_TID, _TENANT, _POOL, _USER = "tidzz", "tenantzz", "poolzz", "userzz"
_NODES = ("nodezz-0", "nodezz-1")
_SERVICE = {
    "TaskSubmitted": "user",
    "TaskStopRequested": "user",
    "TaskQueued": "service:scheduler",
    "TaskPlaced": "service:scheduler",
    "ResourcesReleased": "service:scheduler",
    "TaskRestartScheduled": "service:faulttolerance",
}


def templates() -> list[list[tuple[str, str, str]]]:
    """Task streams made by the task domain itself (so the read model's fold accepts
    them): (type, actor kind, JSON text with placeholders) per event. Shapes: a run
    that succeeds, one that crashes and restarts, one a person stops."""
    spec = TaskSpec(
        name="train", pool=_POOL, worker_spec="8gpu", worker_count=2, image="registry/train:1",
        command="torchrun train.py",
        fault_tolerance=FaultToleranceOptions(auto_restart=True, max_restarts=2),
    )  # fmt: skip
    return [_template(shape, spec) for shape in ("succeeds", "restarts", "stopped")]


class _Stream:
    """One template task stream, decided command by command by the task domain."""

    def __init__(self) -> None:
        self.state: Any = None
        self.now = START
        self.events: list[tuple[str, str, str]] = []

    def do(self, command: Any) -> None:
        self.now += timedelta(seconds=1)
        for event in decide(self.state, command, now=self.now, ids=lambda: "x"):
            self.state = evolve(self.state, (event, self.now))
            name, _, text = MAPPER.encode(event)
            self.events.append((name, _SERVICE.get(name, "service:deployer"), text))


def _template(shape: str, spec: TaskSpec) -> list[tuple[str, str, str]]:
    workers = tuple(
        WorkerPlacement(index=i, node=n, gpus=tuple(range(8))) for i, n in enumerate(_NODES)
    )
    task = _Stream()
    task.do(Submit(_TID, _TENANT, f"{_TENANT}/{_USER}", spec))
    task.do(Queue(_TID, "needs 2 x 8-GPU workers, pool can start 1", 0, 16, 1))
    task.do(Place(_TID, _POOL, workers))
    for stage in DEPLOY_STAGES:
        task.do(StartStage(_TID, stage))
        task.do(CompleteStage(_TID, stage))
    for w in range(2):
        task.do(StartWorker(_TID, 1, task.state.attempt, w))
    if shape == "succeeds":
        for w in range(2):
            task.do(ExitWorker(_TID, 1, task.state.attempt, w, 0))
    elif shape == "restarts":
        task.do(ExitWorker(_TID, 1, task.state.attempt, 0, 1))
    else:
        task.do(RequestStop(_TID, by=f"{_TENANT}/{_USER}", role="member"))
    return task.events


def task_events(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """About `n` events: tasks of ~15 events each (valid for the task domain), in time
    order, with the pool's allocation for each and a few admin cordons."""
    events: list[dict[str, Any]] = []
    shapes = templates()
    pool_versions = dict.fromkeys(POOLS, 0)
    span = timedelta(days=10).total_seconds()
    task = 0
    while len(events) < n:
        task += 1
        tenant, pool = rng.choice(TENANTS), rng.choice(POOLS)
        tid, stream = f"t{task:07d}", f"task-t{task:07d}"
        at = START + timedelta(seconds=span * len(events) / n)
        user = f"u{rng.randrange(20)}"
        nodes = [f"{pool}-n{rng.randrange(NODES_PER_POOL)}" for _ in range(2)]
        names = {
            _TID: tid,
            _TENANT: tenant,
            _POOL: pool,
            _USER: user,
            **dict(zip(_NODES, nodes, strict=True)),
        }
        roll = rng.random()
        shape = shapes[0 if roll < 0.8 else 1 if roll < 0.95 else 2]
        for version, (kind, actor, text) in enumerate(shape, start=1):
            for old, new in names.items():
                text = text.replace(old, new)
            who = f"user:{tenant}/{user}" if actor == "user" else actor
            events.append(
                _event(
                    stream, version, kind, at + timedelta(seconds=version), who, json.loads(text)
                )
            )
        pool_versions[pool] += 1
        allocated = WorkersAllocated(
            task_id=tid, run=1, attempt=1,
            workers=tuple(AllocatedWorker(index=i, node=nd, gpus=tuple(range(8)))
                          for i, nd in enumerate(nodes)),
        )  # fmt: skip
        events.append(
            _event(f"pool-{pool}", pool_versions[pool], "WorkersAllocated", at,
                   "service:scheduler", json.loads(allocated.model_dump_json()))
        )  # fmt: skip
        if rng.random() < 0.01:
            pool_versions[pool] += 1
            cordon = NodeCordoned(node=nodes[0])
            events.append(
                _event(f"pool-{pool}", pool_versions[pool], "NodeCordoned", at, "user:ops/root",
                       json.loads(cordon.model_dump_json()))
            )  # fmt: skip
    for position, event in enumerate(events, start=1):
        event["position"] = position
    return events


def questions(end: datetime) -> dict[str, AuditFilter]:
    day = end - timedelta(days=1)
    return {
        "requeued/rescheduled/restarted in the last hour": AuditFilter(
            since=end - timedelta(hours=1),
            types=(
                "TaskRequeued",
                "TaskPreempted",
                "TaskRescheduleRequested",
                "TaskRestartScheduled",
            ),
        ),
        "who stopped task t0000100": AuditFilter(task="t0000100", types=("TaskStopRequested",)),
        "tasks node pool-3-n7 ran yesterday": AuditFilter(
            node="pool-3-n7", types=("TaskPlaced",), since=day - timedelta(days=1), until=day
        ),
        "admin actions on pools": AuditFilter(actor="user:ops/*", types=("NodeCordoned",)),
        "tenant team-5 on pool-2": AuditFilter(tenant="team-5", pool="pool-2"),
        "a rare node, whole log": AuditFilter(node="pool-1-n99"),
    }


_RAW = (
    "SELECT global_position, event_id, stream_id, stream_version, event_type, schema_version,"
    " data::text AS data, metadata::text AS metadata, occurred_at FROM events"
    " WHERE global_position > $1 AND global_position <= $2 ORDER BY global_position LIMIT $3"
)


async def rebuild_rate(conn: asyncpg.Connection, store: PostgresEventStore, head: int) -> float:
    """Events per second of the task list rebuilt from position 0 by its projector (into
    an empty table, as `runyard rebuild task_list` does its shadow), beside a raw read of
    the same rows in the same batches (the floor: no decoding, folding or writing)."""
    folder = Path(str(resources.files("runyard.gateway") / "migrations"))
    await apply_migrations(conn, load_migrations("gateway", folder))
    began, after = time.perf_counter(), 0
    while rows := await conn.fetch(_RAW, after, head, 500):
        after = rows[-1]["global_position"]
    raw_s = time.perf_counter() - began
    projector = TaskListProjector(store, batch_size=REBUILD_BATCH)
    began = time.perf_counter()
    applied = await projector.apply_range(0, head)
    rebuild_s = time.perf_counter() - began
    tasks = await conn.fetchval("SELECT count(*) FROM task_list")
    rate = applied / rebuild_s
    print(
        f"rebuild task_list: {applied} events, {tasks} rows in {rebuild_s:.1f} s ="
        f" {rate:,.0f} events/s; baseline raw read {head / raw_s:,.0f} events/s"
        f" ({rebuild_s / raw_s:.1f}x the raw read's time)"
    )
    return rate


async def show_at_ms(
    conn: asyncpg.Connection,
    store: PostgresEventStore,
    events: list[dict[str, Any]],
    rng: random.Random,
) -> float:
    """Median ms of `show --at`'s work for one task (read its stream, cut the prefix at a
    position in the middle of it, fold), over 50 tasks; beside a raw read of the stream."""
    streams = sorted({e["stream_id"] for e in events if e["stream_id"].startswith("task-")})
    times, raw = [], []
    for stream in rng.sample(streams, 50):
        began = time.perf_counter()
        await conn.fetch(
            "SELECT * FROM events WHERE stream_id = $1 ORDER BY stream_version", stream
        )
        raw.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        recorded = await store.read_stream(stream)
        at = recorded[len(recorded) // 2].global_position
        cut, _ = stream_prefix(recorded, at, what=stream)
        fold(cut, task_id=stream.removeprefix("task-"))
        times.append((time.perf_counter() - began) * 1000)
    median, floor = statistics.median(times), statistics.median(raw)
    print(
        f"show --at: {median:.2f} ms median over 50 tasks (read, cut, fold);"
        f" baseline raw stream read {floor:.2f} ms ({median / floor:.1f}x)"
    )
    return median


async def run(dsn: str, n: int) -> str:
    admin = await asyncpg.connect(dsn)
    name = f"bench_replay_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = dsn.rpartition("/")
    try:
        conn = await asyncpg.connect(f"{base}/{name}")
        try:
            events = task_events(n, random.Random(7))
            began = time.perf_counter()
            await import_lines(conn, events)
            await conn.execute("ANALYZE")
            print(f"wrote {len(events)} events in {time.perf_counter() - began:.1f} s")
            end = datetime.fromisoformat(events[-1]["occurred_at"])
            slowest = 0.0
            for title, f in questions(end).items():
                times, found = [], 0
                for _ in range(5):
                    began = time.perf_counter()
                    page = await audit_page(conn, f, limit=100)
                    times.append((time.perf_counter() - began) * 1000)
                    found = len(page.items)
                sql, args = audit_sql(f)
                plan = await conn.fetch(f"EXPLAIN {sql}", 0, len(events), 101, *args)
                median = statistics.median(times)
                slowest = max(slowest, median)
                used = sorted({m for r in plan for m in _INDEX.findall(r[0])})
                print(f"{median:8.1f} ms  {found:4d} events  {title}  [{', '.join(used)}]")
            store = await PostgresEventStore.connect(f"{base}/{name}", MAPPER)
            try:
                rate = await rebuild_rate(conn, store, len(events))
                show_at = await show_at_ms(conn, store, events, random.Random(11))
            finally:
                await store.close()
            return (
                f"replay: events={len(events)} rebuild_events_per_s={rate:.0f}"
                f" audit_query_ms={slowest:.1f} show_at_ms={show_at:.2f}"
            )
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events instead of 1,000,000")
    parser.add_argument("--events", type=int, help="how many events to write")
    args = parser.parse_args()
    n = args.events or (100_000 if args.quick else 1_000_000)
    import os

    if dsn := os.environ.get("DATABASE_URL"):
        print(asyncio.run(run(dsn, n)))
        return
    root = Path(tempfile.mkdtemp(prefix="runyard-bench-replay-"))
    server = EmbeddedPostgres(root / "data")
    server.start()
    try:
        print(asyncio.run(run(server.dsn, n)))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
