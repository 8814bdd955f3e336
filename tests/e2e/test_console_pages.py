"""The console's further pages in a real headless Chromium, against one platform for
the whole module (started once: the tests here share it, each with tasks of its own).

The task page's fault tolerance, alerts, runs, rerun with changes, clone and
trace; a task group made, stopped and rerun together; launch-command warnings
while the submit form is filled in; pools with
their node grid, queue and admin node actions; the SRE event tail and health;
the task list live by server-sent events, and polling when there are none.
Every page: another tenant sees nothing of it, POSTs need the CSRF token, axe
finds no serious violation (screenshots as in test_console.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from runyard.api.auth import create_token
from runyard.deployer.stacks import py_spy_binary
from runyard.messaging import KafkaSettings, Topics, ensure_topics

from tests.conftest import fresh_database
from tests.e2e import conftest as e2e
from tests.e2e.conftest import LAYOUT, Platform, running_platform
from tests.e2e.test_console import (
    WAIT_MS,
    base_url,
    chromium,
    shot,
    signed_in,
)
from tests.feishu_fake import FeishuFake

pytestmark = [pytest.mark.slow, pytest.mark.integration]

QUICK = "echo hello from the console"
FEISHU_BOT = "console-alerts"


@pytest.fixture(scope="module")
async def stack(
    postgres_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    """One platform for the module (restarts after at most 0.5 s, alerts allowed to a fake
    Feishu bot), and tokens: `e2e` member carol, `other` member erin, `ops` sre sam (the
    platform's own token is tenant e2e's platform admin)."""
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topics=topics)
    await ensure_topics(kafka.bootstrap, kafka.topics)
    feishu = FeishuFake(bots={FEISHU_BOT: None})
    await feishu.start()
    copy = e2e.copy_config

    def fast_restarts_and_feishu(target: Path, *, grace_s: float = 2.0) -> Path:
        copied = copy(target, grace_s=grace_s)
        runtime = yaml.safe_load((copied / "runtime.yaml").read_text())
        runtime["deployer"] = {**(runtime.get("deployer") or {}), "max_restart_delay_s": 0.5}
        (copied / "runtime.yaml").write_text(yaml.safe_dump(runtime))
        origins = {"webhook_origins": [f"http://127.0.0.1:{feishu.port}"]}
        (copied / "notification.yaml").write_text(yaml.safe_dump(origins))
        return copied

    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(feishu.stop)
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        patch.setattr(e2e, "copy_config", fast_restarts_and_feishu)
        dsn = await stack.enter_async_context(fresh_database(postgres_url))
        home: Path = tmp_path_factory.mktemp("console-pages")
        platform = await stack.enter_async_context(
            running_platform(
                dsn,
                kafka,
                home,
                layout=LAYOUT,
                notification_group_window_s=0.1,
                notification_poll_s=0.1,
            )
        )
        conn = await asyncpg.connect(dsn)
        try:
            tokens = {
                "carol": await create_token(conn, "e2e", "carol", "member"),
                "erin": await create_token(conn, "other", "erin", "member"),
                "sam": await create_token(conn, "ops", "sam", "sre"),
            }
        finally:
            await conn.close()
        yield {"platform": platform, "tokens": tokens, "feishu": feishu}


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


async def submit_as(platform: Platform, token: str, **spec: Any) -> str:
    body = {"pool": "dev-a100", "worker_spec": "1gpu", "image": "bash-only", **spec}
    body.setdefault("name", "console-pages")
    answer = await platform.http.post("/v1/tasks", json=body, headers=bearer(token))
    assert answer.status_code == 201, answer.text
    task_id: str = answer.json()["task_id"]
    return task_id


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def csrf_of(page: Any) -> str:
    token: str = await page.locator("input[name=csrf]").first.get_attribute("value")
    return token


async def test_task_page_fault_tolerance_alerts_runs_rerun_with_changes_clone_and_trace(
    stack: dict[str, Any], browser: Any
) -> None:
    platform: Platform = stack["platform"]
    carol, erin = stack["tokens"]["carol"], stack["tokens"]["erin"]
    task_id = await submit_as(
        platform,
        carol,
        name="console-rerun",
        command=QUICK,
        env="PLAIN=1;SECRET_TOKEN=hunter2",
        creator_only=["SECRET_TOKEN"],
    )
    await platform.wait_status(task_id, "succeeded")
    feishu: FeishuFake = stack["feishu"]
    failing = await submit_as(
        platform,
        carol,
        name="console-alerted",
        command="exit 3",
        alerts=[{"webhook_url": feishu.url(FEISHU_BOT), "alerts": ["failed"]}],
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    base = base_url(platform)

    context, page = await signed_in(browser, base, carol)
    await page.goto(f"/console/tasks/{task_id}")
    await page.wait_for_selector("#ft-counts", timeout=WAIT_MS)
    await page.wait_for_selector("#no-stack-reports")
    await page.wait_for_selector("#no-alerts")
    assert await page.locator("#runs tr[data-run]").count() == 1
    await shot(page, "task-more")

    # Rerun with changes: the form holds the spec's values; only the change is sent.
    await page.click("#rerun-changes-link")
    assert await page.input_value("#r-command") == QUICK
    assert await page.input_value("#r-spec") == "1gpu"
    await shot(page, "rerun-with-changes")
    refused = await context.request.post(
        f"/console/tasks/{task_id}/rerun-with-changes", form={"command": "echo no"}
    )
    assert refused.status == 403  # no CSRF token: nothing done
    await page.fill("#r-command", "echo changed by the rerun")
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.click("#rerun-changes-button")
    await page.wait_for_url(f"**/console/tasks/{task_id}")
    await platform.wait_for(task_id, lambda t: t["run"] == 2 and t["status"] == "succeeded")
    reruns = [e for e in await platform.events(task_id) if e["type"] == "TaskRerunRequested"]
    assert [e["data"]["changes"] for e in reruns] == [["command"]]
    assert reruns[0]["data"]["spec"]["command"] == "echo changed by the rerun"
    assert reruns[0]["actor"] == "user:e2e/carol"
    await page.reload()
    assert await page.locator("#runs tr[data-run]").count() == 2
    assert "echo changed by the rerun" in await page.locator('#runs tr[data-run="2"]').inner_text()

    # Clone: the submit form with the spec, the creator-only value left out, even for
    # its creator.
    await page.click("#clone-link")
    await page.wait_for_selector("#clone-note")
    assert await page.input_value("#f-command") == "echo changed by the rerun"
    assert await page.input_value("#f-env") == "PLAIN=1"
    assert "hunter2" not in await page.content()
    assert "SECRET_TOKEN" in await page.locator("#clone-note").inner_text()
    await shot(page, "clone")
    await page.fill("#f-name", "console-clone")
    await page.click("#submit-button")
    await page.wait_for_url(lambda url: "/console/tasks/" in url and task_id not in url)

    # A task restarted once, then failed: its fault-tolerance log, and the alert sent
    # about it with its channel and result.
    await platform.wait_status(failing, "failed")
    for _ in range(200):
        if any(e["type"] == "AlertDelivered" for e in await platform.events(failing)):
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(f"no alert delivered: {feishu.received}")
    await page.goto(f"/console/tasks/{failing}")
    await page.wait_for_selector('#alerts-sent tr[data-alert-type="AlertDelivered"]')
    await page.wait_for_selector("#ft-log >> text=Restart 1 scheduled after failure")
    assert "delivered" in await page.locator("#alerts-sent").inner_text()
    await shot(page, "task-alerts")

    # The trace of the task: each event under its cause.
    await page.goto(f"/console/tasks/{task_id}/trace")
    await page.wait_for_selector('#trace tr[data-type="TaskSubmitted"]')
    await shot(page, "trace")
    await context.close()

    # Another tenant: every part of the task is a 404.
    context, page = await signed_in(browser, base, erin)
    for path in (
        f"/console/tasks/{task_id}/fault-tolerance",
        f"/console/tasks/{task_id}/alerts",
        f"/console/tasks/{task_id}/rerun-with-changes",
        f"/console/tasks/{task_id}/trace",
        f"/console/submit?clone={task_id}",
    ):
        answer = await context.request.get(path)
        assert answer.status == 404, path
        assert "hunter2" not in await answer.text()
    await context.close()


SWEEP = """
template:
  name: console-sweep
  pool: dev-a100
  worker_spec: 1gpu
  image: bash-only
  command: sleep 60
items:
  - {name: console-sweep-a}
  - {name: console-sweep-b}
"""


async def test_a_group_is_made_stopped_and_rerun_in_the_console(
    stack: dict[str, Any], browser: Any
) -> None:
    """A sweep run by someone who never opens a terminal: the group made from YAML on
    the console's form, its tasks stopped together and run again together."""
    platform: Platform = stack["platform"]
    context, page = await signed_in(browser, base_url(platform), stack["tokens"]["carol"])
    await page.goto("/console/tasks")
    await page.click("nav >> text=Groups")
    await page.click("#new-group-link")
    assert "template:" in await page.input_value("#group-text")  # an example to start from
    await shot(page, "group-new")
    await page.fill("#group-text", SWEEP)
    await page.click("#group-submit")
    await page.wait_for_url(re.compile(r".*/console/groups/[^/]+$"))
    group_id = page.url.rsplit("/", 1)[1]
    tasks = page.locator("#group-tasks tr[data-task-id]")
    assert await tasks.count() == 2
    task_ids = [await tasks.nth(i).get_attribute("data-task-id") for i in range(2)]
    for task_id in task_ids:
        assert task_id is not None
        await platform.wait_status(task_id, "running")
    await shot(page, "group")
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.click("#group-stop-button")
    for task_id in task_ids:
        assert task_id is not None
        await platform.wait_status(task_id, "stopped")
    # the page redraws itself: once both have ended, the rerun button is there
    await page.wait_for_selector("#group-rerun-button", timeout=WAIT_MS)
    assert "stopped 2" in await page.locator("#group-counts").inner_text()
    await page.click("#group-rerun-button")
    await page.wait_for_url(f"**/console/groups/{group_id}")
    for task_id in task_ids:
        assert task_id is not None
        await platform.wait_for(task_id, lambda t: t["run"] == 2 and t["status"] == "running")
    await page.goto("/console/groups")
    assert group_id in await page.locator("#groups").inner_text()
    await page.click(f"#groups >> text={group_id}")
    await page.click("#group-stop-button")  # the second run ends with the test
    await page.wait_for_selector("#group-rerun-button", timeout=WAIT_MS)
    await context.close()
    # Another tenant: no such group.
    context, page = await signed_in(browser, base_url(platform), stack["tokens"]["erin"])
    answer = await context.request.get(f"/console/groups/{group_id}")
    assert answer.status == 404
    await context.close()


async def test_an_admin_makes_and_revokes_a_token_in_the_console(
    stack: dict[str, Any], browser: Any
) -> None:
    """The tokens page in a browser: a token made for a new colleague is shown once and
    signs in; revoked from its row (confirmed), it signs in no more."""
    platform: Platform = stack["platform"]
    base = base_url(platform)
    context, page = await signed_in(browser, base, platform.token)
    await page.goto("/console/tasks")
    await page.click("nav >> text=Tokens")
    await page.fill("#t-user", "dora")
    await page.fill("#t-description", "dora's notebook")
    await page.click("#make-token-button")
    token = (await page.locator("#new-token").inner_text()).strip()
    assert token.startswith("ry_")
    await shot(page, "token-made")
    dora, _ = await signed_in(browser, base, token)
    assert (await dora.request.get("/console/tasks")).status == 200
    await dora.close()
    await page.goto("/console/tokens")
    assert token not in await page.content()
    await shot(page, "tokens")
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    row = page.locator('#tokens tr[data-state="active"]', has_text="dora's notebook")
    await row.locator("button").click()
    await page.wait_for_url("**/console/tokens")
    assert await row.count() == 0
    refused = await browser.new_context(base_url=base)
    answer = await refused.request.post("/console/sign-in", form={"token": token})
    assert answer.status == 401 and "auth.token_revoked" in await answer.text()
    await refused.close()
    await context.close()


async def test_submit_form_warns_about_the_launch_command_while_it_is_typed(
    stack: dict[str, Any], browser: Any
) -> None:
    platform: Platform = stack["platform"]
    context, page = await signed_in(browser, base_url(platform), stack["tokens"]["carol"])
    await page.goto("/console/submit")
    await page.fill("#f-command", "python train.py | tee out.log")
    warning = page.locator('.command-warning[data-code="command.pipe_without_pipefail"]')
    await warning.wait_for(timeout=WAIT_MS)
    await shot(page, "submit-warnings")
    await page.fill("#f-command", "set -o pipefail; python train.py | tee out.log")
    await warning.wait_for(state="detached", timeout=WAIT_MS)
    refused = await context.request.post("/console/submit/lint", form={"command": "x | tee y"})
    assert refused.status == 403  # the CSRF token is needed here too
    await context.close()


async def test_pools_show_nodes_queue_and_only_admins_act_on_nodes(
    stack: dict[str, Any], browser: Any
) -> None:
    platform: Platform = stack["platform"]
    carol, erin = stack["tokens"]["carol"], stack["tokens"]["erin"]
    base = base_url(platform)
    nodes = [f"dev-a100-node-{n}" for n in range(4)]
    running = await submit_as(platform, carol, name="holds-a-gpu", command="sleep 60")
    await platform.wait_status(running, "running")

    # The admin cordons a node from the page, confirmed on a page of its own.
    context, page = await signed_in(browser, base, platform.token)
    await page.click("nav >> text=Pools")
    await page.wait_for_selector('#pools tr[data-pool="dev-a100"]')
    await shot(page, "pools")
    await page.click('#pools tr[data-pool="dev-a100"] a')
    await page.wait_for_selector(f'#node-grid a.gpu-used[href$="{running}"]', timeout=WAIT_MS)
    await page.click(f'li[data-node="{nodes[0]}"] a.cordon')
    await page.wait_for_selector("#node-action-question")
    await shot(page, "node-action")
    refused = await context.request.post(f"/console/pools/dev-a100/nodes/{nodes[0]}/cordon")
    assert refused.status == 403  # no CSRF token
    await page.click("#confirm-node-action")
    await page.wait_for_url("**/console/pools/dev-a100")
    for _ in range(100):
        if await page.locator(f'li[data-node="{nodes[0]}"][data-health="cordoned"]').count():
            break
        await asyncio.sleep(0.3)
        await page.reload()
    else:
        raise AssertionError("the node was not shown cordoned")

    # With every node cordoned a new task waits: its place and why are shown.
    for node in nodes[1:]:
        answer = await platform.http.post(f"/v1/admin/pools/dev-a100/nodes/{node}/cordon")
        assert answer.status_code == 200, answer.text
    waiting = await submit_as(platform, carol, name="waits", command=QUICK)
    await platform.wait_status(waiting, "queued")
    for _ in range(100):
        await page.reload()
        if await page.locator(f'#queue tr[data-task-id="{waiting}"]').count():
            break
        await asyncio.sleep(0.3)
    else:
        raise AssertionError("the waiting task is not in the queue shown")
    assert await page.locator(f'#queue tr[data-task-id="{waiting}"] td').last.inner_text()
    await shot(page, "pool")
    # Marking a node faulty asks for the reason, shown on the node.
    await page.click(f'li[data-node="{nodes[1]}"] a.fault')
    await page.fill("#fault-reason", "ECC errors on GPU 3")
    await page.click("#confirm-node-action")
    await page.wait_for_url("**/console/pools/dev-a100")
    for _ in range(100):
        if await page.locator(f'li[data-node="{nodes[1]}"][data-health="faulty"]').count():
            break
        await asyncio.sleep(0.3)
        await page.reload()
    else:
        raise AssertionError("the node was not shown faulty")
    assert "ECC errors" in await page.locator(f'li[data-node="{nodes[1]}"]').inner_text()
    await context.close()

    # A member sees the pool but may not act on nodes (403, nothing sent).
    context, page = await signed_in(browser, base, carol)
    await page.goto("/console/pools/dev-a100")
    assert await page.locator(".node-actions").count() == 0
    csrf = await csrf_of(page)
    confirm = await context.request.get(f"/console/pools/dev-a100/nodes/{nodes[1]}/uncordon")
    assert confirm.status == 403
    act = await context.request.post(
        f"/console/pools/dev-a100/nodes/{nodes[1]}/uncordon", form={"csrf": csrf}
    )
    assert act.status == 403
    await context.close()

    # Another tenant sees that GPUs and queue places are taken, never by which task.
    context, page = await signed_in(browser, base, erin)
    await page.goto("/console/pools/dev-a100")
    html = await page.content()
    assert running not in html and waiting not in html
    assert await page.locator("#node-grid .gpu-other").count() >= 1
    assert "another tenant's task" in await page.locator("#queue").inner_text()
    await context.close()

    # The pool as it was, for the other tests.
    for task in (running, waiting):
        await platform.http.post(f"/v1/tasks/{task}/stop", headers=bearer(carol))
    answer = await platform.http.post(f"/v1/admin/pools/dev-a100/nodes/{nodes[1]}/heal")
    assert answer.status_code == 200, answer.text
    for node in nodes:
        answer = await platform.http.post(f"/v1/admin/pools/dev-a100/nodes/{node}/uncordon")
        assert answer.status_code in (200, 409), answer.text
    for _ in range(100):
        capacity = (await platform.http.get("/v1/pools/dev-a100/capacity")).json()
        if capacity.get("schedulable_nodes") == len(nodes):
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(f"the pool did not come back: {capacity}")


async def test_sre_pages_tail_events_live_show_health_and_refuse_members(
    stack: dict[str, Any], browser: Any
) -> None:
    platform: Platform = stack["platform"]
    carol, sam = stack["tokens"]["carol"], stack["tokens"]["sam"]
    base = base_url(platform)

    context, page = await signed_in(browser, base, sam)
    await page.click("nav >> text=Event tail")
    await page.fill("input[name=type]", "TaskSubmitted")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(re.compile(r".*/console/sre/events\?.*"))
    await page.evaluate("window.runyardNotReloaded = true")
    task_id = await submit_as(platform, carol, name="tailed", command=QUICK)
    row = f'#tail-rows tr[data-type="TaskSubmitted"] >> text=task-{task_id}'
    await page.wait_for_selector(row, timeout=WAIT_MS)
    assert await page.evaluate("window.runyardNotReloaded") is True
    types = await page.locator("#tail-rows tr[data-type]").evaluate_all(
        "rows => rows.map(r => r.dataset.type)"
    )
    assert set(types) == {"TaskSubmitted"}
    await shot(page, "sre-events")
    # Older pages by position: not live, each event older than the page before.
    await page.goto("/console/sre/events?limit=5")
    newest = await page.locator("#tail-rows tr[data-position]").last.get_attribute("data-position")
    await page.click("a[rel=next]")
    await page.wait_for_url(re.compile(r".*before=.*"))
    older = await page.locator("#tail-rows tr[data-position]").first.get_attribute("data-position")
    assert int(older) < int(newest)
    assert await page.locator("#tail-rows").get_attribute("hx-get") is None
    await page.goto(f"/console/sre/events?task={task_id}")
    streams = await page.locator("#tail-rows tr[data-type] td:nth-child(4)").all_inner_texts()
    assert streams and all(f"task-{task_id}" in s for s in streams)
    await page.click("#tail-rows a.trace-link >> nth=0")
    await page.wait_for_selector('#trace tr[data-type="TaskSubmitted"]')

    await page.click("nav >> text=Health")
    await page.wait_for_selector('#services tr[data-service="gateway"][data-ready="True"]')
    await shot(page, "sre-health")
    await context.close()

    context, page = await signed_in(browser, base, carol)
    assert await page.locator("nav >> text=Event tail").count() == 0
    for path in ("/console/sre/events", "/console/sre/events/rows", "/console/sre/health"):
        answer = await context.request.get(path)
        assert answer.status == 403, path
    await context.close()


async def test_task_list_is_live_by_server_sent_events_and_polls_without_them(
    stack: dict[str, Any], browser: Any
) -> None:
    platform: Platform = stack["platform"]
    carol, erin = stack["tokens"]["carol"], stack["tokens"]["erin"]
    base = base_url(platform)

    context, page = await signed_in(browser, base, carol)
    await page.wait_for_selector('#task-rows[data-live="sse"]', timeout=WAIT_MS)
    polls: list[str] = []  # from now on: the stream is open
    page.on("request", lambda r: polls.append(r.url) if "/console/tasks/rows" in r.url else None)
    await page.evaluate("window.runyardNotReloaded = true")
    task_id = await submit_as(platform, carol, name="streamed", command="sleep 2; echo done")
    row = f'tr[data-task-id="{task_id}"]'
    await page.wait_for_selector(row, timeout=WAIT_MS)
    await platform.wait_status(task_id, "succeeded", within=WAIT_MS / 1000)
    await page.wait_for_selector(f'{row} [data-status="succeeded"]', timeout=10_000)
    assert await page.evaluate("window.runyardNotReloaded") is True
    assert polls == []  # the stream kept it live, no polling
    await shot(page, "tasks-live")
    await context.close()

    # Without EventSource the rows poll, as before.
    context = await browser.new_context(base_url=base)
    await context.add_init_script("delete window.EventSource;")
    page = await context.new_page()
    await page.goto("/")
    await page.fill("#token", carol)
    await page.click("button[type=submit]")
    async with page.expect_request(lambda r: "/console/tasks/rows" in r.url, timeout=WAIT_MS):
        await page.wait_for_url("**/console/tasks")
    await context.close()

    # Another tenant's stream carries none of these rows.
    context, page = await signed_in(browser, base, erin)
    await page.wait_for_selector('#task-rows[data-live="sse"]', timeout=WAIT_MS)
    await asyncio.sleep(1.5)
    assert task_id not in await page.content()
    await context.close()


PYTHON_WAITING = """python -u - <<'EOF'
import time

def wait_for_allreduce():
    time.sleep(100000)

print("step 1 done", flush=True)
wait_for_allreduce()
EOF"""


async def test_capture_stacks_and_clone_with_the_whole_spec(
    stack: dict[str, Any], browser: Any
) -> None:
    platform: Platform = stack["platform"]
    carol, erin = stack["tokens"]["carol"], stack["tokens"]["erin"]
    base = base_url(platform)
    running = await submit_as(
        platform,
        carol,
        name="console-stacks",
        image="pytorch:2.3-cuda12",  # the platform's own Python
        command=PYTHON_WAITING,
        env="PLAIN=1;SECRET_TOKEN=hunter2",
        creator_only=["SECRET_TOKEN"],
        mounts=[{"file_system": "fs-main", "volume": "datasets", "mount_path": "/data"}],
        fault_tolerance={"auto_restart": True, "max_restarts": 2},
    )
    await platform.wait_status(running, "running")

    # Another tenant may not capture (404, nothing sent); no CSRF token: 403.
    context, page = await signed_in(browser, base, erin)
    csrf = await csrf_of(page)
    capture = f"/console/tasks/{running}/stacks/capture"
    assert (await context.request.post(capture, form={"csrf": csrf})).status == 404
    assert (await context.request.get(f"/console/tasks/{running}/clone")).status == 404
    await context.close()

    context, page = await signed_in(browser, base, carol)
    assert (await context.request.post(capture)).status == 403
    await page.goto(f"/console/tasks/{running}")
    await page.wait_for_selector("#capture-stacks-button", timeout=WAIT_MS)
    await shot(page, "task-capture-stacks")
    await page.click("#capture-stacks-button")
    await page.wait_for_load_state()
    if py_spy_binary() is not None:
        await page.wait_for_url(re.compile(rf".*/console/tasks/{running}/stacks/.+"))
        assert "wait_for_allreduce" in await page.content()
        events = await platform.events(running)
        (captured,) = [e for e in events if e["type"] == "StacksCaptured"]
        assert captured["actor"] == "user:e2e/carol"
    else:  # no py-spy here: the service's refusal, with its code
        assert "stacks." in await page.locator(".error").inner_text()

    # Clone with the whole spec: mounts and fault-tolerance options are in the text, the
    # creator-only value is not (its name is listed); a bad spec shows the rules' hint.
    await page.goto(f"/console/tasks/{running}")
    await page.click("#clone-spec-link")
    text = await page.input_value("#clone-spec")
    assert "mount_path: /data" in text and "max_restarts: 2" in text
    assert "hunter2" not in await page.content()
    assert "SECRET_TOKEN" in await page.locator("#clone-hidden").inner_text()
    await shot(page, "clone-spec")
    refused = await context.request.post(f"/console/tasks/{running}/clone", form={"spec": text})
    assert refused.status == 403  # no CSRF token
    await page.fill("#clone-spec", text.replace("worker_spec: 1gpu", "worker_spec: 3gpu"))
    await page.click("#clone-submit")
    await page.wait_for_selector("#clone-error >> text=spec.unknown")
    assert "3gpu" in await page.input_value("#clone-spec")
    await shot(page, "clone-spec-refused")
    edited = text.replace("name: console-stacks", "name: console-stacks-clone")
    await page.fill("#clone-spec", edited)
    await page.click("#clone-submit")
    await page.wait_for_url(lambda url: "/console/tasks/" in url and running not in url)
    clone_id = page.url.rsplit("/", 1)[1]
    answer = await platform.http.get(f"/v1/tasks/{clone_id}", headers=bearer(carol))
    spec = answer.json()["spec"]
    assert spec["mounts"][0]["mount_path"] == "/data"
    assert spec["fault_tolerance"]["max_restarts"] == 2
    assert [v["name"] for v in spec["env"]] == ["PLAIN"]
    await context.close()
    for task in (running, clone_id):
        await platform.http.post(f"/v1/tasks/{task}/stop", headers=bearer(carol))


async def test_sre_audit_time_travel_and_whatif(stack: dict[str, Any], browser: Any) -> None:
    platform: Platform = stack["platform"]
    carol, erin, sam = stack["tokens"]["carol"], stack["tokens"]["erin"], stack["tokens"]["sam"]
    base = base_url(platform)
    task_id = await submit_as(platform, carol, name="audited", command=QUICK)
    await platform.wait_status(task_id, "succeeded")

    context, page = await signed_in(browser, base, sam)
    # The audit: filtered by task and by actor, each event linked to the task as of it.
    await page.click("nav >> text=Audit")
    await page.fill("#a-task", task_id)
    await page.fill("#a-actor", "user:e2e/carol")
    await page.click("#audit-filters button[type=submit]")
    await page.wait_for_selector('#audit-rows tr[data-type="TaskSubmitted"]', timeout=WAIT_MS)
    types = await page.locator("#audit-rows tr[data-type]").evaluate_all(
        "rows => rows.map(r => r.dataset.type)"
    )
    assert types == ["TaskSubmitted"]  # the other events' actors are the services
    await shot(page, "sre-audit")
    await page.goto(f"/console/sre/audit?task={task_id}")
    positions = await page.locator("#audit-rows tr[data-position]").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.position))"
    )
    assert len(positions) > 2 and positions == sorted(positions)
    # (the pool's events that name the task are in its audit too)
    own = await page.locator(f'#audit-rows tr[data-stream="task-{task_id}"]').count()

    # The task as of its first event, then as of now.
    await page.click('#audit-rows tr[data-type="TaskSubmitted"] a.travel-link')
    await page.wait_for_selector("#as-of")
    assert await page.locator("#as-of").get_attribute("data-version") == "1"
    assert await page.locator("#travel-events tr[data-version]").count() == 1
    await shot(page, "sre-time-travel")
    await page.fill("#t-at", str(positions[-1]))
    await page.click("#travel-form button[type=submit]")
    await page.wait_for_selector('#as-of[data-status="succeeded"]')
    assert await page.locator("#travel-events tr[data-version]").count() == own

    # What-if: dev-a100 since the task was submitted, on twice the nodes, beside what
    # happened (the window starts after the pool was registered: the platform is new).
    submitted = (await platform.events(task_id))[0]["occurred_at"]
    await page.click("nav >> text=What-if")
    await page.select_option("#w-pool", "dev-a100")
    await page.fill("#w-from", submitted)
    await page.fill("#w-to", "0m")
    await page.fill("#w-nodes", "8")
    await page.fill("#w-gpus", "8")
    refused = await context.request.post("/console/sre/whatif", form={"from": "1h", "to": "0m"})
    assert refused.status == 403  # no CSRF token
    await page.click("#whatif-button")
    await page.wait_for_selector("#whatif-answer, .error", timeout=WAIT_MS)
    assert await page.locator(".error").count() == 0, await page.locator(".error").inner_text()
    table = page.locator('#whatif-answer table.whatif[data-pool="dev-a100"]')
    await table.wait_for(timeout=WAIT_MS)
    assert "8" in await page.locator("#whatif-answer h3").first.inner_text()
    runs = await table.locator('tr[data-figure="runs"] td').all_inner_texts()
    assert len(runs) == 2 and int(runs[0]) >= 1  # the task's run, at least
    await shot(page, "sre-whatif")
    await context.close()

    # A member (of either tenant) gets none of it.
    for token in (carol, erin):
        context, page = await signed_in(browser, base, token)
        assert await page.locator("nav >> text=Audit").count() == 0
        for path in (
            f"/console/sre/audit?task={task_id}",
            f"/console/sre/time-travel?task={task_id}&at=1",
            "/console/sre/whatif",
        ):
            answer = await context.request.get(path)
            assert answer.status == 403, path
            assert task_id not in await answer.text()
        await context.close()
