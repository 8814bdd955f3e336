"""Rebuilding read models beside the live ones, on a real Postgres: `runyard rebuild`.

The task list (the gateway's), the scheduler's pool views and queue, and the
notification service's queue waits are rebuilt from position 0 into shadow
tables with their owners' own code: after tasks have run, the diff is empty;
a corrupted live row is exactly one difference, and the swap repairs it
without stopping anything; a rebuild cut off half way resumes from its shadow
checkpoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.cli.rebuild import READ_MODELS, print_diff, progress
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.domain import Fail, Queue
from runyard.domain.task import Submit, decide
from runyard.eventstore import PostgresEventStore
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.gateway.proxy import ROUTES
from runyard.gateway.rebuild import TaskListRebuild
from runyard.messaging.progress import read_progress
from runyard.notification.main import http_app as notification_http
from runyard.notification.rebuild import QueueWaitsRebuild
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.config import parse_pools
from runyard.scheduler.rebuild import SchedulerRebuild
from runyard.scheduler.views import POOL_VIEWS as POOL_VIEWS_TABLE
from runyard.scheduler.views import QUEUE as QUEUE_TABLE
from runyard.stack.up import Stack

from tests.integration.test_gateway import config_dir
from tests.integration.test_notification import Harness, harness
from tests.integration.test_notification import spec as notification_spec
from tests.integration.test_scheduler_http import NOW, Face, face  # noqa: F401  (fixture)
from tests.integration.test_scheduler_http import POOLS as SCHEDULER_POOLS
from tests.security.test_infra_credentials import stack as stack  # roles as `runyard up`
from tests.unit.test_task_domain import Story, make_spec

pytestmark = pytest.mark.integration

BASE = "/v1/admin/read-models/task_list"


@dataclass
class Lists:
    gateway: Gateway
    http: httpx.AsyncClient
    tokens: dict[str, str]

    async def call(self, who: str, method: str, path: str, **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.request(method, BASE + path, params=params, headers=headers)


@pytest.fixture
async def lists(dsn: str, tmp_path: Path) -> AsyncIterator[Lists]:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "sre": await create_token(gateway.db, "ops", "sam", "sre"),
        "member": await create_token(gateway.db, "ml", "alice", "member"),
    }
    app = create_app(gateway, {})
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw"
        ) as http:
            yield Lists(gateway, http, tokens)
    finally:
        await app.state.owners.aclose()
        await gateway.close()


async def tasks_ran(gateway: Gateway, count: int, first: int = 0) -> None:
    """`count` tasks of tenant ml (t<first>, ...): each queued, placed, running, crashed
    and restarted."""
    meta = Metadata(actor="user:ml/alice")
    for n in range(first, first + count):
        story = Story(make_spec(workers=1, auto_restart=True, max_restarts=1)).running()
        story.exit(0, 1)
        for event, at in story.events:
            if "task_id" in type(event).model_fields:  # each task its own id
                event = event.model_copy(update={"task_id": f"t{n}"})
            await gateway.store.append(f"task-t{n}", [NewEvent(event, meta, at)])
    await gateway.projector.catch_up()


async def rebuilt(lists: Lists, max_events: int = 100_000) -> list[dict[str, Any]]:
    """Steps of a rebuild until it is done, as the CLI makes them."""
    steps: list[dict[str, Any]] = []
    while not steps or not steps[-1]["done"]:
        answer = await lists.call("sre", "POST", "/rebuild", max_events=max_events)
        assert answer.status_code == 200, answer.text
        steps.append(answer.json())
    return steps


async def test_rebuild_diff_is_empty_after_tasks_ran(lists: Lists) -> None:
    await tasks_ran(lists.gateway, 3)
    steps = await rebuilt(lists)
    head = await lists.gateway.store.head_position()
    assert steps[-1]["position"] == steps[-1]["target"] == head
    assert sum(s["applied"] for s in steps) == head
    diff = (await lists.call("sre", "GET", "/diff")).json()
    [table] = diff["tables"]
    assert (table["differences"], table["live_rows"], table["rebuilt_rows"]) == (0, 3, 3)


async def test_a_corrupted_row_is_one_difference_and_the_swap_repairs_it(
    lists: Lists, capsys: pytest.CaptureFixture[str]
) -> None:
    await tasks_ran(lists.gateway, 3)
    await rebuilt(lists)
    before = await lists.gateway.db.fetchrow("SELECT * FROM task_list WHERE task_id = 't1'")
    await lists.gateway.db.execute("UPDATE task_list SET status = 'bogus' WHERE task_id = 't1'")
    # events appended after the rebuild's last step are brought in under the lock
    await tasks_ran(lists.gateway, 1, first=3)
    diff = (await lists.call("sre", "GET", "/diff")).json()
    [table] = diff["tables"]
    assert table["differences"] == 1
    [row] = table["items"]
    assert (row["key"], row["kind"]) == ("t1", "changed")
    assert row["columns"] == {"status": {"live": "bogus", "rebuilt": before["status"]}}
    print_diff(diff, swapped=False)  # what `runyard rebuild task_list --diff` prints
    printed = capsys.readouterr().out
    assert "task_list at position" in printed and "1 differences (differs" in printed
    assert "bogus" in printed and before["status"] in printed

    swapped = (await lists.call("sre", "POST", "/swap")).json()
    assert (swapped["repaired"], swapped["rows"]) == (1, 4)
    after = await lists.gateway.db.fetchrow("SELECT * FROM task_list WHERE task_id = 't1'")
    assert dict(after) == dict(before)
    # the live projector goes on from its checkpoint with the swapped rows
    await tasks_ran(lists.gateway, 1, first=4)
    assert await lists.gateway.db.fetchval("SELECT count(*) FROM task_list") == 5
    gone = await lists.call("sre", "GET", "/diff")
    assert (gone.status_code, gone.json()["code"]) == (404, "rebuild.not_started")
    await rebuilt(lists)
    again = (await lists.call("sre", "GET", "/diff")).json()
    assert again["tables"][0]["differences"] == 0


async def test_an_interrupted_rebuild_resumes_from_its_shadow_checkpoint(lists: Lists) -> None:
    await tasks_ran(lists.gateway, 3)
    head = await lists.gateway.store.head_position()
    first = (await lists.call("sre", "POST", "/rebuild", max_events=5)).json()
    assert (first["applied"], first["done"]) == (5, False)
    # the gateway is gone (a new process): the shadow's position is in `checkpoints`
    async with lists.gateway.db.acquire() as conn:
        progress = {p.name: p for p in await read_progress(conn)}
    assert progress["shadow:task_list"].position == first["position"]
    assert progress["shadow:task_list"].kind == "shadow"
    resumed = await TaskListRebuild(lists.gateway).step(1000)
    assert resumed["applied"] == head - first["position"] and resumed["done"]
    restarted = (await lists.call("sre", "POST", "/rebuild", max_events=5, restart="true")).json()
    assert restarted["position"] <= 5 + 1 and restarted["applied"] == 5


async def test_the_gateway_rebuilds_on_its_own_database_role(stack: Stack, tmp_path: Path) -> None:
    """`runyard up` connects the gateway as a role that may create no table in `public`:
    the shadow goes to `runyard_shadow`, where it may, and rebuild, diff, swap, a fresh
    start and discard all work as that role (they were a 500 `permission denied`)."""
    gateway = await Gateway.connect(stack.service_dsns["gateway"], config_dir(tmp_path))
    try:
        await tasks_ran(gateway, 2)
        rebuild = TaskListRebuild(gateway)
        while not (await rebuild.step(1000))["done"]:
            pass
        [table] = (await rebuild.diff())["tables"]
        assert (table["differences"], table["live_rows"], table["rebuilt_rows"]) == (0, 2, 2)
        assert (await rebuild.swap())["rows"] == 2
        assert (await rebuild.step(1000, restart=True))["done"]
        assert (await rebuild.discard())["dropped"]
        shadows = "SELECT count(*) FROM pg_tables WHERE schemaname = 'runyard_shadow'"
        assert await gateway.db.fetchval(shadows) == 0
    finally:
        await gateway.close()


async def test_only_operators_rebuild(lists: Lists) -> None:
    for method, path in [("POST", "/rebuild"), ("GET", "/diff"), ("POST", "/swap")]:
        refused = await lists.call("member", method, path)
        assert (refused.status_code, refused.json()["code"]) == (403, "auth.operator_only")


# --- the scheduler's read models (its own routes, routed by the gateway) ----------------


async def test_scheduler_read_models_rebuild_diff_and_swap(
    face: Face,  # noqa: F811  (the fixture)
) -> None:
    face.tokens["sre"] = await create_token(face.store.pool, "ops", "sam", "sre")
    await face.submit("running", "t1")  # takes the only node
    await face.submit("mine", "t1")
    await face.submit("theirs", "t2")
    base = "http://scheduler/v1/admin/scheduler/read-models"

    async def call(method: str, name: str, path: str, who: str = "sre") -> Any:
        answer = await face.http.request(
            method, f"{base}/{name}/{path}", headers={"Authorization": face.auth(who)}
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    for name in ("scheduler_pool_views", "scheduler_queue"):
        step = await call("POST", name, "rebuild")
        assert step["done"] and step["pools"] == 1 and step["pending"] == 0
        [table] = (await call("GET", name, "diff"))["tables"]
        assert table["differences"] == 0, table
    assert table["live_rows"] == 2  # mine and theirs wait

    await face.store.pool.execute("UPDATE scheduler_queue SET why = 'bogus' WHERE task_id = 'mine'")
    await face.store.pool.execute(
        "UPDATE scheduler_pool_views SET view = jsonb_set(view, '{capacity,free_gpus}', '99')"
    )
    for name, key, column in [
        ("scheduler_queue", "mine", "why"),
        ("scheduler_pool_views", "dev-a100", "view"),
    ]:
        await call("POST", name, "rebuild")
        [table] = (await call("GET", name, "diff"))["tables"]
        assert table["differences"] == 1, table
        [row] = table["items"]
        assert (row["key"], list(row["columns"])) == (key, [column])
        swapped = await call("POST", name, "swap")
        assert swapped["repaired"] == 1
        await call("POST", name, "rebuild")
        [table] = (await call("GET", name, "diff"))["tables"]
        assert table["differences"] == 0
    why = await face.store.pool.fetchval("SELECT why FROM scheduler_queue WHERE task_id = 'mine'")
    assert why != "bogus"
    refused = await face.http.post(
        f"{base}/scheduler_queue/rebuild", headers={"Authorization": face.auth("t1")}
    )
    assert (refused.status_code, refused.json()["code"]) == (403, "auth.operator_only")


# --- the notification service's queue waits (its own routes, routed by the gateway) -----


async def test_queue_waits_rebuild_diff_and_swap(dsn: str, tmp_path: Path) -> None:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))  # its migrations hold the tokens
    try:
        tokens = {
            "sre": await create_token(gateway.db, "ops", "sam", "sre"),
            "member": await create_token(gateway.db, "t1", "alice", "member"),
        }
        async with harness(dsn, serve=False) as h:
            await queued_and_ran(h)
            app = notification_http(h.app, tmp_path)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://notification"
            ) as http:
                await _queue_waits_rebuilt(h, http, tokens)
    finally:
        await gateway.close()


async def queued_and_ran(h: Harness) -> None:
    """Three tasks waiting (one queued twice), one whose wait ended, two that ran and
    restarted (their streams as the task domain makes them)."""
    for n in range(3):
        await h.submit(f"w{n}", notification_spec(f"waits-{n}"))
        await h.command(f"w{n}", Queue(f"w{n}", "needs 2 x 8-GPU workers", n, 16, 1))
    await h.command("w0", Queue("w0", "pool too small", 0, 16, 0, blocked=True))  # a new kind
    await h.submit("ended", notification_spec("ended"))
    await h.command("ended", Queue("ended", "waiting", 3, 16, 0))
    await h.command("ended", Fail("ended", "ends the wait"))
    for n in range(2):
        story = Story(make_spec(workers=1, auto_restart=True, max_restarts=1)).running()
        story.exit(0, 1)
        events = [
            NewEvent(e.model_copy(update={"task_id": f"ran{n}"}), Metadata(actor="x:y"), at)
            if "task_id" in type(e).model_fields
            else NewEvent(e, Metadata(actor="x:y"), at)
            for e, at in story.events
        ]
        await h.store.append(f"task-ran{n}", events)
        await h.deliver(await h.store.read_stream(f"task-ran{n}"))


async def _queue_waits_rebuilt(h: Harness, http: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    base = "/v1/admin/notification/read-models/queue_waits"

    async def call(method: str, path: str, who: str = "sre") -> Any:
        headers = {"Authorization": f"Bearer {tokens[who]}"}
        answer = await http.request(method, f"{base}/{path}", headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    step = await call("POST", "rebuild")
    assert step["done"] and (step["tasks"], step["waiting"]) == (6, 3)
    [table] = (await call("GET", "diff"))["tables"]
    assert (table["differences"], table["live_rows"], table["rebuilt_rows"]) == (0, 3, 3), table

    before = await h.store.pool.fetchrow("SELECT * FROM queue_waits WHERE task_id = 'w1'")
    await h.store.pool.execute(
        "UPDATE queue_waits SET queued_at = queued_at - interval '1 hour' WHERE task_id = 'w1'"
    )
    [table] = (await call("GET", "diff"))["tables"]
    assert table["differences"] == 1, table
    [row] = table["items"]
    assert (row["key"], row["kind"], list(row["columns"])) == ("w1", "changed", ["queued_at"])
    swapped = await call("POST", "swap")
    assert (swapped["repaired"], swapped["rows"]) == (1, 3)
    after = await h.store.pool.fetchrow("SELECT * FROM queue_waits WHERE task_id = 'w1'")
    assert dict(after) == dict(before)
    # the service goes on with the swapped rows: a wait that ends deletes its row
    await h.command("w2", Fail("w2", "ends the wait"))
    await call("POST", "rebuild")
    [table] = (await call("GET", "diff"))["tables"]
    assert (table["differences"], table["live_rows"]) == (0, 2)
    assert (await call("DELETE", "rebuild"))["dropped"]

    refused = await http.post(
        f"{base}/rebuild", headers={"Authorization": f"Bearer {tokens['member']}"}
    )
    assert (refused.status_code, refused.json()["code"]) == (403, "auth.operator_only")
    # the gateway routes the same paths to the notification service, for operators only
    [route] = [r for r in ROUTES if r.owner == "notification" and r.operator]
    assert route.path.format(name="queue_waits", action="swap") == f"{base}/swap"
    assert READ_MODELS["queue_waits"] == base


# --- rebuilds cut off half way resume from their shadow checkpoints --------------------


def two_pools() -> dict[str, Any]:
    """The scheduler's test pool and a second one like it (a rebuild goes pool by pool)."""
    [pool] = SCHEDULER_POOLS["pools"]
    return {"pools": [pool, {**pool, "id": "dev-b100", "nodes": {"prefix": "b-", "count": 1}}]}


async def submitted(
    store: PostgresEventStore, scheduler: SchedulerApp, task: str, pool: str
) -> None:
    spec = TaskSpec(
        name="t",
        pool=pool,
        worker_spec="8gpu",
        image="img",
        command="python train.py",
        resource_type="subscription",
    )
    new = decide(None, Submit(task, "t1", "alice", spec), now=NOW, ids=str)
    meta = Metadata(actor="user:t1/alice")
    await store.append(f"task-{task}", [NewEvent(e, meta, NOW) for e in new], 0)
    for recorded in await store.read_stream(f"task-{task}"):
        await scheduler.handle(recorded)


async def test_an_interrupted_scheduler_rebuild_resumes_pool_by_pool(
    dsn: str, tmp_path: Path
) -> None:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))  # the migrations
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        scheduler = SchedulerApp(store, parse_pools(two_pools()), clock=lambda: NOW)
        await scheduler.start()
        for task, pool in [("a1", "dev-a100"), ("a2", "dev-a100"), ("b1", "dev-b100")]:
            await submitted(store, scheduler, task, pool)
        await submitted(store, scheduler, "b2", "dev-b100")
        head = await store.head_position()

        first = await SchedulerRebuild(store).step(QUEUE_TABLE)
        assert (first["pools_done"], first["pools"], first["done"]) == (1, 2, False)
        assert first["folded"] == ["dev-a100"] and first["position"] == head
        assert progress(first) == "pools 1 of 2 (50%)"  # what the CLI prints on stderr
        async with store.pool.acquire() as conn:
            checkpoints = {p.name: p.position for p in await read_progress(conn)}
        assert checkpoints["shadow:scheduler_queue"] == head
        assert checkpoints["shadow:scheduler_pool_views"] == head
        shadow_pools = "SELECT pool_id FROM runyard_shadow.scheduler_pool_views__shadow"
        assert [r["pool_id"] for r in await store.pool.fetch(shadow_pools)] == ["dev-a100"]

        # cut off here: a new process goes on with the next pool, not from the start
        await submitted(store, scheduler, "a3", "dev-a100")  # after the rebuild's position
        resumed = await SchedulerRebuild(store).step(QUEUE_TABLE)
        assert (resumed["pools_done"], resumed["done"], resumed["folded"]) == (
            2,
            True,
            ["dev-b100"],
        )
        assert progress(resumed) == "pools 2 of 2 (100%)"
        # the diff folds, under the lock, only the pool that moved since (a3's)
        for name in (QUEUE_TABLE, POOL_VIEWS_TABLE):
            diff = await SchedulerRebuild(store).diff(name)
            [table] = diff["tables"]
            assert table["differences"] == 0, table
            assert diff["position"] == await store.head_position()
        assert diff["folded"] == []  # nothing moved after the first diff
        assert table["live_rows"] == 2
        waiting = "SELECT count(*) FROM runyard_shadow.scheduler_queue__shadow"
        assert await store.pool.fetchval(waiting) == 3  # a2, a3, b2 (a1, b1 run)
        restarted = await SchedulerRebuild(store).step(QUEUE_TABLE, restart=True)
        assert (restarted["pools_done"], restarted["done"]) == (1, False)
    finally:
        await store.close()
        await gateway.close()


async def test_an_interrupted_queue_waits_rebuild_resumes_from_its_checkpoint(
    dsn: str, tmp_path: Path
) -> None:
    async with harness(dsn, serve=False) as h:
        await queued_and_ran(h)
        head = await h.store.head_position()
        first = await QueueWaitsRebuild(h.app).step(3)
        assert (first["position"], first["target"], first["applied"]) == (3, head, 3)
        assert not first["done"]
        assert progress(first) == f"position 3 of {head} ({300 // head}%)"
        async with h.store.pool.acquire() as conn:
            checkpoints = {p.name: p.position for p in await read_progress(conn)}
        assert checkpoints["shadow:queue_waits"] == 3

        # cut off here: a new process goes on from position 3, in steps of 3
        steps = [first]
        while not steps[-1]["done"]:
            steps.append(await QueueWaitsRebuild(h.app).step(3))
        assert len(steps) == -(-head // 3)
        assert sum(s["applied"] for s in steps) == head
        assert [s["position"] for s in steps] == [min(3 * (n + 1), head) for n in range(len(steps))]
        diff = await QueueWaitsRebuild(h.app).diff()
        [table] = diff["tables"]
        assert (table["differences"], table["live_rows"], table["rebuilt_rows"]) == (0, 3, 3)

        # events after the rebuild's position are folded in under the lock
        await h.command("w2", Fail("w2", "ends the wait"))
        diff = await QueueWaitsRebuild(h.app).diff()
        [table] = diff["tables"]
        assert (table["differences"], table["live_rows"]) == (0, 2), table
        assert diff["position"] == await h.store.head_position()
        restarted = await QueueWaitsRebuild(h.app).step(2, restart=True)
        assert (restarted["position"], restarted["applied"]) == (2, 2)
        shadow = "SELECT count(*) FROM runyard_shadow.queue_waits__shadow"
        assert await h.store.pool.fetchval(shadow) <= 1
        assert (await QueueWaitsRebuild(h.app).discard())["dropped"]
