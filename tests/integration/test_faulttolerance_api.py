"""The fault-tolerance endpoints of the gateway (`runyard.faulttolerance.http`) on a real
Postgres: the FT log as the task's events say, tenant isolation, stacks on demand
through an in-process FT service (503 with a hint without one), reports by id.

The task is driven by the domain's commands (as in test_faulttolerance_service.py);
the stack capture is a fake (the real py-spy capture is in tests/e2e).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.domain.task import ExitWorker
from runyard.faulttolerance.app import (
    FaultToleranceApp,
    database_key,
    publish_in_process,
    withdraw_in_process,
)
from runyard.faulttolerance.stacks import Frame, ProcessStacks, ThreadStack
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app

from tests.integration.test_faulttolerance_service import Clock, FixedProcesses, Harness, spec
from tests.integration.test_gateway import config_dir

pytestmark = pytest.mark.integration


class Api:
    def __init__(self, gateway: Gateway, http: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        self.gateway, self.http, self.tokens = gateway, http, tokens

    async def call(self, who: str, method: str, path: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.request(method, path, headers=headers)


async def fake_capture(pgid: int, *, native: bool) -> list[ProcessStacks]:
    frames = (
        Frame("clock_nanosleep", "/usr/lib/libc.so.6", 0),
        Frame("wait_for_allreduce", "/w/train.py", 4),
        Frame("<module>", "/w/train.py", 7),
    )
    return [ProcessStacks(pgid, (ThreadStack(pgid, 1, "MainThread", False, frames),))]


@pytest.fixture
async def api(dsn: str, tmp_path: Path) -> AsyncIterator[tuple[Api, Harness]]:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "alice": await create_token(gateway.db, "acme", "alice", "member"),
        "carol": await create_token(gateway.db, "other", "carol", "member"),
    }
    processes = FixedProcesses()
    from runyard.faulttolerance.reports import StackReportStore

    reports = StackReportStore(gateway.db)
    await reports.migrate()
    clock = Clock()
    ft = FaultToleranceApp(
        gateway.store, reports=reports, processes=processes, capture=fake_capture, clock=clock
    )
    transport = httpx.ASGITransport(app=create_app(gateway))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield Api(gateway, client, tokens), Harness(gateway.store, ft, clock, reports)
    await ft.drain()
    await gateway.close()


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


async def test_stacks_on_demand_need_the_in_process_service(api: tuple[Api, Harness]) -> None:
    a, h = api
    await h.launch("busy", spec(workers=2))
    assert isinstance(h.app.processes, FixedProcesses)
    h.app.processes.by_key[("busy", 1, 1)] = {0: 101, 1: 102}

    refused = await a.call("alice", "POST", "/v1/tasks/busy/stacks")
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "stacks.unavailable"
    assert "runyard up" in refused.json()["hint"]

    key = await database_key(a.gateway.db)
    publish_in_process(key, h.app)
    try:
        hidden = await a.call("carol", "POST", "/v1/tasks/busy/stacks")
        assert hidden.status_code == 404
        answer = await a.call("alice", "POST", "/v1/tasks/busy/stacks")
    finally:
        withdraw_in_process(key, h.app)
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
