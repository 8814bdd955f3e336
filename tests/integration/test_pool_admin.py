"""Pool admin through the scheduler's HTTP face and the CLI, on a real Postgres.

The scheduler's admin routes make node admin decisions over the pool stream
(`runyard.scheduler.admin`), appending with the stream's expected version, so
any instance serves them. The tests hand the events appended to an in-process
`SchedulerApp.handle`, as the scheduler's Kafka consumer would, and check what
the scheduler then does; capacity is read through the gateway's API.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from runyard.api.auth import create_token
from runyard.cli.main import app as cli_app
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.pool_events import NodeCordoned, NodeMarkedFaulty, SpotCapacityChanged
from runyard.contracts.spec import SpotOptions, TaskSpec
from runyard.contracts.task_events import (
    ResourcesReleased,
    TaskPlaced,
    TaskPreempted,
    TaskQueued,
    TaskRequeued,
)
from runyard.domain.task import Submit, decide, fold
from runyard.eventstore import EVENT_COLUMNS, PostgresEventStore
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.config import parse_pools
from runyard.scheduler.domain import fold_pool
from runyard.scheduler.http import http_app
from runyard.scheduler.views import read_pool_view
from runyard.stack.ports import free_port
from typer.testing import CliRunner, Result

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
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
        },
        {
            "id": "dev-spot",
            "zone": "cn-north-1",
            "resource_type": "spot",
            "gpu_model": "A100",
            "network": "ethernet",
            "specs": [{"name": "8gpu", "gpus": 8, "cpus": 96, "memory_gib": 800}],
            "nodes": {"prefix": "s-", "count": 2},
        },
    ]
}
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def spec(worker_spec: str = "8gpu", count: int = 1, pool: str = "dev-a100", **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool=pool,
        worker_spec=worker_spec,
        worker_count=count,
        image="img",
        command="python train.py",
        resource_type="spot" if pool == "dev-spot" else "subscription",
        **kw,
    )


@dataclass
class Env:
    """One store, an in-process scheduler, its HTTP face (`http`) and the gateway's API
    (`gw`) over the same database."""

    store: PostgresEventStore
    scheduler: SchedulerApp
    gateway: Gateway
    http: httpx.AsyncClient
    gw: httpx.AsyncClient
    tokens: dict[str, str]
    #: Global position up to which events were handed to the scheduler.
    delivered: int = 0

    async def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}", **kw.pop("headers", {})}
        return await self.http.request(method, path, headers=headers, **kw)

    async def events(self, stream: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(stream)

    async def types(self, task_id: str) -> list[str]:
        return [e.type for e in await self.events(f"task-{task_id}")]

    async def submit(self, task_id: str, task_spec: TaskSpec) -> None:
        """The submission service accepts a task; the scheduler sees it."""
        new = decide(None, Submit(task_id, "t1", "alice", task_spec), now=NOW, ids=lambda: "x")
        meta = Metadata(actor="user:t1/alice")
        await self.store.append(f"task-{task_id}", [NewEvent(e, meta, NOW) for e in new], 0)
        await self.deliver()

    async def deliver(self) -> None:
        """Hand every event appended since the last delivery to the scheduler, in order."""
        while True:
            rows = await self.store.pool.fetch(
                f"SELECT {EVENT_COLUMNS}"
                " FROM events WHERE global_position > $1 ORDER BY global_position",
                self.delivered,
            )
            if not rows:
                return
            for row in rows:
                recorded = self.store.decode(row)
                await self.scheduler.handle(recorded)
                self.delivered = recorded.global_position

    async def pool(self, pool_id: str = "dev-a100") -> Any:
        return fold_pool(e.event for e in await self.events(f"pool-{pool_id}"))

    async def capacity(self, pool_id: str = "dev-a100") -> dict[str, Any]:
        auth = {"Authorization": f"Bearer {self.tokens['alice']}"}
        answer = await self.gw.get(f"/v1/pools/{pool_id}/capacity", headers=auth)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


@pytest.fixture
async def env(dsn: str, tmp_path: Path) -> AsyncIterator[Env]:
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(REPO / "infra/config/catalogue.yaml", config / "catalogue.yaml")
    store = await PostgresEventStore.connect(dsn, default_mapper())
    scheduler = SchedulerApp(store, parse_pools(POOLS), clock=lambda: NOW)
    await scheduler.start()
    gateway = await Gateway.connect(dsn, config)
    tokens = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "root": await create_token(gateway.db, "t1", "root", "admin"),
    }
    face = httpx.ASGITransport(app=http_app(store, role=lambda: "active"))
    edge = httpx.ASGITransport(app=create_app(gateway))
    async with (
        httpx.AsyncClient(transport=face, base_url="http://scheduler") as client,
        httpx.AsyncClient(transport=edge, base_url="http://gw") as gw,
    ):
        env = Env(store, scheduler, gateway, client, gw, tokens)
        env.delivered = int(await store.pool.fetchval("SELECT max(global_position) FROM events"))
        yield env
    await gateway.close()
    await store.close()


async def test_fault_on_a_running_node_reaches_the_pool_stream_and_the_capacity_view(
    env: Env,
) -> None:
    await env.submit("job", spec("1gpu"))
    assert (await env.types("job"))[-1] == "TaskPlaced"
    node = (await env.pool()).allocations["job"].workers[0].node
    before = await env.capacity()
    assert (before["schedulable_nodes"], before["free_gpus"]) == (4, 31)

    answer = await env.call(
        "root",
        "POST",
        f"/v1/admin/pools/dev-a100/nodes/{node}/fault",
        json={"reason": "GPU 3 fell off the bus"},
        headers={"X-Request-Id": "req-fault-1"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["events"] == ["NodeMarkedFaulty"]
    last = (await env.events("pool-dev-a100"))[-1]
    assert isinstance(last.event, NodeMarkedFaulty)
    assert (last.event.node, last.event.reason) == (node, "GPU 3 fell off the bus")
    assert last.metadata.actor == "user:t1/root"
    assert last.metadata.correlation_id == "req-fault-1"
    assert answer.json()["version"] == last.stream_version
    assert (await env.capacity())["free_gpus"] == 31, "the admin route does not write the view"

    await env.deliver()  # the scheduler consumes NodeMarkedFaulty and re-plans
    after = await env.capacity()
    assert after["schedulable_nodes"] == 3
    assert after["free_gpus"] == 24 and after["launchable"]["1"] == 24
    view = await read_pool_view(env.store.pool, "dev-a100")
    assert view is not None
    listed = {n["node"]: n for n in view["nodes"]["items"]}
    assert listed[node]["health"] == "faulty"
    assert listed[node]["fault"] == "GPU 3 fell off the bus"
    assert "job" in (await env.pool()).allocations, "running workers stay until rescheduled"

    healed = await env.call("root", "POST", f"/v1/admin/pools/dev-a100/nodes/{node}/heal")
    assert healed.status_code == 200 and healed.json()["events"] == ["NodeMarkedHealthy"]
    await env.deliver()
    assert (await env.capacity())["free_gpus"] == 31


async def test_a_cordoned_node_takes_no_new_workers_until_uncordoned(env: Env) -> None:
    answer = await env.call("root", "POST", "/v1/admin/pools/dev-a100/nodes/a-0/cordon")
    assert answer.status_code == 200, answer.text
    assert isinstance((await env.events("pool-dev-a100"))[-1].event, NodeCordoned)
    await env.deliver()

    await env.submit("three", spec("8gpu", count=3))
    placed = (await env.events("task-three"))[-1].event
    assert isinstance(placed, TaskPlaced)
    assert "a-0" not in {w.node for w in placed.workers}
    await env.submit("small", spec("1gpu"))
    queued = (await env.events("task-small"))[-1].event
    assert isinstance(queued, TaskQueued), "only the cordoned node has free GPUs"
    assert (await env.capacity())["launchable"]["1"] == 0

    answer = await env.call("root", "POST", "/v1/admin/pools/dev-a100/nodes/a-0/uncordon")
    assert answer.status_code == 200, answer.text
    await env.deliver()
    placed = (await env.events("task-small"))[-1].event
    assert isinstance(placed, TaskPlaced) and placed.workers[0].node == "a-0"


async def test_spot_shrink_through_the_api_preempts_and_requeues(env: Env) -> None:
    limits = SpotOptions(max_requeues=3, max_queue_duration_s=3600)
    await env.submit("low", spec("8gpu", pool="dev-spot", priority=0, spot=limits))
    await env.submit("high", spec("8gpu", pool="dev-spot", priority=5, spot=limits))
    assert (await env.types("low"))[-1] == (await env.types("high"))[-1] == "TaskPlaced"
    low_node = (await env.pool("dev-spot")).allocations["low"].workers[0].node

    answer = await env.call(
        "root",
        "POST",
        "/v1/admin/pools/dev-spot/spot-capacity",
        json={"remove": 1, "reason": "provider reclaimed"},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["preempted"] == [{"task_id": "low", "outcome": "requeued", "nodes": [low_node]}]
    assert body["removed_nodes"] == [low_node]
    assert body["events"] == ["WorkersReleased", "SpotCapacityChanged"]
    events = [e.event for e in await env.events("task-low")]
    assert [type(e) for e in events[-3:]] == [TaskPreempted, TaskRequeued, ResourcesReleased]
    pool = await env.pool("dev-spot")
    assert set(pool.allocations) == {"high"} and low_node not in pool.nodes

    await env.deliver()  # the scheduler puts the requeued task back in its queue
    assert (await env.types("low"))[-1] == "TaskQueued"
    assert env.scheduler.view("dev-spot")["queue"]["waiting"] == 1

    grown = await env.call(
        "root", "POST", "/v1/admin/pools/dev-spot/spot-capacity", json={"add": ["s-new"]}
    )
    assert grown.status_code == 200, grown.text
    assert isinstance((await env.events("pool-dev-spot"))[-1].event, SpotCapacityChanged)
    await env.deliver()
    placed = (await env.events("task-low"))[-1].event
    assert isinstance(placed, TaskPlaced) and placed.workers[0].node == "s-new"
    assert fold(await env.events("task-low")).requeues == 1


ROUTES = [
    ("POST", "/v1/admin/pools/dev-a100/nodes", {"node": "a-9"}),
    ("DELETE", "/v1/admin/pools/dev-a100/nodes/a-0", None),
    ("POST", "/v1/admin/pools/dev-a100/nodes/a-0/cordon", None),
    ("POST", "/v1/admin/pools/dev-a100/nodes/a-0/uncordon", None),
    ("POST", "/v1/admin/pools/dev-a100/nodes/a-0/fault", {"reason": "x"}),
    ("POST", "/v1/admin/pools/dev-a100/nodes/a-0/heal", None),
    ("POST", "/v1/admin/pools/dev-spot/spot-capacity", {"remove": 1}),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_members_are_refused_and_nothing_is_written(
    env: Env, method: str, path: str, body: dict[str, Any] | None
) -> None:
    before = await env.store.head_position()
    answer = await env.call("alice", method, path, json=body)
    assert answer.status_code == 403, answer.text
    assert answer.json()["code"] == "auth.platform_admin_only"
    assert set(answer.json()) >= {"code", "field", "message", "hint"}
    unauthenticated = await env.http.request(method, path, json=body)
    assert unauthenticated.status_code == 401
    assert await env.store.head_position() == before


async def test_refusals_map_to_status_codes_with_hints(env: Env) -> None:
    async def refused(path: str, method: str = "POST", **kw: Any) -> tuple[int, dict[str, Any]]:
        answer = await env.call("root", method, path, **kw)
        return answer.status_code, answer.json()

    status, body = await refused("/v1/admin/pools/dev-a100/nodes/nope/cordon")
    assert (status, body["code"], body["field"]) == (404, "scheduler.node_unknown", "node")
    assert body["hint"]
    status, body = await refused("/v1/admin/pools/nope/nodes/a-0/cordon")
    assert (status, body["code"], body["field"]) == (404, "scheduler.pool_unknown", "pool_id")
    assert "dev-a100" in body["hint"], "the hint lists the known pools"
    status, body = await refused("/v1/admin/pools/dev-a100/nodes", json={"node": "a-1"})
    assert (status, body["code"]) == (409, "scheduler.node_exists")

    await env.submit("job", spec("8gpu"))
    busy = (await env.pool()).allocations["job"].workers[0].node
    status, body = await refused(f"/v1/admin/pools/dev-a100/nodes/{busy}", "DELETE")
    assert (status, body["code"], body["tasks"]) == (409, "scheduler.node_busy", ["job"])

    status, body = await refused("/v1/admin/pools/dev-a100/nodes/a-0/fault", json={})
    assert (status, body["code"], body["field"]) == (400, "request.invalid", "reason")
    status, body = await refused("/v1/admin/pools/dev-a100/nodes", json={"node": "x", "gpus": 9})
    assert (status, body["field"]) == (400, "gpus")
    spot = "/v1/admin/pools/dev-spot/spot-capacity"
    status, body = await refused(spot, json={"remove": 1, "add": ["s-9"]})
    assert (status, body["code"]) == (400, "request.invalid")
    status, body = await refused(spot, json={"remove": 5})
    assert (status, body["code"]) == (400, "spot.invalid_change")
    status, body = await refused("/v1/admin/pools/dev-a100/spot-capacity", json={"remove": 1})
    assert (status, body["code"]) == (400, "spot.not_spot_pool")
    status, body = await refused("/v1/admin/pools/a%00b/nodes/a-0/cordon")
    assert status == 400, "a NUL never reaches Postgres"
    status, body = await refused("/v1/admin/pools/dev-a100/nodes", json={"node": "x\u0000"})
    assert (status, body["field"]) == (400, "node")
    status, body = await refused(spot, json={"remove": 1, "reason": "\u0000"})
    assert (status, body["field"]) == (400, "reason")
    for name in ("a-1,a-2", "a-[1-2]", "has space", " a-9", "-a"):
        # Not a host name: Slurm would read several nodes in a node list of it.
        status, body = await refused("/v1/admin/pools/dev-a100/nodes", json={"node": name})
        assert (status, body["code"], body["field"]) == (400, "scheduler.admin_invalid", "node")
        assert "host name" in body["message"] and "letters, digits" in body["hint"]
    status, body = await refused(spot, json={"add": ["s-9", "s,10"]})
    assert (status, body["code"], body["field"]) == (400, "scheduler.admin_invalid", "add")
    assert len(await env.events("pool-dev-a100")) == 6, "PoolRegistered, 4 nodes, the job"

    added = await env.call("root", "POST", "/v1/admin/pools/dev-a100/nodes", json={"node": "a-9"})
    assert added.status_code == 201 and added.json()["events"] == ["NodeAdded"]
    removed = await env.call("root", "DELETE", "/v1/admin/pools/dev-a100/nodes/a-9")
    assert removed.status_code == 200 and removed.json()["events"] == ["NodeRemoved"]


async def test_an_admin_change_the_scheduler_has_not_seen_makes_its_placement_decide_again(
    env: Env,
) -> None:
    """The fault is appended while the scheduler holds an older pool version: its
    placement append conflicts, it reads the change and decides again."""
    answer = await env.call(
        "root", "POST", "/v1/admin/pools/dev-a100/nodes/a-0/fault", json={"reason": "ecc"}
    )
    assert answer.status_code == 200
    new = decide(None, Submit("gang", "t1", "alice", spec("8gpu", count=4)), now=NOW, ids=str)
    meta = Metadata(actor="user:t1/alice")
    await env.store.append("task-gang", [NewEvent(e, meta, NOW) for e in new], 0)
    for recorded in await env.events("task-gang"):  # the fault itself is not delivered
        await env.scheduler.handle(recorded)
    assert (await env.types("gang"))[-1] == "TaskQueued"
    pool = await env.pool()
    assert "gang" not in pool.allocations and pool.nodes["a-0"].health == "faulty"
    assert env.scheduler.view("dev-a100")["health"]["faulty"] == 1


# --- the CLI --------------------------------------------------------------------


async def cli(url: str, token: str, *args: str) -> Result:
    env = {"RUNYARD_URL": url, "RUNYARD_TOKEN": token, "COLUMNS": "250"}
    return await asyncio.to_thread(CliRunner().invoke, cli_app, list(args), env=env)


async def test_cli_admin_commands(env: Env) -> None:
    port = free_port()
    face = http_app(env.store, role=lambda: "active")
    config = uvicorn.Config(face, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.02)
        url, root, alice = f"http://127.0.0.1:{port}", env.tokens["root"], env.tokens["alice"]

        cordoned = await cli(url, root, "admin", "node", "cordon", "dev-a100", "a-1", "--json")
        assert cordoned.exit_code == 0, cordoned.output
        assert '"NodeCordoned"' in cordoned.output
        faulty = await cli(
            url, root, "admin", "node", "fault", "dev-a100", "a-2", "--reason", "xid"
        )
        assert faulty.exit_code == 0, faulty.output
        assert "node a-2 of pool dev-a100: NodeMarkedFaulty" in faulty.output
        assert (await env.pool()).nodes["a-2"].fault == "xid"

        unknown = await cli(url, root, "admin", "node", "heal", "dev-a100", "nope")
        assert unknown.exit_code == 1
        assert "scheduler.node_unknown" in unknown.output and "hint:" in unknown.output
        member = await cli(url, alice, "admin", "node", "uncordon", "dev-a100", "a-1")
        assert member.exit_code == 3 and "auth.platform_admin_only" in member.output

        await env.submit("low", spec("8gpu", pool="dev-spot"))
        shrunk = await cli(url, root, "admin", "spot", "dev-spot", "--remove", "2")
        assert shrunk.exit_code == 0, shrunk.output
        assert "low" in shrunk.output and "requeued" in shrunk.output
        grown = await cli(url, root, "admin", "spot", "dev-spot", "--add", "s-7,s-8", "--json")
        assert grown.exit_code == 0 and '"s-8"' in grown.output
        usage = await cli(url, root, "admin", "spot", "dev-spot")
        assert usage.exit_code == 2 and "--remove" in usage.output
    finally:
        server.should_exit = True
        await serving
