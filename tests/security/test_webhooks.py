"""Webhooks cannot be turned against the platform or its users (SSRF and friends).

One test per finding: a subscription to the platform's own address or the
cloud's metadata service is refused, a tenant's or a task spec's (and a task
spec's such webhook is never called, should one be stored); plain http is
refused; a redirect is not followed; what the remote
end answers is never stored; failures to one webhook are one event per window.
The subscription API runs on a real gateway; delivery runs the notification
service on a real Postgres against real local HTTP servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from runyard.api.auth import create_token
from runyard.contracts.spec import AlertSubscription
from runyard.contracts.task_events import AlertFailed
from runyard.contracts.webhooks import WebhookPolicy
from runyard.domain import Fail, RequestStop
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.notification import store as tables
from runyard.stack.ports import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.integration.test_gateway import config_dir
from tests.integration.test_gateway_routing import notification_service
from tests.integration.test_notification import FAST, Harness, harness, spec

pytestmark = pytest.mark.integration

HOOK_PATH = "/open-apis/bot/v2/hook/"
#: Text a hostile endpoint puts in its answers: it must never reach an event or a table.
LEAK = "LEAKED-internal-metadata-7f3a"


# --- the subscription API ------------------------------------------------------------


@pytest.fixture
async def api(dsn: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    config = config_dir(tmp_path)
    gateway = await Gateway.connect(dsn, config)
    token = await create_token(gateway.db, "t1", "alice", "member")
    endpoints: dict[str, str] = {}
    async with notification_service(dsn, config, endpoints):
        app = create_app(gateway, endpoints)
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gw", headers=headers
        ) as c:
            yield c, gateway
        await app.state.owners.aclose()
    await gateway.close()


async def _subscribe(client: httpx.AsyncClient, url: str) -> httpx.Response:
    return await client.post("/v1/alert-subscriptions", json={"webhook_url": url})


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:8080{HOOK_PATH}abc",
        "http://127.0.0.1:5432/",
        f"http://169.254.169.254{HOOK_PATH}abc",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        f"https://169.254.169.254{HOOK_PATH}abc",
        f"https://localhost{HOOK_PATH}abc",
        f"https://open.feishu.cn@127.0.0.1{HOOK_PATH}abc",
        f"https://open.feishu.cn.evil.example{HOOK_PATH}abc",
    ],
)
async def test_ssrf_to_the_platform_or_the_metadata_service_is_refused(
    api: tuple[httpx.AsyncClient, Gateway], url: str
) -> None:
    client, gateway = api
    answer = await _subscribe(client, url)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert (body["code"], body["field"]) == ("alerts.invalid_subscription", "webhook_url")
    assert "open.feishu.cn/open-apis/bot/v2/hook/" in body["hint"]
    assert await gateway.db.fetchval("SELECT count(*) FROM alert_subscriptions") == 0


@pytest.mark.parametrize(
    "url", [f"http://169.254.169.254{HOOK_PATH}abc", f"http://127.0.0.1:8080{HOOK_PATH}abc"]
)
async def test_a_task_spec_webhook_to_the_platform_is_refused_at_submission(
    api: tuple[httpx.AsyncClient, Gateway], url: str
) -> None:
    client, gateway = api
    before = await gateway.db.fetchval("SELECT count(*) FROM events")
    spec = {
        "name": "ssrf",
        "pool": "pool-a",
        "worker_spec": "1gpu",
        "image": "pytorch:2.3-cuda12",
        "command": "echo hello",
        "alerts": [{"webhook_url": url, "alerts": ["failed"]}],
    }
    answer = await client.post("/v1/tasks", json=spec)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert (body["code"], body["field"]) == ("alert.invalid_webhook", "alerts[0].webhook_url")
    assert "open.feishu.cn/open-apis/bot/v2/hook/" in body["hint"]
    assert await gateway.db.fetchval("SELECT count(*) FROM events") == before


async def test_plain_http_is_refused_even_to_feishu(
    api: tuple[httpx.AsyncClient, Gateway],
) -> None:
    client, _ = api
    answer = await _subscribe(client, f"http://open.feishu.cn{HOOK_PATH}abc")
    assert answer.status_code == 400
    assert "not allowed" in answer.json()["message"]
    ok = await _subscribe(client, f"https://open.feishu.cn{HOOK_PATH}abc")
    assert ok.status_code == 201, ok.text
    lark = await _subscribe(client, f"https://open.larksuite.com{HOOK_PATH}abc")
    assert lark.status_code == 201, lark.text


async def test_a_tenant_has_at_most_20_subscriptions(
    api: tuple[httpx.AsyncClient, Gateway],
) -> None:
    client, _ = api
    for i in range(20):
        made = await _subscribe(client, f"https://open.feishu.cn{HOOK_PATH}bot{i}")
        assert made.status_code == 201, made.text
    refused = await _subscribe(client, f"https://open.feishu.cn{HOOK_PATH}bot20")
    assert refused.status_code == 400
    assert "20" in refused.json()["message"] and "delete" in refused.json()["hint"]


# --- delivery --------------------------------------------------------------------------


@dataclass
class Hostile:
    """A local endpoint that redirects, or answers with text of its own."""

    mode: str
    target: str = ""
    port: int = field(default_factory=free_port)
    hits: int = 0
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    def url(self, token: str = "abc") -> str:
        return f"http://127.0.0.1:{self.port}{HOOK_PATH}{token}"

    async def _hook(self, request: Request) -> Response:
        self.hits += 1
        if self.mode == "redirect":
            return RedirectResponse(self.target, status_code=302)
        if self.mode == "feishu-code":
            return JSONResponse({"code": 19021, "msg": LEAK, "data": {"hint": LEAK}})
        return Response(f"<html>{LEAK}</html>", status_code=403, media_type="text/html")

    async def __aenter__(self) -> Hostile:
        app = Starlette(routes=[Route(HOOK_PATH + "{token}", self._hook, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                await self._task  # raises why it could not start
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await self._task


async def _fail_with_alert_to(h: Harness, task_id: str, url: str) -> None:
    await h.submit(task_id, spec(task_id, AlertSubscription(webhook_url=url, alerts=("failed",))))
    await h.command(task_id, Fail(task_id, "boom"))


async def _failures(h: Harness, task_id: str) -> list[AlertFailed]:
    return [a for a in await h.alerts(task_id) if isinstance(a, AlertFailed)]


async def test_a_task_specs_webhook_to_the_metadata_service_is_never_called(dsn: str) -> None:
    async with harness(dsn) as h:
        # The allowed origin is the fake Feishu's; the spec names another local server.
        async with Hostile("feishu-code") as other:
            await _fail_with_alert_to(h, "ssrf-1", other.url())
            await _fail_with_alert_to(h, "ssrf-2", f"http://169.254.169.254{HOOK_PATH}abc")

            async def both_refused() -> bool:
                return bool(await _failures(h, "ssrf-1")) and bool(await _failures(h, "ssrf-2"))

            await h.run_until(both_refused)
            assert other.hits == 0
        for task_id in ("ssrf-1", "ssrf-2"):
            (failed,) = await _failures(h, task_id)
            assert failed.reason.startswith("webhook not allowed")
            assert not failed.retryable
        assert h.fake.received == []


async def test_a_redirect_is_not_followed(dsn: str) -> None:
    async with harness(dsn) as h:
        async with Hostile("redirect", target=h.fake.url("bot-plain")) as hostile:
            config = replace(
                FAST,
                webhooks=WebhookPolicy(
                    (f"http://127.0.0.1:{h.fake.port}", f"http://127.0.0.1:{hostile.port}")
                ),
            )
            await h.new_app(config)
            await _fail_with_alert_to(h, "redir-1", hostile.url())

            async def refused() -> bool:
                return bool(await _failures(h, "redir-1"))

            await h.run_until(refused)
            assert hostile.hits == 1
        (failed,) = await _failures(h, "redir-1")
        assert (failed.code, failed.retryable) == (302, False)
        assert "redirect not followed" in failed.reason
        assert h.fake.received == [], "the redirect's target got nothing"


@pytest.mark.parametrize("mode", ["feishu-code", "html"])
async def test_the_remote_answer_is_never_stored(dsn: str, mode: str) -> None:
    async with harness(dsn) as h:
        async with Hostile(mode) as hostile:
            config = replace(FAST, webhooks=WebhookPolicy((f"http://127.0.0.1:{hostile.port}",)))
            await h.new_app(config)
            await _fail_with_alert_to(h, "leak-1", hostile.url())

            async def refused() -> bool:
                return bool(await _failures(h, "leak-1"))

            await h.run_until(refused)
        (failed,) = await _failures(h, "leak-1")
        assert failed.code == (19021 if mode == "feishu-code" else 403)
        events = await h.store.read_stream("task-leak-1")
        stored = [e.event.model_dump_json() for e in events]
        stored += [str(row) for row in await tables.outbox(h.store.pool)]
        assert not [text for text in stored if LEAK in text]


async def test_failures_to_one_webhook_are_one_event_per_window_with_a_count(dsn: str) -> None:
    """Stopping a group of 60 tasks under a tenant subscription to `stopped`, with the
    bot unreachable past `retry_for_s`: every alert is given up, and the failures
    are one AlertFailed for the window, counting them all."""
    config = replace(FAST, failure_window_s=4 * 3600.0, retry_for_s=3600.0)
    async with harness(dsn, config, serve=False) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "stopped")
        ids = [f"stop-{i:02d}" for i in range(60)]
        for task_id in ids:
            await h.submit(task_id, spec(task_id))
            await h.command(task_id, RequestStop(task_id))

        async def tried_twice() -> bool:
            rows = await tables.outbox(h.store.pool)
            return max((r["attempts"] for r in rows), default=0) >= 2

        await h.run_until(tried_twice)
        h.clock.offset += timedelta(hours=2)  # still down past retry_for_s

        async def all_given_up() -> bool:
            rows = await tables.outbox(h.store.pool)
            return len(rows) == len(ids) and all(r["status"] == "failed" for r in rows)

        await h.run_until(all_given_up)
        # Within the window nothing is appended: the failures are being counted.
        assert [t for t in ids if await _failures(h, t)] == []
        # One request per backoff (the first summary card); the second waited behind it.
        untried = [r["task_id"] for r in await tables.outbox(h.store.pool) if not r["attempts"]]
        assert untried == ids[config.summary_per_card :]
        h.clock.offset += timedelta(hours=4)  # the window closes
        await h.app.step()
        failed = [(t, f) for t in ids for f in await _failures(h, t)]
        assert len(failed) == 1, failed
        task_id, event = failed[0]
        assert task_id == ids[0]
        # Each request and each alert given up behind one counts once.
        assert event.tasks == len(ids) and event.count >= len(ids)
        assert event.reason.startswith("network error") and not event.retryable
        assert "gave up" in event.reason
        await h.app.step()  # recorded once: a later pass appends nothing more
        assert sum([len(await _failures(h, t)) for t in ids]) == 1
