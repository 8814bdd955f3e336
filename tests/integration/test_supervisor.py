"""The supervisor `runyard up` runs: every service a child process, kept running.

On the test's own database and topic prefix, every built service is started
as `runyard up` starts it (`service_specs`: `python -m runyard.stack.serve
<name>`), under the supervisor with its state file; `runyard ps --json` reads
that file and asks each service. A service killed with -9 comes back (its
restart counted) while the others go on serving; stopping the supervisor
leaves no process behind. Also: migrations applied by many services starting
at once on an empty database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.cli.ps import consumer_lag
from runyard.deployer.runtime import group_members
from runyard.eventstore import apply_migrations
from runyard.messaging import KafkaSettings
from runyard.stack.context import ServiceContext
from runyard.stack.ports import free_port
from runyard.stack.processes import ProcessIdentity
from runyard.stack.serve import service_migrations
from runyard.stack.supervisor import (
    ChildSpec,
    Supervisor,
    free_endpoints,
    restart_delay,
    service_specs,
)
from runyard.stack.up import wait_ready

from tests.e2e.conftest import built_services, copy_config

pytestmark = pytest.mark.integration

RUNYARD = Path(sys.executable).parent / "runyard"


def test_restart_delays_double_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(7)
    for quick_exits, bound in [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (40, 30.0)]:
        delay = restart_delay(quick_exits, base_s=0.5, cap_s=30.0, rng=rng)
        assert bound / 2 <= delay <= bound, (quick_exits, delay)


async def test_services_starting_together_apply_each_migration_once(dsn: str) -> None:
    conns = [await asyncpg.connect(dsn) for _ in range(6)]
    try:
        wanted = service_migrations("logs")
        applied = await asyncio.gather(*(apply_migrations(c, wanted) for c in conns))
        rows = await conns[0].fetch("SELECT component, version FROM schema_migrations")
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    names = [name for each in applied for name in each]
    assert sorted(names) == sorted(f"{m.component}/{m.name}" for m in wanted)
    assert sorted((r["component"], r["version"]) for r in rows) == sorted(
        (m.component, m.version) for m in wanted
    )


@pytest.fixture
async def supervised(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> AsyncIterator[tuple[Supervisor, ServiceContext]]:
    ctx = ServiceContext(
        dsn=dsn,
        kafka=kafka,
        data_dir=tmp_path / "home",
        config_dir=copy_config(tmp_path / "config"),
        settings={"http_host": "127.0.0.1", "http_port": free_port(), "grpc_port": free_port()},
    )
    (ctx.data_dir / "run").mkdir(parents=True)
    names = built_services()
    free_endpoints(ctx, names)
    supervisor = Supervisor(
        service_specs(ctx, names),
        state_path=ctx.data_dir / "run" / "services.json",
        base_s=1.0,
        grace_s=15,
    )
    try:
        await supervisor.start()
        yield supervisor, ctx
    finally:
        try:
            await supervisor.stop()
        finally:
            supervisor.kill_groups()


async def runyard_ps(home: Path) -> tuple[int, list[dict[str, Any]]]:
    proc = await asyncio.create_subprocess_exec(
        str(RUNYARD), "ps", "--home", str(home), "--json", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out)


def state_of(path: Path, name: str) -> dict[str, Any]:
    (service,) = [s for s in json.loads(path.read_text())["services"] if s["name"] == name]
    found: dict[str, Any] = service
    return found


@pytest.mark.timeout(90)
async def test_every_service_a_child_restarted_after_kill_9_and_none_left_after_stop(
    supervised: tuple[Supervisor, ServiceContext],
) -> None:
    supervisor, ctx = supervised
    names = list(supervisor.children)
    assert {"relay", "gateway", "scheduler", "deployer"} <= set(names)
    pids = {n: c.process.pid for n, c in supervisor.children.items() if c.process}
    assert len(set(pids.values())) == len(names) and os.getpid() not in pids.values()
    async with httpx.AsyncClient(base_url=ctx.endpoints["gateway"], timeout=10) as http:
        await wait_ready(ctx.endpoints, names)

        code, listed = await runyard_ps(ctx.data_dir)
        assert code == 0, [s for s in listed if not s["healthy"]]
        assert {s["name"]: s["pid"] for s in listed} == pids
        assert all(s["healthy"] and s["ready"] and s["restarts"] == 0 for s in listed), listed

        conn = await asyncpg.connect(ctx.dsn)
        try:
            token = await create_token(conn, "e2e", "alice", "admin")
        finally:
            await conn.close()
        http.headers["Authorization"] = f"Bearer {token}"
        victim = supervisor.children["scheduler"]
        first = ProcessIdentity.of(pids["scheduler"])
        os.kill(pids["scheduler"], signal.SIGKILL)
        answer = await http.get("/v1/tasks")  # the others keep serving meanwhile
        assert answer.status_code == 200, answer.text

        deadline = time.monotonic() + 30
        while not (victim.restarts == 1 and victim.running):
            assert time.monotonic() < deadline, supervisor.exited()
            await asyncio.sleep(0.1)
        assert victim.process is not None and victim.process.pid != pids["scheduler"]
        assert victim.last_exit == -signal.SIGKILL
        recorded = state_of(ctx.data_dir / "run" / "services.json", "scheduler")
        assert (recorded["restarts"], recorded["pid"]) == (1, victim.process.pid)
        assert recorded["last_exit"] == -signal.SIGKILL
        await wait_ready(ctx.endpoints, ["scheduler"])
        others = {n: c.process.pid for n, c in supervisor.children.items() if c.process}
        assert {n: p for n, p in others.items() if n != "scheduler"} == {
            n: p for n, p in pids.items() if n != "scheduler"
        }

    started = [ProcessIdentity.of(p) for p in others.values()] + [first]
    await supervisor.stop()
    assert all(c.last_exit is not None for c in supervisor.children.values())
    assert not any(i.running() for i in started if i is not None)
    assert not any(group_members(p) for p in [*pids.values(), *others.values()])
    assert not (ctx.data_dir / "run" / "services.json").exists()


async def test_a_service_started_alone_migrates_serves_and_stops_on_sigterm(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """`python -m runyard.relay` on an empty database: its tables made, ready, exit 0."""
    ctx = ServiceContext(
        dsn, kafka, tmp_path, copy_config(tmp_path / "c"), settings={"http_port": 0}
    )
    free_endpoints(ctx, ["relay"])
    (spec,) = service_specs(ctx, ["relay"])
    relay = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runyard.relay", env=dict(spec.env), start_new_session=True
    )
    try:
        await wait_ready(ctx.endpoints, ["relay"], alive=lambda: _running(relay))
        relay.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(relay.wait(), 20) == 0
    finally:
        if relay.returncode is None:
            os.killpg(relay.pid, signal.SIGKILL)
            await relay.wait()


def _running(process: asyncio.subprocess.Process) -> None:
    assert process.returncode is None, f"exited with {process.returncode}"


async def test_a_child_that_exits_is_restarted_and_one_deaf_to_sigterm_is_killed(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "deaf-ready"
    deaf = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    )
    specs = [
        ChildSpec("flaky", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ)),
        ChildSpec("deaf", [sys.executable, "-c", deaf, str(mark)], dict(os.environ)),
    ]
    state = tmp_path / "services.json"
    reports: list[str] = []
    supervisor = Supervisor(
        specs, state_path=state, base_s=0.05, cap_s=0.1, grace_s=0.5, report=reports.append
    )
    running = asyncio.create_task(supervisor.run())
    try:
        flaky = None
        while flaky is None or flaky.restarts < 2 or not mark.exists():
            assert not running.done(), running
            await asyncio.sleep(0.05)
            flaky = supervisor.children.get("flaky")
        assert flaky.last_exit == 3 and state_of(state, "flaky")["restarts"] >= 2
        assert "flaky exited (code 3)" in reports[0] and "(restart 1)" in reports[0]
        assert state_of(state, "deaf")["pid"] == supervisor.children["deaf"].process.pid  # type: ignore[union-attr]
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        supervisor.kill_groups()
    assert supervisor.children["deaf"].last_exit == -signal.SIGKILL
    assert any("deaf: still running" in r for r in reports)
    assert not state.exists()


async def test_what_a_child_needs_before_a_restart_is_done_before_it_starts_again(
    tmp_path: Path,
) -> None:
    """A service whose code was updated under `runyard up` may need what only the
    supervisor can do (migrations as the owner role): `before_restart` runs before each
    restart, so the child comes back instead of exiting at every restart."""
    needed = tmp_path / "migrated"
    child = (
        "import pathlib, sys, time\n"
        "if not pathlib.Path(sys.argv[1]).exists(): sys.exit(1)\n"
        "time.sleep(60)\n"
    )
    asked: list[str] = []

    async def before_restart(name: str) -> None:
        asked.append(name)
        needed.touch()

    spec = ChildSpec("svc", [sys.executable, "-c", child, str(needed)], dict(os.environ))
    supervisor = Supervisor(
        [spec], base_s=0.05, cap_s=0.1, grace_s=0.5, before_restart=before_restart
    )
    running = asyncio.create_task(supervisor.run())
    try:
        svc = None
        while svc is None or svc.restarts < 1:
            assert not running.done(), running
            await asyncio.sleep(0.05)
            svc = supervisor.children.get("svc")
        assert asked == ["svc"]  # not before its first start
        assert svc.last_exit == 1
        assert needed.exists()  # done before the second start, which found it
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        supervisor.kill_groups()


def test_ps_sums_the_consumer_lag_samples_of_the_metrics_text() -> None:
    text = (
        "# HELP runyard_consumer_lag messages not taken yet\n"
        "# TYPE runyard_consumer_lag gauge\n"
        'runyard_consumer_lag{consumer="logs",topic="runyard.logs"} 7.0\n'
        'runyard_consumer_lag{consumer="logs",topic="a b}"} 5\n'
        "runyard_consumer_lag_total 100\n"
        'runyard_events_handled_total{consumer="logs"} 3\n'
    )
    assert consumer_lag(text) == 12.0
    assert consumer_lag("runyard_events_handled_total 3\n") is None
