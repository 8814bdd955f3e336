"""A 429 (the tenant uses its share of something at once) answered by a real HTTP server
on a free port (uvicorn): what `runyard.client` sends again, how long it waits, and what
`runyard` says meanwhile and once the retries run out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from runyard.client import AsyncClient, Client, ClientError, Retry, TooBusy
from runyard.stack.ports import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.unit.test_cli import REPO, cli
from tests.unit.test_client_retry import TASK

pytestmark = pytest.mark.integration


def busy(code: str, retry_after: str | None = "2") -> Response:
    body = {"code": code, "field": "", "message": f"{code} now", "hint": "send it again"}
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return JSONResponse(body, status_code=429, headers=headers)


@dataclass
class Scripted:
    """A gateway that answers each request with the next of `answers` (then 404)."""

    url: str
    answers: list[Response] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    here = Scripted("")

    async def answer(request: Request) -> Response:
        here.seen.append(f"{request.method} {request.url.path}")
        if here.answers:
            return here.answers.pop(0)
        return JSONResponse({"code": "x", "field": "", "message": "none", "hint": ""}, 404)

    app = Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:  # noqa: ASYNC110  (uvicorn has no event for it)
            await asyncio.sleep(0.02)
    here.url = f"http://127.0.0.1:{port}"
    yield here
    server.should_exit = True
    await task


def blocking(
    on: Scripted, retry: Retry, waits: list[float], told: list[tuple[str, float]]
) -> Client:
    def tell(error: ClientError, wait_s: float) -> None:
        told.append((error.code, wait_s))

    return Client(on.url, "t", retry=retry, sleep=waits.append, on_retry=tell)


async def test_a_create_refused_before_acting_is_sent_again_after_retry_after(
    scripted: Scripted,
) -> None:
    """`submission.busy` (nothing written): the create is sent again after what
    Retry-After says, and the caller is told before each wait."""
    scripted.answers = [busy("submission.busy"), JSONResponse(TASK, 201)]
    waits: list[float] = []
    told: list[tuple[str, float]] = []
    with blocking(scripted, Retry(), waits, told) as runyard:
        task = await asyncio.to_thread(runyard.create_task, {"name": "x"})
    assert task.task_id == "t-1"
    assert scripted.seen == ["POST /v1/tasks"] * 2
    assert waits == [2.0] and told == [("submission.busy", 2.0)]


async def test_a_create_refused_with_another_429_or_without_retry_after_is_not_sent_again(
    scripted: Scripted,
) -> None:
    """A 429 whose code does not say nothing was done is sent again only for a read; one
    without Retry-After never."""
    scripted.answers = [busy("quota.other"), busy("quota.other"), JSONResponse(TASK)]
    waits: list[float] = []
    with blocking(scripted, Retry(), waits, []) as runyard:
        with pytest.raises(TooBusy) as raised:
            await asyncio.to_thread(runyard.create_task, {"name": "x"})
        assert raised.value.retryable and raised.value.http_status == 429
        assert (await asyncio.to_thread(runyard.get_task, "t-1")).task_id == "t-1"
        assert waits == [2.0]
        scripted.answers = [busy("submission.busy", retry_after=None)]
        with pytest.raises(TooBusy):
            await asyncio.to_thread(runyard.create_task, {"name": "x"})
    assert waits == [2.0]
    reads = ["GET /v1/tasks/t-1"] * 2
    assert scripted.seen == ["POST /v1/tasks", *reads, "POST /v1/tasks"]


async def test_a_long_retry_after_is_capped_and_the_last_refusal_is_raised(
    scripted: Scripted,
) -> None:
    scripted.answers = [busy("logs.busy", retry_after="60")] * 3
    waits: list[float] = []
    with (
        blocking(scripted, Retry(attempts=3), waits, []) as runyard,
        pytest.raises(TooBusy) as raised,
    ):
        await asyncio.to_thread(runyard.task_logs, "t-1")
    assert raised.value.code == "logs.busy" and raised.value.retry_after_s == 60
    assert waits == [10.0, 10.0] and len(scripted.seen) == 3


async def test_the_async_client_sends_a_busy_call_again(scripted: Scripted) -> None:
    scripted.answers = [busy("streams.too_many"), JSONResponse([])]
    waits: list[float] = []
    told: list[str] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    async with AsyncClient(
        scripted.url, "t", sleep=wait, on_retry=lambda error, _: told.append(error.code)
    ) as runyard:
        assert await runyard.task_events("t-1") == []
    assert waits == [2.0] and told == ["streams.too_many"]


async def test_runyard_says_it_waits_and_prints_the_refusal_once_retries_run_out(
    scripted: Scripted,
) -> None:
    """`runyard submit` on a busy gateway: each wait is said on standard error; once the
    CLI's retries run out, the refusal and its hint, exit 1 (a refusal)."""
    spec = str(REPO / "examples/hello.yaml")
    scripted.answers = [busy("submission.busy", retry_after="1"), JSONResponse(TASK, 201)]
    done = await cli(scripted.url, "t", "submit", "-f", spec)
    assert done.exit_code == 0, done.output
    assert "the gateway is busy (submission.busy): retrying in 1 s" in done.stderr
    assert done.stdout.split()[0] == "t-1"
    scripted.answers = [busy("submission.busy", retry_after="1")] * 3
    refused: Any = await cli(scripted.url, "t", "submit", "-f", spec)
    assert refused.exit_code == 1, refused.output
    lines = refused.stderr.splitlines()
    assert lines.count("the gateway is busy (submission.busy): retrying in 1 s") == 2
    assert lines[-2:] == ["error submission.busy: submission.busy now", "hint: send it again"]


async def test_a_stream_refused_before_it_starts_is_opened_again(scripted: Scripted) -> None:
    """`streams.too_many` is answered before the stream starts: the stream is opened
    again after Retry-After, and yields the answer that came."""
    event = Response("event: end\ndata: {}\n\n", media_type="text/event-stream")
    scripted.answers = [busy("streams.too_many"), event]
    waits: list[float] = []
    told: list[tuple[str, float]] = []

    def watch() -> list[str]:
        with (
            blocking(scripted, Retry(), waits, told) as runyard,
            runyard.stream("GET", "/v1/tasks/t-1/watch") as answer,
        ):
            return list(answer.iter_lines())

    assert (await asyncio.to_thread(watch))[:2] == ["event: end", "data: {}"]
    assert waits == [2.0] and told == [("streams.too_many", 2.0)]
    assert scripted.seen == ["GET /v1/tasks/t-1/watch"] * 2

    scripted.answers = [busy("streams.too_many"), event]
    async with (
        AsyncClient(scripted.url, "t", sleep=lambda _: asyncio.sleep(0)) as runyard,
        runyard.stream("GET", "/v1/tasks/t-1/watch") as answer,
    ):
        assert [line async for line in answer.aiter_lines()][:1] == ["event: end"]
    assert len(scripted.seen) == 4


async def test_a_follow_waits_out_a_busy_log_service_instead_of_ending(
    scripted: Scripted,
) -> None:
    """`runyard logs --follow --grep` asks for the next page again and again; the log
    service busy with the tenant's other searches for longer than the client retries
    (429 `logs.busy` three times) is waited out, and the follow goes on to the task's
    end."""
    line = {"at": "2026-12-06T10:00:00+00:00", "run": 1, "attempt": 1, "worker": 0}
    line |= {"stream": "stdout", "line": "loss=0.5"}

    def page(lines: list[dict[str, Any]], cursor: str) -> Response:
        return JSONResponse({"lines": lines, "next_cursor": None, "tail_cursor": cursor})

    scripted.answers = [
        page([], "c1"),
        JSONResponse({**TASK, "status": "running"}),
        *[busy("logs.busy", retry_after="1")] * 3,
        page([line], "c2"),
        JSONResponse({**TASK, "status": "succeeded"}),
        page([], "c2"),
    ]
    done: Any = await cli(scripted.url, "t", "logs", "t-1", "--follow", "--grep", "loss")
    assert done.exit_code == 0, done.output
    assert "loss=0.5" in done.stdout
    waits = done.stderr.splitlines().count("the gateway is busy (logs.busy): retrying in 1 s")
    assert waits == 3, done.stderr
    assert scripted.answers == [] and scripted.seen.count("GET /v1/tasks/t-1/logs") == 6
