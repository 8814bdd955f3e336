"""The `runyard` CLI against a real gateway (uvicorn on a free port, real Postgres)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from runyard.cli.main import app
from runyard.gateway.app import Gateway
from runyard.gateway.auth import create_token
from runyard.gateway.http import create_app
from typer.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def served(dsn: str) -> AsyncIterator[tuple[str, str]]:
    """A gateway over the repo's config on a free port: (url, alice's token)."""
    gateway = await Gateway.connect(dsn, REPO / "infra/config")
    token = await create_token(gateway.db, "t1", "alice", "member")
    port = free_port()
    config = uvicorn.Config(create_app(gateway), port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.02)
    yield f"http://127.0.0.1:{port}", token
    server.should_exit = True
    await task
    await gateway.close()


async def cli(url: str, token: str | None, *args: str) -> Result:
    env = {"RUNYARD_URL": url, "RUNYARD_TOKEN": token or "", "COLUMNS": "250"}
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


async def test_submit_then_events_show_actor_and_correlation(served: tuple[str, str]) -> None:
    url, token = served
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    assert submitted.exit_code == 0, submitted.output
    task_id = json.loads(submitted.stdout)["task_id"]
    timeline = await cli(url, token, "events", task_id, "--json")
    assert timeline.exit_code == 0, timeline.output
    first = json.loads(timeline.stdout)[0]
    assert (first["type"], first["actor"]) == ("TaskSubmitted", "user:t1/alice")
    assert first["correlation_id"]
    table = await cli(url, token, "events", task_id)
    assert "TaskSubmitted" in table.stdout and first["correlation_id"] in table.stdout
    shown = await cli(url, token, "show", task_id)
    assert "status=new" in shown.stdout
    stopped = await cli(url, token, "stop", task_id)
    assert "status=stopped" in stopped.stdout
    watched = await cli(url, token, "watch", task_id)
    assert watched.exit_code == 0 and "TaskStopped" in watched.stdout
    listed = await cli(url, token, "ls", "--json")
    assert [t["task_id"] for t in json.loads(listed.stdout)["items"]] == [task_id]


async def test_refusals_print_the_hint_with_exit_codes(served: tuple[str, str]) -> None:
    url, token = served
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    await cli(url, token, "stop", task_id)
    refused = await cli(url, token, "rerun", task_id, "--image", "nope:1")
    assert refused.exit_code == 1
    assert "image.not_found" in refused.stderr and "hint:" in refused.stderr
    rerun = await cli(url, token, "rerun", task_id, "--command", "echo again", "--json")
    assert json.loads(rerun.stdout)["run"] == 2
    assert (await cli(url, None, "ls")).exit_code == 3
    assert (await cli(url, "wrong", "ls")).exit_code == 3
    assert (await cli(f"http://127.0.0.1:{free_port()}", token, "ls")).exit_code == 4
    assert (await cli(url, token, "show", "nope")).exit_code == 1


async def test_ddp_warnings_pools_capacity_and_groups(served: tuple[str, str]) -> None:
    url, token = served
    ddp = await cli(url, token, "submit", "-f", str(REPO / "examples/ddp.yaml"), "--json")
    assert ddp.exit_code == 0, ddp.output
    assert json.loads(ddp.stdout)["spec"]["env"][1]["value"] == "replace-me"
    pools = await cli(url, token, "pools", "--json")
    assert "dev-a100" in {p["pool_id"] for p in json.loads(pools.stdout)}
    capacity = await cli(url, token, "capacity", "dev-a100")
    assert capacity.exit_code == 0 and "8gpu" in capacity.stdout
    group = await cli(
        url, token, "group", "create", "-f", str(REPO / "examples/group.yaml"), "--json"
    )
    assert group.exit_code == 0, group.output
    group_id = json.loads(group.stdout)["group_id"]
    listed = await cli(url, token, "group", "ls", group_id)
    assert "sweep-lr-0.01" in listed.stdout and "new: 2" in listed.stdout
