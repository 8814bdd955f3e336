"""The whole platform in-process, on the test's own database and topic prefix.

`platform` starts what `runyard up` starts (`run_platform`: the outbox relay,
then every built service's `run(ctx)`: gateway on a free port, scheduler,
deployer with the local runtime) on the `dsn` and `kafka` fixtures, with a
copy of infra/config in the test's temp folder (a short stop grace), and
gives the test an HTTP client and an admin token of tenant `e2e`. Tests only
talk to the gateway's HTTP API; they peek into the running deployer only to
check that processes are gone.

RUNYARD_E2E_SKIP=logs,faulttolerance (service names, comma-separated) leaves
services out, to tell a service's own failure from the path under test.

After a test that passed, every event of its database must keep the audit
chain (R-62, `audit.py`): each names its cause, and the causes lead back to a
person's request or an admin's action.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from runyard.api.auth import create_token
from runyard.messaging import KafkaSettings
from runyard.stack.context import ServiceContext
from runyard.stack.up import SERVICES, run_platform

from tests.e2e.audit import assert_audit_chain

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "stopped"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def copy_config(target: Path, *, grace_s: float = 2.0) -> Path:
    """infra/config copied to `target`, with the local runtime's stop grace shortened."""
    shutil.copytree(REPO / "infra/config", target)
    runtime = yaml.safe_load((target / "runtime.yaml").read_text())
    runtime["local"]["grace_s"] = grace_s
    (target / "runtime.yaml").write_text(yaml.safe_dump(runtime))
    return target


@dataclass
class Platform:
    ctx: ServiceContext
    http: httpx.AsyncClient
    token: str
    runner: asyncio.Task[None]

    @property
    def kafka(self) -> KafkaSettings:
        return self.ctx.kafka

    @property
    def deployer(self) -> Any:
        return self.ctx.settings["deployer_app"]

    async def submit(self, **spec: Any) -> dict[str, Any]:
        body = {"pool": "dev-a100", "worker_spec": "1gpu", "image": "bash-only", **spec}
        body.setdefault("name", "e2e")
        answer = await self.http.post("/v1/tasks", json=body)
        assert answer.status_code == 201, answer.text
        created: dict[str, Any] = answer.json()
        return created

    async def task(self, task_id: str) -> dict[str, Any]:
        answer = await self.http.get(f"/v1/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        task: dict[str, Any] = answer.json()
        return task

    async def events(self, task_id: str) -> list[dict[str, Any]]:
        answer = await self.http.get(f"/v1/tasks/{task_id}/events")
        assert answer.status_code == 200, answer.text
        events: list[dict[str, Any]] = answer.json()
        return events

    async def wait_for(
        self,
        task_id: str,
        done: Callable[[dict[str, Any]], bool],
        within: float = 30.0,
    ) -> dict[str, Any]:
        """Poll the task until `done(task)`; fail (with the timeline) after `within` s."""
        deadline = time.monotonic() + within
        while True:
            self.check_alive()
            task = await self.task(task_id)
            if done(task):
                return task
            if time.monotonic() > deadline:
                types = [e["type"] for e in await self.events(task_id)]
                raise AssertionError(f"task {task_id} is {task['status']} after {within}s: {types}")
            await asyncio.sleep(0.05)

    async def wait_status(self, task_id: str, status: str, within: float = 30.0) -> dict[str, Any]:
        task = await self.wait_for(
            task_id, lambda t: t["status"] == status or t["status"] in TERMINAL, within
        )
        assert task["status"] == status, (task["status"], task["last_failure_reason"])
        return task

    def check_alive(self) -> None:
        if self.runner.done():
            raise AssertionError(f"the platform stopped: {self.runner.exception()!r}")


async def _wait_ready(
    ctx: ServiceContext, http: httpx.AsyncClient, run: asyncio.Task[None]
) -> None:
    deadline = time.monotonic() + 30
    while True:
        if run.done():
            run.result()
            raise AssertionError("the platform returned before it was ready")
        ready = "scheduler_app" in ctx.settings and "deployer_app" in ctx.settings
        relay = ctx.settings.get("relay")
        if ready and relay is not None and relay.ready.is_set():
            with contextlib.suppress(httpx.TransportError):
                await http.get("/openapi.json")
                return
        assert time.monotonic() < deadline, "the platform did not start within 30 s"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_platform(
    dsn: str, kafka: KafkaSettings, home: Path, **settings: Any
) -> AsyncIterator[Platform]:
    """The platform on `dsn` / `kafka` with config and data under `home`."""
    port, grpc_port = free_port(), free_port()
    ctx = ServiceContext(
        dsn=dsn,
        kafka=kafka,
        data_dir=home / "data",
        config_dir=copy_config(home / "config"),
        settings={
            "http_port": port,
            "grpc_port": grpc_port,
            "scheduler_tick_s": 1.0,
            **settings,
        },
    )
    skip = set(os.environ.get("RUNYARD_E2E_SKIP", "").split(","))
    services = [s for s in SERVICES if s.split(".")[1].split(":")[0] not in skip]
    run = asyncio.create_task(run_platform(ctx, services=services), name="platform")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            await _wait_ready(ctx, http, run)
            conn = await asyncpg.connect(dsn)
            try:
                token = await create_token(conn, "e2e", "alice", "admin")
            finally:
                await conn.close()
            http.headers["Authorization"] = f"Bearer {token}"
            yield Platform(ctx, http, token, run)
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    await assert_audit_chain(dsn)  # only after a test that passed


@pytest.fixture
async def platform(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Platform]:
    async with running_platform(dsn, kafka, tmp_path) as running:
        yield running
