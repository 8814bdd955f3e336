"""Roles with scope and the token lifecycle, against a real Postgres, over HTTP and gRPC.

One test per finding: a tenant admin is only its tenant's admin; an sre reads
every tenant and changes nothing; revocation and expiry hold at once on both
APIs; tokens are stored hashed; minting and revoking are events naming the
admin; names in tokens are checked; `Bearer` is parsed strictly and the
OpenAPI document declares the scheme.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import pytest
import uvicorn
from runyard.api.auth import authenticate, create_token, ensure_dev_token, token_hash
from runyard.cli.main import app as cli_app
from runyard.eventstore import apply_migrations
from runyard.gateway.app import Gateway, gateway_migrations
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.gateway.http import create_app
from runyard.stack.ports import free_port
from runyard.stack.up import all_migrations
from typer.testing import CliRunner, Result

from tests.integration.test_gateway import BASE, config_dir
from tests.integration.test_gateway_routing import log_service, notification_service


@dataclass
class World:
    """One gateway (HTTP in process, gRPC on a port) and a token per person."""

    gateway: Gateway
    http: httpx.AsyncClient
    stub: pb_grpc.TasksStub
    tokens: dict[str, str]

    async def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.request(method, path, headers=headers, **kw)

    async def mint(self, who: str, **body: Any) -> httpx.Response:
        return await self.call(who, "POST", "/v1/admin/tokens", json=body)

    async def grpc_get(self, token: str, task_id: str) -> grpc.StatusCode:
        try:
            await self.stub.GetTask(
                pb.GetTaskRequest(task_id=task_id),
                metadata=(("authorization", f"Bearer {token}"),),
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


@pytest.fixture
async def world(dsn: str, tmp_path: Path) -> AsyncIterator[World]:
    config = config_dir(tmp_path)
    gateway = await Gateway.connect(dsn, config)
    tokens = {
        "root": await create_token(gateway.db, "ops", "root", "platform_admin"),
        "ta_admin": await create_token(gateway.db, "ta", "anna", "tenant_admin"),
        "tb_admin": await create_token(gateway.db, "tb", "boris", "tenant_admin"),
        "ta_alice": await create_token(gateway.db, "ta", "alice", "member"),
        "tb_bob": await create_token(gateway.db, "tb", "bob", "member"),
        "sre": await create_token(gateway.db, "ops", "sam", "sre"),
    }
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    server, port = await start_server(gateway, "127.0.0.1", 0, owners=app.state.owners)
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            log_service(dsn, tmp_path / "exports", endpoints),
            notification_service(dsn, config, endpoints),
            httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            yield World(gateway, client, pb_grpc.TasksStub(channel), tokens)
    finally:
        await server.stop(grace=None)
        await app.state.owners.aclose()
        await gateway.close()


async def _submit(world: World, who: str, **changes: Any) -> str:
    answer = await world.call(who, "POST", "/v1/tasks", json={**BASE, **changes})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["task_id"])


async def test_tenant_admin_cannot_mint_for_another_tenant_or_a_higher_role(world: World) -> None:
    for body, code in [
        ({"tenant": "ta", "user": "alice", "role": "member"}, "auth.other_tenant"),
        ({"tenant": "tb", "user": "eve", "role": "platform_admin"}, "auth.role_not_grantable"),
        ({"tenant": "tb", "user": "eve", "role": "admin"}, "auth.role_not_grantable"),
        ({"tenant": "tb", "user": "eve", "role": "sre"}, "auth.role_not_grantable"),
    ]:
        answer = await world.mint("tb_admin", **body)
        assert (answer.status_code, answer.json()["code"]) == (403, code), body
    count = await world.gateway.db.fetchval("SELECT count(*) FROM api_tokens")
    assert count == len(world.tokens)  # nothing was stored
    # Within its tenant it may: a member, a service account, another tenant admin.
    for role in ("member", "service", "tenant_admin"):
        made = await world.mint("tb_admin", tenant="tb", user=f"u-{role}", role=role)
        assert made.status_code == 201, made.text
        assert (made.json()["tenant"], made.json()["role"]) == ("tb", role)
    # Members and sres mint nothing.
    for who in ("tb_bob", "sre"):
        denied = await world.mint(who, tenant="tb", user="x", role="member")
        assert denied.status_code == 403, denied.text


async def test_tenant_admin_cannot_read_another_tenants_creator_only_secret(world: World) -> None:
    """The finding's consequence: a token minted across tenants showed a creator-only
    value in clear. Now the mint is refused, and nobody but the creator sees it."""
    task_id = await _submit(world, "ta_alice", env="API_KEY=s3cret", creator_only=["API_KEY"])
    mine = await world.call("ta_alice", "GET", f"/v1/tasks/{task_id}")
    assert "s3cret" in mine.text
    stolen = await world.mint("tb_admin", tenant="ta", user="alice", role="member")
    assert stolen.status_code == 403
    for who in ("root", "sre"):  # read across tenants, but they are not the creator
        seen = await world.call(who, "GET", f"/v1/tasks/{task_id}")
        assert seen.status_code == 200 and "s3cret" not in seen.text, who
        events = await world.call(who, "GET", f"/v1/tasks/{task_id}/events")
        assert events.status_code == 200 and "s3cret" not in events.text, who
    # The same user name in another tenant is not the creator either.
    world.tokens["tb_alice"] = await create_token(world.gateway.db, "tb", "alice", "member")
    other = await world.call("tb_alice", "GET", f"/v1/tasks/{task_id}")
    assert other.status_code == 404


async def test_tenant_admin_cannot_mint_a_user_someone_else_made(world: World) -> None:
    """A token for a user name is that user: an admin of alice's own tenant minting
    `alice` would read her creator-only values. It mints only itself, new users and
    users it made; a platform admin mints for anyone."""
    task_id = await _submit(world, "ta_alice", env="API_KEY=s3cret", creator_only=["API_KEY"])
    stored = await world.gateway.db.fetchval("SELECT count(*) FROM api_tokens")
    for role in ("member", "tenant_admin", "service"):
        taken = await world.mint("ta_admin", tenant="ta", user="alice", role=role)
        assert (taken.status_code, taken.json()["code"]) == (403, "auth.user_not_yours"), role
        assert "system" in taken.json()["message"] and "platform admin" in taken.json()["hint"]
    assert await world.gateway.db.fetchval("SELECT count(*) FROM api_tokens") == stored
    # Itself, a new user, and that user again (a rotation): its own to mint.
    for user in ("anna", "carol", "carol"):
        made = await world.mint("ta_admin", tenant="ta", user=user, role="member")
        assert made.status_code == 201, (user, made.text)
    # Another admin of the same tenant did not make carol.
    world.tokens["ta_admin2"] = await create_token(world.gateway.db, "ta", "ada", "tenant_admin")
    denied = await world.mint("ta_admin2", tenant="ta", user="carol", role="member")
    assert (denied.status_code, denied.json()["code"]) == (403, "auth.user_not_yours")
    # A platform admin may, and that token is alice: the creator.
    granted = await world.mint("root", tenant="ta", user="alice", role="member")
    assert granted.status_code == 201, granted.text
    world.tokens["ta_alice2"] = granted.json()["token"]
    seen = await world.call("ta_alice2", "GET", f"/v1/tasks/{task_id}")
    assert "s3cret" in seen.text
    # ... after which anna still may not.
    again = await world.mint("ta_admin", tenant="ta", user="alice", role="member")
    assert again.status_code == 403


async def test_a_name_a_tenant_admin_minted_first_is_not_minted_again_by_a_platform_admin(
    world: World,
) -> None:
    """A tenant admin mints `dave` before dave has a token (a new name is its to mint);
    a platform admin then minting `dave` for the real dave would make the tenant
    admin's token dave, creator-only values included. It is a 409 naming who holds
    tokens of dave, until they are revoked; users the platform made, a platform admin
    made and the user made itself stay a platform admin's to mint."""
    squatted = await world.mint("ta_admin", tenant="ta", user="dave", role="member")
    assert squatted.status_code == 201, squatted.text
    world.tokens["squat"] = squatted.json()["token"]
    stored = await world.gateway.db.fetchval("SELECT count(*) FROM api_tokens")
    refused = await world.mint("root", tenant="ta", user="dave", role="member")
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "auth.user_held", refused.text
    assert "user:ta/anna" in refused.json()["message"] and "revoke" in refused.json()["hint"]
    assert await world.gateway.db.fetchval("SELECT count(*) FROM api_tokens") == stored
    # once its tokens are revoked they act as nobody: the platform admin mints dave
    revoked = await world.call(
        "ta_admin", "DELETE", f"/v1/admin/tokens/{squatted.json()['token_id']}"
    )
    assert revoked.status_code == 200, revoked.text
    granted = await world.mint("root", tenant="ta", user="dave", role="member")
    assert granted.status_code == 201, granted.text
    world.tokens["dave"] = granted.json()["token"]
    task_id = await _submit(world, "dave", env="API_KEY=s3cret", creator_only=["API_KEY"])
    assert (await world.call("squat", "GET", f"/v1/tasks/{task_id}")).status_code == 401
    # made by the platform (alice), by a platform admin (dave now), by the user itself
    for user in ("alice", "dave"):
        again = await world.mint("root", tenant="ta", user=user, role="member")
        assert again.status_code == 201, (user, again.text)
    world.tokens["ta_erin"] = (
        await world.mint("ta_admin", tenant="ta", user="erin", role="tenant_admin")
    ).json()["token"]
    own = await world.mint("ta_erin", tenant="ta", user="erin", role="tenant_admin")
    assert own.status_code == 201, own.text
    held = await world.mint("root", tenant="ta", user="erin", role="member")
    assert held.status_code == 409 and "user:ta/anna" in held.json()["message"], held.text
    assert "user:ta/erin" not in held.json()["message"], held.text


async def test_tenant_admin_lists_and_revokes_only_its_tenant(world: World) -> None:
    ta_items = (await world.call("ta_admin", "GET", "/v1/admin/tokens")).json()["items"]
    assert {t["tenant"] for t in ta_items} == {"ta"} and len(ta_items) == 2
    assert all("token" not in t and "token_sha256" not in t for t in ta_items)
    peek = await world.call("tb_admin", "GET", "/v1/admin/tokens", params={"tenant": "ta"})
    assert (peek.status_code, peek.json()["code"]) == (403, "auth.other_tenant")
    tb_items = (await world.call("tb_admin", "GET", "/v1/admin/tokens")).json()["items"]
    assert {t["tenant"] for t in tb_items} == {"tb"}
    every = (await world.call("root", "GET", "/v1/admin/tokens")).json()["items"]
    assert {t["tenant"] for t in every} == {"ops", "ta", "tb"}
    # `?tenant=` (empty) is no tenant given: every tenant's, and a tenant admin's own
    given_none = await world.call("root", "GET", "/v1/admin/tokens", params={"tenant": ""})
    assert given_none.json()["items"] == every, given_none.text
    own = await world.call("ta_admin", "GET", "/v1/admin/tokens", params={"tenant": ""})
    assert own.json()["items"] == ta_items, own.text
    alice_id = next(t["token_id"] for t in ta_items if t["user"] == "alice")
    revoke = await world.call("tb_admin", "DELETE", f"/v1/admin/tokens/{alice_id}")
    assert (revoke.status_code, revoke.json()["code"]) == (404, "token.not_found")
    assert (await world.call("ta_alice", "GET", "/v1/tasks")).status_code == 200
    # A platform admin's token in tb's tenant is out of tb's admin's reach too.
    made = await world.mint("root", tenant="tb", user="chief", role="platform_admin")
    chief = made.json()["token_id"]
    denied = await world.call("tb_admin", "DELETE", f"/v1/admin/tokens/{chief}")
    assert (denied.status_code, denied.json()["code"]) == (403, "auth.role_not_grantable")


async def test_sre_reads_every_tenant_but_changes_nothing(world: World) -> None:
    task_id = await _submit(world, "ta_alice")
    for path in (
        f"/v1/tasks/{task_id}",
        f"/v1/tasks/{task_id}/events",
        f"/v1/tasks/{task_id}/logs",
        f"/v1/tasks/{task_id}/first-error",
    ):
        answer = await world.call("sre", "GET", path)
        assert answer.status_code == 200, (path, answer.text)
    listed = await world.call("sre", "GET", "/v1/tasks", params={"tenant": "ta"})
    assert [t["task_id"] for t in listed.json()["items"]] == [task_id]
    assert await world.grpc_get(world.tokens["sre"], task_id) == grpc.StatusCode.OK
    # A member cannot list another tenant.
    nosy = await world.call("tb_bob", "GET", "/v1/tasks", params={"tenant": "ta"})
    assert (nosy.status_code, nosy.json()["code"]) == (403, "auth.other_tenant")
    before = await world.gateway.db.fetchval("SELECT count(*) FROM events")
    for method, path, body in [
        ("POST", "/v1/tasks", BASE),
        ("POST", f"/v1/tasks/{task_id}/stop", None),
        ("POST", f"/v1/tasks/{task_id}/rerun", {}),
        ("POST", f"/v1/tasks/{task_id}/clone", {}),
        ("POST", "/v1/groups", {"template": BASE, "items": [{}]}),
        ("POST", "/v1/admin/tokens", {"tenant": "ops", "user": "x", "role": "member"}),
        ("POST", "/v1/alert-subscriptions", {"webhook_url": "https://open.feishu.cn/x"}),
        ("POST", "/v1/admin/images", {"name": "x:1", "zones": ["cn-north-1"]}),
    ]:
        answer = await world.call("sre", method, path, json=body)
        assert answer.status_code == 403, (path, answer.text)
    stop = world.stub.StopTask(
        pb.StopTaskRequest(task_id=task_id),
        metadata=(("authorization", f"Bearer {world.tokens['sre']}"),),
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stop
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await world.gateway.db.fetchval("SELECT count(*) FROM events") == before


async def test_platform_admin_reads_other_tenants_but_changes_only_its_own(world: World) -> None:
    task_id = await _submit(world, "ta_alice")
    assert (await world.call("root", "GET", f"/v1/tasks/{task_id}")).status_code == 200
    stop = await world.call("root", "POST", f"/v1/tasks/{task_id}/stop")
    assert (stop.status_code, stop.json()["code"]) == (403, "auth.other_tenant")


async def test_revocation_holds_at_once_on_http_and_grpc(world: World) -> None:
    task_id = await _submit(world, "ta_alice")
    made = await world.mint("ta_admin", tenant="ta", user="ci", role="service")
    token, token_id = made.json()["token"], made.json()["token_id"]
    world.tokens["ci"] = token
    assert (await world.call("ci", "GET", f"/v1/tasks/{task_id}")).status_code == 200
    assert await world.grpc_get(token, task_id) == grpc.StatusCode.OK
    revoked = await world.call("ta_admin", "DELETE", f"/v1/admin/tokens/{token_id}")
    assert (revoked.status_code, revoked.json()["state"]) == (200, "revoked")
    after = await world.call("ci", "GET", f"/v1/tasks/{task_id}")
    assert (after.status_code, after.json()["code"]) == (401, "auth.token_revoked")
    assert await world.grpc_get(token, task_id) == grpc.StatusCode.UNAUTHENTICATED
    listed = await world.call("ta_admin", "GET", "/v1/admin/tokens")
    assert token_id not in {t["token_id"] for t in listed.json()["items"]}
    everything = await world.call(
        "ta_admin", "GET", "/v1/admin/tokens", params={"include_revoked": "true"}
    )
    states = {t["token_id"]: t["state"] for t in everything.json()["items"]}
    assert states[token_id] == "revoked"


async def test_expired_token_is_refused(world: World) -> None:
    made = await world.mint("ta_admin", tenant="ta", user="short", role="member", ttl="1h")
    assert made.status_code == 201, made.text
    token, token_id = made.json()["token"], made.json()["token_id"]
    world.tokens["short"] = token
    assert (await world.call("short", "GET", "/v1/tasks")).status_code == 200
    # Time passes: the stored expiry is moved into the past rather than sleeping.
    await world.gateway.db.execute(
        "UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE token_id = $1",
        token_id,
    )
    answer = await world.call("short", "GET", "/v1/tasks")
    assert (answer.status_code, answer.json()["code"]) == (401, "auth.token_expired")
    assert await world.grpc_get(token, "any") == grpc.StatusCode.UNAUTHENTICATED
    # Expiries out of range are refused when minting.
    for body in ({"ttl": "366d"}, {"ttl": 0}, {"expires_at": "2000-01-01T00:00:00Z"}):
        refused = await world.mint("ta_admin", tenant="ta", user="x", role="member", **body)
        assert (refused.status_code, refused.json()["code"]) == (400, "auth.invalid_expiry")


async def test_tokens_are_stored_hashed_and_never_listed(world: World) -> None:
    made = await world.mint("root", tenant="ta", user="hashme", role="member")
    token = made.json()["token"]
    rows = await world.gateway.db.fetch("SELECT * FROM api_tokens")
    stored = json.dumps([dict(r) for r in rows], default=str)
    assert token not in stored and token_hash(token) in stored
    assert all(
        not any(v == t for v in dict(r).values()) for r in rows for t in world.tokens.values()
    )
    listed = await world.call("root", "GET", "/v1/admin/tokens")
    assert token not in listed.text and token_hash(token) not in listed.text
    events = await world.gateway.db.fetch("SELECT data::text AS d FROM events")
    assert all(token not in e["d"] and token_hash(token) not in e["d"] for e in events)


async def test_mint_and_revoke_are_events_with_the_admin_as_actor(world: World) -> None:
    made = await world.mint("ta_admin", tenant="ta", user="dana", role="member", description="ci")
    token_id = made.json()["token_id"]
    await world.call("ta_admin", "DELETE", f"/v1/admin/tokens/{token_id}")
    image = await world.call("root", "POST", "/v1/admin/images", json={"name": "n:1"})
    assert image.status_code == 201, image.text
    rows = await world.gateway.db.fetch(
        """SELECT stream_id, event_type, metadata->>'actor' AS actor FROM events
           WHERE stream_id = $1 OR stream_id LIKE 'catalogue-%' ORDER BY global_position""",
        f"access-{token_id}",
    )
    assert [(r["stream_id"], r["event_type"], r["actor"]) for r in rows] == [
        (f"access-{token_id}", "TokenIssued", "user:ta/anna"),
        (f"access-{token_id}", "TokenRevoked", "user:ta/anna"),
        ("catalogue-image", "CatalogueEntrySet", "user:ops/root"),
    ]


async def test_names_in_tokens_are_checked(world: World) -> None:
    for field, value in [
        ("user", "eve\nforged line"),
        ("user", "eve\x1b[31m"),
        ("user", "x" * 65),
        ("user", ""),
        ("tenant", "t" * 64),
        ("tenant", "a/b"),
        ("tenant", "ta\x00"),
    ]:
        body = {"tenant": "ta", "user": "ok", "role": "member", field: value}
        answer = await world.mint("root", **body)
        assert answer.status_code == 400, (field, value, answer.text)
        assert (answer.json()["code"], answer.json()["field"]) in {
            ("auth.invalid_name", field),
            ("request.invalid", field),  # NUL is refused before the rules see it
        }, answer.text
    long_ok = await world.mint("root", tenant="t" * 63, user="a.b-c_d@x.org", role="member")
    assert long_ok.status_code == 201, long_ok.text


@pytest.mark.parametrize(
    "header",
    ["bearer {t}", "Bearer  {t}", "BEARER {t}", "Bearer {t} ", "Bearer\t{t}", "Token {t}", "{t}"],
)
async def test_bearer_parsing_is_strict(world: World, header: str) -> None:
    token = world.tokens["ta_alice"]
    answer = await world.http.get("/v1/tasks", headers={"Authorization": header.format(t=token)})
    assert (answer.status_code, answer.json()["code"]) == (401, "auth.malformed_header")
    assert "Bearer <token>" in answer.json()["message"]
    if "\t" in header:
        return  # gRPC clients refuse to send a tab in metadata
    try:
        await world.stub.ListTasks(
            pb.ListTasksRequest(), metadata=(("authorization", header.format(t=token)),)
        )
        code = grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
    assert code == grpc.StatusCode.UNAUTHENTICATED
    exact = await world.http.get("/v1/tasks", headers={"Authorization": f"Bearer {token}"})
    assert exact.status_code == 200


async def test_two_authorization_headers_are_refused_over_http_and_grpc(world: World) -> None:
    """Servers and proxies differ on which of two headers they read (HTTP read the first,
    gRPC the last): a request with two is no one's, in either order."""
    token = world.tokens["ta_alice"]
    for pair in ((f"Bearer {token}", "Bearer other"), ("Bearer other", f"Bearer {token}")):
        headers = [("Authorization", value) for value in pair]
        answer = await world.http.get("/v1/tasks", headers=headers)
        assert (answer.status_code, answer.json()["code"]) == (401, "auth.malformed_header")
        assert "2 Authorization headers" in answer.json()["message"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            metadata = tuple(("authorization", value) for value in pair)
            await world.stub.ListTasks(pb.ListTasksRequest(), metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "2 Authorization headers" in str(refused.value.details())


async def test_openapi_declares_the_bearer_scheme_on_every_protected_route(world: World) -> None:
    doc = (await world.http.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "send exactly `Authorization: Bearer <token>` (capital B, one space)",
    }
    operations = [
        (path, method, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]
    assert len(operations) > 30
    unprotected = [(p, m) for p, m, op in operations if op.get("security") != [{"HTTPBearer": []}]]
    assert unprotected == []


async def test_old_admin_tokens_become_platform_admins_and_the_dev_token_works(
    dsn: str, tmp_path: Path
) -> None:
    """Migration: a token stored with the old `admin` role reads as platform_admin;
    `runyard up`'s dev token is a platform admin with an expiry and an event."""
    path = tmp_path / "token"
    token = await ensure_dev_token(dsn, path, all_migrations())
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    try:
        principal = await authenticate(gateway.db, token)
        assert principal.role == "platform_admin"
        row = await gateway.db.fetchrow(
            "SELECT token_id, expires_at > now() AS live FROM api_tokens WHERE token_sha256 = $1",
            token_hash(token),
        )
        assert row["live"]
        actor = await gateway.db.fetchval(
            "SELECT metadata->>'actor' FROM events WHERE stream_id = $1",
            f"access-{row['token_id']}",
        )
        assert actor == "system:runyard-up"
        # A row as the old schema wrote it (role `admin`) still authenticates.
        await gateway.db.execute("ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_role_check")
        await gateway.db.execute(
            "UPDATE api_tokens SET role = 'admin' WHERE token_id = $1", row["token_id"]
        )
        assert (await authenticate(gateway.db, token)).role == "platform_admin"
    finally:
        await gateway.close()


async def test_migration_keeps_tokens_stored_before_scoped_roles(dsn: str) -> None:
    """Rows written by the single-`admin` schema: after the migration each has an id
    and an expiry, `admin` reads as platform_admin, and the same clear token works."""
    old = [m for m in gateway_migrations() if m.version < 3]
    conn = await asyncpg.connect(dsn)
    try:
        await apply_migrations(conn, old)
        for token, role in (("ry_old-admin", "admin"), ("ry_old-member", "member")):
            await conn.execute(
                "INSERT INTO api_tokens (token_sha256, tenant, user_name, role)"
                " VALUES ($1, 't1', $2, $3)",
                token_hash(token),
                role,
                role,
            )
        await apply_migrations(conn, gateway_migrations())
        rows = await conn.fetch(
            "SELECT role, token_id, expires_at > now() AS live FROM api_tokens ORDER BY role"
        )
        assert [(r["role"], r["live"]) for r in rows] == [
            ("member", True),
            ("platform_admin", True),
        ]
        assert all(r["token_id"].startswith("tok_") for r in rows)
        admin = await authenticate(conn, "ry_old-admin")
        assert (admin.tenant, admin.user, admin.role) == ("t1", "admin", "platform_admin")
        assert (await authenticate(conn, "ry_old-member")).role == "member"
    finally:
        await conn.close()


async def _cli(url: str, token: str, *args: str) -> Result:
    env = {"RUNYARD_URL": url, "RUNYARD_TOKEN": token, "COLUMNS": "250"}
    return await asyncio.to_thread(CliRunner().invoke, cli_app, list(args), env=env)


async def test_cli_admin_tokens_create_list_revoke(world: World) -> None:
    port = free_port()
    config = uvicorn.Config(
        create_app(world.gateway), port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.02)
        url, admin = f"http://127.0.0.1:{port}", world.tokens["ta_admin"]
        made = await _cli(
            url, admin, "admin", "tokens", "create", "ta", "ci-bot", "--role", "service",
            "--ttl", "7d", "--description", "nightly CI", "--json",
        )  # fmt: skip
        assert made.exit_code == 0, made.output
        created = json.loads(made.output)
        assert (created["role"], created["description"]) == ("service", "nightly CI")
        table = await _cli(url, admin, "admin", "tokens", "list")
        assert table.exit_code == 0, table.output
        assert created["token_id"] in table.output and "ci-bot" in table.output
        assert created["token"] not in table.output
        revoked = await _cli(url, admin, "admin", "tokens", "revoke", created["token_id"])
        assert revoked.exit_code == 0, revoked.output
        assert f"token {created['token_id']} of ta/ci-bot: revoked" in revoked.output
        other = await _cli(url, admin, "admin", "tokens", "create", "tb", "x")
        assert other.exit_code == 3 and "auth.other_tenant" in other.output
    finally:
        server.should_exit = True
        await serving


async def test_the_console_makes_lists_and_revokes_tokens_as_the_api_does(world: World) -> None:
    """A tenant admin who never opens a terminal brings a colleague in and out from the
    console: the new token shown once (never in the list), the API's minting rules
    (another tenant, a higher role, a user someone else made: refused on the page, the
    form kept), a revoked token refused at once; members get a 403, every change
    needs the session's CSRF token, another tenant's admin sees none of it."""

    async def signed_in(client: httpx.AsyncClient, token: str) -> str:
        signed = await client.post("/console/sign-in", data={"token": token})
        assert signed.status_code == 303, signed.text
        page = await client.get("/console/tokens")
        return (
            page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0] if page.is_success else ""
        )

    transport = world.http._transport
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://gw") as anna,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as boris,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as alice,
    ):
        csrf = await signed_in(anna, world.tokens["ta_admin"])
        await signed_in(boris, world.tokens["tb_admin"])
        await signed_in(alice, world.tokens["ta_alice"])
        page = await anna.get("/console/tokens")
        assert page.status_code == 200 and 'data-token-id="' in page.text
        assert '<option value="platform_admin"' not in page.text  # not its to grant
        member = await alice.get("/console/tokens")
        assert member.status_code == 403 and "auth.admin_only" in member.text
        form = {"user": "carl", "role": "member", "ttl": "12h", "description": "carl's laptop"}
        assert (await anna.post("/console/tokens", data=form)).status_code == 403  # no CSRF
        made = await anna.post("/console/tokens", data={**form, "csrf": csrf})
        assert made.status_code == 201, made.text
        token = made.text.split('<code id="new-token">', 1)[1].split("</code>", 1)[0]
        assert token.startswith("ry_")
        assert (
            await world.http.get("/v1/tasks", headers={"Authorization": f"Bearer {token}"})
        ).is_success
        listed = (await anna.get("/console/tokens")).text
        assert "carl&#39;s laptop" in listed and token not in listed
        [carl] = [
            t
            for t in (await world.call("ta_admin", "GET", "/v1/admin/tokens")).json()["items"]
            if t["user"] == "carl"
        ]
        assert carl["created_by"] == "user:ta/anna" and carl["tenant"] == "ta"
        # the API's rules, on the page, the form kept
        for refused_form, code in (
            ({"user": "zed", "role": "platform_admin"}, "auth.role_not_grantable"),
            ({"user": "alice", "role": "member"}, "auth.user_not_yours"),
            ({"user": "no spaces", "role": "member"}, "auth.invalid_name"),
        ):
            refused = await anna.post("/console/tokens", data={**refused_form, "csrf": csrf})
            assert refused.status_code in (400, 403) and code in refused.text, (code, refused.text)
            assert f'value="{refused_form["user"]}"' in refused.text
        # another tenant's admin: neither sees nor revokes it
        assert carl["token_id"] not in (await boris.get("/console/tokens")).text
        boris_csrf = (
            (await boris.get("/console/tokens"))
            .text.split('name="csrf" value="', 1)[1]
            .split('"', 1)[0]
        )
        theirs = await boris.post(
            f"/console/tokens/{carl['token_id']}/revoke", data={"csrf": boris_csrf}
        )
        assert theirs.status_code == 404
        revoke = f"/console/tokens/{carl['token_id']}/revoke"
        assert (await anna.post(revoke)).status_code == 403  # no CSRF
        revoked = await anna.post(revoke, data={"csrf": csrf})
        assert (revoked.status_code, revoked.headers["location"]) == (303, "/console/tokens")
        assert (
            await world.http.get("/v1/tasks", headers={"Authorization": f"Bearer {token}"})
        ).status_code == 401
        assert carl["token_id"] not in (await anna.get("/console/tokens")).text
        shown = (await anna.get("/console/tokens?revoked=1")).text
        assert f'data-token-id="{carl["token_id"]}" data-state="revoked"' in shown


async def test_a_tenant_holds_a_bounded_number_of_active_tokens(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every token is a row each request looks up and each mint an event: a tenant
    admin minting without end is refused past the limit (two mints at once never pass
    it together), a revoked token frees its place, and a listing answers at most its
    limit, saying when more matched."""
    from runyard.api import auth as auth_module

    monkeypatch.setattr(auth_module, "MAX_ACTIVE_TOKENS", 4)
    monkeypatch.setattr(auth_module, "MAX_LISTED_TOKENS", 3)
    # tenant ta holds anna's and alice's: two more fit, and only one of three at once
    assert (await world.mint("ta_admin", tenant="ta", user="u1")).status_code == 201
    raced = await asyncio.gather(
        *(world.mint("ta_admin", tenant="ta", user=f"r{i}") for i in range(3))
    )
    assert sorted(r.status_code for r in raced) == [201, 409, 409], [r.text for r in raced]
    full = await world.mint("root", tenant="ta", user="late")  # a platform admin too
    assert (full.status_code, full.json()["code"]) == (409, "auth.too_many_tokens")
    assert "revoke" in full.json()["hint"]
    assert (await world.mint("tb_admin", tenant="tb", user="u1")).status_code == 201
    listed = (await world.call("ta_admin", "GET", "/v1/admin/tokens")).json()
    assert len(listed["items"]) == 3 and listed["truncated"] is True
    async with httpx.AsyncClient(transport=world.http._transport, base_url="http://gw") as anna:
        signed = await anna.post("/console/sign-in", data={"token": world.tokens["ta_admin"]})
        assert signed.status_code == 303
        page = (await anna.get("/console/tokens")).text
        assert 'id="tokens-truncated"' in page and page.count('data-token-id="') == 3
    [u1] = [t for t in listed["items"] if t["user"] == "u1"]
    revoked = await world.call("ta_admin", "DELETE", f"/v1/admin/tokens/{u1['token_id']}")
    assert revoked.status_code == 200
    assert (await world.mint("ta_admin", tenant="ta", user="u2")).status_code == 201
