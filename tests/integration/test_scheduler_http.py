"""The scheduler's HTTP face on a real Postgres: the queue route and the gateway's client
of it, the instance's role in health answers, admin served by a standby."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.resources import PoolView
from runyard.contracts.spec import TaskSpec
from runyard.domain.task import Submit, decide
from runyard.eventstore import PostgresEventStore
from runyard.gateway.app import Gateway
from runyard.gateway.scheduler_client import queue_entries
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.config import parse_pools
from runyard.scheduler.http import MAX_QUEUE_TASKS, http_app
from runyard.scheduler.views import read_queue_entries
from runyard.submission.pools import pool_views

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
            "specs": [{"name": "8gpu", "gpus": 8, "cpus": 96, "memory_gib": 800}],
            "nodes": {"prefix": "a-", "count": 1},
        }
    ]
}
NOW = datetime(2026, 1, 1, tzinfo=UTC)
BASE = "http://scheduler"


@dataclass
class Face:
    store: PostgresEventStore
    scheduler: SchedulerApp
    http: httpx.AsyncClient
    tokens: dict[str, str]
    role: list[str]

    def auth(self, who: str) -> str:
        return f"Bearer {self.tokens[who]}"

    async def submit(self, task_id: str, tenant: str) -> None:
        task = TaskSpec(
            name="t",
            pool="dev-a100",
            worker_spec="8gpu",
            image="img",
            command="python train.py",
            resource_type="subscription",
        )
        new = decide(None, Submit(task_id, tenant, "alice", task), now=NOW, ids=str)
        meta = Metadata(actor=f"user:{tenant}/alice")
        await self.store.append(f"task-{task_id}", [NewEvent(e, meta, NOW) for e in new], 0)
        for recorded in await self.store.read_stream(f"task-{task_id}"):
            await self.scheduler.handle(recorded)


@pytest.fixture
async def face(dsn: str, tmp_path: Path) -> AsyncIterator[Face]:
    shutil.copy(REPO / "infra/config/catalogue.yaml", tmp_path / "catalogue.yaml")
    gateway = await Gateway.connect(dsn, tmp_path)  # its migrations hold the tokens
    tokens = {
        "t1": await create_token(gateway.db, "t1", "alice", "member"),
        "t2": await create_token(gateway.db, "t2", "bob", "member"),
        "root": await create_token(gateway.db, "t1", "root", "platform_admin"),
    }
    store = await PostgresEventStore.connect(dsn, default_mapper())
    scheduler = SchedulerApp(store, parse_pools(POOLS), clock=lambda: NOW)
    await scheduler.start()
    role = ["active"]
    app = http_app(store, role=lambda: role[0])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        yield Face(store, scheduler, http, tokens, role)
    await store.close()
    await gateway.close()


async def test_queue_route_answers_the_read_model_for_the_callers_tenant(face: Face) -> None:
    await face.submit("running", "t1")  # takes the only node
    await face.submit("mine", "t1")
    await face.submit("theirs", "t2")
    ids = ["running", "mine", "theirs", "nope"]
    stored = await read_queue_entries(face.store.pool, ids)
    assert set(stored) == {"mine", "theirs"}

    mine = await queue_entries(face.http, BASE, ids, authorization=face.auth("t1"))
    assert mine == {"mine": stored["mine"]}, "another tenant's task is absent, not an error"
    assert mine["mine"]["position"] == 0
    theirs = await queue_entries(face.http, BASE, ids, authorization=face.auth("t2"))
    assert theirs == {"theirs": stored["theirs"]}
    everyone = await queue_entries(face.http, BASE, ids, authorization=face.auth("root"))
    assert everyone == stored
    assert await queue_entries(face.http, BASE, [], authorization=face.auth("t1")) == {}


async def test_queue_route_refuses_without_a_token_and_past_its_bound(face: Face) -> None:
    answer = await face.http.get(BASE + "/v1/internal/queue", params={"task_id": "x"})
    assert answer.status_code == 401
    many = [("task_id", f"t{n}") for n in range(MAX_QUEUE_TASKS + 1)]
    answer = await face.http.get(
        BASE + "/v1/internal/queue", params=tuple(many), headers={"Authorization": face.auth("t1")}
    )
    assert (answer.status_code, answer.json()["field"]) == (400, "task_id")
    # the client asks in chunks under the bound; a refusal leaves places out
    ids = [f"t{n}" for n in range(MAX_QUEUE_TASKS + 1)]
    assert await queue_entries(face.http, BASE, ids, authorization=face.auth("t1")) == {}
    assert await queue_entries(face.http, BASE, ["x"], authorization="Bearer wrong") == {}


async def test_client_leaves_queue_places_out_while_the_scheduler_is_down() -> None:
    async with httpx.AsyncClient() as http:
        found = await queue_entries(http, "http://127.0.0.1:9", ["a"], authorization="Bearer x")
    assert found == {}


async def test_health_answers_say_the_role_and_a_standby_is_ready(face: Face) -> None:
    for role in ("active", "standby"):
        face.role[0] = role
        alive = await face.http.get(BASE + "/healthz")
        ready = await face.http.get(BASE + "/readyz")
        assert alive.status_code == ready.status_code == 200
        assert alive.json()["role"] == ready.json()["role"] == role
        assert ready.json()["ready"] is True
        assert alive.headers["content-type"] == "application/json"


async def test_a_standby_serves_admin_changes(face: Face) -> None:
    face.role[0] = "standby"
    answer = await face.http.post(
        BASE + "/v1/admin/pools/dev-a100/nodes/a-0/cordon",
        headers={"Authorization": face.auth("root")},
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["events"] == ["NodeCordoned"]
    last = (await face.store.read_stream("pool-dev-a100"))[-1]
    assert last.type == "NodeCordoned" and body["version"] == last.stream_version


async def test_the_submission_rules_read_the_pools_gpus_in_all_from_the_view(
    face: Face, tmp_path: Path
) -> None:
    """The rules refuse a task that needs more GPUs than its pool has: from the
    scheduler's view too, not only from the pools file it falls back on."""
    await face.submit("running", "t1")  # listings to leave out: a node and a holder
    no_file = tmp_path / "no-pools-file"
    no_file.mkdir()
    pools = await pool_views(face.store.pool, no_file)
    assert pools["dev-a100"] == PoolView(
        pool_id="dev-a100",
        zone="cn-north-1",
        resource_type="subscription",
        network="roce",
        specs={"8gpu": 8},
        total_gpus=8,
    )
    await face.store.pool.execute("DROP TABLE scheduler_pool_views CASCADE")
    assert await pool_views(face.store.pool, no_file) == {}  # no view, no file: none
