"""Odd inputs the fuzzer rarely builds: each is refused with a 4xx, never a 5xx."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration import test_gateway
from tests.integration.test_gateway import BASE, Api

api = test_gateway.api  # the same fixture: an in-process gateway and a client per user

NUL = "\u0000"
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/tasks", {"json": {**BASE, "command": f"echo {NUL}"}}),
    ("POST", "/v1/tasks", {"json": {**BASE, "name": f"a{NUL}b"}}),
    ("POST", "/v1/tasks", {"json": {**BASE, "tags": [NUL]}}),
    ("POST", "/v1/tasks", {"json": {**BASE, "env": f"A={NUL}"}}),
    ("POST", "/v1/tasks", {"json": {**BASE, "env": "A=x", "creator_only": ["A"]}, "nul": True}),
    ("POST", "/v1/tasks", {"json": BASE, "headers": {"X-Request-Id": "a%00"}}),
    ("GET", "/v1/tasks/a%00b", {}),
    ("GET", "/v1/tasks", {"params": {"name": NUL}}),
    ("GET", "/v1/tasks", {"params": {"status": NUL, "tag": NUL, "pool": NUL}}),
    ("GET", "/v1/tasks", {"params": {"cursor": NUL}}),
    ("GET", "/v1/tasks", {"params": {"limit": 10**12}}),
    ("GET", "/v1/groups", {"params": {"limit": -1}}),
    ("GET", "/v1/groups/%00", {}),
    ("POST", "/v1/groups/%00/rerun", {}),
    ("GET", "/v1/pools/%00/capacity", {}),
    ("POST", "/v1/groups", {"json": {"template": BASE, "items": [{}], "group_id": NUL}}),
    ("POST", "/v1/groups", {"json": {"template": BASE, "items": [{}], "group_id": 7}}),
    ("POST", "/v1/groups", {"json": {"template": BASE, "items": [5]}}),
    ("POST", "/v1/admin/images", {"json": {"name": NUL}, "admin": True}),
    ("POST", "/v1/admin/images", {"json": {"name": "x", "zones": [NUL]}, "admin": True}),
    (
        "POST",
        "/v1/admin/volumes",
        {"json": {"file_system": NUL, "volume": "v", "zone": "z"}, "admin": True},
    ),
    ("POST", "/v1/admin/public-data", {"json": {"zone": NUL}, "admin": True}),
    (
        "POST",
        "/v1/admin/tokens",
        {"json": {"tenant": NUL, "user": "u", "role": "member"}, "admin": True},
    ),
    (
        "POST",
        "/v1/admin/tokens",
        {"json": {"tenant": "t", "user": "u", "role": ["x"]}, "admin": True},
    ),
]


@pytest.mark.parametrize(("method", "path", "kw"), CASES)
async def test_odd_input_is_never_a_server_error(
    api: Api, method: str, path: str, kw: dict[str, Any]
) -> None:
    kw = dict(kw)
    who = "admin" if kw.pop("admin", False) else "alice"
    if kw.pop("nul", False):
        kw["json"] = {**kw["json"], "env": f"A=x{NUL}"}
    answer = await api.call(who, method, path, **kw)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert answer.json()["code"], answer.text


async def test_numbers_out_of_the_databases_range_are_a_400(api: Api) -> None:
    """Found by the fuzzer: an int query parameter past int32 reached Postgres (500)."""
    task_id = (await api.submit()).json()["task_id"]
    for path in (f"/v1/tasks/{task_id}/first-error", f"/v1/tasks/{task_id}/logs"):
        answer = await api.call("alice", "GET", path, params={"run": 2**31})
        # The logs router refuses it itself, naming the field and the range.
        assert (answer.status_code, answer.json()["code"]) == (400, "logs.out_of_range"), (
            answer.text
        )
        assert answer.json()["field"] == "run" and "2147483647" in answer.json()["hint"]


async def test_a_filter_given_twice_is_a_400_naming_it_not_its_last_value(api: Api) -> None:
    """`?status=running&status=failed` was read as `status=failed` alone, silently. A
    parameter of one value given twice is refused naming it; one that takes a list (the
    audit's `type`, a log search's `worker`) may still repeat."""
    task_id = (await api.submit()).json()["task_id"]
    for params in (
        [("status", "running"), ("status", "failed")],
        [("status", "new"), ("name", "x"), ("status", "new")],
        [("limit", "1"), ("limit", "2")],
    ):
        twice = params[0][0]
        answer = await api.call("alice", "GET", "/v1/tasks", params=params)
        assert answer.status_code == 400, answer.text
        error = answer.json()
        assert (error["code"], error["field"]) == ("request.invalid", twice), error
        assert error["message"].startswith(f"{twice} is given 2 times"), error
    listed = await api.call("alice", "GET", "/v1/tasks", params=[("status", "new"), ("name", "")])
    assert listed.status_code == 200, listed.text
    assert [t["task_id"] for t in listed.json()["items"]] == [task_id]
    grouped = await api.call("alice", "GET", "/v1/groups", params=[("limit", "1"), ("limit", "1")])
    assert grouped.status_code == 400 and grouped.json()["field"] == "limit", grouped.text

    types = [("type", "TaskSubmitted"), ("type", "TaskQueued")]
    audited = await api.call("admin", "GET", "/v1/audit/events", params=types)
    assert audited.status_code == 200, audited.text
    logs = f"/v1/tasks/{task_id}/logs"
    searched = await api.call("alice", "GET", logs, params=[("worker", "0"), ("worker", "1")])
    assert searched.status_code == 200, searched.text
