"""The whole platform on the test's own database and topic prefix.

`platform` starts what `runyard up` starts, every built service (relay,
gateway on a free port, submission, scheduler, deployer with the local
runtime, fault tolerance, logs, notification) on the `dsn` and `kafka`
fixtures, with a copy of infra/config in the test's temp folder (a short stop
grace), and gives the test an HTTP client and an admin token of tenant `e2e`.

Layouts:
- `processes`: each service is a child process (`python -m runyard.stack.serve
  <name>`, started together, each on a free port, every URL in
  RUNYARD_ENDPOINTS), as `runyard up` runs them; a child that exits fails the
  test, and none outlives it (its process group is killed at teardown,
  whatever happened);
- `one-process`: all in the test's event loop (`run_platform`).
A test marked `processes` (those whose path crosses services the most: stack
capture, alert cards with the first error, DDP, a task's whole life) always
runs in the `processes` layout; the others run in RUNYARD_E2E_LAYOUT's
(default `one-process`, a few seconds less per test). RUNYARD_E2E_LAYOUT=processes
runs the whole suite with every service in its own process.
The platform is ready when every service answers /readyz with 200.

Tests talk to the gateway's HTTP API only, and look at the OS for worker
processes (`Platform.worker_pids`, by the variables the runtime gives them).

RUNYARD_E2E_SKIP=logs,faulttolerance (service names, comma-separated) leaves
services out, to tell a service's own failure from the path under test.

A module whose tests do not disturb each other (each submits tasks of its own
and waits for what it started) may share its platforms (`SharedPlatform`,
`shared_platform`): one per layout, started for the first test that needs it
and stopped once the next test needs the other layout or the module ends; its
tests then run grouped by layout (`pytest_collection_modifyitems`), so a
module starts at most one platform of each.

After a test that passed, every event of its database must keep the audit
chain (R-62, `audit.py`): each names its cause, and the causes lead back to a
person's request or an admin's action. (A shared platform's database is checked
after each test and again once the platform stopped.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from runyard.api.auth import create_token
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.stack.context import ServiceContext
from runyard.stack.ports import free_port
from runyard.stack.serve import SERVICE_NAMES, load_runner
from runyard.stack.supervisor import Supervisor, service_processes
from runyard.stack.up import run_platform, wait_ready

from tests.conftest import fresh_database
from tests.e2e.audit import assert_audit_chain

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "stopped"}


def copy_config(target: Path, *, grace_s: float = 2.0) -> Path:
    """infra/config copied to `target`, with the local runtime's stop grace shortened."""
    shutil.copytree(REPO / "infra/config", target)
    runtime = yaml.safe_load((target / "runtime.yaml").read_text())
    runtime["local"]["grace_s"] = grace_s
    (target / "runtime.yaml").write_text(yaml.safe_dump(runtime))
    return target


def restarts_capped(seconds: float) -> Callable[[Path], None]:
    """A `configure` for `running_platform`: the deployer waits at most `seconds` before
    a restart (runtime.yaml `deployer: max_restart_delay_s`), not the backoff's 10 s."""

    def configure(config: Path) -> None:
        runtime = yaml.safe_load((config / "runtime.yaml").read_text())
        runtime["deployer"] = {**(runtime.get("deployer") or {}), "max_restart_delay_s": seconds}
        (config / "runtime.yaml").write_text(yaml.safe_dump(runtime))

    return configure


@dataclass
class Platform:
    ctx: ServiceContext
    http: httpx.AsyncClient
    token: str
    #: Raises when the platform stopped (a service process exited, or the
    #: in-process platform returned).
    check: Callable[[], None]
    #: The service processes (the `processes` layout; None in one process).
    supervisor: Supervisor | None = None

    @property
    def kafka(self) -> KafkaSettings:
        return self.ctx.kafka

    def worker_pids(self, key: tuple[str, int | str, int]) -> dict[int, int]:
        """Worker index -> pid (its process group) of the live workers of `key`
        (task id, run, attempt), found in /proc by the variables the local runtime
        gives each worker's wrapper (the task's id and the attempt: a test's task
        has one run at a time)."""
        task_id, _, attempt = key
        wanted = {f"RUNYARD_TASK_ID={task_id}".encode(), f"RUNYARD_ATTEMPT={attempt}".encode()}
        found: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if stat[0] in ("Z", "X") or int(stat[2]) != int(entry) or not wanted <= set(environ):
                continue  # gone, not a group's leader, or not of this attempt
            index = next(v for v in environ if v.startswith(b"RUNYARD_WORKER_INDEX="))
            found[int(index.partition(b"=")[2])] = int(entry)
        return found

    async def submit(self, **spec: Any) -> dict[str, Any]:
        body = {"pool": "dev-a100", "worker_spec": "1gpu", "image": "bash-only", **spec}
        body.setdefault("name", "e2e")
        answer = await self.http.post("/v1/tasks", json=body)
        assert answer.status_code == 201, answer.text
        created: dict[str, Any] = answer.json()
        return created

    async def task(self, task_id: str) -> dict[str, Any]:
        answer = await self.http.get(f"/v1/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        task: dict[str, Any] = answer.json()
        return task

    async def events(self, task_id: str) -> list[dict[str, Any]]:
        answer = await self.http.get(f"/v1/tasks/{task_id}/events")
        assert answer.status_code == 200, answer.text
        events: list[dict[str, Any]] = answer.json()
        return events

    async def wait_for(
        self,
        task_id: str,
        done: Callable[[dict[str, Any]], bool],
        within: float = 30.0,
    ) -> dict[str, Any]:
        """Poll the task until `done(task)`; fail (with the timeline) after `within` s."""
        deadline = time.monotonic() + within
        while True:
            self.check_alive()
            task = await self.task(task_id)
            if done(task):
                return task
            if time.monotonic() > deadline:
                types = [e["type"] for e in await self.events(task_id)]
                raise AssertionError(f"task {task_id} is {task['status']} after {within}s: {types}")
            await asyncio.sleep(0.05)

    async def wait_status(self, task_id: str, status: str, within: float = 30.0) -> dict[str, Any]:
        task = await self.wait_for(
            task_id, lambda t: t["status"] == status or t["status"] in TERMINAL, within
        )
        assert task["status"] == status, (task["status"], task["last_failure_reason"])
        return task

    def check_alive(self) -> None:
        self.check()


LAYOUT = os.environ.get("RUNYARD_E2E_LAYOUT", "one-process")
#: The layout of the running test (`layout` below).
_layout = LAYOUT


@pytest.fixture(autouse=True)
def layout(request: pytest.FixtureRequest) -> Iterator[str]:
    """This test's layout: `processes` when it is marked so, else RUNYARD_E2E_LAYOUT's."""
    global _layout
    _layout = "processes" if request.node.get_closest_marker("processes") else LAYOUT
    try:
        yield _layout
    finally:
        _layout = LAYOUT


def built_services() -> list[str]:
    skip = set(os.environ.get("RUNYARD_E2E_SKIP", "").split(","))
    return [n for n in SERVICE_NAMES if n not in skip and load_runner(n) is not None]


@contextlib.asynccontextmanager
async def _in_process(
    ctx: ServiceContext, names: list[str], restart: bool
) -> AsyncIterator[tuple[Callable[[], None], Supervisor | None]]:
    """Every service of `names` in this event loop (`run_platform`)."""
    if restart:
        raise ValueError("services restarted by a supervisor need the processes layout")
    services = [f"runyard.{name}.main:run" for name in names]
    run = asyncio.create_task(run_platform(ctx, services=services), name="platform")

    def check() -> None:
        if run.done():
            raise AssertionError(f"the platform stopped: {run.exception()!r}")

    try:
        while not set(names) <= set(ctx.endpoints):  # bound before any service starts
            check()
            await asyncio.sleep(0.02)
        yield check, None
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


@contextlib.asynccontextmanager
async def _processes(
    ctx: ServiceContext, names: list[str], restart: bool
) -> AsyncIterator[tuple[Callable[[], None], Supervisor | None]]:
    """Every service of `names` as a child process, all started at once; with
    `restart`, one that exits is started again (as `runyard up` does), and the test
    reads the restarts from the supervisor."""
    ctx.settings["log_level"] = os.environ.get("RUNYARD_LOG_LEVEL", "warning").lower()
    async with service_processes(ctx, names, restart=restart) as supervisor:

        def check() -> None:
            if not restart and (exited := supervisor.exited()):
                raise AssertionError(f"service processes exited: {exited}")

        yield check, supervisor


@contextlib.asynccontextmanager
async def running_platform(
    dsn: str,
    kafka: KafkaSettings,
    home: Path,
    *,
    layout: str | None = None,
    configure: Callable[[Path], None] | None = None,
    restart: bool = False,
    **settings: Any,
) -> AsyncIterator[Platform]:
    """The platform on `dsn` / `kafka` with config and data under `home`, in `layout`
    (default: the running test's, see `layout` above); `configure` may change the
    copied config folder before any service reads it; `restart` (processes layout
    only) starts a service process that exits again."""
    config_dir = copy_config(home / "config")
    if configure is not None:
        configure(config_dir)
    ctx = ServiceContext(
        dsn=dsn,
        kafka=kafka,
        data_dir=home / "data",
        config_dir=config_dir,
        settings={
            "http_port": free_port(),
            "grpc_port": free_port(),
            "scheduler_tick_s": 1.0,
            **settings,
        },
    )
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    names = built_services()
    start = _in_process if (layout or _layout) == "one-process" else _processes
    async with (
        start(ctx, names, restart) as (check, supervisor),
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{ctx.settings['http_port']}", timeout=30
        ) as http,
    ):
        await wait_ready(ctx.endpoints, names, within_s=60, alive=check)
        conn = await asyncpg.connect(dsn)
        try:
            token = await create_token(conn, "e2e", "alice", "admin")
        finally:
            await conn.close()
        http.headers["Authorization"] = f"Bearer {token}"
        yield Platform(ctx, http, token, check, supervisor)
    await assert_audit_chain(dsn)  # only after a test that passed


@pytest.fixture
async def platform(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Platform]:
    async with running_platform(dsn, kafka, tmp_path) as running:
        yield running


def layout_of(item: pytest.Item) -> str:
    """The layout `item` runs in: `processes` when it is marked so, else RUNYARD_E2E_LAYOUT's."""
    return "processes" if item.get_closest_marker("processes") else LAYOUT


class SharedPlatform:
    """The platforms of a module's tests, one at a time: `get(layout)` gives the one
    running in `layout`, started at the first call (a database and topic prefix of its
    own, a home folder from `home`), and stops the other layout's first. `close` stops
    the one running. `options` go to `running_platform` (`configure`, settings)."""

    def __init__(
        self, postgres_url: str, kafka_bootstrap: str, home: Callable[[], Path], **options: Any
    ) -> None:
        self.postgres_url = postgres_url
        self.kafka_bootstrap = kafka_bootstrap
        self.home = home
        self.options = options
        self._running: tuple[str, Platform, contextlib.AsyncExitStack] | None = None

    async def get(self, layout: str) -> Platform:
        if self._running is not None and self._running[0] == layout:
            return self._running[1]
        await self.close()
        stack = contextlib.AsyncExitStack()
        try:
            kafka = KafkaSettings(
                bootstrap=self.kafka_bootstrap, topics=Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
            )
            await ensure_topics(kafka.bootstrap, kafka.topics)
            dsn = await stack.enter_async_context(fresh_database(self.postgres_url))
            platform = await stack.enter_async_context(
                running_platform(dsn, kafka, self.home(), layout=layout, **self.options)
            )
        except BaseException:
            await stack.aclose()
            raise
        self._running = (layout, platform, stack)
        return platform

    async def close(self) -> None:
        if self._running is not None:
            _, _, stack = self._running
            self._running = None
            await stack.aclose()


@contextlib.asynccontextmanager
async def shared_for_module(
    postgres_url: str,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    **options: Any,
) -> AsyncIterator[SharedPlatform]:
    """A `SharedPlatform` for one module, its homes under the session's temp folder."""
    shared = SharedPlatform(
        postgres_url, kafka_bootstrap, lambda: tmp_path_factory.mktemp(name), **options
    )
    try:
        yield shared
    finally:
        await shared.close()


@contextlib.asynccontextmanager
async def platform_for_test(
    shared: SharedPlatform, request: pytest.FixtureRequest
) -> AsyncIterator[Platform]:
    """The shared platform of this test's layout; its audit chain checked after the test."""
    running = await shared.get(layout_of(request.node))
    yield running
    await assert_audit_chain(running.ctx.dsn)


@pytest.fixture(scope="module")
async def shared_platform(
    postgres_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SharedPlatform]:
    """The module's shared platforms, with the defaults of `platform`."""
    async with shared_for_module(
        postgres_url, kafka_bootstrap, tmp_path_factory, "shared"
    ) as shared:
        yield shared


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In a module with `SHARED_PLATFORM = True`, the tests of one layout run together
    (in the order they had otherwise), so it starts one platform of each layout at most."""
    start = 0
    while start < len(items):
        module = getattr(items[start], "module", None)
        end = start
        while end < len(items) and getattr(items[end], "module", None) is module:
            end += 1
        if getattr(module, "SHARED_PLATFORM", False):
            items[start:end] = sorted(items[start:end], key=lambda i: layout_of(i) != LAYOUT)
        start = end
