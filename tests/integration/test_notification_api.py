"""The alert subscription API (`/v1/alert-subscriptions`) on the gateway, and its use.

A subscription made through the API reaches the notification service: its
secret is in the secret store (never answered), and its alerts are signed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app

from tests.feishu_fake import FeishuFake
from tests.integration.test_gateway import config_dir
from tests.integration.test_gateway_routing import notification_service

pytestmark = pytest.mark.integration

HOOK = "https://open.feishu.cn/open-apis/bot/v2/hook/0123456789abcdef"


class Api:
    def __init__(self, gateway: Gateway, http: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        self.gateway, self.http, self.tokens = gateway, http, tokens

    async def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.request(method, path, headers=headers, **kw)


@pytest.fixture
async def api(dsn: str, tmp_path: Path) -> AsyncIterator[Api]:
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "carol": await create_token(gateway.db, "t2", "carol", "member"),
    }
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    transport = httpx.ASGITransport(app=app)
    async with (
        notification_service(dsn, gateway.config_dir, endpoints),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        yield Api(gateway, client, tokens)
    await app.state.owners.aclose()
    await gateway.close()


class Lines(logging.Handler):
    """Every log line written while it is installed (tests run with `-p no:logging`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_create_list_delete_never_shows_the_secret(api: Api) -> None:
    logs, root = Lines(), logging.getLogger()
    root.addHandler(logs)
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        await _create_list_delete(api, logs)
    finally:
        root.removeHandler(logs)
        root.setLevel(level)


async def _create_list_delete(api: Api, logs: Lines) -> None:
    body = {"webhook_url": HOOK, "alerts": ["failed", "queued:900"], "secret": "top-secret-42"}
    created = await api.call("alice", "POST", "/v1/alert-subscriptions", json=body)
    assert created.status_code == 201, created.text
    sub = created.json()
    assert sub["id"].startswith("sub-") and sub["signed"] is True
    assert sub["alerts"] == ["failed", "queued:900"]
    assert sub["webhook_url"].endswith("/****cdef")

    listed = await api.call("alice", "GET", "/v1/alert-subscriptions")
    assert [s["id"] for s in listed.json()["items"]] == [sub["id"]]
    other = await api.call("carol", "GET", "/v1/alert-subscriptions")
    assert other.json()["items"] == []
    assert "top-secret-42" not in created.text + listed.text + "\n".join(logs.lines)
    stored = await api.gateway.db.fetchval(
        "SELECT value FROM secrets WHERE tenant = 't1' AND ref = $1", sub["secret_ref"]
    )
    assert stored == "top-secret-42"

    path = f"/v1/alert-subscriptions/{sub['id']}"
    assert (await api.call("carol", "DELETE", path)).status_code == 404
    gone = await api.call("alice", "DELETE", path)
    assert gone.json() == {"id": sub["id"], "deleted": True}
    assert (await api.call("alice", "GET", "/v1/alert-subscriptions")).json()["items"] == []
    assert await api.gateway.db.fetchval("SELECT count(*) FROM secrets") == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"webhook_url": "not a url"}, "webhook_url"),
        ({"webhook_url": HOOK, "alerts": ["exploded"]}, "alerts"),
        ({"webhook_url": HOOK, "alerts": ["failed:10"]}, "alerts"),
        ({"webhook_url": HOOK, "queued_after_s": 0}, "queued_after_s"),
    ],
)
async def test_bad_subscriptions_are_refused_with_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    answer = await api.call("alice", "POST", "/v1/alert-subscriptions", json=body)
    assert answer.status_code == 400
    assert (
        answer.json()["field"] == field and answer.json()["code"] == "alerts.invalid_subscription"
    )


async def test_a_bad_queued_threshold_says_what_a_threshold_is(api: Api) -> None:
    for alert in ("queued:-5", "queued:abc", "queued:inf", "queued:nan"):
        body = {"webhook_url": HOOK, "alerts": [alert]}
        answer = await api.call("alice", "POST", "/v1/alert-subscriptions", json=body)
        assert answer.status_code == 400, alert
        assert "is not a positive number of seconds" in answer.json()["message"], alert
    other = {"webhook_url": HOOK, "alerts": ["failed:10"]}
    answer = await api.call("alice", "POST", "/v1/alert-subscriptions", json=other)
    assert "only `queued:<seconds>` takes a threshold" in answer.json()["message"]


async def test_the_console_lists_adds_and_removes_the_tenants_bots(api: Api) -> None:
    """Someone who never opens a terminal subscribes the team's bot in the console: a
    refusal keeps the form (never the secret), the secret is never shown, another
    tenant neither sees nor removes it, every change needs the session's CSRF token."""
    transport = api.http._transport
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://gw") as alice,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as carol,
    ):
        for client, who in ((alice, "alice"), (carol, "carol")):
            signed = await client.post("/console/sign-in", data={"token": api.tokens[who]})
            assert signed.status_code == 303
        page = await alice.get("/console/alerts")
        assert page.status_code == 200 and "No bot is subscribed" in page.text
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        form = {"webhook_url": HOOK, "alerts": "failed, queued:900", "secret": "top-secret-42"}
        assert (await alice.post("/console/alerts", data=form)).status_code == 403
        bad = {**form, "csrf": csrf, "webhook_url": "http://127.0.0.1/open-apis/bot/v2/hook/x"}
        refused = await alice.post("/console/alerts", data=bad)
        assert refused.status_code == 400 and "alerts.invalid_subscription" in refused.text
        assert 'value="http://127.0.0.1/open-apis/bot/v2/hook/x"' in refused.text
        assert "top-secret-42" not in refused.text
        added = await alice.post("/console/alerts", data={**form, "csrf": csrf})
        assert (added.status_code, added.headers["location"]) == (303, "/console/alerts")
        listed = (await alice.get("/console/alerts")).text
        assert "hook/****cdef" in listed and "failed, queued:900" in listed
        assert "top-secret-42" not in listed and HOOK not in listed
        [sub] = (await api.call("alice", "GET", "/v1/alert-subscriptions")).json()["items"]
        assert sub["signed"] is True and sub["id"] in listed
        other = await carol.get("/console/alerts")
        assert sub["id"] not in other.text
        carol_csrf = other.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        gone = f"/console/alerts/{sub['id']}/delete"
        assert (await carol.post(gone, data={"csrf": carol_csrf})).status_code == 404
        assert (await alice.post(gone)).status_code == 403  # no CSRF token
        assert (await alice.post(gone, data={"csrf": csrf})).status_code == 303
        assert (await api.call("alice", "GET", "/v1/alert-subscriptions")).json()["items"] == []


async def test_no_token_no_subscriptions(api: Api) -> None:
    answer = await api.http.get("/v1/alert-subscriptions")
    assert answer.status_code == 401


async def test_a_subscription_made_through_the_api_signs_its_alerts(api: Api) -> None:
    from runyard.contracts.task_events import AlertDelivered
    from runyard.domain import Fail

    from tests.integration.test_notification import FAST, Clock, Harness, allowing, spec

    fake = FeishuFake(bots={"team": "team-secret"})
    await fake.start()
    try:
        body = {"webhook_url": fake.url("team"), "alerts": ["failed"], "secret": "team-secret"}
        refused = await api.call("alice", "POST", "/v1/alert-subscriptions", json=body)
        assert refused.status_code == 400, "a local URL is not a Feishu bot's"
        # The operators allow it (a self-hosted Feishu) in the gateway's config folder.
        (api.gateway.config_dir / "notification.yaml").write_text(
            f"webhook_origins: ['http://127.0.0.1:{fake.port}']\n"
        )
        assert (await api.call("alice", "POST", "/v1/alert-subscriptions", json=body)).is_success
        h = Harness(api.gateway.store, fake, Clock(), allowing(FAST, fake))
        app = await h.new_app()
        try:
            await h.submit("api-1", spec("via-api"))
            await h.command("api-1", Fail("api-1", "boom"))

            async def delivered() -> bool:
                return any(isinstance(a, AlertDelivered) for a in await h.alerts("api-1"))

            await h.run_until(delivered)
        finally:
            await app.close()
        assert [r.code for r in fake.received] == [0]
        events = await api.call("alice", "GET", "/v1/tasks/api-1/events")
        assert "AlertDelivered" in [e["type"] for e in events.json()]
    finally:
        await fake.stop()
