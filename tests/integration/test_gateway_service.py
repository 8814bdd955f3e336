"""The gateway service entrypoint: `run(ctx)` serves HTTP and projects until cancelled,
with submissions going to the submission service's `run(ctx)` beside it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncpg
import grpc
import httpx
from runyard.api.auth import create_token
from runyard.gateway import main
from runyard.gateway.grpc_gen import tasks_pb2, tasks_pb2_grpc
from runyard.messaging import KafkaSettings
from runyard.stack.context import ServiceContext
from runyard.stack.ports import free_port
from runyard.submission import main as submission_main

REPO = Path(__file__).resolve().parents[2]


async def wait_ready(client: httpx.AsyncClient) -> None:
    for _ in range(200):
        try:
            await client.get("/openapi.json")
            return
        except httpx.TransportError:
            await asyncio.sleep(0.05)
    raise AssertionError("the gateway did not start")


async def answers_after_idling(url: str, idle_s: float) -> bool:
    """Whether the server at `url` still answers on one HTTP/1.1 connection after it
    has been idle for `idle_s` seconds."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    reader, writer = await asyncio.open_connection(host, port)
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    try:
        answers = []
        for pause in (0.0, idle_s):
            await asyncio.sleep(pause)
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            answers.append(head.startswith(b"HTTP/1.1 200"))
        return all(answers)
    except (ConnectionError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()


async def test_run_serves_http_grpc_and_projects(dsn: str, tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    ctx = ServiceContext(
        dsn=dsn,
        kafka=KafkaSettings(),
        data_dir=tmp_path,
        config_dir=REPO / "infra/config",
        settings={"http_port": port, "grpc_port": grpc_port},
    )
    submission = asyncio.create_task(submission_main.run(ctx))
    service = asyncio.create_task(main.run(ctx))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        await wait_ready(client)
        assert (await client.get("/v1/tasks")).status_code == 401
        conn = await asyncpg.connect(dsn)
        try:
            token = await create_token(conn, "t1", "alice")
            headers = {"Authorization": f"Bearer {token}"}
            body = {
                "name": "hi",
                "pool": "dev-a100",
                "worker_spec": "1gpu",
                "image": "bash-only",
                "command": "echo hi",
            }
            created = await client.post("/v1/tasks", json=body, headers=headers)
            assert created.status_code == 201, created.json()
            for _ in range(100):  # the background projector writes the row
                if await conn.fetchval("SELECT count(*) FROM task_list"):
                    break
                await asyncio.sleep(0.05)
            assert await conn.fetchval("SELECT name FROM task_list") == "hi"
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = tasks_pb2_grpc.TasksStub(channel)
                got = await stub.GetTask(
                    tasks_pb2.GetTaskRequest(task_id=created.json()["task_id"]),
                    metadata=(("authorization", f"Bearer {token}"),),
                )
                assert (got.name, got.status) == ("hi", tasks_pb2.TASK_STATUS_NEW)
            # An idle connection outlives a client's keep-alive (httpx: 5 s), so
            # no server closes one just as a client sends on it again.
            kept = await asyncio.gather(
                answers_after_idling(f"http://127.0.0.1:{port}", idle_s=6),
                answers_after_idling(ctx.endpoints["submission"], idle_s=6),
            )
            assert list(kept) == [True, True]  # gateway, submission
        finally:
            await conn.close()
    for running in (service, submission):
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert service.done()
