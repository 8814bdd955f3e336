"""SRE replay end to end (R-61): `runyard show --at` on a task that queued, deployed,
crashed and restarted, on the whole platform with real worker processes.

A gang holds the whole dev-a100 pool, so the task queues; the gang is stopped,
the task is placed, goes through the deploy stages and runs; its worker is
killed (SIGKILL: a crash), the task restarts on its own and runs attempt 2.
Then `runyard show ID --at T` at four moments (queued, deploying, running
attempt 1, running again after the restart) must print exactly the fold of the
task stream's events up to T, read here from the store with the task domain's
fold; `runyard diff` and `runyard pools --at` are read at the same moments.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from datetime import datetime
from itertools import takewhile
from typing import Any

import pytest
from runyard.contracts import Event, RecordedEvent, default_mapper
from runyard.domain import fold
from runyard.eventstore import PostgresEventStore
from runyard.gateway.replay import placement_view
from runyard.gateway.views import task_view

from tests.e2e.conftest import Platform
from tests.e2e.test_fault_tolerance import (  # noqa: F401  (fixtures)
    feishu,
    ft_platform,
    ft_shared,
)
from tests.unit.test_cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CRASHES_IN_ATTEMPT_1 = 'if [ "$RUNYARD_ATTEMPT" = 1 ]; then sleep 60; fi; sleep 30'


@pytest.fixture
async def store(ft_platform: Platform) -> AsyncIterator[PostgresEventStore]:  # noqa: F811
    opened = await PostgresEventStore.connect(ft_platform.ctx.dsn, default_mapper())
    yield opened
    await opened.close()


def moment_after(stream: list[RecordedEvent[Event]], index: int) -> datetime:
    """A time after event `index` and before the next event stamped later."""
    at = stream[index].occurred_at
    later = next((e.occurred_at for e in stream[index + 1 :] if e.occurred_at > at), None)
    return at + (later - at) / 2 if later is not None else at


def expected_at(stream: list[RecordedEvent[Event]], at: datetime) -> dict[str, Any]:
    """The task as the fold of its stream's events that had occurred by `at`."""
    cut = list(takewhile(lambda e: e.occurred_at <= at, stream))
    state = fold(cut)
    return {**task_view(state, cut, True, {}), "placement": placement_view(state)}


def first(stream: list[RecordedEvent[Event]], kind: str, nth: int = 1) -> int:
    return [i for i, e in enumerate(stream) if e.type == kind][nth - 1]


async def test_show_at_four_moments_is_the_fold_of_the_stream_prefix(
    ft_platform: Platform,  # noqa: F811
    store: PostgresEventStore,
) -> None:
    platform = ft_platform
    gang = await platform.submit(
        name="gang",
        worker_spec="8gpu",
        worker_count=4,
        framework="pytorch_ddp",
        command="sleep 60",
    )
    await platform.wait_status(gang["task_id"], "running")
    created = await platform.submit(
        name="crashes-once",
        command=CRASHES_IN_ATTEMPT_1,
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    task_id = created["task_id"]
    await platform.wait_status(task_id, "queued")
    stopped = await platform.http.post(f"/v1/tasks/{gang['task_id']}/stop")
    assert stopped.status_code == 200, stopped.text

    running = await platform.wait_status(task_id, "running")
    assert running["attempt"] == 1
    await asyncio.sleep(0.5)
    pids = platform.worker_pids((task_id, 1, 1))
    assert len(pids) == 1, pids
    os.killpg(pids[0], signal.SIGKILL)  # the worker crashes
    await platform.wait_for(
        task_id, lambda t: t["attempt"] == 2 and t["status"] == "running", within=30
    )

    stream = await store.read_stream(f"task-{task_id}")
    moments = {
        "queued": moment_after(stream, first(stream, "TaskQueued")),
        "deploying": moment_after(stream, first(stream, "DeployStageStarted")),
        "running attempt 1": moment_after(stream, first(stream, "TaskRunning")),
        "after the restart": moment_after(stream, first(stream, "TaskRunning", 2)),
    }
    url, token = str(platform.http.base_url).rstrip("/"), platform.token
    seen = {}
    for name, at in moments.items():
        shown = await cli(url, token, "show", task_id, "--at", at.isoformat(), "--json")
        assert shown.exit_code == 0, (name, shown.output)
        answer = json.loads(shown.stdout)
        assert answer["task"] == expected_at(stream, at), name
        seen[name] = answer["task"]
    assert seen["queued"]["status"] == "queued" and seen["queued"]["placement"] is None
    assert seen["deploying"]["status"] == "deploying" and seen["deploying"]["stage"]
    assert (seen["running attempt 1"]["status"], seen["running attempt 1"]["attempt"]) == (
        "running",
        1,
    )
    after = seen["after the restart"]
    assert (after["status"], after["attempt"], after["counters"]["restarts"]) == ("running", 2, 1)
    crashed = after["placement"]["workers"][0]
    assert crashed["started"] is True and crashed["exit_code"] is None

    # the table form, on a pipe: whole lines
    table = await cli(url, token, "show", task_id, "--at", moments["queued"].isoformat())
    assert "status=queued" in table.stdout and "placement: none" in table.stdout
    # a position: the same prefix as the time right after that event
    queued_position = stream[first(stream, "TaskQueued")].global_position
    by_position = await cli(url, token, "show", task_id, "--at", str(queued_position), "--json")
    assert json.loads(by_position.stdout)["task"]["status"] == "queued"

    between = [
        "diff",
        task_id,
        "--from",
        moments["running attempt 1"].isoformat(),
        "--to",
        moments["after the restart"].isoformat(),
    ]
    diff = await cli(url, token, *between, "--json")
    assert diff.exit_code == 0, diff.output
    changed = {c["field"]: (c["from"], c["to"]) for c in json.loads(diff.stdout)["changes"]}
    assert changed["attempt"] == (1, 2) and changed["counters.restarts"] == (0, 1)
    types = [e["type"] for e in json.loads(diff.stdout)["events"]]
    assert "WorkerExited" in types and "TaskRestartScheduled" in types

    piped = await cli(url, token, *between)
    assert "counters.restarts\t0\t1\n" in piped.stdout and "attempt\t1\t2\n" in piped.stdout
    pool_table = await cli(
        url, token, "pools", "--at", moments["running attempt 1"].isoformat(), "--pool", "dev-a100"
    )
    assert f"\n{task_id}\t1\t1\t1\tdev-a100-node-" in pool_table.stdout

    pools = await cli(
        url,
        token,
        "pools",
        "--at",
        moments["running attempt 1"].isoformat(),
        "--pool",
        "dev-a100",
        "--json",
    )
    assert pools.exit_code == 0, pools.output
    (pool,) = json.loads(pools.stdout)["pools"]
    assert [a["task_id"] for a in pool["occupancy"]["items"]] == [task_id]

    # refusals name what is wrong and what to do
    before = await cli(url, token, "show", task_id, "--at", "2001-01-01T00:00:00Z")
    assert before.exit_code == 1 and "replay.before_start" in before.output
    assert "did not exist yet" in before.output and "hint:" in before.output
    bad = await cli(url, token, "show", task_id, "--at", "noon")
    assert bad.exit_code == 1 and "replay.bad_point" in bad.output
    past = await cli(url, token, "show", task_id, "--at", "999999999")
    assert past.exit_code == 1 and "replay.past_end" in past.output
    await platform.http.post(f"/v1/tasks/{task_id}/stop")
    await platform.wait_status(task_id, "stopped", within=20)
