"""The fault-tolerance service's own routes (`runyard.faulttolerance.http` on its HTTP
face, `runyard.api.service`) on a real Postgres: the FT log as the task's events say,
tenant isolation, stacks on demand through a capture command that the deployer
carries out (504 with a hint when no deployer answers), reports by id.

The task is driven by the domain's commands (as in test_faulttolerance_service.py);
the commands go straight to a `DeployerApp` whose stack capture is a fake (the real
py-spy capture is in test_faulttolerance_service.py and tests/e2e).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.api.security import TokenAuthenticator
from runyard.api.service import service_app
from runyard.contracts import default_mapper
from runyard.contracts.stacks import ProcessStacks, StackFrame, ThreadStack
from runyard.domain.task import ExitWorker
from runyard.eventstore import PostgresEventStore
from runyard.faulttolerance.app import FaultToleranceApp
from runyard.faulttolerance.http import faulttolerance_router
from runyard.faulttolerance.reports import StackReportStore
from runyard.stack.serve import migrate_service

from tests.integration.test_faulttolerance_service import (
    Clock,
    CommandsToDeployer,
    Harness,
    spec,
)

pytestmark = pytest.mark.integration


class Api:
    def __init__(self, http: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        self.http, self.tokens = http, tokens

    async def call(self, who: str, method: str, path: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.request(method, path, headers=headers)


async def fake_capture(pgid: int, *, native: bool = True) -> list[ProcessStacks]:
    frames = (
        StackFrame(name="clock_nanosleep", filename="/usr/lib/libc.so.6", line=0),
        StackFrame(name="wait_for_allreduce", filename="/w/train.py", line=4),
        StackFrame(name="<module>", filename="/w/train.py", line=7),
    )
    thread = ThreadStack(pid=pgid, thread_id=1, thread_name="MainThread", frames=frames)
    return [ProcessStacks(pid=pgid, threads=(thread,))]


@pytest.fixture
async def api(dsn: str) -> AsyncIterator[tuple[Api, Harness]]:
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
    face = service_app("faulttolerance", routers=[router])
    transport = httpx.ASGITransport(app=face)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://ft") as client:
            yield Api(client, tokens), Harness(store, ft, clock, reports)
    finally:
        await ft.drain()
        await store.close()


async def test_ft_log_counts_and_lines_for_the_tenant_only(api: tuple[Api, Harness]) -> None:
    a, h = api
    task_spec = spec(auto_restart=True)
    await h.launch("crashy", task_spec)
    await h.act("crashy", ExitWorker("crashy", 1, 1, 0, 1))
    await h.launch("crashy", task_spec, attempt=2)
    await h.lines("crashy", 0, ["Loading checkpoint from /ckpt/step_50.pt (step 50)"], attempt=2)

    answer = await a.call("alice", "GET", "/v1/tasks/crashy/ft-log")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["task_id"] == "crashy" and body["status"] == "running" and body["run"] == 1
    assert body["counts"] == {"restarts": 1, "reschedules": 0, "hangs": 0, "slowdowns": 0}
    assert [line["kind"] for line in body["lines"]] == ["restart", "resume"]
    assert body["lines"][1]["text"].startswith("Resume observed at step 50 from /ckpt/step_50.pt")
    assert set(body["lines"][0]) == {"at", "run", "attempt", "kind", "level", "text"}

    for path in ("/v1/tasks/crashy/ft-log", "/v1/tasks/crashy/stacks"):
        hidden = await a.call("carol", "GET", path)
        assert hidden.status_code == 404, hidden.text
    missing = await a.call("alice", "GET", "/v1/tasks/nope/ft-log")
    assert missing.status_code == 404


async def test_stacks_on_demand_are_captured_by_the_deployer(api: tuple[Api, Harness]) -> None:
    a, h = api
    await h.launch("busy", spec(workers=2))

    unanswered = await a.call("alice", "POST", "/v1/tasks/busy/stacks")
    assert unanswered.status_code == 504, unanswered.text
    assert unanswered.json()["code"] == "stacks.timeout"
    assert "deployer" in unanswered.json()["hint"]

    h.workers[("busy", 1, 1)] = {0: 101, 1: 102}
    hidden = await a.call("carol", "POST", "/v1/tasks/busy/stacks")
    assert hidden.status_code == 404
    answer = await a.call("alice", "POST", "/v1/tasks/busy/stacks")
    assert answer.status_code == 201, answer.text
    report = answer.json()
    assert report["frames_by_worker"] == {
        "0": ["wait_for_allreduce (train.py:4)"],
        "1": ["wait_for_allreduce (train.py:4)"],
    }
    events = await h.events("busy")
    captured = [e for e in events if e.type == "StacksCaptured"]
    assert [e.metadata.actor for e in captured] == ["user:acme/alice"]

    listed = (await a.call("alice", "GET", "/v1/tasks/busy/stacks")).json()["reports"]
    assert [r["report_id"] for r in listed] == [report["report_id"]]
    got = await a.call("alice", "GET", f"/v1/tasks/busy/stacks/{report['report_id']}")
    assert got.status_code == 200 and got.json() == report
    raw: dict[str, Any] = got.json()["workers"]["1"][0]["threads"][0]
    assert [f["name"] for f in raw["frames"]] == [
        "clock_nanosleep",
        "wait_for_allreduce",
        "<module>",
    ]
    wrong = await a.call("alice", "GET", "/v1/tasks/busy/stacks/nope")
    assert wrong.status_code == 404 and wrong.json()["code"] == "stacks.not_found"

    await h.launch("other", spec())
    elsewhere = await a.call("alice", "GET", f"/v1/tasks/other/stacks/{report['report_id']}")
    assert elsewhere.status_code == 404, "a report is only found under its own task"


async def test_stacks_of_a_task_that_does_not_run_are_refused(api: tuple[Api, Harness]) -> None:
    a, h = api
    await h.launch("done", spec())
    await h.act("done", ExitWorker("done", 1, 1, 0, 0))
    refused = await a.call("alice", "POST", "/v1/tasks/done/stacks")
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "stacks.not_running"
    anonymous = await a.http.post("/v1/tasks/done/stacks")
    assert anonymous.status_code == 401
