"""What `runyard.client` sends again, and what it raises, answered by a scripted
transport (httpx.MockTransport): each test lists the answers in order."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from runyard.client import (
    NO_RETRY,
    ApiError,
    AsyncClient,
    Client,
    GatewayUnreachable,
    Retry,
    Unavailable,
)

TASK = {
    "task_id": "t-1",
    "tenant": "acme",
    "creator": "bob",
    "name": "hello",
    "status": "queued",
    "run": 1,
    "spec": {"pool": "pool-a"},
    "version": 2,
}
OUTAGE = httpx.Response(
    503,
    headers={"Retry-After": "2"},
    json={"code": "service.unavailable", "field": "", "message": "away", "hint": "again"},
)
Step = httpx.Response | Exception


def scripted(steps: list[Step], seen: list[str]) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.raw_path.decode()}")
        step = steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    return answer


def client(steps: list[Step], seen: list[str], waits: list[float], retry: Retry) -> Client:
    http = httpx.Client(base_url="http://gw", transport=httpx.MockTransport(scripted(steps, seen)))
    return Client(http=http, retry=retry, sleep=waits.append)


def test_a_read_waits_what_retry_after_says_then_answers_the_model() -> None:
    seen: list[str] = []
    waits: list[float] = []
    runyard = client([OUTAGE, httpx.Response(200, json=TASK)], seen, waits, Retry())
    task = runyard.get_task("t-1")
    assert (task.task_id, task.status, task.counters.restarts) == ("t-1", "queued", 0)
    assert waits == [2.0] and seen == ["GET /v1/tasks/t-1"] * 2


def test_a_create_is_not_sent_again_after_a_503_or_a_broken_connection() -> None:
    for failure in (OUTAGE, httpx.ReadError("connection reset")):
        seen: list[str] = []
        waits: list[float] = []
        runyard = client([failure], seen, waits, Retry())
        with pytest.raises((Unavailable, GatewayUnreachable)) as raised:
            runyard.create_task({"name": "x"})
        assert raised.value.retryable  # the caller may decide to send it again
        assert waits == [] and seen == ["POST /v1/tasks"]


def test_a_create_is_sent_again_when_the_connection_was_not_made() -> None:
    seen: list[str] = []
    waits: list[float] = []
    steps: list[Step] = [httpx.ConnectError("refused"), httpx.Response(201, json=TASK)]
    task = client(steps, seen, waits, Retry(backoff_s=0.1)).create_task({"name": "x"})
    assert task.task_id == "t-1" and waits == [0.1]


def test_a_stop_is_idempotent_and_the_last_failure_is_raised() -> None:
    seen: list[str] = []
    waits: list[float] = []
    runyard = client([OUTAGE, OUTAGE, OUTAGE], seen, waits, Retry(attempts=3, max_wait_s=1))
    with pytest.raises(Unavailable) as raised:
        runyard.stop_task("t-1")
    assert raised.value.retry_after_s == 2 and raised.value.http_status == 503
    assert waits == [1.0, 1.0] and len(seen) == 3  # Retry-After capped by max_wait_s


def test_a_refusal_keeps_its_body_and_an_answer_without_one_gets_a_code() -> None:
    refused = httpx.Response(
        400, json={"code": "spec.invalid", "field": "pool", "message": "no", "hint": "h", "item": 2}
    )
    gateway_down = httpx.Response(502, text="Bad Gateway")
    seen: list[str] = []
    runyard = client([refused, gateway_down], seen, [], NO_RETRY)
    with pytest.raises(ApiError) as first:
        runyard.create_task({})
    assert (first.value.code, first.value.field, first.value.extra) == (
        "spec.invalid",
        "pool",
        {"item": 2},
    )
    with pytest.raises(ApiError) as second:
        runyard.get_task("t-1")
    assert (second.value.http_status, second.value.code) == (502, "http.502")
    assert second.value.message == "Bad Gateway"


async def test_the_async_client_retries_the_same_way() -> None:
    seen: list[str] = []
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    steps: list[Step] = [httpx.RemoteProtocolError("gone"), httpx.Response(200, json=[])]
    transport = httpx.MockTransport(scripted(steps, seen))
    http = httpx.AsyncClient(base_url="http://gw", transport=transport)
    async with AsyncClient(http=http, retry=Retry(backoff_s=0.5), sleep=wait) as runyard:
        assert await runyard.task_events("t%1") == []
    await http.aclose()
    assert waits == [0.5] and seen == ["GET /v1/tasks/t%251/events"] * 2
