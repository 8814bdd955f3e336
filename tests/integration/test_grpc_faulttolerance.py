"""The fault-tolerance RPCs of the gateway's gRPC API answer what the fault-tolerance
service's HTTP routes answer, typed: the FT log, stack reports listed, captured on
demand and read back, and the same refusals (404 for another tenant, 409 when no
worker runs, 504 when no deployer answers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.api.grpc_errors import error_info, status_of_rpc
from runyard.api.security import TokenAuthenticator
from runyard.api.service import service_app
from runyard.contracts import default_mapper
from runyard.domain.task import ExitWorker
from runyard.eventstore import PostgresEventStore
from runyard.faulttolerance.app import FaultToleranceApp
from runyard.faulttolerance.http import faulttolerance_router
from runyard.faulttolerance.reports import StackReportStore
from runyard.gateway import grpc_convert as convert
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.proxy import Owners
from runyard.stack.serve import migrate_service

from tests.integration.test_faulttolerance_api import Api, fake_capture
from tests.integration.test_faulttolerance_service import (
    Clock,
    CommandsToDeployer,
    Harness,
    spec,
)

pytestmark = pytest.mark.integration


@dataclass
class Faces:
    http: Api
    stub: pb_grpc.TasksStub
    harness: Harness

    def auth(self, who: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.http.tokens[who]}"),)

    async def refused(self, method: str, request: object, who: str = "alice") -> str:
        """The code of a refusal, after checking its ErrorInfo names the same code."""
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await getattr(self.stub, method)(request, metadata=self.auth(who))
        status = status_of_rpc(raised.value)
        info = error_info(status) if status is not None else None
        assert info is not None, raised.value
        return f"{raised.value.code().name} {info.metadata['code']}"


@pytest.fixture
async def faces(dsn: str, tmp_path: Path) -> AsyncIterator[Faces]:
    await migrate_service("gateway", dsn, grants=False)  # the tokens table
    store = await PostgresEventStore.connect(dsn, default_mapper())
    tokens = {
        "alice": await create_token(store.pool, "acme", "alice", "member"),
        "carol": await create_token(store.pool, "other", "carol", "member"),
    }
    reports = StackReportStore(store.pool)
    await reports.migrate()
    clock = Clock()
    ft = FaultToleranceApp(
        store,
        reports=reports,
        deployer=CommandsToDeployer(store, capture=fake_capture),
        clock=clock,
        stacks_wait_s=0.5,
    )
    router = faulttolerance_router(ft, reports, TokenAuthenticator(store.pool))
    transport = httpx.ASGITransport(app=service_app("faulttolerance", routers=[router]))
    owners = Owners({"faulttolerance": "http://ft"}, transport=transport)
    gateway = await Gateway.connect(dsn, tmp_path)
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=owners)
    try:
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://ft") as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            harness = Harness(store, ft, clock, reports)
            yield Faces(Api(client, tokens), pb_grpc.TasksStub(channel), harness)
    finally:
        await server.stop(grace=None)
        await owners.aclose()
        await gateway.close()
        await ft.drain()
        await store.close()


async def test_the_ft_log_over_grpc_is_the_http_answer_typed(faces: Faces) -> None:
    h = faces.harness
    task_spec = spec(auto_restart=True)
    await h.launch("crashy", task_spec)
    await h.act("crashy", ExitWorker("crashy", 1, 1, 0, 1))
    await h.launch("crashy", task_spec, attempt=2)

    request = pb.GetFaultToleranceLogRequest(task_id="crashy")
    log = await faces.stub.GetFaultToleranceLog(request, metadata=faces.auth("alice"))
    over_http = await faces.http.call("alice", "GET", "/v1/tasks/crashy/ft-log")
    assert convert.to_dict(log) == over_http.json()
    assert (log.status, log.counts.restarts) == (pb.TASK_STATUS_RUNNING, 1)
    assert [line.kind for line in log.lines] == ["restart"]
    assert log.lines[0].HasField("time")
    assert await faces.refused("GetFaultToleranceLog", request, "carol") == (
        "NOT_FOUND task_not_found"
    )


async def test_stacks_over_grpc_are_the_http_reports_typed(faces: Faces) -> None:
    h = faces.harness
    await h.launch("busy", spec(workers=2))
    capture = pb.CaptureStacksRequest(task_id="busy")
    assert await faces.refused("CaptureStacks", capture) == "DEADLINE_EXCEEDED stacks.timeout"

    h.workers[("busy", 1, 1)] = {0: 101, 1: 102}
    report = await faces.stub.CaptureStacks(capture, metadata=faces.auth("alice"))
    assert [(w.worker, list(w.frames)) for w in report.frames_by_worker] == [
        (0, ["wait_for_allreduce (train.py:4)"]),
        (1, ["wait_for_allreduce (train.py:4)"]),
    ]
    frames = report.workers[1].processes[0].threads[0].frames
    assert [f.name for f in frames] == ["clock_nanosleep", "wait_for_allreduce", "<module>"]

    got = await faces.stub.GetStackReport(
        pb.GetStackReportRequest(task_id="busy", report_id=report.report_id),
        metadata=faces.auth("alice"),
    )
    path = f"/v1/tasks/busy/stacks/{report.report_id}"
    assert convert.stack_report_dict(got) == (await faces.http.call("alice", "GET", path)).json()
    # the same report (its maps come back from the store in another key order)
    assert convert.stack_report_dict(got) == convert.stack_report_dict(report)

    listed = await faces.stub.ListStackReports(
        pb.ListStackReportsRequest(task_id="busy"), metadata=faces.auth("alice")
    )
    over_http = await faces.http.call("alice", "GET", "/v1/tasks/busy/stacks")
    assert convert.to_dict(listed) == over_http.json()
    assert [r.report_id for r in listed.reports] == [report.report_id]

    missing = pb.GetStackReportRequest(task_id="busy", report_id="nope")
    assert await faces.refused("GetStackReport", missing) == "NOT_FOUND stacks.not_found"
    await h.act("busy", ExitWorker("busy", 1, 1, 0, 0))
    await h.act("busy", ExitWorker("busy", 1, 1, 1, 0))
    assert await faces.refused("CaptureStacks", capture) == (
        "FAILED_PRECONDITION stacks.not_running"
    )
