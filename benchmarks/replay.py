"""SRE replay benchmark: audit queries over a large log.

Builds a log of task and pool events (`--quick`: 100,000 events; otherwise
1,000,000) for 8 tenants, 6 pools and 600 nodes, over 10 days, written the
way `runyard import-events` writes (the `audit_facets` trigger included), on
Postgres: DATABASE_URL, else an embedded server in a temp dir. Then times the
questions of docs/operations.md ("SRE replay"), each the first page (100
events) and the median of 5 runs, and prints the plan's top node for each.

The last line is `replay: events=<n> audit_query_ms=<y>`, where y is the
slowest question's median.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from runyard.eventstore.audit import AuditFilter, audit_page, audit_sql
from runyard.eventstore.export import import_lines
from runyard.stack.embedded import EmbeddedPostgres

START = datetime(2026, 11, 20, tzinfo=UTC)
TENANTS = [f"team-{i}" for i in range(8)]
POOLS = [f"pool-{i}" for i in range(6)]
NODES_PER_POOL = 100
#: The relations a plan line reads: `Index Scan using x`, `Bitmap Index Scan on x`.
_INDEX = re.compile(r"(?:using|Scan on) (\w+)")


def _event(
    stream: str, version: int, kind: str, at: datetime, actor: str, **data: Any
) -> dict[str, Any]:
    return {
        "stream_id": stream, "version": version, "type": kind, "schema_version": 1,
        "occurred_at": at.isoformat(), "recorded_at": at.isoformat(), "actor": actor,
        "causation_id": None, "correlation_id": None, "event_id": str(uuid.uuid4()),
        "data": data, "metadata": {"actor": actor, "causation_id": None,
                                   "correlation_id": None, "trace_context": {}},
    }  # fmt: skip


def task_events(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """About `n` events: tasks of ~10 events each, in time order, with pool events."""
    events: list[dict[str, Any]] = []
    pool_versions = dict.fromkeys(POOLS, 0)
    span = timedelta(days=10).total_seconds()
    task = 0
    while len(events) < n:
        task += 1
        tenant, pool = rng.choice(TENANTS), rng.choice(POOLS)
        tid, stream = f"t{task:07d}", f"task-t{task:07d}"
        at = START + timedelta(seconds=span * len(events) / n)
        user = f"user:{tenant}/u{rng.randrange(20)}"
        nodes = [f"{pool}-n{rng.randrange(NODES_PER_POOL)}" for _ in range(2)]
        workers = [
            {"index": i, "node": node, "gpus": list(range(8))} for i, node in enumerate(nodes)
        ]
        seq: list[tuple[str, str, dict[str, Any]]] = [
            ("TaskSubmitted", user, {"task_id": tid, "tenant": tenant, "creator": user[5:],
                                     "spec": {"name": "train", "pool": pool}}),
            ("TaskQueued", "service:scheduler", {"reason": "needs 2 x 8-GPU workers"}),
            ("TaskPlaced", "service:scheduler",
             {"run": 1, "attempt": 1, "pool": pool, "workers": workers}),
            ("WorkerStarted", "service:deployer",
             {"run": 1, "attempt": 1, "worker": 0, "node": nodes[0]}),
            ("WorkerStarted", "service:deployer",
             {"run": 1, "attempt": 1, "worker": 1, "node": nodes[1]}),
            ("TaskRunning", "service:deployer", {"run": 1, "attempt": 1}),
        ]  # fmt: skip
        roll = rng.random()
        if roll < 0.1:
            seq += [
                (
                    "TaskPreempted",
                    "service:scheduler",
                    {"run": 1, "reason": "spot capacity shrank"},
                ),
                ("TaskRequeued", "service:scheduler", {"run": 1, "requeue_count": 1}),
            ]
        elif roll < 0.2:
            seq.append(
                ("TaskRestartScheduled", "service:faulttolerance", {"run": 1, "reason": "hang"})
            )
        elif roll < 0.25:
            seq.append(("TaskStopRequested", user, {"reason": "stopped", "stopped_by": user[5:]}))
        seq += [
            ("TaskSucceeded", "service:deployer", {"run": 1}),
            ("ResourcesReleased", "service:scheduler", {"run": 1}),
        ]
        for version, (kind, actor, data) in enumerate(seq, start=1):
            events.append(
                _event(stream, version, kind, at + timedelta(seconds=version), actor, **data)
            )
        pool_versions[pool] += 1
        events.append(
            _event(f"pool-{pool}", pool_versions[pool], "WorkersAllocated", at, "service:scheduler",
                   task_id=tid, run=1, attempt=1, workers=workers)
        )  # fmt: skip
        if rng.random() < 0.01:
            pool_versions[pool] += 1
            events.append(
                _event(
                    f"pool-{pool}",
                    pool_versions[pool],
                    "NodeCordoned",
                    at,
                    "user:ops/root",
                    node=nodes[0],
                )
            )
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
            return f"replay: events={len(events)} audit_query_ms={slowest:.1f}"
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
