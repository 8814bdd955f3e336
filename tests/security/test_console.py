"""The web console's security over HTTP (no browser): the session cookie, CSRF and
origin checks, headers, tenants and creator-only masking on every page and fragment.

One in-process gateway and a log service on a real Postgres (the `api` fixture
of tests/integration/test_gateway.py); the browser tests are
tests/e2e/test_console.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

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
