"""Audit queries over the whole log, on a real Postgres: each filter answers exactly
the matching events, paging is complete and stable, and only sre and
platform_admin may ask (HTTP and the CLI)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.cli import audit as cli_audit
from runyard.cli.main import app as cli_app
from runyard.domain import ConfirmStop
from runyard.eventstore.audit import AuditFilter, InvalidCursor, audit_page
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from typer.testing import CliRunner

from tests.integration.audit_log import (
    SECRET_REF,
    T0,
    WEBHOOK_PATH,
    AuditLog,
    connect,
)
from tests.integration.test_gateway import config_dir


async def _all(db: asyncpg.Pool, f: AuditFilter, limit: int = 1000) -> list[int]:
    positions: list[int] = []
    cursor = None
    while True:
        page = await audit_page(db, f, limit=limit, cursor=cursor)
        positions += [r.position for r in page.items]
        if page.next_cursor is None:
            return positions
        cursor = page.next_cursor


RESTARTS = ("TaskRequeued", "TaskRescheduleRequested", "TaskRestartScheduled", "TaskPreempted")
FILTERS = {
    "none": AuditFilter(),
    "requeues, reschedules, restarts": AuditFilter(types=RESTARTS),
    "last hour": AuditFilter(since=T0 + timedelta(minutes=20)),
    "window": AuditFilter(since=T0 + timedelta(minutes=5), until=T0 + timedelta(minutes=25)),
    "tenant ta": AuditFilter(tenant="ta"),
    "tenant tb": AuditFilter(tenant="tb"),
    "pool h100": AuditFilter(pool="h100"),
    "pool a100": AuditFilter(pool="a100"),
    "node n1": AuditFilter(node="n1"),
    "node h2": AuditFilter(node="h2"),
    "node h3 placements": AuditFilter(node="h3", types=("TaskPlaced",)),
    "task tb-1": AuditFilter(task="tb-1"),
    "who stopped tb-1": AuditFilter(task="tb-1", types=("TaskStopRequested",)),
    "actor root": AuditFilter(actor="user:ops/root"),
    "actors of people": AuditFilter(actor="user:*"),
    "services": AuditFilter(actor="service:*", tenant="ta", pool="h100"),
    "admin actions on pools": AuditFilter(actor="user:*", types=("NodeCordoned", "NodeAdded")),
    "no such node": AuditFilter(node="nowhere"),
    "tenant and node": AuditFilter(tenant="ta", node="h3"),
}


@pytest.mark.parametrize("name", list(FILTERS))
async def test_each_filter_answers_exactly_the_matching_events(log: AuditLog, name: str) -> None:
    f = FILTERS[name]
    expected = log.expected(f)
    assert await _all(log.store.pool, f) == expected
    if name not in ("none", "no such node"):
        assert expected, "the log must hold something for this filter"
        assert len(expected) < len(log.events) or name == "none"


async def test_the_questions_of_an_incident(log: AuditLog) -> None:
    page = await audit_page(log.store.pool, FILTERS["who stopped tb-1"])
    assert [(r.actor, r.data["stopped_by"]) for r in page.items] == [("user:tb/bob", "bob")]
    placed = await audit_page(log.store.pool, AuditFilter(node="h3", types=("TaskPlaced",)))
    assert sorted(r.stream_id for r in placed.items) == ["task-ta-2", "task-tb-1"]
    why = await audit_page(log.store.pool, AuditFilter(types=("TaskRescheduleRequested",)))
    assert [r.data["reason"] for r in why.items] == ["node h2 is faulty"]


async def test_paging_is_complete_stable_and_bound_to_its_filters(log: AuditLog) -> None:
    f = AuditFilter(tenant="ta")
    first = await audit_page(log.store.pool, f, limit=3)
    assert first.next_cursor
    # events appended after the first page are not in this query's pages
    await log.do("ta-2", ConfirmStop("ta-2"), "service:deployer")
    rest = await _rest(log.store.pool, f, first.next_cursor, limit=3)
    paged = [r.position for r in first.items] + rest
    assert paged == log.expected(f)[:-1] == sorted(set(paged))
    # a new query sees it
    assert await _all(log.store.pool, f, limit=2) == log.expected(f)
    with pytest.raises(InvalidCursor):
        await audit_page(log.store.pool, AuditFilter(tenant="tb"), cursor=first.next_cursor)
    with pytest.raises(InvalidCursor):
        await audit_page(log.store.pool, f, cursor="bm90LWEtY3Vyc29y")


async def _rest(db: asyncpg.Pool, f: AuditFilter, cursor: str | None, limit: int) -> list[int]:
    positions: list[int] = []
    while cursor:
        page = await audit_page(db, f, limit=limit, cursor=cursor)
        positions += [r.position for r in page.items]
        cursor = page.next_cursor
    return positions


async def test_answers_mask_creator_only_values_and_credentials(log: AuditLog) -> None:
    page = await audit_page(log.store.pool, AuditFilter(types=("TaskSubmitted",), tenant="ta"))
    text = str([r.as_json() for r in page.items])
    assert SECRET_REF not in text and WEBHOOK_PATH not in text
    env = page.items[0].data["spec"]["env"]
    assert {"name": "HF_TOKEN", "value": "******", "creator_only": True, "secret_ref": None} in env


async def test_facets_of_events_stored_before_the_migration_are_backfilled(
    log: AuditLog, dsn: str
) -> None:
    facets = "SELECT * FROM audit_facets ORDER BY kind, value, global_position"
    async with log.store.pool.acquire() as conn:
        before = await conn.fetch(facets)
        await conn.execute(
            "DROP TRIGGER events_audit_index ON events; DELETE FROM audit_facets;"
            " DELETE FROM audit_tasks;"
            " DELETE FROM schema_migrations WHERE component = 'eventstore' AND version = 4"
        )
    again = await connect(dsn)  # applies 0004 again: it indexes what is there
    await again.close()
    async with log.store.pool.acquire() as conn:
        assert await conn.fetch(facets) == before


# --- the gateway and the CLI ------------------------------------------------


@pytest.fixture
async def gateway(
    log: AuditLog, dsn: str, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    gw = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        role: await create_token(
            gw.db, "ops" if role in ("sre", "platform_admin") else "ta", role, role
        )
        for role in ("sre", "platform_admin", "tenant_admin", "member", "service")
    }
    app = create_app(gw, {})
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw"
        ) as client:
            yield client, tokens
    finally:
        await app.state.owners.aclose()
        await gw.close()


async def _get(
    gw: tuple[httpx.AsyncClient, dict[str, str]], role: str, **params: str | int
) -> httpx.Response:
    client, tokens = gw
    return await client.get(
        "/v1/audit/events", params=params, headers={"Authorization": f"Bearer {tokens[role]}"}
    )


@pytest.mark.parametrize("role", ["sre", "platform_admin"])
async def test_sre_and_platform_admin_ask_over_http(
    log: AuditLog, gateway: object, role: str
) -> None:
    gw = gateway
    answer = await _get(gw, role, type="TaskRequeued,TaskPreempted", tenant="ta")  # type: ignore[arg-type]
    assert answer.status_code == 200, answer.text
    f = AuditFilter(types=("TaskRequeued", "TaskPreempted"), tenant="ta")
    assert [i["position"] for i in answer.json()["items"]] == log.expected(f)
    # as a person types a list: spaces after the commas
    spaced = await _get(gw, role, type=" TaskRequeued, TaskPreempted ", tenant="ta")  # type: ignore[arg-type]
    assert spaced.status_code == 200, spaced.text
    assert [i["position"] for i in spaced.json()["items"]] == log.expected(f)
    pool_admin = await _get(gw, role, category="pool", actor="user:*")  # type: ignore[arg-type]
    assert [i["type"] for i in pool_admin.json()["items"]] == ["NodeCordoned"]


@pytest.mark.parametrize("role", ["tenant_admin", "member", "service"])
async def test_tenant_roles_are_refused_with_a_hint(gateway: object, role: str) -> None:
    answer = await _get(gateway, role)  # type: ignore[arg-type]
    assert answer.status_code == 403
    body = answer.json()
    assert body["code"] == "auth.audit_only" and "runyard events" in body["hint"]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"limit": 0}, "request.invalid"),
        ({"limit": 1001}, "request.invalid"),
        ({"since": "yesterday"}, "audit.time_range"),
        ({"since": "2026-12-01T00:00:00"}, "audit.time_range"),
        ({"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"}, "audit.time_range"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor.invalid"),
        ({"node": "x" * 1025}, "request.invalid"),
        ({"category": "nothing"}, "audit.unknown_category"),
        ({"type": "TaskSucceded"}, "audit.unknown_type"),
        ({"type": "TaskPlaced,Nope"}, "audit.unknown_type"),
    ],
)
async def test_bad_queries_are_400s(gateway: object, params: dict[str, object], code: str) -> None:
    answer = await _get(gateway, "sre", **params)  # type: ignore[arg-type]
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == code


async def test_an_unknown_type_names_the_nearest_known_one(gateway: object) -> None:
    answer = await _get(gateway, "sre", type="tasksucceded")  # type: ignore[arg-type]
    assert answer.status_code == 400
    body = answer.json()
    assert body["field"] == "type" and "'tasksucceded'" in body["message"]
    assert body["hint"] == "did you mean TaskSucceeded?"


async def test_cli_prints_whole_lines_on_a_pipe_and_follows_pages(
    log: AuditLog,
    gateway: tuple[httpx.AsyncClient, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, tokens = gateway
    monkeypatch.setattr(cli_audit, "PAGE", 2)
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(
        "runyard.cli.main.make_client",
        lambda url, token: _SyncOverAsgi(client, tokens["sre"], loop),
    )
    result = await asyncio.to_thread(
        CliRunner().invoke, cli_app, ["audit", "--type", "TaskRestartScheduled,TaskPreempted"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == ["position", "time", "type", "stream", "actor", "detail"]
    f = AuditFilter(types=("TaskRestartScheduled", "TaskPreempted"))
    assert [int(line.split("\t")[0]) for line in lines[1:]] == log.expected(f)
    assert len(lines) > 3, "more than one page (PAGE = 2)"
    assert "reason=spot capacity shrank: n2 left" in lines[1]


class _SyncOverAsgi(httpx.Client):
    """The CLI's sync client, answered by the in-process app through the test's loop."""

    def __init__(
        self, client: httpx.AsyncClient, token: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(base_url="http://gw", headers={"Authorization": f"Bearer {token}"})
        self._client = client
        self._loop = loop

    def request(self, method: str, url: str, **kw: Any) -> httpx.Response:  # type: ignore[override]
        future = asyncio.run_coroutine_threadsafe(
            self._client.request(method, url, headers=self.headers, **kw),
            self._loop,
        )
        return future.result(30)


def test_filters_of_other_values_have_other_digests() -> None:
    # (The CLI's times, `1h` and ISO 8601: tests/unit/test_cli_when.py.)
    assert replace(AuditFilter(), node="a").digest() != AuditFilter(node="b").digest()
