"""What-if scheduling end to end (R-61): `runyard whatif` over a window recorded on the
whole platform, with real worker processes.

Eight 8-GPU tasks (`sleep 2`) are submitted at once to dev-a100, which has four
8-GPU nodes: four run, four queue behind them. Then, over the window from just
before the submissions to just after the last end:

- with the same nodes, the simulation reproduces each run's real queue time.
  The simulated pool frees a run's GPUs when the real pool released them (the
  pool stream's `WorkersReleased`) and places the next run at that instant; the
  real scheduler places it in its next pass, a little later (its reaction
  time: milliseconds, more under load). Each real placement's reaction time is
  read from the log (its `WorkersAllocated` time minus the latest of the run's
  submission and the last release before it) and their sum is the tolerance:
  the simulated wait is never longer than the real one, and never shorter by
  more than that sum.
  No wall-clock figure is asserted beyond what the log records.
- with twice the nodes, no run waits at all in the simulation.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from runyard.api.auth import create_token
from runyard.contracts import default_mapper
from runyard.eventstore import PostgresEventStore

from tests.e2e.conftest import Platform
from tests.unit.test_cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TASKS = 8
#: Events are stamped to the microsecond; answers are rounded to the millisecond.
ROUNDING_S = 0.002


async def reaction_times(dsn: str, start: datetime, end: datetime) -> float:
    """The sum, over the window's placements, of how long each came after what let it
    start (its run's submission, or the last release of GPUs before it), as the log says."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        rows = await store.pool.fetch(
            "SELECT stream_id, event_type, occurred_at, data->>'task_id' AS task FROM events"
            " WHERE event_type = ANY($1::text[]) AND occurred_at BETWEEN $2 AND $3"
            " ORDER BY global_position",
            ["TaskSubmitted", "WorkersAllocated", "WorkersReleased"],
            start,
            end,
        )
    finally:
        await store.close()
    submitted: dict[str, datetime] = {}
    last_release = start
    total = 0.0
    for row in rows:
        at = row["occurred_at"]
        if row["event_type"] == "TaskSubmitted":
            submitted[row["task"]] = at
        elif row["event_type"] == "WorkersReleased":
            last_release = max(last_release, at)
        else:
            total += (at - max(submitted[row["task"]], last_release)).total_seconds()
    return total


async def whatif(platform: Platform, body: dict[str, Any]) -> dict[str, Any]:
    answer = await platform.http.post("/v1/pools/whatif", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


async def test_whatif_reproduces_real_queue_times_and_twice_the_nodes_waits_less(
    platform: Platform, dsn: str
) -> None:
    start = datetime.now(UTC) - timedelta(milliseconds=1)
    created = [
        await platform.submit(name=f"w{i}", worker_spec="8gpu", command="sleep 2")
        for i in range(TASKS)
    ]
    for task in created:
        await platform.wait_status(task["task_id"], "succeeded", within=90)
    await asyncio.sleep(0.2)  # the last releases are appended
    end = datetime.now(UTC)
    window = {"from": start.isoformat(), "to": end.isoformat(), "pool": "dev-a100"}

    same = await whatif(platform, window)
    (pool,) = same["pools"]
    assert pool["nodes"] == {"real": 4, "simulated": 4}
    runs = {r["task_id"]: r for r in same["runs"]}
    assert set(runs) == {t["task_id"] for t in created}
    real_waits = sorted(r["real_wait_s"] for r in runs.values())
    assert real_waits[-1] >= 2.0, real_waits  # half of them queued behind a `sleep 2`
    tolerance = await reaction_times(dsn, start, end) + ROUNDING_S
    for run in runs.values():
        gap = run["real_wait_s"] - run["simulated_wait_s"]
        assert -ROUNDING_S <= gap <= tolerance, (run, tolerance)
    for figure in ("p50_s", "p90_s", "p99_s", "max_s"):
        gap = pool["real"][figure] - pool["simulated"][figure]
        assert -ROUNDING_S <= gap <= tolerance, (figure, pool, tolerance)
    assert pool["real"]["placed"] == pool["simulated"]["placed"] == TASKS
    # Every run held its GPUs as long as it really did: the same GPU time in all.
    assert pool["simulated"]["gpu_hours"] == pytest.approx(pool["real"]["gpu_hours"], abs=1e-3)
    (spec,) = pool["specs"]
    assert spec["spec"] == "8gpu" and spec["real"]["runs"] == TASKS

    doubled = {"pools": [{"id": "dev-a100", "nodes": {"prefix": "d-", "count": 8, "gpus": 8}}]}
    # (the body's `pools` is the `pools` list of a pools file)
    bigger = await whatif(platform, {**window, **doubled})
    (twice,) = bigger["pools"]
    assert twice["nodes"] == {"real": 4, "simulated": 8}
    assert twice["simulated"]["max_s"] == 0.0 < pool["simulated"]["max_s"]
    assert twice["simulated"]["p90_s"] < pool["real"]["p90_s"]
    assert twice["simulated"]["utilisation"] < pool["simulated"]["utilisation"]

    # The command line, as an SRE (read-only: the gateway lets the what-if POST through):
    # the same answer as JSON, and the side-by-side table.
    conn = await asyncpg.connect(dsn)
    try:
        token = await create_token(conn, "ops", "sam", "sre")
    finally:
        await conn.close()
    url = str(platform.http.base_url).rstrip("/")
    args = ["whatif", "--from", window["from"], "--to", window["to"], "--pool", "dev-a100"]
    shown = await cli(url, token, *args, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["pools"] == same["pools"]
    table = await cli(url, token, *args)
    assert table.exit_code == 0, table.output
    assert "queue p90 (s)" in table.stdout and "what-if" in table.stdout
