"""`runyard alerts` against a real gateway (uvicorn on a free port, real Postgres)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runyard.api.auth import create_token
from runyard.cli.main import app
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from typer.testing import CliRunner, Result

from tests.integration.test_gateway_routing import notification_service, serving

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

HOOK = "https://open.feishu.cn/open-apis/bot/v2/hook/feedbeef0000"


@pytest.fixture
async def served(dsn: str) -> AsyncIterator[tuple[str, str]]:
    """A gateway and the notification service over the repo's config, each on a free
    port: (the gateway's url, alice's token)."""
    gateway = await Gateway.connect(dsn, REPO / "infra/config")
    token = await create_token(gateway.db, "t1", "alice", "member")
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    async with (
        notification_service(dsn, REPO / "infra/config", endpoints),
        serving("gateway", app, {}) as url,
    ):
        yield url, token
    await app.state.owners.aclose()
    await gateway.close()


async def cli(url: str, token: str, *args: str, **env: str) -> Result:
    environ = {"RUNYARD_URL": url, "RUNYARD_TOKEN": token, "COLUMNS": "250", **env}
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=environ)


async def test_add_list_remove_a_subscription(served: tuple[str, str]) -> None:
    url, token = served
    added = await cli(
        url, token, "alerts", "add", HOOK, "--alert", "failed", "--alert", "queued:600",
        "--secret-env", "BOT_SECRET", "--json", BOT_SECRET="cli-secret-9",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    sub = json.loads(added.output)
    assert sub["signed"] and sub["alerts"] == ["failed", "queued:600"]

    listed = await cli(url, token, "alerts", "ls")
    assert listed.exit_code == 0 and sub["id"] in listed.output and "****0000" in listed.output
    assert "cli-secret-9" not in added.output + listed.output

    removed = await cli(url, token, "alerts", "rm", sub["id"])
    assert removed.exit_code == 0 and f"deleted {sub['id']}" in removed.output
    again = await cli(url, token, "alerts", "rm", sub["id"])
    assert again.exit_code == 1 and "alerts.subscription_not_found" in again.output
    assert "hint: list them: runyard alerts ls" in again.output


async def test_alerts_may_be_a_comma_list(served: tuple[str, str]) -> None:
    url, token = served
    added = await cli(
        url, token, "alerts", "add", HOOK, "--alert", "failed, hang", "--alert", "stopped",
        "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["alerts"] == ["failed", "hang", "stopped"]


async def test_an_unknown_alert_is_refused(served: tuple[str, str]) -> None:
    url, token = served
    refused = await cli(url, token, "alerts", "add", HOOK, "--alert", "exploded")
    assert refused.exit_code == 1 and "unknown kind" in refused.output
