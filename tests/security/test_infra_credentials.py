"""The infrastructure `runyard up` starts gives the services no superuser power.

The stack here is the one `runyard up` builds (runyard.stack.up.Stack, embedded
Postgres, on a home of the test's own): it used to hand every service the
superuser with trust auth, so a task read the `secrets` table in clear and ran
`COPY ... TO PROGRAM` on the host. Now each service connects as a
non-superuser role with a scram password, and these tests prove what those
credentials can no longer do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.eventstore import apply_migrations
from runyard.messaging import KafkaSettings
from runyard.stack import roles
from runyard.stack.context import ServiceContext
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres, _pg_bin
from runyard.stack.ports import free_port
from runyard.stack.serve import SERVICE_NAMES
from runyard.stack.up import (
    Stack,
    _write_private,
    all_migrations,
    migrate,
    run_platform,
    running,
    wait_ready,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str) -> Iterator[Stack]:
    """Postgres as `runyard up` starts it, migrated by the owner role, grants applied."""
    # Not under pytest's basetemp, which is private to root: the server's own
    # system user must reach its data directory.
    home = Path(tempfile.mkdtemp(prefix="runyard-test-home-"))
    (home / "run").mkdir(mode=0o700)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("DATABASE_URL", raising=False)
        env.setenv("RUNYARD_PG_PORT", str(free_port()))
        env.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)  # the session's broker
        up = Stack(home)
        up.start_infrastructure()
    try:
        asyncio.run(migrate(up.owner_dsn, grants=True))
        yield up
    finally:
        up.stop_infrastructure()
        shutil.rmtree(home, ignore_errors=True)


def _service_role_dsns(stack: Stack) -> dict[str, str]:
    """Every DSN a service (or the CLI, through .runyard/env) is given."""
    dsns = {"relay": stack.dsn, "migrations": stack.owner_dsn}
    dsns.update(stack.service_dsns)
    return dsns


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    return dsn.replace(f":{parts.password}@", "@")


async def test_services_get_non_superuser_scram_roles_over_loopback(stack: Stack) -> None:
    assert stack.postgres is not None
    dsns = _service_role_dsns(stack)
    assert set(stack.service_dsns) == {"gateway", "submission", "deployer", "notification", "logs"}
    seen = set()
    for service, dsn in dsns.items():
        parts = urlsplit(dsn)
        assert parts.hostname == "127.0.0.1" and parts.password, (service, "no TCP password")
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(
                """SELECT current_user AS name, rolsuper, rolcreaterole, rolcreatedb,
                          rolreplication, rolbypassrls
                   FROM pg_roles WHERE rolname = current_user"""
            )
            ssl_or_tcp = await conn.fetchval("SELECT inet_client_addr()::text")
        finally:
            await conn.close()
        assert row["name"] in roles.ROLES, service
        assert not any(v for k, v in row.items() if k.startswith("rol")), dict(row)
        assert ssl_or_tcp == "127.0.0.1/32"
        seen.add(row["name"])
    assert seen == set(roles.ROLES)
    admin = await asyncpg.connect(stack.postgres.dsn)
    try:
        verifiers = await admin.fetch(
            "SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY($1)",
            list(roles.ROLES),
        )
        rules = await admin.fetch("SELECT type, auth_method FROM pg_hba_file_rules")
        listen = await admin.fetchval("SHOW listen_addresses")
    finally:
        await admin.close()
    assert all(v["rolpassword"].startswith("SCRAM-SHA-256$") for v in verifiers)
    assert {(r["type"], r["auth_method"]) for r in rules} == {
        ("local", "peer"),
        ("host", "scram-sha-256"),
    }
    assert listen == "127.0.0.1"


async def test_service_roles_cannot_run_programs_or_read_server_files(
    stack: Stack, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    for service, dsn in _service_role_dsns(stack).items():
        conn = await asyncpg.connect(dsn)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval("SELECT pg_read_file('/etc/passwd')")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CREATE TEMP TABLE leak (line text)")
                await conn.execute("COPY leak FROM '/etc/passwd'")
            for capability in roles.FORBIDDEN_MEMBERSHIPS:
                member = await conn.fetchval(
                    "SELECT pg_has_role(current_user, $1, 'MEMBER')", capability
                )
                assert not member, (service, capability)
        finally:
            await conn.close()
        assert not marker.exists(), service


async def test_connections_without_the_password_are_refused(stack: Stack) -> None:
    assert stack.postgres is not None
    for service, dsn in _service_role_dsns(stack).items():
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(_without_password(dsn), password="")
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(_without_password(dsn), password="guess")
        # Over the socket (no password asked): only the superuser's OS user may.
        user = urlsplit(dsn).username
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError) as refused:
            await asyncpg.connect(
                stack.postgres.dsn_for(roles.DATABASE).replace("postgres@", f"{user}@")
            )
        assert "no pg_hba.conf entry" in str(refused.value)
        assert service
    # The superuser has no password at all: over TCP it cannot log in.
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{stack.postgres.port}/postgres")


async def test_only_the_secrets_role_reads_creator_only_values(stack: Stack) -> None:
    secrets_dsn = stack.service_dsns["gateway"]
    assert stack.service_dsns["deployer"] == secrets_dsn
    writer = await asyncpg.connect(secrets_dsn)
    try:
        await writer.execute(
            "INSERT INTO secrets (tenant, ref, value) VALUES ('ta', 'r1', 'hunter2')"
            " ON CONFLICT DO NOTHING"
        )
        assert await writer.fetchval("SELECT value FROM secrets WHERE ref = 'r1'") == "hunter2"
    finally:
        await writer.close()
    for dsn in (stack.dsn, stack.service_dsns["logs"]):
        conn = await asyncpg.connect(dsn)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch("SELECT value FROM secrets")
            # ... while the rest of the store is theirs to read and write.
            assert await conn.fetchval("SELECT count(*) FROM events") >= 0
        finally:
            await conn.close()


async def test_service_roles_change_no_schema_nor_history(stack: Stack) -> None:
    for dsn in (stack.dsn, stack.service_dsns["gateway"]):
        conn = await asyncpg.connect(dsn)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CREATE TABLE intruder (x int)")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("DROP TABLE events")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("INSERT INTO schema_migrations VALUES ('x', 1, 'x')")
            for rewrite in ("DELETE FROM events", "UPDATE events SET stream_id = stream_id"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(rewrite)
        finally:
            await conn.close()
    # The maintenance database is closed to them.
    conn_dsn = stack.dsn.rpartition("/")[0] + "/postgres"
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await asyncpg.connect(conn_dsn)


#: Started by root in groups of its own (`os.setgroups`), an embedded Postgres prints
#: its server's user, group and supplementary groups, then stops.
_GROUPS_PROBE = """
import os, sys
from pathlib import Path
from runyard.stack.embedded import EmbeddedPostgres
os.setgroups([0, 4])
pg = EmbeddedPostgres(Path(sys.argv[1]))
pg.start()
try:
    status = Path(f"/proc/{pg.postmaster_pid()}/status").read_text().splitlines()
    print(*(line for line in status if line.startswith(("Uid", "Gid", "Groups"))), sep="\\n")
finally:
    pg.stop()
"""


def test_the_server_runs_as_its_own_user_in_no_other_group() -> None:
    """The embedded Postgres started by root runs as its system user with none of the
    starter's supplementary groups (root's 0 would let it read what that group may)."""
    if os.geteuid() != 0:
        pytest.skip("the server changes user only when started by root")
    home = Path(tempfile.mkdtemp(prefix="runyard-test-groups-"))  # reachable by its user
    try:
        done = subprocess.run(
            [sys.executable, "-c", _GROUPS_PROBE, str(home / "pg")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    status = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert status["Uid"].split()[0] != "0" and status["Gid"].split()[0] != "0", status
    assert status["Groups"].split() == [], status


def test_passwords_are_readable_by_their_owner_only(stack: Stack) -> None:
    assert stat.S_IMODE(stack.credentials_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(stack.credentials_path.parent.stat().st_mode) == 0o700
    credentials = roles.StackCredentials.load_or_create(stack.credentials_path)
    assert set(credentials.passwords) == set(roles.ROLES)
    assert len(set(credentials.passwords.values())) == len(roles.ROLES)
    env = stack.home / "env"
    _write_private(env, f"DATABASE_URL={stack.dsn}\n")
    assert stat.S_IMODE(env.stat().st_mode) == 0o600


def test_a_readable_password_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "postgres-roles.json"
    roles.StackCredentials.load_or_create(path)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        roles.StackCredentials.load_or_create(path)


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* shows them) listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].rpartition(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                found.add(address)
    return found


def test_embedded_servers_listen_on_loopback_only(stack: Stack, tmp_path: Path) -> None:
    assert stack.postgres is not None
    assert _listening(stack.postgres.port) == {"0100007F"}  # 127.0.0.1
    broker = EmbeddedKafka(log_path=tmp_path / "tansu.log")
    broker.start()
    try:
        assert _listening(broker.port) == {"0100007F"}
    finally:
        broker.stop()


def test_the_embedded_broker_refuses_to_listen_beyond_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        EmbeddedKafka(host="0.0.0.0").start()


async def test_the_compose_init_script_makes_the_same_roles() -> None:
    """infra/postgres/init-roles.sh (docker-compose's Postgres), run as the
    postgres image runs it, on a fresh server: then `runyard up` migrates and
    grants as the owner, and the roles hold as on the embedded stack."""
    root = Path(tempfile.mkdtemp(prefix="runyard-test-init-"))
    server = EmbeddedPostgres(root / "data")
    server.start()
    try:
        passwords = {role: f"pw-{role}" for role in roles.ROLES}
        env = {
            **os.environ,
            "PATH": f"{_pg_bin()}:{os.environ['PATH']}",
            "POSTGRES_USER": "postgres",
            "PGHOST": str(server.data_dir),
            "PGPORT": str(server.port),
            "PGDATA": str(server.data_dir),
            **{
                f"RUNYARD_DB_{r.removeprefix('runyard_').upper()}_PASSWORD": p
                for r, p in passwords.items()
            },
        }
        script = REPO / "infra/postgres/init-roles.sh"
        done = await asyncio.to_thread(
            subprocess.run, ["bash", str(script)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        pid = int((server.data_dir / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGHUP)  # the image restarts the server after its init scripts
        await _until_superuser_refused_over_tcp(server)

        def dsn(role: str) -> str:
            return server.tcp_dsn(role, passwords[role], roles.DATABASE)

        await migrate(dsn(roles.OWNER), grants=True)
        for role in roles.ROLES:
            conn = await asyncpg.connect(dsn(role))
            try:
                assert not await conn.fetchval(
                    "SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles"
                    " WHERE rolname = current_user"
                )
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
            finally:
                await conn.close()
        app = await asyncpg.connect(dsn(roles.APP))
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await app.fetch("SELECT * FROM secrets")
        finally:
            await app.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _until_superuser_refused_over_tcp(server: EmbeddedPostgres) -> None:
    """Wait for the script's pg_hba.conf to be loaded: it has no rule at all
    for the superuser over TCP (the embedded one asked for a password)."""
    for _ in range(200):
        try:
            await asyncpg.connect(server.tcp_dsn("postgres", "anything", "postgres"))
        except asyncpg.InvalidPasswordError:  # (a subclass): the old rules still hold
            await asyncio.sleep(0.05)
        except asyncpg.InvalidAuthorizationSpecificationError:  # "no pg_hba.conf entry"
            return
    raise AssertionError("the server did not load the init script's pg_hba.conf")


@contextlib.asynccontextmanager
async def _platform(
    stack: Stack, kafka: KafkaSettings, home: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, asyncio.Task[None]]]:
    """Every service, as `runyard up` starts them, each on its own role; an
    HTTP client with a member's token, and the task running them."""
    http_port = free_port()
    ctx = ServiceContext(
        dsn=stack.dsn,
        kafka=kafka,
        data_dir=home / "data",
        config_dir=Path(shutil.copytree(REPO / "infra/config", home / "config")),
        settings={"http_port": http_port, "grpc_port": free_port(), "scheduler_tick_s": 1.0},
        service_dsns=dict(stack.service_dsns),
    )
    run = asyncio.create_task(run_platform(ctx), name="platform")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
            await wait_ready(ctx.endpoints, SERVICE_NAMES, within_s=60, alive=running(run))
            conn = await asyncpg.connect(stack.dsn)
            try:
                token = await create_token(conn, "sec", "alice", "member")
            finally:
                await conn.close()
            http.headers["Authorization"] = f"Bearer {token}"
            yield http, run
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


@pytest.mark.slow
async def test_the_platform_runs_on_the_service_roles(
    stack: Stack, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """A task is placed, deployed and its output stored (the log service
    makes its day partition as `runyard_logs`): no service needs more."""
    async with _platform(stack, kafka, tmp_path) as (http, run):
        lines = await _run_task(http, run, "echo hello-from-a-role; echo done")
    assert "hello-from-a-role" in lines


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0, reason="workers are sandboxed only when the deployer runs as root"
)
async def test_a_task_cannot_reach_the_stack_servers_nor_read_their_passwords(
    stack: Stack, kafka: KafkaSettings, tmp_path: Path
) -> None:
    assert stack.postgres is not None
    broker_port = kafka.bootstrap.rpartition(":")[2]
    probe = (
        f"for port in {stack.postgres.port} {broker_port}; do"
        " if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null;"
        " then echo reached-$port; else echo refused-$port; fi; done;"
        f" cat {stack.credentials_path} >/dev/null 2>&1"
        " && echo read-credentials || echo no-credentials; echo done"
    )
    async with _platform(stack, kafka, tmp_path) as (http, run):
        lines = await _run_task(http, run, probe)
    assert f"refused-{stack.postgres.port}" in lines, lines
    assert f"refused-{broker_port}" in lines, lines
    assert "no-credentials" in lines, lines


async def _run_task(http: httpx.AsyncClient, run: asyncio.Task[None], command: str) -> list[str]:
    """Submit `command`, wait for it to succeed, return its output lines
    (all of them: the command's last line is `done`)."""
    body = {
        "name": "on-roles",
        "pool": "dev-a100",
        "worker_spec": "1gpu",
        "image": "bash-only",
        "command": command,
    }
    answer = await http.post("/v1/tasks", json=body)
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["task_id"]

    async def finished() -> bool:
        task = (await http.get(f"/v1/tasks/{task_id}")).json()
        return task["status"] in ("succeeded", "failed", "stopped")

    await _until(run, finished)
    task = (await http.get(f"/v1/tasks/{task_id}")).json()
    assert task["status"] == "succeeded", task["last_failure_reason"]
    lines: list[str] = []

    async def logged() -> bool:
        page = (await http.get(f"/v1/tasks/{task_id}/logs")).json()["lines"]
        lines[:] = [line["line"] for line in page]
        return "done" in lines

    await _until(run, logged)
    return lines


async def _until(
    run: asyncio.Task[None], check: Callable[[], Awaitable[bool]], within_s: float = 60.0
) -> None:
    """Poll `check` until true; fail if the platform stops or `within_s` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        if run.done():
            raise AssertionError(f"the platform stopped: {run.exception()!r}")
        assert loop.time() < deadline, f"not done within {within_s:.0f} s: {check}"
        await asyncio.sleep(0.1)


async def test_a_data_directory_of_an_older_runyard_is_closed_and_adopted(
    kafka_bootstrap: str,
) -> None:
    """Before the roles, `runyard up` ran with trust auth and kept its tables
    in database `postgres`, owned by the superuser. The next start closes the
    door and hands the data to the owner role, in database `runyard`."""
    home = Path(tempfile.mkdtemp(prefix="runyard-test-legacy-"))
    (home / "run").mkdir(mode=0o700)
    old = EmbeddedPostgres(home / "pg", port=free_port())
    old.start()
    conn = await asyncpg.connect(old.dsn)
    try:
        await apply_migrations(conn, all_migrations())
        await conn.execute("INSERT INTO checkpoints (name, position) VALUES ('legacy-marker', 42)")
    finally:
        await conn.close()
    old.stop()
    (home / "pg/pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    up = Stack(home)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.delenv("DATABASE_URL", raising=False)
            env.setenv("RUNYARD_PG_PORT", str(old.port))
            env.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
            await asyncio.to_thread(up.start_infrastructure)
        await migrate(up.owner_dsn, grants=True)
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{old.port}/postgres")
        app = await asyncpg.connect(up.dsn)
        try:
            marker = await app.fetchval(
                "SELECT position FROM checkpoints WHERE name = 'legacy-marker'"
            )
            owners = await app.fetch(
                """SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"""
            )
            functions = await app.fetch(
                """SELECT DISTINCT pg_get_userbyid(p.proowner) AS owner FROM pg_proc p
                   JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"""
            )
        finally:
            await app.close()
        assert marker == 42
        assert {r["owner"] for r in owners} == {roles.OWNER, roles.LOGS}
        assert {r["owner"] for r in functions} == {roles.OWNER}
        assert up.postgres is not None
        admin = await asyncpg.connect(up.postgres.dsn)  # a fresh, empty `postgres`
        try:
            assert not await admin.fetchval("SELECT to_regclass('public.checkpoints')")
        finally:
            await admin.close()
    finally:
        up.stop_infrastructure()
        shutil.rmtree(home, ignore_errors=True)
