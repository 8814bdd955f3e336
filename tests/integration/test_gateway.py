"""The gateway's HTTP API against a real Postgres: rules, tenants, masking, reruns, groups."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.eventstore import apply_migrations
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.gateway.projection import all_rows
from runyard.stack.serve import service_migrations

REPO = Path(__file__).resolve().parents[2]
POOLS_YAML = """
pools:
  - {id: pool-a, zone: cn-north-1, resource_type: subscription, network: roce, nodes: 4,
     specs: {1gpu: 1, 4gpu: 4, 8gpu: 8}}
  - {id: pool-east, zone: cn-east-1, resource_type: subscription, network: ib, nodes: 2,
     specs: {8gpu: 8}}
  - {id: pool-spot, zone: cn-north-1, resource_type: spot, network: ethernet, nodes: 2,
     specs: {8gpu: 8}}
"""
BASE = {
    "name": "hello",
    "pool": "pool-a",
    "worker_spec": "1gpu",
    "image": "pytorch:2.3-cuda12",
    "command": "echo hello",
    "tags": ["demo"],
}


def config_dir(tmp_path: Path) -> Path:
    """A config folder with the repo's catalogue and a test pools.yaml."""
    folder = tmp_path / "config"
    folder.mkdir()
    shutil.copy(REPO / "infra/config/catalogue.yaml", folder / "catalogue.yaml")
    (folder / "pools.yaml").write_text(POOLS_YAML)
    return folder


@dataclass
class Api:
    """An HTTP client per user, over one in-process gateway."""

    gateway: Gateway
    http: httpx.AsyncClient
    tokens: dict[str, str]

    async def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}", **kw.pop("headers", {})}
        return await self.http.request(method, path, headers=headers, **kw)

    async def submit(
        self, who: str = "alice", headers: dict[str, str] | None = None, **changes: Any
    ) -> httpx.Response:
        body = {**BASE, **changes}
        return await self.call(who, "POST", "/v1/tasks", json=body, headers=headers or {})

    async def event_count(self) -> int:
        return int(await self.gateway.db.fetchval("SELECT count(*) FROM events"))


@pytest.fixture
async def api(dsn: str, tmp_path: Path) -> AsyncIterator[Api]:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "bob": await create_token(gateway.db, "t1", "bob", "member"),
        "carol": await create_token(gateway.db, "t2", "carol", "member"),
        "admin": await create_token(gateway.db, "t1", "root", "platform_admin"),
    }
    # The log routes are the log service's: it answers them beside the gateway.
    from tests.integration.test_gateway_routing import log_service

    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    transport = httpx.ASGITransport(app=app)
    async with (
        log_service(dsn, tmp_path / "exports", endpoints),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        yield Api(gateway, client, tokens)
    await app.state.owners.aclose()
    await gateway.close()


# (changes to the base spec, expected code, expected field)
REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    ({"pool": "nope"}, "pool.not_found", "pool"),
    ({"resource_type": "spot"}, "pool.resource_type_mismatch", "resource_type"),
    ({"spot": {}}, "spot.options_not_spot", "spot"),
    ({"worker_spec": None}, "spec.missing", "worker_spec"),
    ({"worker_spec": "3gpu"}, "spec.unknown", "worker_spec"),
    (
        {"worker_spec": "8gpu", "worker_count": 5, "framework": "pytorch_ddp"},
        "workers.exceed_pool",
        "worker_count",
    ),
    ({"worker_count": 2}, "framework.single_worker", "worker_count"),
    ({"rdma": True}, "rdma.not_allowed", "rdma"),
    ({"image": "nope:1"}, "image.not_found", "image"),
    ({"image": "notebook:latest"}, "image.service_missing", "image"),
    ({"pool": "pool-east", "worker_spec": "8gpu"}, "image.wrong_zone", "image"),
    ({"env": "oops"}, "env.malformed_pair", "env"),
    ({"env": "1A=x"}, "env.invalid_name", "env"),
    ({"env": "A=1;A=2"}, "env.duplicate", "env"),
    ({"env": "A=1", "creator_only": ["B"]}, "env.creator_only_unknown", "env"),
    (
        {"framework": "pytorch_ddp", "worker_count": 2, "env": "RANK=1"},
        "env.reserved_name",
        "env[0].name",
    ),
    (
        {"mounts": [{"file_system": "fs-main", "volume": "nope", "mount_path": "/mnt/x"}]},
        "volume.not_found",
        "mounts[0]",
    ),
    (
        {"mounts": [{"file_system": "fs-east", "volume": "datasets", "mount_path": "/mnt/x"}]},
        "volume.wrong_zone",
        "mounts[0]",
    ),
    (
        {"mounts": [{"file_system": "fs-main", "volume": "datasets", "mount_path": "mnt"}]},
        "mount.invalid_path",
        "mounts[0].mount_path",
    ),
    (
        {"mounts": [{"file_system": "fs-main", "volume": "datasets", "mount_path": "/etc/x"}]},
        "mount.reserved_path",
        "mounts[0].mount_path",
    ),
    (
        {
            "mounts": [
                {"file_system": "fs-main", "volume": "datasets", "mount_path": "/mnt/d"},
                {"file_system": "fs-main", "volume": "checkpoints", "mount_path": "/mnt/d"},
            ]
        },
        "mount.path_overlap",
        "mounts[1].mount_path",
    ),
    (
        {"pool": "pool-east", "worker_spec": "8gpu", "image": "bash-only", "public_data": True},
        "public_data.unavailable",
        "public_data",
    ),
    ({"name": "   "}, "name.blank", "name"),
    (
        {"fault_tolerance": {"resume_pattern": "("}},
        "fault_tolerance.invalid_pattern",
        "fault_tolerance.resume_pattern",
    ),
    ({"alerts": [{"webhook_url": "ftp://x"}]}, "alert.invalid_webhook", "alerts[0].webhook_url"),
    ({"colour": "red"}, "spec.unknown_field", "colour"),
    ({"worker_count": 0}, "spec.invalid", "worker_count"),
]


async def test_every_refusal_has_code_field_hint_and_writes_no_event(api: Api) -> None:
    for changes, code, field in REFUSALS:
        answer = await api.submit(**changes)
        body = answer.json()
        assert answer.status_code == 400, (changes, body)
        assert (body["code"], body["field"]) == (code, field), (changes, body)
        assert body["hint"] and body["message"], body
    assert await api.event_count() == 0


async def test_wrong_zone_hint_names_the_zone(api: Api) -> None:
    answer = await api.submit(pool="pool-east", worker_spec="8gpu")
    assert "cn-east-1" in answer.json()["hint"]


async def test_submit_get_and_timeline_with_actor_and_correlation(api: Api) -> None:
    answer = await api.submit(
        command="python train.py | tee log.txt", headers={"X-Request-Id": "req-42"}
    )
    assert answer.status_code == 201, answer.json()
    task = answer.json()
    assert task["status"] == "new" and task["creator"] == "alice"
    assert any(w["code"] == "command.pipe_without_pipefail" for w in task["warnings"])
    events = (await api.call("alice", "GET", f"/v1/tasks/{task['task_id']}/events")).json()
    assert [e["type"] for e in events] == ["TaskSubmitted"]
    assert events[0]["actor"] == "user:t1/alice"
    assert events[0]["correlation_id"] == "req-42"
    assert events[0]["data"]["warnings"][0]["code"] == "command.pipe_without_pipefail"


async def test_auth_401_and_403(api: Api) -> None:
    assert (await api.http.get("/v1/tasks")).status_code == 401
    bad = await api.http.get("/v1/tasks", headers={"Authorization": "Bearer nope"})
    assert (bad.status_code, bad.json()["code"]) == (401, "auth.invalid_token")
    image = {"name": "new:1", "zones": ["cn-north-1"], "services": ["training"]}
    denied = await api.call("alice", "POST", "/v1/admin/images", json=image)
    assert (denied.status_code, denied.json()["code"]) == (403, "auth.platform_admin_only")
    assert (await api.call("admin", "POST", "/v1/admin/images", json=image)).status_code == 201
    assert (await api.submit(image="new:1")).status_code == 201


async def test_tenant_never_sees_another_tenants_task(api: Api) -> None:
    task_id = (await api.submit()).json()["task_id"]
    for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/stop"), ("POST", "/clone")]:
        answer = await api.call("carol", method, f"/v1/tasks/{task_id}{path}")
        assert (answer.status_code, answer.json()["code"]) == (404, "task_not_found"), path
    listed = (await api.call("carol", "GET", "/v1/tasks")).json()
    assert listed["items"] == []
    assert (await api.call("bob", "GET", "/v1/tasks")).json()["items"][0]["task_id"] == task_id


async def test_creator_only_values_masked_for_others_and_not_stored_in_clear(api: Api) -> None:
    answer = await api.submit(env="API_KEY=s3cret;MODE=fast", creator_only=["API_KEY"])
    task_id = answer.json()["task_id"]
    mine = (await api.call("alice", "GET", f"/v1/tasks/{task_id}")).json()
    theirs = (await api.call("bob", "GET", f"/v1/tasks/{task_id}")).json()
    assert mine["spec"]["env"][0]["value"] == "s3cret"
    assert theirs["spec"]["env"][0] == {
        "name": "API_KEY",
        "value": "******",
        "creator_only": True,
        "secret_ref": None,
    }
    assert theirs["spec"]["env"][1]["value"] == "fast"
    events = await api.call("bob", "GET", f"/v1/tasks/{task_id}/events")
    assert "s3cret" not in events.text
    stored = await api.gateway.db.fetchval("SELECT string_agg(data::text, '') FROM events")
    assert "s3cret" not in stored
    # a clone by someone else does not copy the value: it must be given again
    clone = await api.call("bob", "POST", f"/v1/tasks/{task_id}/clone", json={})
    assert (clone.status_code, clone.json()["code"]) == (400, "env.missing_value")


async def test_stop_then_rerun_with_allowed_changes_only(api: Api) -> None:
    task_id = (await api.submit()).json()["task_id"]
    early = await api.call("alice", "POST", f"/v1/tasks/{task_id}/rerun", json={})
    assert (early.status_code, early.json()["code"]) == (409, "invalid_transition")
    stopped = (await api.call("alice", "POST", f"/v1/tasks/{task_id}/stop")).json()
    assert stopped["status"] == "stopped"
    again = await api.call("alice", "POST", f"/v1/tasks/{task_id}/stop")
    assert again.status_code == 409
    before = await api.event_count()
    for changes, code, field in [
        ({"pool": "pool-east"}, "rerun.field_not_changeable", "pool"),
        ({"env": "A=1"}, "rerun.field_not_changeable", "env"),
        ({"image": "nope:1"}, "image.not_found", "image"),
        ({"worker_count": 2}, "framework.single_worker", "worker_count"),
    ]:
        answer = await api.call("alice", "POST", f"/v1/tasks/{task_id}/rerun", json=changes)
        assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
            400,
            code,
            field,
        ), answer.json()
    assert await api.event_count() == before
    rerun = await api.call(
        "alice",
        "POST",
        f"/v1/tasks/{task_id}/rerun",
        json={"command": "echo again", "worker_spec": "4gpu"},
    )
    assert rerun.status_code == 200, rerun.json()
    assert (rerun.json()["run"], rerun.json()["status"]) == (2, "new")
    assert rerun.json()["spec"]["command"] == "echo again"


async def test_rerun_pool_change_hint_says_clone(api: Api) -> None:
    task_id = (await api.submit()).json()["task_id"]
    await api.call("alice", "POST", f"/v1/tasks/{task_id}/stop")
    answer = await api.call("alice", "POST", f"/v1/tasks/{task_id}/rerun", json={"pool": "x"})
    assert answer.json()["hint"] == "use clone to change the pool"


async def test_clone_to_another_pool(api: Api) -> None:
    source = (await api.submit()).json()["task_id"]
    clone = await api.call(
        "bob",
        "POST",
        f"/v1/tasks/{source}/clone",
        json={"pool": "pool-east", "worker_spec": "8gpu", "image": "bash-only", "name": "moved"},
    )
    assert clone.status_code == 201, clone.json()
    body = clone.json()
    assert (body["cloned_from"], body["creator"], body["spec"]["pool"]) == (
        source,
        "bob",
        "pool-east",
    )
    assert (await api.call("alice", "GET", f"/v1/tasks/{source}")).json()["clones"] == [
        body["task_id"]
    ]
    refused = await api.call("bob", "POST", f"/v1/tasks/{source}/clone", json={"pool": "nope"})
    assert refused.json()["code"] == "pool.not_found"


async def test_groups_create_all_or_none_and_stop(api: Api) -> None:
    items = [{"name": "a"}, {"name": "b", "command": "echo b"}, {"image": "nope:1"}]
    refused = await api.call("alice", "POST", "/v1/groups", json={"template": BASE, "items": items})
    body = refused.json()
    assert (refused.status_code, body["code"], body["field"], body["item"]) == (
        400,
        "image.not_found",
        "items[2].image",
        2,
    )
    assert await api.event_count() == 0
    empty = await api.call("alice", "POST", "/v1/groups", json={"template": BASE, "items": []})
    assert empty.json()["code"] == "group.empty"
    made = await api.call(
        "alice", "POST", "/v1/groups", json={"template": BASE, "items": items[:2]}
    )
    assert made.status_code == 201, made.json()
    group = made.json()
    assert sorted(t["name"] for t in group["tasks"]) == ["a", "b"]
    assert group["status_counts"] == {"new": 2}
    stopped = await api.call("alice", "POST", f"/v1/groups/{group['group_id']}/stop")
    assert stopped.json()["status_counts"] == {"stopped": 2}
    hidden = await api.call("carol", "GET", f"/v1/groups/{group['group_id']}")
    assert hidden.status_code == 404


async def test_list_filters_and_pagination(api: Api) -> None:
    for i in range(5):
        await api.submit(name=f"job-{i}", tags=["even" if i % 2 == 0 else "odd"])
    await api.submit("bob", name="bobs")
    page = (await api.call("alice", "GET", "/v1/tasks?limit=2")).json()
    seen = [t["name"] for t in page["items"]]
    while page["next_cursor"]:
        page = (
            await api.call("alice", "GET", f"/v1/tasks?limit=2&cursor={page['next_cursor']}")
        ).json()
        seen += [t["name"] for t in page["items"]]
    assert seen == ["bobs", "job-4", "job-3", "job-2", "job-1", "job-0"]
    odd = (await api.call("alice", "GET", "/v1/tasks?tag=odd")).json()["items"]
    assert sorted(t["name"] for t in odd) == ["job-1", "job-3"]
    assert {(t["workers"], t["restarts"]) for t in odd} == {(1, 0)}  # the console's columns
    mine = (await api.call("alice", "GET", "/v1/tasks?creator=bob")).json()["items"]
    assert [t["name"] for t in mine] == ["bobs"]
    named = (await api.call("alice", "GET", "/v1/tasks?name=job-2&status=new")).json()
    assert [t["name"] for t in named["items"]] == ["job-2"]
    await api.submit(name="Loss_100%")
    # "Name contains" takes the text as it is: % and _ are not wildcards; any case.
    for text, names in [("%", ["Loss_100%"]), ("_", ["Loss_100%"]), ("LOSS", ["Loss_100%"])]:
        found = (await api.call("alice", "GET", "/v1/tasks", params={"name": text})).json()
        assert [t["name"] for t in found["items"]] == names, text
    assert (await api.call("alice", "GET", "/v1/tasks?name=b_bs")).json()["items"] == []
    bad = await api.call("alice", "GET", "/v1/tasks?cursor=zzz")
    assert (bad.status_code, bad.json()["field"]) == (400, "cursor")


async def test_projection_rebuild_equals_live(api: Api) -> None:
    first = (await api.submit(name="one")).json()["task_id"]
    await api.call("alice", "GET", "/v1/tasks")  # live projection catches up here
    await api.call("alice", "POST", f"/v1/tasks/{first}/stop")
    await api.call("alice", "POST", f"/v1/tasks/{first}/rerun", json={"command": "echo 2"})
    await api.submit(name="two", tags=["x"])
    await api.call("alice", "POST", f"/v1/tasks/{first}/clone", json={})
    await api.gateway.projector.catch_up()
    live = await all_rows(api.gateway.db)
    assert await api.gateway.projector.catch_up() == 0  # nothing left: idempotent
    await api.gateway.projector.rebuild()
    assert await all_rows(api.gateway.db) == live
    assert {r["run"] for r in live if r["task_id"] == first} == {2}


async def test_watch_streams_events_until_the_task_ends(api: Api) -> None:
    task_id = (await api.submit()).json()["task_id"]
    await api.call("alice", "POST", f"/v1/tasks/{task_id}/stop")
    answer = await api.call("alice", "GET", f"/v1/tasks/{task_id}/watch")
    assert answer.headers["content-type"].startswith("text/event-stream")
    types = [
        line.removeprefix("event: ")
        for line in answer.text.splitlines()
        if line.startswith("event: ")
    ]
    assert types == ["TaskSubmitted", "TaskStopRequested", "TaskStopped", "end"]
    data = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    assert data[0]["actor"] == "user:t1/alice"


async def test_pools_capacity_and_openapi(api: Api) -> None:
    pools = (await api.call("alice", "GET", "/v1/pools")).json()
    assert {p["pool_id"] for p in pools} == {"pool-a", "pool-east", "pool-spot"}
    capacity = (await api.call("alice", "GET", "/v1/pools/pool-a/capacity")).json()
    assert capacity["launchable"] == {"1gpu": 32, "4gpu": 8, "8gpu": 4}
    assert capacity["custom_gpus_max"] == 32
    missing = await api.call("alice", "GET", "/v1/pools/nope/capacity")
    assert (missing.status_code, missing.json()["code"]) == (404, "pool.not_found")
    spec = (await api.http.get("/openapi.json")).json()
    assert "/v1/tasks/{task_id}/rerun" in spec["paths"]


async def test_pools_are_listed_by_id_whatever_order_the_scheduler_stored_them(
    api: Api,
) -> None:
    """The scheduler rewrites a pool's view row on every change: the list (the CLI's
    `runyard pools`, the console's pages and submit form) keeps one order, by id."""
    async with api.gateway.db.acquire() as conn:
        await apply_migrations(conn, service_migrations("scheduler"))
    for pool_id, zone in (("pool-b", "cn-north-1"), ("pool-a", "cn-east-1")):
        view = {"zone": zone, "resource_type": "subscription", "nodes": 1, "specs": {"8gpu": 8}}
        await api.gateway.db.execute(
            "INSERT INTO scheduler_pool_views (pool_id, version, view) VALUES ($1, 1, $2)",
            pool_id,
            json.dumps(view),
        )
    answer = await api.call("alice", "GET", "/v1/pools")
    assert [p["pool_id"] for p in answer.json()] == ["pool-a", "pool-b"], answer.text


async def test_a_path_no_route_takes_is_named_and_an_empty_id_said_so(api: Api) -> None:
    """`POST /v1/tasks//stop` (a script's empty id) is refused naming the request and the
    empty part, as gRPC refuses an empty `task_id`; not a bare `Not Found`."""
    empty = await api.call("alice", "POST", "/v1/tasks//stop")
    assert (empty.status_code, empty.json()["code"]) == (404, "route.not_found")
    assert empty.json()["message"] == "no route takes POST /v1/tasks//stop"
    assert "a part of the path is empty" in empty.json()["hint"]
    typo = await api.call("alice", "GET", "/v1/taks")
    assert typo.json()["message"] == "no route takes GET /v1/taks"
    assert typo.json()["hint"] == "see /openapi.json for the routes"
