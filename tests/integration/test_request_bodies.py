"""Every route's body is a model (runyard.contracts.requests): a body that breaks it is
a 400 before the handler runs, in the one error shape, naming the field, with the code
that body has always been refused with and a hint; nothing is written. A caller the
route is not for is refused (401, 403) before its body is read."""

from __future__ import annotations

from typing import Any

import pytest
from runyard.contracts.spec import MAX_GROUP_SIZE

from tests.integration import test_gateway
from tests.integration.test_gateway import BASE, Api

api = test_gateway.api  # the same fixture: an in-process gateway and a client per user

TOKEN = {"tenant": "t1", "user": "dana"}
#: (who, path — `{task}` a stopped task of alice's —, body, code, field)
CASES: list[tuple[str, str, Any, str, str]] = [
    ("alice", "/v1/tasks", {**BASE, "tags": ["x" * 65]}, "spec.invalid", "tags.0"),
    (
        "alice",
        "/v1/tasks",
        {**BASE, "env": [{"name": "A", "v": 1}]},
        "spec.unknown_field",
        "env.0.v",
    ),
    ("alice", "/v1/tasks", {**BASE, "creator_only": "A"}, "spec.invalid", "creator_only"),
    ("alice", "/v1/tasks", [BASE], "request.invalid", "body"),
    ("alice", "/v1/tasks/{task}/clone", {"name": "n" * 201}, "spec.invalid", "name"),
    ("alice", "/v1/tasks/{task}/clone", {"env": {"API_KEY": "x"}}, "spec.invalid", "env"),
    ("alice", "/v1/tasks/{task}/rerun", {"worker_count": 0}, "spec.invalid", "worker_count"),
    ("alice", "/v1/tasks/{task}/rerun", {"colour": 1}, "spec.unknown_field", "colour"),
    ("alice", "/v1/groups/g/rerun", {"pool": "x"}, "rerun.field_not_changeable", "pool"),
    (
        "alice",
        "/v1/groups",
        {"template": BASE, "items": [{}] * (MAX_GROUP_SIZE + 1)},
        "group.too_large",
        "items",
    ),
    (
        "alice",
        "/v1/groups",
        {"template": BASE, "items": [{}, {"priority": 10**6}]},
        "spec.invalid",
        "items[1].priority",
    ),
    (
        "alice",
        "/v1/groups",
        {"template": {**BASE, "pool": 3}, "items": [{}]},
        "spec.invalid",
        "template.pool",
    ),
    *(
        ("alice", "/v1/groups", {"template": BASE, "items": [{}], "group_id": g}, code, "group_id")
        for g, code in [
            ("team/exp1", "request.invalid"),
            ("..", "request.invalid"),
            ("a b", "request.invalid"),
            ("x%2Fy", "request.invalid"),
        ]
    ),
    ("admin", "/v1/admin/tokens", {**TOKEN, "role": "owner"}, "auth.invalid_role", "role"),
    ("admin", "/v1/admin/tokens", {**TOKEN, "ttl": 1.5}, "auth.invalid_expiry", "ttl"),
    ("admin", "/v1/admin/tokens", {"user": "dana"}, "auth.invalid_name", "tenant"),
    ("admin", "/v1/admin/tokens", {**TOKEN, "colour": 1}, "request.invalid", "colour"),
    ("admin", "/v1/admin/images", {"name": "a b"}, "spec.invalid", "name"),
    ("admin", "/v1/admin/volumes", {"volume": "v", "zone": "z"}, "spec.invalid", "file_system"),
    ("admin", "/v1/admin/public-data", {"zone": "z", "path": "x"}, "spec.invalid", "path"),
    ("alice", "/v1/tasks/{task}/logs/exports", {"format": "pdf"}, "export.format", "format"),
]


@pytest.mark.parametrize(("who", "path", "body", "code", "field"), CASES)
async def test_a_body_that_breaks_its_model_is_a_400_naming_the_field(
    api: Api, who: str, path: str, body: Any, code: str, field: str
) -> None:
    task_id = (await api.submit()).json()["task_id"]
    await api.call("alice", "POST", f"/v1/tasks/{task_id}/stop")
    before = await api.event_count()
    answer = await api.call(who, "POST", path.format(task=task_id), json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert (error["code"], error["field"]) == (code, field), error
    named = field.rsplit(".", 1)[-1].split("[")[0]
    assert named in error["message"] and error["hint"], error
    assert await api.event_count() == before


async def test_a_group_items_refusal_names_the_item(api: Api) -> None:
    group = {"template": BASE, "items": [{}, {"name": 5}]}
    answer = await api.call("alice", "POST", "/v1/groups", json=group)
    assert (answer.status_code, answer.json()["item"]) == (400, 1), answer.text


async def test_callers_the_route_is_not_for_are_refused_before_the_body_is_read(api: Api) -> None:
    broken = {"tenant": "a/b", "user": "", "colour": 1}
    for path in ("/v1/admin/tokens", "/v1/admin/images"):
        answer = await api.call("alice", "POST", path, json=broken)
        assert answer.status_code == 403, answer.text
    unsigned = await api.http.post("/v1/tasks", json={"colour": 1})
    assert unsigned.status_code == 401, unsigned.text


@pytest.mark.parametrize(
    ("path", "who", "text", "where"),
    [
        ("/v1/tasks", "alice", b'{"name": "x",}', "body: not JSON at character 13"),
        ("/v1/tasks", "alice", b'{"name": "x', "body: not JSON at character"),
        ("/v1/groups", "alice", b'{"items": [1,}', "body: not JSON at character 13"),
        ("/v1/admin/tokens", "admin", b"{", "body: not JSON at character"),
        ("/v1/tasks", "alice", b"\xff{}", ""),  # not UTF-8: refused before it is decoded
    ],
)
async def test_a_body_that_is_not_json_is_named_as_the_body(
    api: Api, path: str, who: str, text: bytes, where: str
) -> None:
    """Found by hand: `{"name": "x",}` was refused with field `13` and `13: JSON decode
    error` (FastAPI's position of the error, taken for a field)."""
    headers = {"content-type": "application/json"}
    answer = await api.call(who, "POST", path, content=text, headers=headers)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert (body["code"], body["field"]) == ("request.invalid", "body"), body
    assert body["message"].startswith(where), body
    assert "JSON object" in body["hint"], body
