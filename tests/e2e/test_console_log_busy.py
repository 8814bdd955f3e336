"""The console's log box when the log service is busy: in a real headless Chromium,
against a real gateway and log service (Postgres), the tenant's one search slot held.

A search waits `search_wait_s` for a slot, then the log service refuses it with 429
`logs.busy` and Retry-After. The console showed that refusal nowhere (htmx swaps no
4xx answer: the box stayed "Loading lines…"); it is a message in the log box now, the
page kept, with a button that asks again.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from runyard.api.auth import create_token
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.logs import LogStore
from runyard.logs.errors import LogBusy
from runyard.stack.ports import free_port

from tests.e2e.test_console import chromium, shot, signed_in
from tests.integration.test_gateway_routing import log_service
from tests.log_records import log_record
from tests.unit.test_cli import REPO, cli

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: How long the page may take to show what it should (Chromium on a loaded machine).
WAIT_MS = 60_000


@dataclass
class Stack:
    url: str
    token: str
    store: LogStore
    task_id: str


@pytest.fixture
async def stack(dsn: str) -> AsyncIterator[Stack]:
    """A gateway (with its console) on a free port, the log service beside it, member
    alice's token and a task of hers with two lines of output."""
    endpoints: dict[str, str] = {}
    async with log_service(dsn, Path(tempfile.mkdtemp(prefix="runyard-busy-")), endpoints) as logs:
        gateway = await Gateway.connect(dsn, REPO / "infra/config", endpoints=endpoints)
        token = await create_token(gateway.db, "t1", "alice", "member")
        app = create_app(gateway, endpoints)
        server = uvicorn.Server(
            uvicorn.Config(app, port=free_port(), log_level="warning", lifespan="off")
        )
        serving = asyncio.create_task(server.serve())
        for _ in range(1500):  # 30 s at most
            if server.started:
                break
            await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{server.config.port}"
        try:
            submitted = await cli(
                url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json"
            )
            task_id = json.loads(submitted.stdout)["task_id"]
            now = datetime.now(UTC)
            await logs.store.ingest(
                [log_record(now, task_id, f"epoch {n} loss=0.{n}", seq=n) for n in (1, 2)]
            )
            yield Stack(url, token, logs.store, task_id)
        finally:
            server.should_exit = True
            await serving
            await app.state.owners.aclose()
            await gateway.close()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


async def test_a_busy_log_service_is_a_message_in_the_log_box_and_the_page_stays(
    stack: Stack, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack.store.search_wait_s = 0.2  # a search waits this long for a slot, then 429
    monkeypatch.setattr(LogBusy, "retry_after_s", 7)  # its Retry-After: the wait shown
    context, page = await signed_in(browser, stack.url, stack.token)
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold_the_tenants_slot() -> None:
        async with stack.store.searches.taken("t1", None):
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold_the_tenants_slot())
    try:
        await held.wait()
        await page.goto(f"/console/tasks/{stack.task_id}/logs?q=loss")
        busy = page.locator("#log-busy")
        await busy.wait_for(timeout=WAIT_MS)
        said = " ".join((await busy.inner_text()).split())
        assert said == (
            "The log service is busy with other searches of your tenant; try again in 7 s."
        ), said
        # The page is whole: its heading, the search form, the log box around the message.
        assert (await page.locator("h1").inner_text()).startswith("Logs of hello")
        assert await page.locator("form[role=search] input[name=q]").input_value() == "loss"
        assert await page.locator("#log-lines #log-busy").count() == 1
        await shot(page, "logs-busy")
    finally:
        release.set()
        await holder
    await page.click("#log-busy-retry")
    lines = page.locator("#log-lines .line .text")
    await lines.first.wait_for(timeout=WAIT_MS)
    assert [" ".join(t.split()) for t in await lines.all_inner_texts()] == [
        "epoch 1 loss=0.1",
        "epoch 2 loss=0.2",
    ]
    assert await page.locator("#log-busy").count() == 0
    await context.close()
