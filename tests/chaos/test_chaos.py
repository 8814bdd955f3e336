"""Faults an operator meets, one per scenario, while short tasks flow.

Each scenario submits its tasks (every one prints numbered lines and its exit
time, see harness.py), waits until a share of them have ended, injects its
fault, waits until every task has ended (or none has for `STALLED_S`), then holds
the platform to its promises: every task terminal, none failed by the
platform, none ran twice, every output line stored once, every exit recorded
within a second of when it happened, no process left, every read model equal
to its rebuild, and (where the scenario has tasks that alert) every alert sent
once. It prints one line:

    chaos <scenario>: tasks=<n> lost=0 doubled=0 failed_by_platform=0 stall_s=<x>
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from tests.chaos.conftest import FEISHU_BOT, SWEEP_S, ChaosStack
from tests.chaos.harness import (
    TERMINAL_EVENTS,
    analyse,
    processes_matching,
    read_model_mismatches,
    worker_command,
)

# Each scenario starts its own Postgres and platform and waits out its fault.
pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(300)]

TASKS = 100
LINES = 5
#: Share of the tasks that have ended when the fault is injected.
FAULT_AT = 0.3
#: Share of the tasks submitted before those that alert.
ALERTING_AT = 0.4
#: A scenario stops waiting when no task ended for this long (a bound, not a measure:
#: the 20 s database outage is the longest pause a scenario makes on purpose).
STALLED_S = 30.0

Fault = Callable[[ChaosStack, httpx.AsyncClient], Awaitable[None]]


async def _terminal(dsn: str, task_ids: list[str]) -> int | None:
    """How many of the tasks have ended (None while the database cannot be reached)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=2)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return None
    try:
        count = await conn.fetchval(
            "SELECT count(DISTINCT stream_id) FROM events"
            " WHERE stream_id = ANY($1) AND event_type = ANY($2)",
            [f"task-{t}" for t in task_ids],
            list(TERMINAL_EVENTS),
        )
        return int(count)
    except (OSError, asyncpg.PostgresError):
        return None
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


async def _wait_terminal(stack: ChaosStack, task_ids: list[str], at_least: int) -> None:
    """Until `at_least` tasks ended, or no task ended for `STALLED_S` (the checks then
    count what is missing); fails at once if the platform died."""
    last, moved = -1, time.monotonic()
    while time.monotonic() - moved < STALLED_S:
        stack.check_alive()
        done = await _terminal(stack.dsn, task_ids)
        if done is not None and done >= at_least:
            return
        if done is not None and done > last:
            last, moved = done, time.monotonic()
        await asyncio.sleep(0.25)


async def _wait_running_worker(stack: ChaosStack, run_id: str, within: float = 30.0) -> None:
    """Until a worker of the scenario is alive: the fault hits running work, and the
    process check at the end is shown to see workers."""
    deadline = time.monotonic() + within
    while not processes_matching(environ=f"CHAOS_RUN={run_id}"):
        stack.check_alive()
        assert time.monotonic() < deadline, f"no worker of the scenario ran within {within:.0f} s"
        await asyncio.sleep(0.05)


async def _wait_task_list_caught_up(stack: ChaosStack, within: float = 30.0) -> None:
    """Until the gateway's task list has applied the whole log (its checkpoint is the end)."""
    deadline = time.monotonic() + within
    conn = await asyncpg.connect(stack.dsn)
    try:
        while time.monotonic() < deadline:
            end = await conn.fetchval("SELECT coalesce(max(global_position), 0) FROM events")
            at = await conn.fetchval("SELECT position FROM checkpoints WHERE name = 'task_list'")
            if at == end:
                return
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def _wait_pools_idle(stack: ChaosStack, within: float = 4 * SWEEP_S + 20) -> None:
    """Until the scheduler's pool views hold no task and queue none, as they must once
    every task has ended. An event a killed broker lost reaches the scheduler through
    its sweep, which acts on what it found missing at two sweeps in a row: up to
    `2 * SWEEP_S` after the task list (fed straight from the log) shows the task ended.
    Past `within`, the comparison with the rebuild reports what was never released."""
    deadline = time.monotonic() + within
    conn = await asyncpg.connect(stack.dsn)
    try:
        while time.monotonic() < deadline:
            busy = await conn.fetchval(
                """SELECT count(*) FROM scheduler_pool_views
                   WHERE (view->'occupancy'->>'tasks')::int > 0
                      OR (view->'queue'->>'waiting')::int > 0"""
            )
            if busy == 0:
                return
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def _wait_outputs_stored(stack: ChaosStack, within: float = 60.0) -> list[str]:
    """Until the deployer has removed every finished worker's output files, which it
    does once the log service has stored all their lines (republishing what a broker
    lost); the folders still there after `within`."""
    scratch = stack.home / "scratch"
    deadline = time.monotonic() + within
    while True:
        try:
            left = sorted(
                str(p.parent.relative_to(scratch)) for p in scratch.glob("*/run*-a*/state.json")
            )
        except FileNotFoundError:  # a task's folder removed while it was being listed
            await asyncio.sleep(0.1)
            continue
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


async def _submit(http: httpx.AsyncClient, run_id: str, count: int, **spec: Any) -> list[str]:
    body = {
        "pool": "dev-a100",
        "worker_spec": "1gpu",
        "image": "bash-only",
        "command": worker_command(LINES),
        "env": [{"name": "CHAOS_RUN", "value": run_id}],
        **spec,
    }
    gate = asyncio.Semaphore(8)

    async def one(i: int) -> str:
        async with gate:
            answer = await http.post("/v1/tasks", json={**body, "name": f"chaos-{i}"})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["task_id"])

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def _crash_once(stack: ChaosStack) -> dict[str, Any]:
    """The spec of a task whose first attempt crashes and is restarted (the second does
    the scenario's work), with a Feishu subscription to that restart: one alert each."""
    first = 'if [ "$RUNYARD_ATTEMPT" = 1 ]; then echo "chaos crash"; exit 3; fi; '
    return {
        "command": first + worker_command(LINES),
        "fault_tolerance": {"auto_restart": True, "max_restarts": 1},
        "alerts": [{"webhook_url": stack.feishu.url(FEISHU_BOT), "alerts": ["restarted"]}],
    }


async def _wait_alerts_delivered(
    stack: ChaosStack, task_ids: list[str], within: float = 60.0
) -> dict[str, int]:
    """Until each of `task_ids` has an `AlertDelivered` (or `within` passed): task id ->
    how many it has."""
    deadline = time.monotonic() + within
    conn = await asyncpg.connect(stack.dsn)
    try:
        while True:
            rows = await conn.fetch(
                "SELECT stream_id, count(*) AS n FROM events WHERE stream_id = ANY($1)"
                " AND event_type = 'AlertDelivered' GROUP BY stream_id",
                [f"task-{t}" for t in task_ids],
            )
            delivered = {r["stream_id"].removeprefix("task-"): int(r["n"]) for r in rows}
            if len(delivered) == len(task_ids) or time.monotonic() > deadline:
                return delivered
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


def _alert_problems(stack: ChaosStack, alerting: list[str], delivered: dict[str, int]) -> list[str]:
    """Each alerting task's restart was delivered once: one `AlertDelivered`, and the
    task named in one card the bot accepted. Or in two, when the notification service
    was killed between them: killed after Feishu accepted the card and before it
    recorded the delivery, it sends the card again after its restart (at least once)."""
    cards = stack.feishu.accepted(FEISHU_BOT)
    problems = []
    for task_id in alerting:
        named = [card.at for card in cards if task_id in card.text]
        resent = len(named) == 2 and any(
            named[0] < kill < named[1] for kill in stack.notification_kills
        )
        if delivered.get(task_id, 0) != 1 or not (len(named) == 1 or resent):
            problems.append(
                f"alert of {task_id}: {delivered.get(task_id, 0)} AlertDelivered,"
                f" named in {len(named)} card(s)"
            )
    return problems


async def run_scenario(
    stack: ChaosStack,
    scenario: str,
    fault: Fault,
    *,
    tasks: int = TASKS,
    alerting: int = 0,
    **spec: Any,
) -> None:
    """`tasks` tasks, and `alerting` more whose first attempt crashes and alerts once."""
    run_id = uuid.uuid4().hex
    headers = {"Authorization": f"Bearer {stack.token()}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=30) as http:
        # The alerting ones in the middle: they run while the fault is injected.
        before = await _submit(http, run_id, int(tasks * ALERTING_AT), **spec)
        alerts = await _submit(http, run_id, alerting, **{**spec, **_crash_once(stack)})
        after = await _submit(http, run_id, tasks - len(before), **spec)
        task_ids = before + alerts + after
        await _wait_terminal(stack, task_ids, int(len(task_ids) * FAULT_AT))
        await _wait_running_worker(stack, run_id)
        await fault(stack, http)
        await _wait_terminal(stack, task_ids, len(task_ids))
    stack.check_alive()
    await _wait_task_list_caught_up(stack)
    await _wait_pools_idle(stack)
    kept = await _wait_outputs_stored(stack)
    delivered = await _wait_alerts_delivered(stack, alerts)
    # Every task has ended: no worker of this scenario may be alive now.
    left = [f"worker pid {p}" for p in processes_matching(environ=f"CHAOS_RUN={run_id}")]
    stack.stop()
    left += [f"broker pid {p} after runyard up stopped" for p in stack.broker_pids()]

    report = await analyse(scenario, stack.dsn, task_ids, LINES)
    report.processes_left = left
    report.outputs_left = kept
    report.alerts = _alert_problems(stack, alerts, delivered)
    if not report.still_open:
        # Rebuilt only once nothing is open: a scheduler rebuilt over open tasks places them.
        report.read_models = await read_model_mismatches(stack.dsn, stack.root / "config")
    platform_log = stack.log_path.read_text(errors="replace")
    republished = re.findall(r"published again (\d+) line", platform_log)
    noticed = platform_log.count("the broker lost output lines")
    # What the scheduler's anti-entropy sweep had to do (it heals; a healthy run has none).
    swept = len(
        re.findall(
            r"scheduler: (?:events of task \S+ never reached it|task \S+ was left undone)",
            platform_log,
        )
    )
    print(
        "\n".join(
            [
                report.summary(),
                f"  (broker losses noticed by the deployer: {noticed};"
                f" output lines published again: {sum(map(int, republished))};"
                f" tasks the scheduler's sweep acted on: {swept})",
                f"  (alerting tasks: {len(alerts)}; alerts delivered: {sum(delivered.values())};"
                f" cards accepted: {len(stack.feishu.accepted(FEISHU_BOT))})",
                *report.problems(),
            ]
        )
    )
    report.assert_clean()


# -- faults ---------------------------------------------------------------------------------


async def kill_the_platform(stack: ChaosStack, http: httpx.AsyncClient) -> None:
    """kill -9 of `runyard up`; a few seconds later, the same command again."""
    stack.kill_platform()
    await asyncio.sleep(3)  # workers end meanwhile: their exits wait for adoption
    stack.start()
    await stack.wait_ready()


async def postgres_outage(stack: ChaosStack, http: httpx.AsyncClient) -> None:
    """Postgres gone for 20 s (immediate shutdown), then back on the same port."""
    stack.postgres_down()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stack.check_alive()  # the platform waits an outage out
        await asyncio.sleep(0.5)
    stack.postgres_up()


async def kill_the_broker(stack: ChaosStack, http: httpx.AsyncClient) -> None:
    """kill -9 of the embedded broker; `runyard up` must bring a new one up by itself."""
    killed = stack.kill_broker()
    deadline = time.monotonic() + 30
    while not [p for p in stack.broker_pids() if p != killed]:
        stack.check_alive()
        assert time.monotonic() < deadline, "runyard up did not restart its broker within 30 s"
        await asyncio.sleep(0.2)


async def preempt_spot_capacity(stack: ChaosStack, http: httpx.AsyncClient) -> None:
    """The provider takes one of the two spot nodes back while its tasks run."""
    body = {"remove": 1, "reason": "chaos: the provider reclaimed a node"}
    for _ in range(10):  # a busy pool may answer 409 scheduler.conflict: "try again"
        answer = await http.post("/v1/admin/pools/dev-spot/spot-capacity", json=body)
        if answer.status_code != 409:
            break
        await asyncio.sleep(0.2)
    assert answer.status_code == 200, answer.text
    assert answer.json()["preempted"], f"nothing was preempted: {answer.json()}"


#: The order `kill_each_service` kills them in.
SERVICES = (
    "scheduler",
    "deployer",
    "gateway",
    "submission",
    "relay",
    "logs",
    "notification",
    "faulttolerance",
)


def _services(stack: ChaosStack) -> dict[str, dict[str, Any]]:
    """What `runyard ps` reads: each supervised service's pid, url and restarts."""
    state = json.loads((stack.home / "run" / "services.json").read_text())
    return {s["name"]: s for s in state["services"]}


async def _wait_restarted(stack: ChaosStack, name: str, killed: int, within: float = 60.0) -> None:
    """Until `runyard up` runs `name` again under a new pid and it answers /readyz."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2) as probe:
        while True:
            stack.check_alive()
            with contextlib.suppress(OSError, ValueError, KeyError, httpx.TransportError):
                service = _services(stack)[name]
                if service["pid"] not in (None, killed):
                    answer = await probe.get(f"{service['url']}/readyz")
                    if answer.status_code == 200:
                        return
            assert time.monotonic() < deadline, f"{name} was not back within {within:.0f} s"
            await asyncio.sleep(0.2)


async def _others_serve(http: httpx.AsyncClient, down: str, finished: str) -> None:
    """The rest keep serving while `down` is: the gateway answers reads (the task list is
    its own), and a finished task's logs stay searchable (the log service's)."""
    if down == "gateway":
        return
    listed = await http.get("/v1/tasks", params={"limit": 5})
    assert listed.status_code == 200, f"with {down} down, listing tasks: {listed.text}"
    if down != "logs":
        found = await http.get(f"/v1/tasks/{finished}/logs", params={"phrase": "chaos line"})
        assert found.status_code == 200, f"with {down} down, searching logs: {found.text}"
        assert found.json()["lines"], f"with {down} down, the logs of {finished} are empty"


async def kill_each_service(stack: ChaosStack, http: httpx.AsyncClient) -> None:
    """kill -9 of each supervised service in turn: the others serve while it is down,
    `runyard up` restarts it, then the next one goes."""
    finished = await _a_succeeded_task(http)
    for name in SERVICES:
        pid = _services(stack)[name]["pid"]
        assert pid, f"{name} is not running before its kill: {_services(stack)[name]}"
        if name == "notification":
            stack.notification_kills.append(time.time())
        os.kill(pid, signal.SIGKILL)
        await _others_serve(http, name, finished)
        await _wait_restarted(stack, name, pid)


async def _a_succeeded_task(http: httpx.AsyncClient) -> str:
    answer = await http.get("/v1/tasks", params={"status": "succeeded", "limit": 1})
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    assert items, f"no task has succeeded yet: {answer.json()}"
    return str(items[0]["task_id"])


# -- scenarios ----------------------------------------------------------------------------------


async def test_kill_9_of_the_platform(chaos_stack: ChaosStack) -> None:
    await run_scenario(chaos_stack, "platform_kill", kill_the_platform)


async def test_postgres_outage_of_20_s(chaos_stack: ChaosStack) -> None:
    await run_scenario(chaos_stack, "postgres_outage", postgres_outage)


async def test_broker_killed_and_restarted(chaos_stack: ChaosStack) -> None:
    await run_scenario(chaos_stack, "broker_restart", kill_the_broker)


async def test_spot_preemption(chaos_stack: ChaosStack) -> None:
    spot = {"max_requeues": 20, "max_queue_duration_s": 3600}
    await run_scenario(
        chaos_stack,
        "spot_preemption",
        preempt_spot_capacity,
        tasks=100,
        pool="dev-spot",
        resource_type="spot",
        spot=spot,
    )


async def test_kill_9_of_each_service_in_turn(chaos_stack: ChaosStack) -> None:
    # Eight-GPU workers: four at a time on the pool, so the tasks flow through every kill.
    # Some tasks crash once and alert: each alert is sent once through every kill.
    await run_scenario(
        chaos_stack, "service_kills", kill_each_service, alerting=12, worker_spec="8gpu"
    )
