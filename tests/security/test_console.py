"""The web console's security over HTTP (no browser): the session cookie, CSRF and
origin checks, headers, tenants and creator-only masking on every page and fragment.

One in-process gateway and a log service on a real Postgres (the `api` fixture
of tests/integration/test_gateway.py); the browser tests are
tests/e2e/test_console.py.
"""

from __future__ import annotations

import contextlib
import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.gateway.app import Gateway
from runyard.gateway.console.sessions import COOKIE, PostgresSessions, session_key
from runyard.gateway.http import create_app

from tests.integration import test_gateway
from tests.integration.test_gateway import BASE, Api

api = test_gateway.api  # the same fixture: an in-process gateway and a client per user

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-console-value"


@contextlib.asynccontextmanager
async def sign_in(api: Api, who: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same app with `who`'s session cookie (and no bearer token)."""
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as client:
        answer = await client.post("/console/sign-in", data={"token": api.tokens[who]})
        assert answer.status_code == 303, answer.text
        yield client


async def csrf_of(client: httpx.AsyncClient) -> str:
    page = (await client.get("/console/submit")).text
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


async def created_task(api: Api, **changes: Any) -> str:
    answer = await api.submit("alice", **changes)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["task_id"])


async def test_sign_in_sets_an_opaque_strict_http_only_cookie_and_the_headers(api: Api) -> None:
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as client:
        refused = await client.post("/console/sign-in", data={"token": "nope"})
        assert refused.status_code == 401
        assert "set-cookie" not in refused.headers
        assert "auth.invalid_token" in refused.text
        answer = await client.post("/console/sign-in", data={"token": api.tokens["alice"]})
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert api.tokens["alice"] not in cookie
        page = await client.get("/console/tasks")
        assert page.status_code == 200 and "alice" in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["cache-control"] == "no-store"
        assert api.tokens["alice"] not in page.text
        # The JSON API is left as it was.
        assert "content-security-policy" not in (await client.get("/healthz")).headers


async def test_a_link_to_a_page_signs_in_then_opens_it_and_never_leaves_the_console(
    api: Api,
) -> None:
    """An alert card's link (a task page) while signed out: the sign-in page, then that
    page; a `next` of another site, or not the console's, goes to the task list."""
    task_id = await created_task(api)
    page = f"/console/tasks/{task_id}?tab=events"
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as client:
        asked = await client.get(page)
        assert asked.status_code == 303
        sign_in_at = asked.headers["location"]
        assert sign_in_at == "/console/sign-in?" + urlencode({"next": page})
        form = (await client.get(sign_in_at)).text
        assert f'name="next" value="{html.escape(page)}"' in form
        refused = await client.post("/console/sign-in", data={"token": "nope", "next": page})
        assert f'name="next" value="{html.escape(page)}"' in refused.text  # kept for a retry
        token = api.tokens["alice"]
        signed = await client.post("/console/sign-in", data={"token": token, "next": page})
        assert (signed.status_code, signed.headers["location"]) == (303, page)
        assert (await client.get(page)).status_code == 200
        for elsewhere in (
            "https://evil.example/console/tasks",
            "//evil.example/console/tasks",
            "/\\evil.example/console/tasks",
            "/v1/tasks",
            "javascript:alert(1)",
            "/console/tasks\r\nSet-Cookie: x=1",
        ):
            again = await client.post("/console/sign-in", data={"token": token, "next": elsewhere})
            assert (again.status_code, again.headers["location"]) == (303, "/console/tasks")
            shown = (await client.get("/console/sign-in", params={"next": elsewhere})).text
            assert 'name="next"' not in shown


async def test_the_event_tail_names_a_mistyped_event_type(api: Api) -> None:
    """A type no event has is said so on the tail, with the nearest known one (as the
    audit says it), not shown as an empty, quiet log."""
    task_id = await created_task(api)
    async with sign_in(api, "admin") as client:  # platform_admin reads the tail
        typo = await client.get("/console/sre/events", params={"type": "TaskSubmited"})
        assert typo.status_code == 400
        assert "audit.unknown_type" in typo.text and "did you mean TaskSubmitted?" in typo.text
        found = await client.get("/console/sre/events", params={"type": "TaskSubmitted"})
        assert found.status_code == 200 and task_id in found.text


async def test_the_task_list_refuses_a_status_no_task_has(api: Api) -> None:
    """A status typed into the list's address is refused as the API refuses it, naming
    the statuses, not shown as an empty list."""
    task_id = await created_task(api)
    async with sign_in(api, "alice") as client:
        for path in ("/console/tasks", "/console/tasks/rows", "/console/tasks/stream"):
            typo = await client.get(path, params={"status": "bogus"})
            assert typo.status_code == 400, (path, typo.text)
            assert "is not a task status" in typo.text and "succeeded" in typo.text
        status = (await api.call("alice", "GET", f"/v1/tasks/{task_id}")).json()["status"]
        found = await client.get("/console/tasks", params={"status": status})
        assert found.status_code == 200 and task_id in found.text


async def test_numbers_typed_into_an_address_are_pages_not_server_errors(api: Api) -> None:
    """A position past a bigint, or digits Python reads but the database cannot (`²`),
    in a page's address: the page (read as the end of the log, or left out), never a
    500 or the API's JSON."""
    task_id = await created_task(api)
    huge = "9" * 30
    async with sign_in(api, "admin") as client:
        for path, params in (
            (f"/console/tasks/{task_id}/events", {"after": huge}),
            (f"/console/tasks/{task_id}/events", {"after": "²"}),
            ("/console/sre/events", {"before": huge}),
            ("/console/sre/events", {"before": "²", "limit": "²"}),
            ("/console/sre/events", {"limit": huge}),
            ("/console/sre/audit", {"limit": "²"}),
        ):
            page = await client.get(path, params=params)
            assert page.status_code == 200, (path, params, page.text[:300])
            assert page.headers["content-type"].startswith("text/html"), (path, params)


async def test_a_task_id_in_the_search_box_opens_the_task_for_its_tenant_only(api: Api) -> None:
    """Someone with a task id (an alert card's Task field, the CLI's output) pastes it
    in the task list's search box: the task opens. Another tenant's id finds nothing,
    as a name no task has."""
    task_id = await created_task(api)
    async with sign_in(api, "alice") as client:
        found = await client.get("/console/tasks", params={"q": f" {task_id.upper()} "})
        assert (found.status_code, found.headers["location"]) == (303, f"/console/tasks/{task_id}")
        named = await client.get("/console/tasks", params={"q": "hello"})  # names still search
        assert named.status_code == 200 and task_id in named.text
    async with sign_in(api, "carol") as client:  # tenant t2
        other = await client.get("/console/tasks", params={"q": task_id})
        assert other.status_code == 200 and "No tasks match." in other.text


async def test_a_short_id_in_the_search_box_finds_the_task_for_its_tenant_only(
    api: Api,
) -> None:
    """The list shows a task's short id (its last 8 characters); typed in the search box
    (6 or more hex digits of an id's start or end, up to the whole id), it finds the
    task. The short id tells apart tasks of the same moment (their ids start alike).
    Another tenant's tasks are never found, whatever of their id is typed."""
    task_id = await created_task(api)
    answer = await api.submit("carol")  # tenant t2, submitted in the same moment
    assert answer.status_code == 201, answer.text
    theirs = str(answer.json()["task_id"])
    sibling = await created_task(api)  # alice's too, its id starting as task_id's
    async with sign_in(api, "alice") as client:
        listed = (await client.get("/console/tasks")).text
        assert f'<span class="id">{task_id[-8:]}</span>' in listed
        for typed in (task_id[-8:], f" {task_id[-6:].upper()} "):
            found = await client.get("/console/tasks", params={"q": typed})
            assert found.status_code == 200 and task_id in found.text, typed
            assert sibling not in found.text and theirs not in found.text, typed
        for typed in (task_id[:8], f" {task_id[:6].upper()} ", task_id[:23]):
            found = await client.get("/console/tasks", params={"q": typed})
            assert found.status_code == 200 and task_id in found.text, typed
            assert theirs not in found.text, typed
        rows = await client.get("/console/tasks/rows", params={"q": task_id[:8]})
        assert task_id in rows.text and theirs not in rows.text
        short = await client.get("/console/tasks", params={"q": task_id[:5]})  # too short
        assert "No tasks match." in short.text
        other = await client.get("/console/tasks", params={"q": theirs[:23]})
        assert other.status_code == 200 and "No tasks match." in other.text
    async with sign_in(api, "carol") as client:
        mine = await client.get("/console/tasks", params={"q": task_id[:8]})
        assert mine.status_code == 200 and task_id not in mine.text


async def test_times_read_to_the_second_in_utc_with_the_exact_value_kept(api: Api) -> None:
    """The task page and its events show times as `2026-12-06 04:32:40 UTC`; the exact
    value (microseconds, offset) is in the `<time>` element's datetime and title."""
    task_id = await created_task(api)
    stored = await api.gateway.db.fetchval(
        "SELECT occurred_at FROM events WHERE stream_id = $1 ORDER BY stream_version LIMIT 1",
        f"task-{task_id}",
    )
    shown = stored.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    async with sign_in(api, "alice") as client:
        for path in (f"/console/tasks/{task_id}", f"/console/tasks/{task_id}/events"):
            page = (await client.get(path)).text
            exact = re.search(r'<time datetime="([^"]+)" title="\1">([^<]+)</time>', page)
            assert exact is not None, path
            assert exact.group(2) == shown, path
            assert datetime.fromisoformat(exact.group(1)) == stored, path
            text = re.sub(r"<[^>]*>", "", page)  # what a reader sees
            assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text), path


async def test_changes_need_the_sessions_csrf_token_and_the_consoles_origin(api: Api) -> None:
    task_id = await created_task(api)
    async with sign_in(api, "alice") as client:
        csrf = await csrf_of(client)
        stop = f"/console/tasks/{task_id}/stop"
        assert (await client.post(stop)).status_code == 403
        assert (await client.post(stop, data={"csrf": "forged"})).status_code == 403
        elsewhere = {"origin": "https://evil.example"}
        assert (await client.post(stop, data={"csrf": csrf}, headers=elsewhere)).status_code == 403
        events = (await api.call("alice", "GET", f"/v1/tasks/{task_id}/events")).json()
        assert "TaskStopRequested" not in [e["type"] for e in events]
        # A poll of the live summary: nothing new is a 204 (two rows read), else the part.
        summary = f"/console/tasks/{task_id}/summary?version="
        assert (await client.get(summary + str(len(events)))).status_code == 204
        assert "task-status" in (await client.get(summary + "0")).text
        # htmx sends the token as a header.
        done = await client.post(stop, headers={"x-csrf-token": csrf, "origin": "http://gw"})
        assert done.status_code == 303
        events = (await api.call("alice", "GET", f"/v1/tasks/{task_id}/events")).json()
        (asked,) = [e for e in events if e["type"] == "TaskStopRequested"]
        assert asked["actor"] == "user:t1/alice"
        # Signed out, the session is gone (and a sign-out needs the token too).
        assert (await client.post("/console/sign-out")).status_code == 403
        assert (await client.post("/console/sign-out", data={"csrf": csrf})).status_code == 303
        after = await client.get("/console/tasks")
        assert (after.status_code, after.headers["location"]) == (303, "/console/sign-in")


async def test_another_tenant_gets_404_from_every_page_and_fragment(api: Api) -> None:
    task_id = await created_task(api)
    async with sign_in(api, "carol") as client:  # tenant t2
        for suffix in (
            "",
            "/summary",
            "/summary?version=1",
            "/events",
            "/logs",
            "/logs/lines",
            "/fault-tolerance",
            "/stacks/any",
            "/alerts",
            "/rerun-with-changes",
            "/trace",
        ):
            answer = await client.get(f"/console/tasks/{task_id}{suffix}")
            assert answer.status_code == 404, (suffix, answer.text)
        rows = await client.get("/console/tasks/rows")
        assert task_id not in rows.text
        csrf = await csrf_of(client)
        rerun = await client.post(f"/console/tasks/{task_id}/rerun", data={"csrf": csrf})
        assert rerun.status_code == 404
        changed = f"/console/tasks/{task_id}/rerun-with-changes"
        assert (await client.post(changed, data={"command": "x"})).status_code == 403
        assert (await client.post(changed, data={"csrf": csrf, "command": "x"})).status_code == 404
        assert (await client.get(f"/console/submit?clone={task_id}")).status_code == 404
        # SRE pages and node actions are for their roles only.
        for path in ("/console/sre/events", "/console/sre/events/rows", "/console/sre/health"):
            assert (await client.get(path)).status_code == 403, path
        cordon = "/console/pools/any/nodes/n-0/cordon"
        assert (await client.get(cordon)).status_code == 403
        assert (await client.post(cordon, data={"csrf": csrf})).status_code == 403
        export = f"/console/tasks/{task_id}/logs/export"
        assert (await client.post(export)).status_code == 403  # no CSRF token
        assert (await client.post(export, data={"csrf": csrf})).status_code == 404


async def test_a_creator_only_value_submitted_in_the_form_is_masked_for_all_but_her(
    api: Api,
) -> None:
    async with sign_in(api, "alice") as client:
        form = {**BASE, "tags": "demo", "csrf": await csrf_of(client)}
        form.update(env=f"KEY={SECRET};OTHER=1", creator_only="KEY")
        accepted = await client.post("/console/submit", data=form)
        assert accepted.status_code == 303, accepted.text
    task_id = accepted.headers["location"].rsplit("/", 1)[1]
    for who, shown in (("alice", True), ("bob", False)):
        async with sign_in(api, who) as client:
            page = (await client.get(f"/console/tasks/{task_id}")).text
            events = (await client.get(f"/console/tasks/{task_id}/events")).text
        spec = page.split('id="spec"', 1)[1].split(">", 1)[1].split("</pre>", 1)[0]
        assert (SECRET in spec) is shown, who
        assert ("******" in spec) is not shown, who
        assert SECRET not in page.replace(spec, ""), who
        assert SECRET not in events
    # The clone's form leaves the value out, for its creator too.
    async with sign_in(api, "alice") as client:
        clone = await client.get(f"/console/submit?clone={task_id}")
    assert clone.status_code == 200 and "OTHER=1" in clone.text
    assert SECRET not in clone.text and "KEY" in clone.text


async def test_submit_form_shows_the_rules_code_field_and_hint(api: Api) -> None:
    async with sign_in(api, "alice") as client:
        csrf = await csrf_of(client)
        form = {**BASE, "tags": "demo", "worker_spec": "3gpu", "csrf": csrf}
        refused = await client.post("/console/submit", data=form)
        assert refused.status_code == 400
        assert "spec.unknown" in refused.text and "worker_spec" in refused.text
        assert "Hint:" in refused.text
        accepted = await client.post("/console/submit", data={**form, "worker_spec": "1gpu"})
        assert accepted.status_code == 303
        assert accepted.headers["location"].startswith("/console/tasks/")


def chosen(page: str, name: str) -> str:
    """What a browser sends for the form's `<select name=...>`: the option marked
    selected, else the first."""
    select = re.split(rf'<select[^>]* name="{name}"', page, maxsplit=1)[1].split("</select>")[0]
    if picked := re.search(r'<option value="([^"]*)" selected', select):
        return html.unescape(picked.group(1))
    return html.unescape(re.findall(r'<option value="([^"]*)"', select)[0])


async def test_the_submit_form_as_it_opens_is_not_refused_for_its_pool(api: Api) -> None:
    """A spot pool listed first: the new form chooses a pool of the spec's default
    resource type (subscription) and that type, not a spot pool beside `subscription`."""
    pools = api.gateway.config_dir / "pools.yaml"
    lines = test_gateway.POOLS_YAML.strip().splitlines()
    pools.write_text("\n".join([lines[0], *lines[-2:], *lines[1:-2]]))
    async with sign_in(api, "alice") as client:
        page = (await client.get("/console/submit")).text
        assert page.index("pool-spot (cn-north-1, spot;") < page.index("pool-a (")
        form = {n: chosen(page, n) for n in ("pool", "resource_type", "framework", "image")}
        assert (form["pool"], form["resource_type"]) == ("pool-a", "subscription")
        form.update(name="first", worker_spec="1gpu", command="echo hi", csrf=await csrf_of(client))
        accepted = await client.post("/console/submit", data=form)
        assert accepted.status_code == 303, accepted.text


async def test_a_session_is_shared_by_every_gateway_over_the_database_until_signed_out(
    api: Api, dsn: str, tmp_path: Path
) -> None:
    """Two gateway processes over one database: a session opened through one is
    accepted by the other; signing out through one ends it on both."""
    (tmp_path / "second").mkdir()
    second = await Gateway.connect(dsn, test_gateway.config_dir(tmp_path / "second"))
    app = create_app(second, {})
    try:
        async with (
            sign_in(api, "alice") as first,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw"
            ) as other,
        ):
            cookie = first.cookies[COOKIE]
            other.cookies.set(COOKIE, cookie)
            page = await other.get("/console/tasks")
            assert page.status_code == 200 and "alice" in page.text
            stored = await api.gateway.db.fetch("SELECT * FROM console_sessions")
            assert stored and all(
                api.tokens["alice"].encode() not in bytes(r["sealed_token"])
                and cookie not in r["session_key"]
                for r in stored
            )
            csrf = await csrf_of(other)  # the same session's token, on either gateway
            assert csrf == await csrf_of(first)
            signed_out = await other.post("/console/sign-out", data={"csrf": csrf})
            assert signed_out.status_code == 303
            after = await first.get("/console/tasks")
            assert (after.status_code, after.headers["location"]) == (303, "/console/sign-in")
    finally:
        await app.state.owners.aclose()
        await second.close()


async def test_audit_time_travel_and_whatif_are_for_sres_and_admins_only(api: Api) -> None:
    env = [{"name": "KEY", "value": SECRET, "creator_only": True}]
    task_id = await created_task(api, env=env)
    await created_task(api)
    async with sign_in(api, "admin") as client:  # platform_admin: every tenant
        audit = await client.get(f"/console/sre/audit?task={task_id}")
        assert audit.status_code == 200 and 'data-type="TaskSubmitted"' in audit.text
        assert SECRET not in audit.text  # payloads masked as for anyone but the creator
        # Paged by the API's cursor, oldest first, each page after the one before.
        first = await client.get("/console/sre/audit?actor=user:t1/alice&limit=1")
        (next_url,) = re.findall(r'<a href="([^"]+)" rel="next" id="audit-next">', first.text)
        second = await client.get(html.unescape(next_url))
        positions = [
            int(p)
            for page in (first, second)
            for p in re.findall(r'data-position="(\d+)"', page.text)
        ]
        assert len(positions) == 2 and positions[0] < positions[1]
        bad = await client.get("/console/sre/audit?since=yesterday")
        assert bad.status_code == 400 and "audit.time_range" in bad.text
        travel = await client.get(f"/console/sre/time-travel?task={task_id}&at=1")
        assert travel.status_code == 200 and 'id="as-of"' in travel.text
        assert SECRET not in travel.text
        bad_point = await client.get(f"/console/sre/time-travel?task={task_id}&at=yesterday")
        assert bad_point.status_code == 400 and "replay.bad_point" in bad_point.text
        csrf = await csrf_of(client)
        assert (await client.post("/console/sre/whatif", data={"from": "1h"})).status_code == 403
        nodes = await client.post(
            "/console/sre/whatif", data={"csrf": csrf, "from": "1h", "to": "0m", "nodes": "2"}
        )
        assert nodes.status_code == 400 and "console.whatif_nodes" in nodes.text
    async with sign_in(api, "carol") as client:  # a member of another tenant
        csrf = await csrf_of(client)
        for path in (
            "/console/sre/audit",
            f"/console/sre/audit?task={task_id}",
            f"/console/sre/time-travel?task={task_id}&at=1",
            "/console/sre/whatif",
        ):
            answer = await client.get(path)
            assert answer.status_code == 403 and task_id not in answer.text, path
        whatif = await client.post("/console/sre/whatif", data={"csrf": csrf, "from": "1h"})
        assert whatif.status_code == 403


async def test_clone_with_the_whole_spec_leaves_creator_only_values_out(api: Api) -> None:
    env = [{"name": "KEY", "value": SECRET, "creator_only": True}, {"name": "OTHER", "value": "1"}]
    mounts = [{"file_system": "fs-main", "volume": "datasets", "mount_path": "/data"}]
    task_id = await created_task(
        api, env=env, mounts=mounts, fault_tolerance={"auto_restart": True}
    )
    async with sign_in(api, "alice") as client:
        page = await client.get(f"/console/tasks/{task_id}/clone")
        assert page.status_code == 200
        assert SECRET not in page.text and "KEY" in page.text and "OTHER" in page.text
        text = page.text.split('name="spec"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]
        assert "mount_path: /data" in text and "auto_restart: true" in text
        clone = f"/console/tasks/{task_id}/clone"
        assert (await client.post(clone, data={"spec": "name: x"})).status_code == 403  # no CSRF
        csrf = await csrf_of(client)
        spec = html.unescape(text)
        refused = await client.post(
            clone,
            data={"csrf": csrf, "spec": spec.replace("worker_spec: 1gpu", "worker_spec: 3gpu")},
        )
        assert refused.status_code == 400 and "spec.unknown" in refused.text
        assert "Hint:" in refused.text and "3gpu" in refused.text
        accepted = await client.post(clone, data={"csrf": csrf, "spec": spec})
        assert accepted.status_code == 303, accepted.text
    new_id = accepted.headers["location"].rsplit("/", 1)[1]
    created = (await api.call("alice", "GET", f"/v1/tasks/{new_id}")).json()
    assert created["spec"]["mounts"][0]["mount_path"] == "/data"
    assert created["spec"]["fault_tolerance"]["auto_restart"] is True
    assert [v["name"] for v in created["spec"]["env"]] == ["OTHER"]
    async with sign_in(api, "carol") as client:  # another tenant
        csrf = await csrf_of(client)
        assert (await client.get(f"/console/tasks/{task_id}/clone")).status_code == 404
        posted = await client.post(
            f"/console/tasks/{task_id}/clone", data={"csrf": csrf, "spec": "name: x"}
        )
        assert posted.status_code == 404
        capture = f"/console/tasks/{task_id}/stacks/capture"
        assert (await client.post(capture)).status_code == 403  # no CSRF token
        assert (await client.post(capture, data={"csrf": csrf})).status_code == 404


async def test_a_stored_session_ends_at_its_expiry_on_every_gateway(api: Api) -> None:
    """Two session stores over one database (two gateways): each sees the other's
    session until it expires or is closed; expired rows go when a session is opened."""
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    first = PostgresSessions(lambda: api.gateway.db, lambda: now[0], ttl=timedelta(hours=1))
    second = PostgresSessions(lambda: api.gateway.db, lambda: now[0], ttl=timedelta(hours=1))
    session = await first.open("the-token")
    assert await second.get(session.session_id) == session
    assert await second.get("forged") is None
    now[0] += timedelta(hours=1)
    assert await second.get(session.session_id) is None
    await second.open("another-token")  # clears the expired row
    keys = await api.gateway.db.fetch("SELECT session_key FROM console_sessions")
    assert session_key(session.session_id) not in [r["session_key"] for r in keys]


@pytest.mark.parametrize(
    ("fault_tolerance", "shown"),
    [
        ({"auto_restart": True, "max_restarts": 2}, "<dd>0 of 2</dd>"),
        ({"max_restarts": 5}, "<dd>0 of 5 (auto restart off)</dd>"),
    ],
)
async def test_the_summary_shows_the_restart_limit_and_when_auto_restart_is_off(
    api: Api, fault_tolerance: dict[str, Any], shown: str
) -> None:
    task_id = await created_task(api, fault_tolerance=fault_tolerance)
    async with sign_in(api, "alice") as client:
        summary = await client.get(f"/console/tasks/{task_id}/summary?version=0")
        assert summary.status_code == 200
        assert f"<dt>restarts</dt>{shown}" in summary.text, summary.text


async def test_a_lifetime_typed_in_any_digits_is_refused_on_the_tokens_page(api: Api) -> None:
    """The lifetime box takes what a person types: digits of another script (`²`, `٣`)
    or thousands of them are refused above the form with the rules' field, kept as
    typed, and no token is made; seconds in ASCII digits make one."""
    admin = await create_token(api.gateway.db, "t1", "tam", "tenant_admin")
    api.tokens["tam"] = admin
    async with sign_in(api, "tam") as tam:
        page = await tam.get("/console/tokens")
        assert page.status_code == 200, page.text
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        before = await api.gateway.db.fetchval("SELECT count(*) FROM api_tokens")
        for ttl in ("²", "٣", "9" * 5000):
            refused = await tam.post(
                "/console/tokens", data={"csrf": csrf, "user": "dora", "ttl": ttl}
            )
            assert refused.status_code == 400, refused.text[:3000]
            assert '<span class="field">(ttl)</span>' in refused.text, refused.text[:3000]
            assert f'name="ttl" value="{ttl}"' in refused.text  # kept as typed
        assert await api.gateway.db.fetchval("SELECT count(*) FROM api_tokens") == before
        made = await tam.post("/console/tokens", data={"csrf": csrf, "user": "dora", "ttl": "3600"})
        assert made.status_code == 201 and 'id="new-token"' in made.text, made.text[:3000]


async def test_a_tenant_admin_is_offered_revoke_only_on_the_tokens_it_may_revoke(api: Api) -> None:
    """The tokens page of a tenant admin lists an sre's token of its tenant (a platform
    admin made it) without a Revoke button, which would always be refused 403
    `auth.role_not_grantable`; its members' tokens keep theirs, and a platform admin
    gets one on both."""
    api.tokens["tam"] = await create_token(api.gateway.db, "t1", "tam", "tenant_admin")
    await create_token(api.gateway.db, "t1", "sam", "sre")

    def revocable(page: str) -> dict[str, bool]:
        rows = re.findall(r'<tr data-token-id="[^"]+" data-state="active">(.*?)</tr>', page, re.S)
        users = [re.findall(r"<td>([^<]*)</td>", row)[1] for row in rows]
        return {user: "Revoke</button>" in row for user, row in zip(users, rows, strict=True)}

    async with sign_in(api, "tam") as tam, sign_in(api, "admin") as admin:
        page = (await tam.get("/console/tokens")).text
        assert {k: v for k, v in revocable(page).items() if k in ("sam", "alice")} == {
            "sam": False,
            "alice": True,
        }, page
        assert "a platform admin revokes it" in page
        as_admin = (await admin.get("/console/tokens?tenant=t1")).text
        assert {k: v for k, v in revocable(as_admin).items() if k in ("sam", "alice")} == {
            "sam": True,
            "alice": True,
        }


async def test_the_make_token_form_sent_again_makes_no_second_token(api: Api) -> None:
    """The page that shows a new token once answers a POST: reloaded (or the browser's
    resubmit), the same form is sent again. It makes no second live token the admin
    never sees: 409 `console.token_made_already` names the first, to revoke if it was
    lost; a form opened anew makes another."""
    api.tokens["tam"] = await create_token(api.gateway.db, "t1", "tam", "tenant_admin")

    def fields(page: str) -> dict[str, str]:
        form = page.split('id="make-token"', 1)[1].split("</form>", 1)[0]
        hidden = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)
        return dict(hidden)

    async def dora_tokens() -> int:
        count = await api.gateway.db.fetchval(
            "SELECT count(*) FROM api_tokens WHERE user_name = 'dora' AND revoked_at IS NULL"
        )
        return int(count)

    async with sign_in(api, "tam") as tam:
        form = {**fields((await tam.get("/console/tokens")).text), "user": "dora"}
        made = await tam.post("/console/tokens", data=form)
        assert made.status_code == 201 and 'id="new-token"' in made.text, made.text[:3000]
        first = made.text.split('<span class="id">', 1)[1].split("<", 1)[0]
        again = await tam.post("/console/tokens", data=form)
        assert again.status_code == 409, again.text[:3000]
        assert '<span class="code">console.token_made_already</span>' in again.text
        assert first in again.text and 'id="new-token"' not in again.text
        assert await dora_tokens() == 1
        anew = {**fields(again.text), "user": "dora"}
        assert (await tam.post("/console/tokens", data=anew)).status_code == 201
        assert await dora_tokens() == 2


async def test_a_revoke_goes_back_to_the_tokens_list_as_it_was_shown(api: Api) -> None:
    """A platform admin reading one tenant's tokens, revoked ones included, revokes one
    from its row: the list it comes back to is that tenant's, revoked ones included
    (the one just revoked among them), not every tenant's."""
    await create_token(api.gateway.db, "t2", "cora", "member")
    async with sign_in(api, "admin") as admin:
        page = (await admin.get("/console/tokens?tenant=t2&revoked=1")).text
        row = next(
            r
            for r in re.findall(
                r'<tr data-token-id="[^"]+" data-state="active">.*?</tr>', page, re.S
            )
            if "<td>cora</td>" in r
        )
        action = row.split('action="', 1)[1].split('"', 1)[0]
        form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', row))
        revoked = await admin.post(action, data=form)
        assert revoked.status_code == 303, revoked.text[:2000]
        back = revoked.headers["location"]
        assert back == "/console/tokens?tenant=t2&revoked=1", back
        shown = (await admin.get(back)).text
        assert 'data-state="revoked"' in shown and "<td>t1</td>" not in shown


async def test_a_refused_mint_keeps_the_tokens_list_as_it_was_shown(api: Api) -> None:
    """A platform admin reading one tenant's tokens makes one the rules refuse: the page
    that shows the refusal lists that tenant's tokens still, not every tenant's."""
    await create_token(api.gateway.db, "t2", "cora", "member")
    async with sign_in(api, "admin") as admin:
        page = (await admin.get("/console/tokens?tenant=t2")).text
        form = page.split('id="make-token"', 1)[0].rsplit("<form", 1)[1]
        action = form.split('action="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
        assert action == "/console/tokens?tenant=t2", action
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
        sent = {**fields, "tenant": "t2", "user": "no spaces", "role": "member"}
        refused = await admin.post(action, data=sent)
        assert refused.status_code == 400 and "auth.invalid_name" in refused.text
        assert "<td>cora</td>" in refused.text and "<td>t1</td>" not in refused.text


async def test_yaml_that_cannot_be_read_is_refused_with_the_pages_code(api: Api) -> None:
    """The clone page's spec and the what-if's pools document are YAML typed in a
    textarea and read in the gateway: nested past reading or with a number of
    thousands of digits, each is a 400 with the page's code, the text kept, never a
    500; nothing is submitted."""
    task_id = await created_task(api)
    deep, long_number = "a: " + "[" * 5000 + "]" * 5000, "priority: 1" + "0" * 5000
    async with sign_in(api, "alice") as alice:
        csrf = await csrf_of(alice)
        before = await api.event_count()
        for text in (deep, long_number):
            refused = await alice.post(
                f"/console/tasks/{task_id}/clone", data={"csrf": csrf, "spec": text}
            )
            assert refused.status_code == 400, refused.text[:2000]
            assert '<span class="code">console.spec_yaml</span>' in refused.text
            assert text[:40] in refused.text  # kept as typed
        assert await api.event_count() == before
    async with sign_in(api, "admin") as admin:
        csrf = await csrf_of(admin)
        for text in ("pools: " + deep[3:], "pools: [{id: 1" + "0" * 5000 + "}]"):
            refused = await admin.post(
                "/console/sre/whatif",
                data={"csrf": csrf, "from": "1h", "to": "0m", "pools_yaml": text},
            )
            assert refused.status_code == 400, refused.text[:2000]
            assert '<span class="code">console.whatif_pools</span>' in refused.text


async def test_a_page_whose_token_is_revoked_meanwhile_signs_in_again_to_itself(
    api: Api,
) -> None:
    """A group page polls its live part; the token of its session is revoked meanwhile:
    the poll sends the browser to sign in, naming the page it was on (htmx's
    HX-Current-URL), so signing in again goes back to it; a URL naming another site
    goes to the plain sign-in page."""
    body = {"template": BASE, "items": [{}], "group_id": "sweep"}
    assert (await api.call("alice", "POST", "/v1/groups", json=body)).status_code == 201
    made = await api.call("admin", "POST", "/v1/admin/tokens", json={"tenant": "t1", "user": "ann"})
    assert made.status_code == 201, made.text
    api.tokens["ann"] = made.json()["token"]
    async with sign_in(api, "ann") as ann:
        assert (await ann.get("/console/groups/sweep")).status_code == 200
        revoked = await api.call("admin", "DELETE", f"/v1/admin/tokens/{made.json()['token_id']}")
        assert revoked.status_code == 200, revoked.text
        for shown, sign_in_at in (
            ("http://gw/console/groups/sweep", "/console/sign-in?next=%2Fconsole%2Fgroups%2Fsweep"),
            ("http://evil.example//evil.example/x", "/console/sign-in"),
        ):
            poll = await ann.get(
                "/console/groups/sweep?live=1",
                headers={"HX-Request": "true", "HX-Current-URL": shown},
            )
            assert (poll.status_code, poll.headers["hx-redirect"]) == (401, sign_in_at)
        again = await ann.post(
            "/console/sign-in", data={"token": api.tokens["alice"], "next": "/console/groups/sweep"}
        )
        assert (again.status_code, again.headers["location"]) == (303, "/console/groups/sweep")
