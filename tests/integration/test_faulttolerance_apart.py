"""Stacks on demand with fault tolerance and the deployer in processes of their own.

The relay, the deployer (local runtime, real worker processes) and the
fault-tolerance service each run as `python -m runyard.stack.serve <name>`,
with nothing in common but Postgres, the broker and their URLs. The test
appends the task's submission and placement as the gateway and the scheduler
would; the deployer runs the worker; then `POST /v1/tasks/{id}/stacks` on the
fault-tolerance service's own HTTP face sends a `CaptureStacks` command the
deployer carries out, and the answer shows the worker's sleeping frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import StacksCaptured, TaskPlaced, WorkerPlacement
from runyard.deployer.stacks import py_spy_binary
from runyard.domain.task import Submit, decide
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.stack.context import ServiceContext
from runyard.stack.ports import free_port
from runyard.stack.serve import migrate_service
from runyard.stack.supervisor import service_specs

from tests.e2e.conftest import copy_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed"),
]

SERVICES = ("relay", "deployer", "faulttolerance")
HANGING = """python -u - <<'EOF'
import time

def wait_for_allreduce():
    time.sleep(100000)

print("step 1 done", flush=True)
wait_for_allreduce()
EOF"""


class Apart:
    def __init__(self, ctx: ServiceContext, store: PostgresEventStore, token: str) -> None:
        self.ctx, self.store, self.token = ctx, store, token
        self.children: dict[str, asyncio.subprocess.Process] = {}

    def check_alive(self) -> None:
        for name, child in self.children.items():
            assert child.returncode is None, f"{name} exited with {child.returncode}"

    async def until(self, what: str, within: float, done: Any) -> Any:
        deadline = time.monotonic() + within
        while True:
            self.check_alive()
            found = await done()
            if found:
                return found
            assert time.monotonic() < deadline, f"{what}: not within {within} s"
            await asyncio.sleep(0.1)


@pytest.fixture
async def apart(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Apart]:
    await migrate_service("gateway", dsn, grants=False)  # the tokens table
    ctx = ServiceContext(
        dsn=dsn,
        kafka=kafka,
        data_dir=tmp_path / "home",
        config_dir=copy_config(tmp_path / "config"),
        endpoints={name: f"http://127.0.0.1:{free_port()}" for name in SERVICES},
    )
    store = await PostgresEventStore.connect(dsn, default_mapper())
    token = await create_token(store.pool, "acme", "alice", "member")
    platform = Apart(ctx, store, token)
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        for spec in service_specs(ctx, SERVICES):
            with (logs / f"{spec.name}.log").open("wb") as out:
                platform.children[spec.name] = await asyncio.create_subprocess_exec(
                    *spec.argv, env=spec.env, stdout=out, stderr=out, start_new_session=True
                )
        async with httpx.AsyncClient(timeout=5) as client:

            async def ready() -> bool:
                for name in SERVICES:
                    with contextlib.suppress(httpx.HTTPError):
                        answer = await client.get(f"{ctx.endpoints[name]}/readyz")
                        if answer.status_code != 200:
                            return False
                        continue
                    return False
                return True

            await platform.until("every service ready", 60, ready)
        yield platform
    finally:
        await stop_children(platform.children)
        await store.close()
        for log in sorted(logs.iterdir()):
            tail = log.read_text(errors="replace")[-3000:]
            if tail.strip():
                print(f"--- {log.name}\n{tail}")


async def stop_children(children: dict[str, asyncio.subprocess.Process]) -> None:
    """SIGTERM (the deployer then ends its workers), SIGKILL what is left after 20 s."""
    for child in children.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
    for child in children.values():
        try:
            await asyncio.wait_for(child.wait(), 20)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            await child.wait()


async def launch(apart: Apart, task_id: str) -> None:
    """The task's submission and placement, as the gateway and the scheduler append them."""
    spec = TaskSpec(
        name="apart",
        pool="dev-a100",
        worker_spec="1gpu",
        worker_count=1,
        image="pytorch:2.3-cuda12",
        command=HANGING,
        framework="single",
    )
    now = datetime.now(UTC)
    request = Metadata(actor="user:acme/alice", causation_id="req-1", correlation_id="req-1")
    submitted = decide(None, Submit(task_id, "acme", "alice", spec), now=now, ids=lambda: "x")
    placed = TaskPlaced(
        run=1,
        attempt=1,
        pool="dev-a100",
        workers=(WorkerPlacement(index=0, node="dev-a100-node-0", gpus=(0,)),),
    )
    events = [NewEvent(e, request, now) for e in [*submitted, placed]]
    await apart.store.append(f"task-{task_id}", events, 0)


async def test_stacks_on_demand_come_from_the_deployer_in_another_process(
    apart: Apart,
) -> None:
    pids = {name: child.pid for name, child in apart.children.items()}
    assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()
    await launch(apart, "apart-1")

    async def running() -> bool:
        events = await apart.store.read_stream("task-apart-1")
        return any(e.type == "TaskRunning" for e in events)

    await apart.until("the worker runs", 60, running)
    url = apart.ctx.endpoints["faulttolerance"]
    headers = {"Authorization": f"Bearer {apart.token}", "X-Request-Id": "req-stacks"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:

        async def sleeping() -> dict[str, Any] | None:
            answer = await client.post("/v1/tasks/apart-1/stacks")
            assert answer.status_code == 201, answer.text
            report: dict[str, Any] = answer.json()
            frames = report["frames_by_worker"]["0"]
            return report if frames[0].startswith("wait_for_allreduce (") else None

        # the interpreter may not have reached the function at the first capture
        report = await apart.until("the sleeping frame", 30, sleeping)
        raw = [
            frame["name"]
            for process in report["workers"]["0"]
            for thread in process["threads"]
            for frame in thread["frames"]
        ]
        assert "wait_for_allreduce" in raw and "<module>" in raw
        listed = (await client.get("/v1/tasks/apart-1/stacks")).json()["reports"]
        assert report["report_id"] in [r["report_id"] for r in listed]

    events = await apart.store.read_stream("task-apart-1")
    (captured,) = [
        e
        for e in events
        if isinstance(e.event, StacksCaptured) and e.event.report_id == report["report_id"]
    ]
    assert captured.metadata.actor == "user:acme/alice"
    assert captured.metadata.causation_id == "req-stacks"
    assert isinstance(captured.event, StacksCaptured)
    assert captured.event.workers == (0,)
