"""The causation view on a real Postgres with the real scheduler: `runyard trace`.

A submission (with its request id) is queued and placed by the scheduler; its
trace shows the placement and the pool allocation it caused as one tree with
the submission's request id. A node fault (an admin action through the
scheduler's admin code) and the reschedules it caused on two tenants' tasks
(written as fault tolerance writes them, `Metadata.caused_by`) form one chain
across three streams; a member sees the other tenant's reschedule redacted,
another tenant's task is a 404, and gRPC answers as HTTP does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from runyard.api.auth import create_token
from runyard.api.grpc_errors import error_of_rpc
from runyard.cli.trace import print_trace
from runyard.contracts import Metadata, NewEvent
from runyard.contracts.admin_events import TokenIssued
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import TaskRescheduleRequested
from runyard.domain.task import Submit, decide
from runyard.eventstore.trace import HIDDEN, MAX_TRACE_EVENTS
from runyard.gateway import grpc_convert as convert
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.scheduler import admin

from tests.integration.test_gateway import config_dir
from tests.integration.test_replay_api import Replay, served
from tests.integration.test_scheduler_http import NOW, Face, face  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class Traces(Replay):
    """The replay tests' served gateway, beside the scheduler of `face`."""

    face: Face

    async def submit(self, task_id: str, tenant: str, request_id: str) -> None:
        """As the submission service writes it: the request id is the chain's root."""
        spec = TaskSpec(
            name="t", pool="dev-a100", worker_spec="8gpu", image="img", command="python x.py"
        )
        new = decide(None, Submit(task_id, tenant, "alice", spec), now=NOW, ids=str)
        meta = Metadata(
            actor=f"user:{tenant}/alice",
            causation_id=request_id,
            correlation_id=request_id,
            trace_context={"traceparent": TRACEPARENT},
        )
        await self.face.store.append(f"task-{task_id}", [NewEvent(e, meta, NOW) for e in new], 0)
        for recorded in await self.face.store.read_stream(f"task-{task_id}"):
            await self.face.scheduler.handle(recorded)


@pytest.fixture
async def traces(face: Face, dsn: str, tmp_path: Path) -> AsyncIterator[Traces]:  # noqa: F811
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        **face.tokens,
        "sre": await create_token(gateway.db, "ops", "sam", "sre"),
    }
    try:
        async with served(gateway) as (http, stub):
            yield Traces(gateway, http, stub, tokens, face)
    finally:
        await gateway.close()


def by_type(tree: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {node["type"]: node for node in tree}


async def test_a_placement_and_the_allocation_it_caused_are_one_tree(traces: Traces) -> None:
    await traces.submit("mine", "t1", "submit-1")
    answer = await traces.get("t1", "/v1/tasks/mine/trace")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["correlation_ids"] == ["submit-1"]
    assert body["trace_ids"][0] == TRACEPARENT.split("-")[1]
    tree = body["tree"]
    nodes = by_type(tree)
    root = tree[0]
    assert (root["type"], root["depth"], root["causation_id"]) == ("TaskSubmitted", 0, "submit-1")
    placed, allocated = nodes["TaskPlaced"], nodes["WorkersAllocated"]
    assert allocated["stream_id"] == "pool-dev-a100" and placed["stream_id"] == "task-mine"
    assert placed["parent"] == allocated["parent"], "both caused by the same task event"
    assert {n["correlation_id"] for n in tree} == {"submit-1"}
    # parents come before children, each one level deeper
    seen = {None: -1}
    for node in tree:
        assert node["parent"] in seen and node["depth"] == seen[node["parent"]] + 1
        seen[node["event_id"]] = node["depth"]
    # the chain of any of its events is the same tree
    again = await traces.get("sre", f"/v1/events/{allocated['event_id']}/trace")
    assert again.json()["tree"] == tree
    # another tenant's task, an unknown task or event: 404 as for none
    for who, path in [
        ("t2", "/v1/tasks/mine/trace"),
        ("t2", f"/v1/events/{root['event_id']}/trace"),
        ("sre", "/v1/tasks/nope/trace"),
        ("sre", "/v1/events/not-a-uuid/trace"),
    ]:
        refused = await traces.get(who, path)
        assert refused.status_code == 404, (who, path)


async def test_a_node_fault_and_the_reschedules_it_caused_cross_tenants(traces: Traces) -> None:
    await traces.submit("mine", "t1", "submit-1")
    await traces.submit("theirs", "t2", "submit-2")
    store = traces.face.store
    await admin.mark_node_faulty(
        store, "dev-a100", "a-0", "GPU 3 fell off the bus", request_id="fault-1", now=NOW
    )
    fault = (await store.read_stream("pool-dev-a100"))[-1]
    assert fault.type == "NodeMarkedFaulty"
    meta = Metadata(actor="service:faulttolerance").caused_by(fault, "service:faulttolerance")
    for task_id in ("mine", "theirs"):
        version = await store.stream_version(f"task-{task_id}")
        event = TaskRescheduleRequested(run=1, attempt=1, reason="GPU fault", faulty_nodes=("a-0",))
        at = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
        await store.append(f"task-{task_id}", [NewEvent(event, meta, at)], version)

    sre = (await traces.get("sre", f"/v1/events/{fault.event_id}/trace")).json()
    assert sre["correlation_ids"] == ["fault-1"]
    [root] = [n for n in sre["tree"] if n["depth"] == 0]
    assert root["type"] == "NodeMarkedFaulty"
    children = [n for n in sre["tree"] if n["parent"] == str(fault.event_id)]
    assert sorted(n["stream_id"] for n in children) == ["task-mine", "task-theirs"]

    member = (await traces.get("t1", f"/v1/events/{fault.event_id}/trace")).json()
    shown = {n["stream_id"]: n for n in member["tree"]}
    assert shown["task-mine"]["redacted"] is False
    assert shown[HIDDEN]["redacted"] is True and shown[HIDDEN]["type"] == "TaskRescheduleRequested"
    assert "task-theirs" not in json.dumps(member)
    # the task's trace holds both its chains: its submission's and the fault's
    task = (await traces.get("t1", "/v1/tasks/mine/trace")).json()
    assert task["correlation_ids"] == ["submit-1", "fault-1"]


async def test_another_tenants_token_event_is_no_event(traces: Traces) -> None:
    """A token minted for tenant t2 (its `TokenIssued`, stream `access-<id>`) is traced by
    t2's members and the SRE; to t1's member it is a 404, as any event about t2."""
    issued = TokenIssued(
        token_id="tok_t2bob", tenant="t2", user="bob", role="member", expires_at=NOW
    )
    meta = Metadata(actor="user:t2/admin", causation_id="mint-1", correlation_id="mint-1")
    await traces.face.store.append("access-tok_t2bob", [NewEvent(issued, meta, NOW)], 0)
    [event] = await traces.face.store.read_stream("access-tok_t2bob")
    path = f"/v1/events/{event.event_id}/trace"
    for who in ("t2", "sre"):
        answer = await traces.get(who, path)
        assert answer.status_code == 200, (who, answer.text)
        assert answer.json()["tree"][0]["stream_id"] == "access-tok_t2bob"
    hidden = await traces.get("t1", path)
    assert (hidden.status_code, hidden.json()["code"]) == (404, "event.not_found")
    assert "tok_t2bob" not in hidden.text


async def test_the_tree_is_bounded_and_grpc_answers_as_http(traces: Traces) -> None:
    await traces.submit("mine", "t1", "submit-1")
    small = (await traces.get("sre", "/v1/tasks/mine/trace", limit=2)).json()
    assert (small["events"], small["truncated"], small["limit"]) == (2, True, 2)
    over = await traces.get("sre", "/v1/tasks/mine/trace", limit=MAX_TRACE_EVENTS + 1)
    assert over.status_code in (400, 422)

    auth = (("authorization", f"Bearer {traces.tokens['sre']}"),)
    reply = await traces.stub.Trace(pb.TraceRequest(task_id="mine"), metadata=auth)
    assert convert.trace_dict(reply) == (await traces.get("sre", "/v1/tasks/mine/trace")).json()
    assert all(node.HasField("occur_time") for node in reply.tree)
    for request, code in [
        (pb.TraceRequest(), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.TraceRequest(task_id="nope"), grpc.StatusCode.NOT_FOUND),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await traces.stub.Trace(request, metadata=auth)
        assert refused.value.code() == code
    # A limit HTTP refuses is refused alike, with the same error (it was clamped).
    for limit in (-1, MAX_TRACE_EVENTS + 1):
        by_http = await traces.get("sre", "/v1/tasks/mine/trace", limit=limit)
        assert by_http.status_code == 400, by_http.text
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await traces.stub.Trace(pb.TraceRequest(task_id="mine", limit=limit), metadata=auth)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        error = error_of_rpc(refused.value)
        assert error is not None and error.to_dict() == by_http.json(), limit


async def test_cli_prints_the_tree_with_the_trace_id(
    traces: Traces, capsys: pytest.CaptureFixture[str]
) -> None:
    await traces.submit("mine", "t1", "submit-1")
    body = (await traces.get("sre", "/v1/tasks/mine/trace")).json()
    print_trace(body)
    text = capsys.readouterr().out
    assert "trace of task mine" in text and TRACEPARENT.split("-")[1] in text
    assert "WorkersAllocated  pool-dev-a100" in text
