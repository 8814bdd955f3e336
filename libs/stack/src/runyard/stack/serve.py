"""One service as a process of its own: `runyard serve <name>`, `python -m runyard.<name>`.

The process builds its context from the environment (`ServiceContext.from_env`:
DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS, RUNYARD_TOPIC_PREFIX, RUNYARD_HOME,
RUNYARD_CONFIG, RUNYARD_SETTINGS, RUNYARD_ENDPOINTS), then, before the service
runs:

- applies the migrations it owns (the event store's and its package's
  `migrations` folder) as the owner role, RUNYARD_OWNER_DATABASE_URL when set,
  else DATABASE_URL; the migrations' advisory lock lets every service start
  at once on an empty database (`runyard.eventstore.apply_migrations`);
- creates the topics that are missing.

Both wait out an outage of Postgres or the broker (a service started before
them comes up when they do). SIGTERM or SIGINT cancels the service, which
stops cleanly, and the process exits 0; an error of the service exits 1. A
singleton whose work would not stop when its lease was lost
(`runyard.stack.leader.WorkDidNotStop`) exits 1 at once: a task that ignores
its cancellation cannot be waited for, and its supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import asyncpg
from runyard.eventstore import Migration, apply_migrations, eventstore_migrations, load_migrations
from runyard.eventstore.transient import retrying
from runyard.messaging import ensure_topics
from runyard.stack.context import ServiceContext
from runyard.stack.leader import WorkDidNotStop
from runyard.stack.tuning import tune_gc
from runyard.telemetry import setup_tracing

log = logging.getLogger("runyard.serve")

#: Every service, in the order they are started (the relay first: it publishes
#: what the others consume).
SERVICE_NAMES = (
    "relay",
    "gateway",
    "submission",
    "scheduler",
    "deployer",
    "faulttolerance",
    "logs",
    "notification",
)

Runner = Callable[[ServiceContext], Awaitable[None]]


def load_runner(name: str) -> Runner | None:
    """`runyard.<name>.main:run`, or None when that service has no `main` yet."""
    module_name = f"runyard.{name}.main"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise
    runner: Runner = module.run
    return runner


def service_migrations(name: str) -> list[Migration]:
    """The event store's migrations, then those in service `name`'s `migrations` folder."""
    found = eventstore_migrations()
    try:
        folder = resources.files(f"runyard.{name}") / "migrations"
    except ModuleNotFoundError:
        return found
    if folder.is_dir():
        found += load_migrations(name, Path(str(folder)))
    return found


async def migrate_service(name: str, owner_dsn: str, *, grants: bool) -> list[str]:
    """Apply service `name`'s missing migrations on `owner_dsn`; then (`grants`, and
    only when something was applied) the roles' rights. Returns what was applied."""
    from runyard.stack import roles

    conn = await asyncpg.connect(owner_dsn)
    try:
        applied = await apply_migrations(conn, service_migrations(name))
    finally:
        await conn.close()
    if applied and grants:
        await roles.apply_grants(owner_dsn)
    return applied


async def prepare(name: str, ctx: ServiceContext) -> None:
    """What service `name` needs before it runs: its tables and the topics."""
    owner = os.environ.get("RUNYARD_OWNER_DATABASE_URL") or ctx.dsn
    applied = await retrying(
        lambda: migrate_service(name, owner, grants=owner != ctx.dsn), component=f"{name}.migrate"
    )
    if applied:
        log.info("%s: applied migrations %s", name, ", ".join(applied))
    kafka = ctx.kafka
    await retrying(
        lambda: ensure_topics(kafka.bootstrap, kafka.topics, **kafka.security.client_options()),
        component=f"{name}.topics",
    )


async def serve(name: str, ctx: ServiceContext | None = None) -> None:
    """Prepare and run service `name` until cancelled."""
    runner = load_runner(name)
    if runner is None:
        raise SystemExit(f"service {name!r} is not built (no runyard.{name}.main)")
    ctx = ctx or ServiceContext.from_env()
    await prepare(name, ctx)
    await runner(ctx.for_service(name))


async def _until_signal(name: str) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(serve(name))
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await task
        except* WorkDidNotStop:
            log.critical("%s: exiting now, leaving a task that ignores its cancellation", name)
            logging.shutdown()
            os._exit(1)


def main(name: str | None = None) -> None:
    """Run service `name` (else the first argument) in this process until SIGTERM/SIGINT."""
    if name is None:
        if len(sys.argv) != 2 or sys.argv[1] not in SERVICE_NAMES:
            raise SystemExit(f"usage: python -m runyard.stack.serve {{{','.join(SERVICE_NAMES)}}}")
        name = sys.argv[1]
    logging.basicConfig(
        level=os.environ.get("RUNYARD_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    setup_tracing(name)
    tune_gc()
    try:
        asyncio.run(_until_signal(name))
    except SystemExit:
        raise
    except BaseException:
        log.exception("%s stopped on an error", name)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
