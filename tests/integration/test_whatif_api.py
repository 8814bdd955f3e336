"""What-if scheduling over HTTP on a real Postgres (the scheduler's route, routed by the
gateway): who may ask, what it reads, and the refusals that name the bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.gateway import grpc_convert as convert
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.proxy import ROUTES, Owners
from runyard.scheduler.http import http_app

from tests.integration.test_scheduler_http import NOW, Face, face  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

URL = "http://scheduler/v1/pools/whatif"
WINDOW = {"from": NOW.isoformat(), "to": (NOW + timedelta(hours=1)).isoformat()}


async def ask(face: Face, who: str, body: dict[str, Any]) -> httpx.Response:  # noqa: F811
    return await face.http.post(URL, json=body, headers={"Authorization": face.auth(who)})


async def test_whatif_replays_the_window_for_sres_and_changes_nothing(
    face: Face,  # noqa: F811  (the fixture)
) -> None:
    assert any(r.path == "/v1/pools/whatif" and r.owner == "scheduler" for r in ROUTES)
    face.tokens["sre"] = await create_token(face.store.pool, "ops", "sam", "sre")
    await face.submit("running", "t1")  # takes the only node
    await face.submit("waiting", "t2")
    head = await face.store.head_position()

    same = await ask(face, "sre", WINDOW)
    assert same.status_code == 200, same.text
    (pool,) = same.json()["pools"]
    assert pool["nodes"] == {"real": 1, "simulated": 1}
    assert [r["task_id"] for r in same.json()["runs"]] == ["waiting"]
    assert pool["real"]["waiting_at_end"] == pool["simulated"]["waiting_at_end"] == 1
    assert pool["real"]["utilisation"] == pool["simulated"]["utilisation"] == 1.0

    two = {**WINDOW, "pools": [{"id": "dev-a100", "nodes": ["a", "b"]}]}
    bigger = await ask(face, "root", two)
    assert bigger.status_code == 200, bigger.text
    (pool,) = bigger.json()["pools"]
    assert pool["nodes"] == {"real": 1, "simulated": 2}
    assert pool["simulated"]["placed"] == 1 and pool["simulated"]["max_s"] == 0.0
    assert pool["simulated"]["utilisation"] == 1.0  # both run the whole hour on 2 nodes
    assert await face.store.head_position() == head, "a what-if appends nothing"


async def test_whatif_refusals_name_the_role_and_the_bound(
    face: Face,  # noqa: F811  (the fixture)
) -> None:
    face.tokens["sre"] = await create_token(face.store.pool, "ops", "sam", "sre")
    member = await ask(face, "t1", WINDOW)
    assert (member.status_code, member.json()["code"]) == (403, "auth.sre_only")
    anonymous = await face.http.post(URL, json=WINDOW)
    assert anonymous.status_code == 401
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"to": (NOW + timedelta(days=8)).isoformat()}, 400, "whatif.window_too_long", "to"),
        ({"from": "12"}, 400, "whatif.bad_time", "from"),
        # a window that ends tomorrow: the runs going on now would hold their GPUs till then
        (
            {
                "from": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
                "to": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
            },
            400,
            "whatif.future_window",
            "to",
        ),
        ({"pools": []}, 400, "whatif.bad_pools", "pools"),
        (
            {"pools": [{"id": "dev-a100", "nodes": {"count": 10_001}}]},
            400,
            "whatif.too_many_nodes",
            "pools",
        ),
        ({"pool": "nope"}, 404, "whatif.unknown_pool", "pool"),
        ({"pools": [{"id": "nope", "nodes": ["a"]}]}, 404, "whatif.unknown_pool", "pools"),
    ]
    for change, status, code, field in cases:
        answer = await ask(face, "sre", {**WINDOW, **change})
        body = answer.json()
        assert (answer.status_code, body["code"], body["field"]) == (status, code, field), body
        assert body["hint"]
    policy = await ask(face, "sre", {**WINDOW, "policy": "random"})
    assert policy.status_code == 400
    # a window that starts before the pools existed: the answer says when they did
    early = await ask(face, "sre", {**WINDOW, "from": (NOW - timedelta(hours=1)).isoformat()})
    body = early.json()
    assert (early.status_code, body["code"]) == (404, "whatif.unknown_pool"), body
    assert "was registered at " in body["message"], body
    registered = body["message"].split("was registered at ", 1)[1].split(",", 1)[0]
    assert body["hint"] == f"start the window at or after {registered}"
    assert datetime.fromisoformat(registered) <= NOW + timedelta(minutes=1)


async def test_grpc_whatif_asks_the_scheduler_with_the_callers_token(
    face: Face,  # noqa: F811  (the fixture)
    dsn: str,
    tmp_path: Path,
) -> None:
    sre = await create_token(face.store.pool, "ops", "sam", "sre")
    await face.submit("running", "t1")
    await face.submit("waiting", "t2")
    transport = httpx.ASGITransport(app=http_app(face.store, role=lambda: "active"))
    owners = Owners({"scheduler": "http://scheduler"}, transport=transport)
    gateway = await Gateway.connect(dsn, tmp_path)
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=owners)
    pool = pb.WhatIfPool(pool_id="dev-a100", node_names=pb.NodeNames(names=["a", "b"]))
    request = pb.WhatIfRequest(
        start_time=convert.timestamp(WINDOW["from"]),
        end_time=convert.timestamp(WINDOW["to"]),
        pools=[pool],
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TasksStub(channel)
            reply = await stub.WhatIf(request, metadata=(("authorization", f"Bearer {sre}"),))
            (report,) = reply.pools
            assert (report.nodes.real, report.nodes.simulated) == (1, 2)
            assert report.simulated.max_s == 0.0
            assert convert.iso(reply.start_time) == WINDOW["from"]
            face.tokens["sre"] = sre
            body = {**WINDOW, "pools": [{"id": "dev-a100", "nodes": ["a", "b"]}]}
            over_http = await ask(face, "sre", body)
            assert convert.to_dict(reply) == over_http.json()
            assert [r.task_id for r in reply.runs] == [
                r["task_id"] for r in over_http.json()["runs"]
            ]
            nodes = pb.NodeRange(prefix="sim-", count=3, gpus=8)
            ranged = pb.WhatIfRequest(
                start_time=request.start_time,
                end_time=request.end_time,
                pools=[pb.WhatIfPool(pool_id="dev-a100", node_range=nodes)],
                policy="fifo",
            )
            reply = await stub.WhatIf(ranged, metadata=(("authorization", f"Bearer {sre}"),))
            assert (reply.policy, reply.pools[0].nodes.simulated) == ("fifo", 3)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                member = (("authorization", f"Bearer {face.tokens['t1']}"),)
                await stub.WhatIf(request, metadata=member)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await server.stop(grace=None)
        await owners.aclose()
        await gateway.close()
