"""The web console in a real headless Chromium (Playwright) against the whole platform.

Debian's Chromium (`/usr/bin/chromium`; `.ci/run` installs it) is driven through
Playwright's async API in the test's own event loop, where the platform's
services run too. Without Chromium the tests are skipped, saying so.

Screenshots of the pages land in RUNYARD_CONSOLE_SHOTS (default
`build/console-screenshots`), kept by CI as artifacts; each page shot is also
checked for accessibility with axe-core (axe-playwright-python's copy).
The tests share one platform and one browser (each test has tasks, users and
browser contexts of its own).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from runyard.api.auth import create_token

from tests.e2e.conftest import REPO, Platform, SharedPlatform, platform_for_test

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SHARED_PLATFORM = True

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(os.environ.get("RUNYARD_CONSOLE_SHOTS", REPO / "build/console-screenshots"))
#: How long a page may take to show what the platform did (polls every 2 s).
WAIT_MS = 60_000

if not CHROMIUM.exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does it)",
        allow_module_level=True,
    )
async_api = pytest.importorskip("playwright.async_api")
axe = pytest.importorskip("axe_playwright_python.async_playwright")


@pytest.fixture
async def platform(
    shared_platform: SharedPlatform, request: pytest.FixtureRequest
) -> AsyncIterator[Platform]:
    async with platform_for_test(shared_platform, request) as running:
        yield running


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, driven by Playwright; closed on the way out."""
    async with async_api.async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


async def member_token(dsn: str, tenant: str, user: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return await create_token(conn, tenant, user, "member")
    finally:
        await conn.close()


async def signed_in(browser: Any, base: str, token: str) -> tuple[Any, Any]:
    """A new browser context (its own cookies) signed in with `token`."""
    context = await browser.new_context(base_url=base)
    page = await context.new_page()
    await page.goto("/")
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/console/tasks")
    return context, page


async def shot(page: Any, name: str) -> None:
    """A screenshot of the page, and its accessibility check (axe-core, run in the page):
    no serious or critical violation."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    results = await axe.Axe().run(page)
    serious = [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']]}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert serious == [], f"{name}: {serious}"


def base_url(platform: Platform) -> str:
    return str(platform.http.base_url).rstrip("/")


async def test_sign_in_submit_watch_live_then_stage_chart_logs_and_rerun(
    platform: Platform, browser: Any
) -> None:
    base = base_url(platform)
    alice = await member_token(platform.ctx.dsn, "e2e", "carol")

    # A token the gateway does not know: a clear refusal, no session.
    context = await browser.new_context(base_url=base)
    page = await context.new_page()
    answer = await page.goto("/")
    assert answer.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    await page.fill("#token", "not-a-token")
    await page.click("button[type=submit]")
    error = page.locator("#sign-in-error")
    await error.wait_for()
    assert "not accepted" in await error.inner_text()
    assert await context.cookies() == []
    await shot(page, "sign-in-refused")
    await context.close()

    context, page = await signed_in(browser, base, alice)
    (cookie,) = await context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["value"] != alice  # an opaque session id, never the token

    # The submit form refuses with the API's code and hint, then accepts.
    await page.click("text=Submit a task")
    await page.fill("#f-name", "console-hello")
    await page.select_option("#f-pool", "dev-a100")
    await page.fill("#f-spec", "no-such-spec")
    await page.select_option("#f-image", "bash-only")
    await page.fill("#f-command", "echo hello from the console; sleep 5; echo done")
    await page.click("#submit-button")
    refusal = page.locator("#submit-error")
    await refusal.wait_for()
    assert "worker_spec" in await refusal.inner_text()
    await shot(page, "submit-refused")
    await page.fill("#f-spec", "1gpu")
    await page.click("#submit-button")
    await page.wait_for_url(re.compile(r".*/console/tasks/[^/]+$"))
    task_id = page.url.rsplit("/", 1)[1]
    # A second tab follows the task's log while it runs.
    tail = await context.new_page()
    await tail.goto(f"/console/tasks/{task_id}/logs?follow=1")
    await tail.evaluate("window.runyardNotReloaded = true")

    # The list shows it go to running and succeeded, with no reload.
    await page.click("nav >> text=Tasks")
    await page.wait_for_url("**/console/tasks")
    await page.evaluate("window.runyardNotReloaded = true")
    row = f'tr[data-task-id="{task_id}"]'
    await page.wait_for_selector(f'{row} [data-status="running"]', timeout=WAIT_MS)
    await shot(page, "tasks-running")
    await page.wait_for_selector(f'{row} [data-status="succeeded"]', timeout=WAIT_MS)
    assert await page.evaluate("window.runyardNotReloaded") is True
    await shot(page, "tasks")
    # The search box: the short id the row shows lists the task, its whole id opens it.
    short = (await page.locator(f"{row} .id").inner_text()).strip()
    await page.fill("form.filters input[name=q]", short)
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(re.compile(r".*/console/tasks\?.*q="))
    await page.wait_for_selector(row)
    await page.fill("form.filters input[name=q]", f" {task_id.upper()} ")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(f"**/console/tasks/{task_id}")
    await page.wait_for_selector("#stage-chart")
    await page.click("nav >> text=Tasks")
    await page.wait_for_url("**/console/tasks")
    await tail.wait_for_selector("#log-lines >> text=done", timeout=WAIT_MS)
    assert await tail.evaluate("window.runyardNotReloaded") is True
    assert await tail.locator("#log-lines >> text=hello from the console").count() == 1
    await tail.close()

    # The task page: the stage chart, the events with their actor, then the logs.
    await page.click(f"{row} a")
    await page.wait_for_selector("#stage-chart")
    stages = await page.locator("#stage-chart g[data-stage]").count()
    assert stages == 4
    await page.wait_for_selector("table.events >> text=TaskSubmitted")
    assert await page.locator("table.events >> text=user:e2e/carol").count() >= 1
    when = page.locator("table.events time").first  # to the second, in UTC
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", await when.inner_text())
    exact = await when.get_attribute("datetime")
    assert exact and "T" in exact and await when.get_attribute("title") == exact
    await shot(page, "task")
    await page.click("#logs-link")
    await page.wait_for_selector("#log-lines >> text=hello from the console", timeout=WAIT_MS)
    await page.fill("input[name=q]", "hello")
    await page.click("form.filters button[type=submit]")
    mark = page.locator("#log-lines mark")
    await mark.first.wait_for(timeout=WAIT_MS)
    assert (await mark.first.inner_text()).lower() == "hello"
    await shot(page, "logs")
    # Export the matching lines, watch its progress, download the file.
    await page.click("#export-button")
    await page.wait_for_selector("#export-download", timeout=WAIT_MS)
    await shot(page, "export")
    async with page.expect_download() as downloading:
        await page.click("#export-download")
    exported = Path(await (await downloading.value).path()).read_text()
    assert "hello from the console" in exported and "done" not in exported
    # The time filter: from a minute before the task, its lines; from far later, none.
    await page.goto(f"/console/tasks/{task_id}/logs")
    await page.fill("input[name=since]", "2000-01-01T00:00")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_selector("#log-lines >> text=hello from the console", timeout=WAIT_MS)
    await page.fill("input[name=since]", "2999-01-01T00:00")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_selector("#no-lines", timeout=WAIT_MS)
    assert "since=2999-01-01T00%3A00" in page.url

    # Rerun, then stop, from the page, each confirmed; both are the signed-in user's.
    await page.goto(f"/console/tasks/{task_id}")
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.click("#rerun-button")
    await page.wait_for_url(f"**/console/tasks/{task_id}")
    await page.click("#stop-button", timeout=WAIT_MS)  # shown while the rerun runs
    await page.wait_for_selector('#task-status[data-status="stopped"]', timeout=WAIT_MS)
    actors = {e["type"]: e["actor"] for e in await platform.events(task_id)}
    assert actors["TaskRerunRequested"] == actors["TaskStopRequested"] == "user:e2e/carol"
    await context.close()


async def test_failed_task_shows_its_first_error_tenants_see_only_theirs_csrf_needed(
    platform: Platform, browser: Any
) -> None:
    base = base_url(platform)
    failing = "echo starting; python3 -c \"raise RuntimeError('injected console failure')\""
    created = await platform.submit(name="tenant-one", command=failing)
    task_id = created["task_id"]
    await platform.wait_status(task_id, "failed")
    owner = await member_token(platform.ctx.dsn, "e2e", "dave")
    stranger = await member_token(platform.ctx.dsn, "other", "erin")

    context, page = await signed_in(browser, base, owner)
    await page.click(f'tr[data-task-id="{task_id}"] a')
    first_error = page.locator("#first-error")
    await first_error.wait_for(timeout=WAIT_MS)
    assert "injected console failure" in await first_error.inner_text()
    await shot(page, "task-failed")
    # A change without the session's CSRF token is refused before anything is done.
    refused = await context.request.post(f"/console/tasks/{task_id}/rerun", form={})
    assert refused.status == 403
    wrong = await context.request.post(
        f"/console/tasks/{task_id}/rerun", form={"csrf": "not-the-token"}
    )
    assert wrong.status == 403
    assert [e for e in await platform.events(task_id) if e["type"] == "TaskRerunRequested"] == []
    await context.close()

    context, page = await signed_in(browser, base, stranger)
    assert await page.locator(f'tr[data-task-id="{task_id}"]').count() == 0
    assert "No tasks match" in await page.locator("#task-rows").inner_text()
    answer = await page.goto(f"/console/tasks/{task_id}")
    assert answer.status == 404
    logs = await page.goto(f"/console/tasks/{task_id}/logs")
    assert logs.status == 404
    await shot(page, "other-tenant-404")
    await context.close()
