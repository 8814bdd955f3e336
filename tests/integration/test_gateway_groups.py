"""Group listing and rerun (HTTP and CLI), and catalogue admin changes that survive a restart."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest
import uvicorn
from runyard.api import auth
from runyard.api.auth import Principal, create_token
from runyard.api.inputs import MAX_BODY_BYTES
from runyard.cli.main import app as cli_app
from runyard.contracts import Metadata
from runyard.contracts.resources import Catalogue
from runyard.contracts.spec import MAX_GROUP_SIZE
from runyard.eventstore import apply_migrations
from runyard.gateway.app import Gateway
from runyard.gateway.console import groups_page
from runyard.gateway.http import create_app
from runyard.stack.ports import free_port
from runyard.submission.service import submission_migrations
from typer.testing import CliRunner, Result

from tests.integration import test_gateway
from tests.integration.test_gateway import BASE, Api, config_dir

REPO = Path(__file__).resolve().parents[2]
api = test_gateway.api  # the same fixture: an in-process gateway and a client per user


async def test_a_group_sent_again_grows_at_most_to_the_group_limit(api: Api) -> None:
    """Items sent with the group_id of a group that has tasks join it, up to MAX_GROUP_SIZE
    tasks in all: past it, the group's read, stop and rerun would miss some of them."""
    body = {"template": BASE, "items": [{}, {}], "group_id": "sweep"}
    assert (await api.call("alice", "POST", "/v1/groups", json=body)).status_code == 201
    before = await api.gateway.db.fetchval("SELECT count(*) FROM events")
    many = {**body, "items": [{}] * (MAX_GROUP_SIZE - 1)}
    refused = await api.call("bob", "POST", "/v1/groups", json=many)
    assert refused.status_code == 400, refused.text[:300]
    error = refused.json()
    assert (error["code"], error["field"]) == ("group.too_large", "group_id"), error
    assert f"has 2 tasks: {MAX_GROUP_SIZE - 1} more" in error["message"], error
    assert "group_id" in error["hint"]
    assert await api.gateway.db.fetchval("SELECT count(*) FROM events") == before
    # Room left: they join it; another tenant's group of that name is its own.
    grown = await api.call("bob", "POST", "/v1/groups", json={**body, "items": [{}] * 3})
    assert (grown.status_code, len(grown.json()["tasks"])) == (201, 5), grown.text
    theirs = await api.call("carol", "POST", "/v1/groups", json=body)
    assert (theirs.status_code, len(theirs.json()["tasks"])) == (201, 2), theirs.text


async def test_two_calls_racing_into_one_group_never_pass_the_group_limit(api: Api) -> None:
    """Two calls that add to one group at once are counted in the transactions that append
    them: one joins, the other is refused with the count the first left, and the group
    holds no more than MAX_GROUP_SIZE tasks."""
    body = {"template": BASE, "items": [{}, {}], "group_id": "race"}
    assert (await api.call("alice", "POST", "/v1/groups", json=body)).status_code == 201
    half = {**body, "items": [{}] * (MAX_GROUP_SIZE // 2)}
    answers = await asyncio.gather(
        api.call("alice", "POST", "/v1/groups", json=half),
        api.call("bob", "POST", "/v1/groups", json=half),
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201, 400], [a.text[:300] for a in answers]
    refused = next(a.json() for a in answers if a.status_code == 400)
    assert (refused["code"], refused["field"]) == ("group.too_large", "group_id"), refused
    has = 2 + MAX_GROUP_SIZE // 2
    assert f"has {has} tasks: {MAX_GROUP_SIZE // 2} more" in refused["message"], refused
    submitted = await api.gateway.db.fetchval(
        "SELECT count(*) FROM events WHERE event_type = 'TaskSubmitted'"
        " AND data->>'tenant' = 't1' AND data->>'group_id' = 'race'"
    )
    assert submitted == has


async def test_groups_made_before_the_group_counts_are_counted_by_the_migration(
    api: Api,
) -> None:
    """A database whose groups were made before the submission service counted them: its
    migration counts their tasks from the log, so they keep to the limit too."""
    body = {"template": BASE, "items": [{}, {}], "group_id": "older"}
    assert (await api.call("alice", "POST", "/v1/groups", json=body)).status_code == 201
    async with api.gateway.db.acquire() as conn:
        await conn.execute("DELETE FROM task_groups")
        await conn.execute(
            "DELETE FROM schema_migrations WHERE component = 'submission' AND version = 2"
        )
        assert await apply_migrations(conn, submission_migrations()) == [
            "submission/0002_task_groups.sql"
        ]
        counted = await conn.fetch("SELECT tenant, group_id, tasks FROM task_groups")
    assert [tuple(r) for r in counted] == [("t1", "older", 2)]
    many = {**body, "items": [{}] * (MAX_GROUP_SIZE - 1)}
    refused = await api.call("alice", "POST", "/v1/groups", json=many)
    assert (refused.status_code, refused.json()["code"]) == (400, "group.too_large")


async def test_list_groups_newest_first_per_tenant(api: Api) -> None:
    first = await api.call("alice", "POST", "/v1/groups", json={"template": BASE, "items": [{}]})
    second = await api.call(
        "bob", "POST", "/v1/groups", json={"template": BASE, "items": [{"name": "x"}, {}]}
    )
    await api.submit()  # a task outside any group is not a group
    await api.call("alice", "POST", f"/v1/groups/{first.json()['group_id']}/stop")
    listed = await api.call("alice", "GET", "/v1/groups")
    assert listed.status_code == 200, listed.json()
    items = listed.json()["items"]
    assert [g["group_id"] for g in items] == [
        second.json()["group_id"],
        first.json()["group_id"],
    ]
    assert [(g["tasks"], g["status_counts"]) for g in items] == [
        (2, {"new": 2}),
        (1, {"stopped": 1}),
    ]
    assert (await api.call("carol", "GET", "/v1/groups")).json() == {
        "items": [],
        "next_cursor": None,
    }
    assert (await api.call("alice", "GET", "/v1/groups?limit=1")).json()["items"] == items[:1]
    bad = await api.call("alice", "GET", "/v1/groups?limit=0")
    assert (bad.status_code, bad.json()["field"]) == (400, "limit")


async def test_groups_page_by_cursor_in_the_api_and_the_console(api: Api) -> None:
    """More groups than a page: each page's `next_cursor` gives the next (newest first,
    every group once, the last page none), in the API and the console (an "Older
    groups" link); a forged cursor is refused."""
    made = []
    for n in range(5):
        group = await api.call(
            "alice", "POST", "/v1/groups", json={"template": BASE, "items": [{"name": f"g{n}"}]}
        )
        assert group.status_code == 201, group.json()
        made.append(group.json()["group_id"])
    newest_first = made[::-1]
    seen, cursor = [], None
    for _ in range(len(made)):  # a page that never ends the list fails, not hangs
        query = f"/v1/groups?limit=2{f'&cursor={cursor}' if cursor else ''}"
        page = (await api.call("alice", "GET", query)).json()
        seen += [g["group_id"] for g in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == newest_first and cursor is None
    forged = await api.call("alice", "GET", "/v1/groups?cursor=bm90LWEtY3Vyc29y")
    assert (forged.status_code, forged.json()["field"]) == (400, "cursor")
    # The console: the newest 50 first; with more, the link to the next page.
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as alice:
        await _console_of(api, alice, "alice")
        page_size = groups_page.GROUPS_LISTED
        groups_page.GROUPS_LISTED = 3
        try:
            first = await alice.get("/console/groups")
            older = re.search(r'href="([^"]+)" rel="next" id="older-groups"', first.text)
            assert older is not None, first.text
            second = await alice.get(html.unescape(older.group(1)))
        finally:
            groups_page.GROUPS_LISTED = page_size
        listed = [re.findall(r'data-group-id="([^"]+)"', p.text) for p in (first, second)]
        assert listed == [newest_first[:3], newest_first[3:]]
        assert 'id="older-groups"' not in second.text and 'id="newest-groups"' in second.text


async def test_rerun_group_reruns_every_finished_task(api: Api) -> None:
    made = await api.call(
        "alice", "POST", "/v1/groups", json={"template": BASE, "items": [{"name": "a"}, {}]}
    )
    group = made.json()
    group_id = group["group_id"]
    none_finished = await api.call("alice", "POST", f"/v1/groups/{group_id}/rerun")
    assert (none_finished.status_code, none_finished.json()["code"]) == (
        409,
        "group.nothing_to_rerun",
    )
    # only one task has finished: only that one runs again
    first = group["tasks"][0]["task_id"]
    await api.call("alice", "POST", f"/v1/tasks/{first}/stop")
    before = await api.event_count()
    refused = await api.call(
        "alice", "POST", f"/v1/groups/{group_id}/rerun", json={"pool": "pool-east"}
    )
    assert (refused.status_code, refused.json()["code"], refused.json()["field"]) == (
        400,
        "rerun.field_not_changeable",
        "pool",
    )
    assert await api.event_count() == before
    rerun = await api.call(
        "alice", "POST", f"/v1/groups/{group_id}/rerun", json={"command": "echo 2"}
    )
    assert rerun.status_code == 200, rerun.json()
    assert rerun.json()["status_counts"] == {"new": 2}
    runs = {t["task_id"]: t["run"] for t in rerun.json()["tasks"]}
    assert runs[first] == 2 and sorted(runs.values()) == [1, 2]
    task = (await api.call("alice", "GET", f"/v1/tasks/{first}")).json()
    assert task["spec"]["command"] == "echo 2"
    hidden = await api.call("carol", "POST", f"/v1/groups/{group_id}/rerun")
    assert (hidden.status_code, hidden.json()["code"]) == (404, "group.not_found")


async def test_catalogue_admin_changes_survive_a_restart(dsn: str, tmp_path: Path) -> None:
    folder = config_dir(tmp_path)
    gateway = await Gateway.connect(dsn, folder)
    admin = await create_token(gateway.db, "t1", "root", "platform_admin")
    member = await create_token(gateway.db, "t1", "alice", "member")
    changes = [
        ("/v1/admin/images", {"name": "new:1", "zones": ["cn-east-1"], "services": ["training"]}),
        ("/v1/admin/images", {"name": "bash-only", "zones": ["cn-north-1"], "services": []}),
        ("/v1/admin/volumes", {"file_system": "fs-east", "volume": "scratch", "zone": "cn-east-1"}),
        ("/v1/admin/public-data", {"zone": "cn-east-1"}),
    ]
    transport = httpx.ASGITransport(app=create_app(gateway))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        for path, body in changes:
            denied = await client.post(
                path, json=body, headers={"Authorization": f"Bearer {member}"}
            )
            assert denied.status_code == 403
            answer = await client.post(
                path, json=body, headers={"Authorization": f"Bearer {admin}"}
            )
            assert answer.status_code == 201, answer.json()
        bad = await client.post(
            "/v1/admin/volumes", json={"volume": "x"}, headers={"Authorization": f"Bearer {admin}"}
        )
        assert (bad.status_code, bad.json()["code"]) == (400, "spec.invalid")
    reader = Principal("t1", "alice", "member")
    live = await gateway.catalogue_view(reader)
    await gateway.close()

    restarted = await Gateway.connect(dsn, folder)  # and its submission service
    try:
        assert await restarted.catalogue_view(reader) == live
        catalogue = Catalogue.model_validate(live)
        assert catalogue.image("new:1") is not None
        assert catalogue.image("bash-only").services == ()  # type: ignore[union-attr]
        assert catalogue.image("pytorch:2.3-cuda12") is not None  # the file still counts
        assert len(catalogue.volumes_named("fs-east", "scratch")) == 1
        assert catalogue.public_data_in("cn-east-1") is not None
    finally:
        await restarted.close()


# --- CLI ------------------------------------------------------------------------


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


async def cli(url: str, token: str, *args: str) -> Result:
    env = {"RUNYARD_URL": url, "RUNYARD_TOKEN": token, "COLUMNS": "250"}
    return await asyncio.to_thread(CliRunner().invoke, cli_app, list(args), env=env)


async def test_cli_group_ls_without_id_and_group_rerun(served: tuple[str, str]) -> None:
    url, token = served
    made = await cli(
        url, token, "group", "create", "-f", str(REPO / "examples/group.yaml"), "--json"
    )
    assert made.exit_code == 0, made.output
    group_id = json.loads(made.stdout)["group_id"]
    listed = await cli(url, token, "group", "ls")
    assert listed.exit_code == 0, listed.output
    assert group_id in listed.stdout
    as_json = json.loads((await cli(url, token, "group", "ls", "--json")).stdout)
    assert [g["group_id"] for g in as_json["items"]] == [group_id]
    early = await cli(url, token, "group", "rerun", group_id)
    assert early.exit_code == 1
    assert "group.nothing_to_rerun" in early.stderr
    assert (await cli(url, token, "group", "stop", group_id)).exit_code == 0
    rerun = await cli(url, token, "group", "rerun", group_id, "--command", "echo 2", "--json")
    assert rerun.exit_code == 0, rerun.output
    tasks = json.loads(rerun.stdout)["tasks"]
    assert {t["run"] for t in tasks} == {2}
    one = await cli(url, token, "group", "ls", group_id)
    assert one.exit_code == 0 and "new" in one.stdout
    shown = await cli(url, token, "group", "show", group_id)
    assert shown.exit_code == 0 and shown.stdout == one.stdout
    missing = await cli(url, token, "group", "show", "no-such-group")
    assert missing.exit_code == 1 and "hint:" in missing.stderr


async def test_cli_group_ls_pages_with_the_next_cursor_on_stderr(served: tuple[str, str]) -> None:
    url, token = served
    made = []
    for _ in range(3):
        group = await cli(
            url, token, "group", "create", "-f", str(REPO / "examples/group.yaml"), "--json"
        )
        assert group.exit_code == 0, group.output
        made.append(json.loads(group.stdout)["group_id"])
    first = await cli(url, token, "group", "ls", "--limit", "2")
    assert first.exit_code == 0, first.output
    assert [g in first.stdout for g in made] == [False, True, True]
    cursor = re.search(r"--cursor (\S+)", first.stderr)
    assert cursor is not None and "--cursor" not in first.stdout, first.output
    rest = await cli(url, token, "group", "ls", "--limit", "2", "--cursor", cursor.group(1))
    assert rest.exit_code == 0, rest.output
    assert [g in rest.stdout for g in made] == [True, False, False]
    assert "--cursor" not in rest.stderr  # the last page
    as_json = json.loads((await cli(url, token, "group", "ls", "--limit", "2", "--json")).stdout)
    assert as_json["next_cursor"] == cursor.group(1)


async def test_cli_reads_a_group_of_another_tenant_with_tenant(
    served: tuple[str, str], dsn: str
) -> None:
    """`group ls ID --tenant` and `group show ID --tenant`: an sre reads the tenant's group
    (without --tenant it looks in its own tenant, which has none of that id)."""
    url, token = served
    made = await cli(
        url, token, "group", "create", "-f", str(REPO / "examples/group.yaml"), "--json"
    )
    assert made.exit_code == 0, made.output
    group_id = json.loads(made.stdout)["group_id"]
    db = json.loads((await cli(url, token, "group", "ls", group_id, "--json")).stdout)
    conn = await asyncpg.connect(dsn)
    try:
        sre = await create_token(conn, "ops", "sam", "sre")
    finally:
        await conn.close()
    for command in ("ls", "show"):
        read = await cli(url, sre, "group", command, group_id, "--tenant", "t1", "--json")
        assert read.exit_code == 0, read.output
        assert json.loads(read.stdout)["tasks"] == db["tasks"]
        own = await cli(url, sre, "group", command, group_id)
        assert own.exit_code == 1 and "group.not_found" in own.stderr, own.output
    refused = await cli(url, token, "group", "show", group_id, "--tenant", "ops")
    assert refused.exit_code == 3 and "auth.other_tenant" in refused.stderr, refused.output


@contextlib.asynccontextmanager
async def write_in_flight(api: Api) -> AsyncIterator[None]:
    """Another tenant's write appended but not committed (a token issued: any event
    takes a position) for as long as the block runs: the task list stops before it."""
    store = api.gateway.store
    conn = await store.pool.acquire()
    in_flight = conn.transaction()
    await in_flight.start()
    try:
        now = await conn.fetchval("SELECT now()")
        _, info = await auth.insert_token(conn, "t2", "someone", "member", now + timedelta(days=1))
        await auth.record_token_issued(store, conn, info, Metadata(actor="test"), now)
        yield
    finally:
        await in_flight.rollback()
        await store.pool.release(conn)


async def answered_after_the_write(api: Api, call: Awaitable[httpx.Response]) -> httpx.Response:
    """`call`'s answer, seen to wait for the write in flight (it comes once that ends)."""
    async with write_in_flight(api):
        answer = asyncio.ensure_future(call)
        # the change is written at once, but the list holds it only after the write
        # in flight: the answer waits for it
        done, _ = await asyncio.wait({answer}, timeout=5)
        assert not done, answer.result().text
    return await answer


async def test_a_group_made_while_another_write_is_in_flight_is_answered_whole(
    api: Api,
) -> None:
    """The task list reads the log in order and stops before a write still in flight
    (any tenant's: a large group takes seconds), so a group made meanwhile was
    answered 404 group.not_found though it was made. Its answer now waits for its
    tasks in the list, and comes whole once the earlier write has ended."""
    body = {"template": BASE, "items": [{}, {}, {}], "group_id": "meanwhile"}
    answer = await answered_after_the_write(api, api.call("alice", "POST", "/v1/groups", json=body))
    assert answer.status_code == 201, answer.text
    assert len(answer.json()["tasks"]) == 3, answer.text


async def test_group_stop_and_rerun_during_another_write_answer_what_they_did(api: Api) -> None:
    """A group's stop and rerun answer from the task list too: during another write
    they showed the statuses from before (tasks still queued after the stop, the old
    run after the rerun). They now wait until the list holds what they wrote."""
    body = {"template": BASE, "items": [{}, {}], "group_id": "changed-meanwhile"}
    made = await api.call("alice", "POST", "/v1/groups", json=body)
    assert made.status_code == 201, made.text
    assert set(made.json()["status_counts"]) <= {"new", "queued"}, made.text
    path = "/v1/groups/changed-meanwhile"
    stopped = await answered_after_the_write(api, api.call("alice", "POST", f"{path}/stop"))
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["status_counts"] == {"stopped": 2}, stopped.text
    rerun = await answered_after_the_write(api, api.call("alice", "POST", f"{path}/rerun"))
    assert rerun.status_code == 200, rerun.text
    assert rerun.json()["status_counts"] == {"new": 2}, rerun.text
    assert [t["run"] for t in rerun.json()["tasks"]] == [2, 2], rerun.text


def _csrf(page: httpx.Response) -> str:
    return page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


async def test_the_console_makes_lists_stops_and_reruns_a_group(api: Api) -> None:
    """Someone who never opens a terminal runs a sweep in the console: makes a group from
    the example the page opens with (a refused item named, nothing written), finds it
    in the list, stops it and reruns it; another tenant finds nothing, an sre reads it
    and changes nothing; every change needs the session's CSRF token."""
    sam = await create_token(api.gateway.db, "t9", "sam", "sre")
    transport = api.http._transport
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://gw") as alice,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as carol,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as sre,
    ):
        for client, token in (
            (alice, api.tokens["alice"]),
            (carol, api.tokens["carol"]),
            (sre, sam),
        ):
            signed = await client.post("/console/sign-in", data={"token": token})
            assert signed.status_code == 303, signed.text
        listed = await alice.get("/console/groups")
        assert listed.status_code == 200 and "No task group yet" in listed.text
        form = await alice.get("/console/new-group")
        assert form.status_code == 200, form.text
        example = html.unescape(form.text.split('name="group"', 1)[1].split(">", 1)[1])
        example = example.split("</textarea>", 1)[0]
        assert "pool: pool-a" in example and "sweep-lr-0.01" in example, example
        csrf = _csrf(form)
        assert (await alice.post("/console/new-group", data={"group": example})).status_code == 403
        before = await api.event_count()
        bad = example.replace("- name: sweep-lr-0.01", "- name: sweep-lr-0.01\n  worker_spec: 3gpu")
        refused = await alice.post("/console/new-group", data={"group": bad, "csrf": csrf})
        assert refused.status_code == 400, refused.text
        assert "spec.unknown" in refused.text and "In item 1 of" in refused.text, refused.text
        assert "3gpu" in refused.text  # the text is kept as typed
        not_yaml = await alice.post("/console/new-group", data={"group": "a: [", "csrf": csrf})
        assert not_yaml.status_code == 400 and "console.group_yaml" in not_yaml.text
        assert await api.event_count() == before
        made = await alice.post("/console/new-group", data={"group": example, "csrf": csrf})
        assert made.status_code == 303, made.text
        url = made.headers["location"]
        group_id = url.rsplit("/", 1)[1]
        page = await alice.get(url)
        assert page.status_code == 200, page.text
        assert "sweep-lr-0.1" in page.text and "sweep-lr-0.01" in page.text
        assert 'id="group-stop-button"' in page.text
        assert 'id="group-rerun-button"' not in page.text  # nothing has ended
        assert group_id in (await alice.get("/console/groups")).text
        # another tenant: no such group; an sre: read only
        assert (await carol.get(url)).status_code == 404
        assert group_id not in (await carol.get("/console/groups")).text
        as_sre = await sre.get(f"{url}?tenant=t1")
        assert as_sre.status_code == 200 and "sweep-lr-0.01" in as_sre.text
        assert "group-stop-button" not in as_sre.text
        assert group_id in (await sre.get("/console/groups?tenant=t1")).text
        sre_stop = await sre.post(f"{url}/stop", data={"csrf": _csrf(as_sre)})
        assert sre_stop.status_code == 403, sre_stop.text
        # nothing has finished yet: a rerun is refused on the group's page
        early = await alice.post(f"{url}/rerun", data={"csrf": csrf})
        assert early.status_code == 409 and "group.nothing_to_rerun" in early.text
        assert (await alice.post(f"{url}/stop")).status_code == 403  # no CSRF token
        stopped = await alice.post(f"{url}/stop", data={"csrf": csrf})
        assert (stopped.status_code, stopped.headers["location"]) == (303, url)
        page = await alice.get(url)
        assert 'data-status="stopped">stopped</span> 2' in page.text, page.text
        assert 'id="group-rerun-button"' in page.text and "group-stop-button" not in page.text
        rerun = await alice.post(f"{url}/rerun", data={"csrf": csrf})
        assert rerun.status_code == 303, rerun.text
        group = (await api.call("alice", "GET", f"/v1/groups/{group_id}")).json()
        assert sorted(t["run"] for t in group["tasks"]) == [2, 2], group
        # a task of the group links to it
        task_page = await alice.get(f"/console/tasks/{group['tasks'][0]['task_id']}")
        assert f'href="/console/groups/{group_id}" id="group-link"' in task_page.text


async def _console_of(api: Api, client: httpx.AsyncClient, who: str) -> str:
    """Sign `client` in as `who`; the session's CSRF token."""
    signed = await client.post("/console/sign-in", data={"token": api.tokens[who]})
    assert signed.status_code == 303, signed.text
    return _csrf(await client.get("/console/new-group"))


async def test_a_group_text_the_api_would_not_take_is_refused_with_its_code(api: Api) -> None:
    """The new-group page reads YAML in the gateway: text nested past reading, a number of
    thousands of digits, or aliases that write out to more than `POST /v1/groups` takes
    (a 60 kB command named 20 times: 1.2 MB) are refused with a code above the text,
    kept as typed, and nothing is written; the same group without the aliases' excess
    is made."""
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as alice:
        csrf = await _console_of(api, alice, "alice")
        example = html.unescape(
            (await alice.get("/console/new-group")).text.split('name="group"', 1)[1]
        )
        example = example.split(">", 1)[1].split("</textarea>", 1)[0]
        command = "python train.py " + "--x 1 " * 10_000
        aliased = example.replace(
            "command: python train.py --lr 0.1", f"command: &long '{command}'"
        ).split("items:", 1)[0]
        before = await api.event_count()
        for text, status, code in (
            ("a: " + "[" * 5000 + "]" * 5000, 400, "console.group_yaml"),
            (
                example.replace("name: sweep\n", "name: sweep\n  priority: 1" + "0" * 5000 + "\n"),
                400,
                "console.group_yaml",
            ),
            (
                aliased + "items:\n" + "".join("- {command: *long}\n" for _ in range(20)),
                413,
                "request.too_large",
            ),
        ):
            refused = await alice.post("/console/new-group", data={"group": text, "csrf": csrf})
            assert refused.status_code == status, refused.text[:2000]
            assert f'class="code">{code}</span>' in refused.text, refused.text[:2000]
            assert html.escape(text[:60]) in refused.text  # kept as typed
        assert await api.event_count() == before
        made = await alice.post(
            "/console/new-group",
            data={"group": aliased + "items:\n- {command: *long}\n- {}\n", "csrf": csrf},
        )
        assert made.status_code == 303, made.text[:2000]


async def test_a_console_form_over_the_body_limit_is_refused_with_a_page(api: Api) -> None:
    """A form posted with more than the gateway takes (1 MiB) is refused before any page
    runs: for the console a page a person reads (the code, what to do, the console's
    security headers), for the API the JSON error; nothing is written."""
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as alice:
        csrf = await _console_of(api, alice, "alice")
        before = await api.event_count()
        refused = await alice.post(
            "/console/new-group", data={"group": "x" * (MAX_BODY_BYTES + 1), "csrf": csrf}
        )
        assert refused.status_code == 413
        assert refused.headers["content-type"].startswith("text/html")
        assert 'class="code">request.too_large</span>' in refused.text, refused.text[:2000]
        assert "split large task groups" in refused.text
        assert refused.headers["x-frame-options"] == "DENY"
        api_refused = await api.call(
            "alice", "POST", "/v1/groups", content=b"x" * (MAX_BODY_BYTES + 1)
        )
        assert api_refused.status_code == 413
        assert api_refused.json()["code"] == "request.too_large"
        assert await api.event_count() == before


async def test_a_rerun_of_a_group_the_caller_may_only_read_is_refused_as_a_stop_is(
    api: Api,
) -> None:
    """An sre, or a platform admin of another tenant, who reads a group and POSTs its
    rerun is told it may not change it (403, the code a stop gets), not that the group
    it just read does not exist; another tenant's member still finds no such group."""
    sam = await create_token(api.gateway.db, "t9", "sam", "sre")
    api.tokens["sam"] = sam
    body = {"template": BASE, "items": [{}], "group_id": "theirs"}
    assert (await api.call("carol", "POST", "/v1/groups", json=body)).status_code == 201
    assert (await api.call("carol", "POST", "/v1/groups/theirs/stop")).status_code == 200
    url = "/console/groups/theirs"
    transport = api.http._transport
    for who, status in (("sam", 403), ("admin", 403), ("alice", 404)):
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            csrf = await _console_of(api, client, who)
            stop = await client.post(f"{url}/stop", data={"csrf": csrf})
            rerun = await client.post(f"{url}/rerun", data={"csrf": csrf})
            assert (stop.status_code, rerun.status_code) == (status, status), rerun.text[:3000]
            codes = [re.findall(r'class="code">([^<]+)<', a.text) for a in (stop, rerun)]
            assert codes[0] == codes[1] and len(codes[0]) == 1, codes
    group = (await api.call("carol", "GET", "/v1/groups/theirs")).json()
    assert [t["run"] for t in group["tasks"]] == [1], group


def _live_url(page: httpx.Response) -> str:
    return html.unescape(page.text.split('id="group-live" hx-get="', 1)[1].split('"', 1)[0])


async def test_a_group_page_polled_while_nothing_changed_is_not_drawn_again(api: Api) -> None:
    """The live part of a group's page is its every task's row (1000 for a large
    sweep): a poll while none changed is a 204 (htmx keeps what it shows), a poll after
    a change draws the rows again, with what a next poll is compared to."""
    body = {"template": BASE, "items": [{}] * 30, "group_id": "poll"}
    assert (await api.call("alice", "POST", "/v1/groups", json=body)).status_code == 201
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as alice:
        await _console_of(api, alice, "alice")
        page = await alice.get("/console/groups/poll")
        assert page.status_code == 200, page.text
        url = _live_url(page)
        polled = await alice.get(url)
        if polled.status_code == 200:  # the minute the rows' ages count in turned meanwhile
            url = _live_url(polled)
            polled = await alice.get(url)
        assert (polled.status_code, polled.text) == (204, ""), polled.text[:2000]
        assert (await api.call("alice", "POST", "/v1/groups/poll/stop")).status_code == 200
        changed = await alice.get(url)
        assert changed.status_code == 200, changed.text[:2000]
        assert 'data-status="stopped">stopped</span> 30' in changed.text, changed.text[:2000]
        again = await alice.get(_live_url(changed))
        if again.status_code == 200:
            again = await alice.get(_live_url(again))
        assert again.status_code == 204


async def test_an_sre_goes_back_from_a_group_to_the_groups_of_its_tenant(api: Api) -> None:
    """An sre opens another tenant's group from that tenant's list (`?tenant=`): the
    page's way back is to that list, not to the sre's own tenant's (with none of them)."""
    api.tokens["sam"] = await create_token(api.gateway.db, "t9", "sam", "sre")
    body = {"template": BASE, "items": [{}], "group_id": "theirs"}
    assert (await api.call("carol", "POST", "/v1/groups", json=body)).status_code == 201
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as sam:
        await _console_of(api, sam, "sam")
        listed = await sam.get("/console/groups?tenant=t2")
        assert 'href="/console/groups/theirs?tenant=t2"' in listed.text, listed.text
        page = await sam.get("/console/groups/theirs?tenant=t2")
        assert page.status_code == 200, page.text
        back = page.text.split('id="groups-link"', 1)[0].rsplit("<a ", 1)[1]
        assert back == 'href="/console/groups?tenant=t2" ', back
