"""The deployer through faults of the platform: its own crash, a store outage, a preemption.

Real Postgres, a real broker, real worker processes. A store outage is a real one as
the deployer sees it: its store connects through a TCP proxy in front of Postgres that
the test cuts (connections dropped, new ones refused) and restores. Workers wait for a
file on a volume before they exit, so each exit happens exactly in the window the test
chose; each prints `date +%s.%N` just before exiting, the time its `WorkerExited`
must carry (within a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import SpotOptions, TaskSpec
from runyard.contracts.task_events import (
    ResourcesReleased,
    TaskPlaced,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import LocalRuntime, LocalRuntimeConfig, OutputLine, group_members
from runyard.domain.task import Submit, TaskState, decide, fold
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# --- a store that can be cut ------------------------------------------------------------


class Proxy:
    """A TCP proxy in front of Postgres: `cut` drops every connection and refuses new
    ones (what a killed Postgres looks like from the client), `restore` accepts again."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        host, _, port = parts.netloc.rpartition("@")[2].rpartition(":")
        #: Postgres' host and port, or its unix socket (the embedded server's DSN names
        #: the socket's folder as its host).
        self._host, self._port = unquote(host) or "127.0.0.1", int(port or 5432)
        self._parts = parts
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def dsn(self) -> str:
        auth, _, _ = self._parts.netloc.rpartition("@")
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(self._parts._replace(netloc=netloc))

    async def restore(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._host.startswith("/"):
                socket = f"{self._host}/.s.PGSQL.{self._port}"
                up_reader, up_writer = await asyncio.open_unix_connection(socket)
            else:
                up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


# --- the world ------------------------------------------------------------------------------


def spec(command: str, *, workers: int = 1, **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool=kw.pop("pool", "dev"),
        worker_spec="1gpu",
        worker_count=workers,
        image="bash-only",
        command=command,
        **kw,
    )


@dataclass
class World:
    store: PostgresEventStore
    dsn: str
    tmp: Path
    lines: list[OutputLine] = field(default_factory=list)
    apps: list[DeployerApp] = field(default_factory=list)
    #: Mount points made on the host (empty directories, removed afterwards).
    mounts: list[Path] = field(default_factory=list)

    def config(self) -> LocalRuntimeConfig:
        return LocalRuntimeConfig(
            scratch_root=self.tmp / "scratch",
            volumes_root=self.tmp / "volumes",
            images={"bash-only": Path("/usr")},
            grace_s=2.0,
        )

    def deployer(
        self, store: PostgresEventStore | None = None, sink: Any = None
    ) -> tuple[DeployerApp, LocalRuntime]:
        runtime = LocalRuntime(self.config())

        async def keep(line: OutputLine) -> None:
            self.lines.append(line)

        app = DeployerApp(store or self.store, runtime, on_output=sink or keep, stop_grace_s=1.0)
        self.apps.append(app)
        return app, runtime

    def control(self, runtime: LocalRuntime) -> tuple[str, dict[str, str], Path]:
        """A volume shared by the workers and the test: where workers reach it, its
        mount, and the file `go` in it as the test sees it."""
        mount = f"/mnt/runyard-test-{uuid.uuid4().hex[:8]}"
        self.mounts.append(Path(mount))
        where = mount if runtime.namespaces else mount.lstrip("/")
        gate = self.tmp / "volumes" / "fs" / "ctl" / "go"
        return where, {"file_system": "fs", "volume": "ctl", "mount_path": mount}, gate

    def gated(self, command: str, *, runtime: LocalRuntime) -> tuple[TaskSpec, Path]:
        """A task that runs `command` once the test creates the returned file."""
        where, mount, gate = self.control(runtime)
        wait = f"while [ ! -e {where}/go ]; do sleep 0.02; done; "
        return spec(wait + command, mounts=(mount,)), gate

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def state(self, task_id: str) -> TaskState:
        return fold(await self.events(task_id))

    async def append(self, task_id: str, *events: Event) -> list[RecordedEvent[Event]]:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="service:test")
        await self.store.append(
            stream, [NewEvent(e, meta, datetime.now(UTC)) for e in events], version
        )
        return await self.store.read_stream(stream, version + 1)

    async def submit(self, task_id: str, task: TaskSpec) -> None:
        now = datetime.now(UTC)
        await self.append(
            task_id, *decide(None, Submit(task_id, "acme", "alice", task), now=now, ids=lambda: "x")
        )

    async def launch(self, app: DeployerApp, task_id: str, task: TaskSpec) -> None:
        """Submit and place the task, and hand the placement to `app`."""
        await self.submit(task_id, task)
        workers = tuple(
            WorkerPlacement(index=i, node=f"n-{i}", gpus=(i,)) for i in range(task.worker_count)
        )
        placed = TaskPlaced(run=1, attempt=1, pool="dev", workers=workers)
        for event in await self.append(task_id, placed):
            await app.handle(event)

    async def until(
        self, task_id: str, done: Callable[[TaskState], bool], within: float = 30.0
    ) -> TaskState:
        async def poll() -> TaskState:
            while True:
                events = await self.events(task_id)
                if events and done(state := fold(events)):
                    return state
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(poll(), within)


@pytest.fixture
async def world(dsn: str, tmp_path: Path) -> AsyncIterator[World]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    w = World(store, dsn, tmp_path)
    try:
        yield w
    finally:
        for app in w.apps:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(app.close(record_within_s=1.0), 10)
        await store.close()
        for mount in w.mounts:
            with contextlib.suppress(OSError):
                mount.rmdir()


async def gone(pids: list[int], within: float = 10.0) -> None:
    async def poll() -> None:
        while any(group_members(p) for p in pids):  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), within)


def exits(events: list[RecordedEvent[Event]]) -> list[RecordedEvent[Event]]:
    return [e for e in events if isinstance(e.event, WorkerExited)]


def printed_time(lines: list[str]) -> datetime:
    """The time the worker printed just before exiting (its last line: `date +%s.%N`)."""
    return datetime.fromtimestamp(float(lines[-1]), UTC)


# --- adoption after a crash of the deployer ---------------------------------------------


async def test_a_restarted_deployer_service_publishes_the_rest_and_records_the_real_exit_time(
    world: World, kafka: KafkaSettings
) -> None:
    """kill -9 of the deployer while its worker runs; the worker finishes while no deployer
    runs; the restarted service (its producer connected before it adopts) publishes the
    lines the first one had not, each once, and records the exit at the time it happened."""
    from runyard.deployer import main as service
    from runyard.stack.context import ServiceContext

    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()

    async def publish(line: OutputLine) -> None:  # what the service's own sink does
        record = line.record()
        await producer.send_and_wait(kafka.topics.logs, record.to_bytes(), key=record.key())
        # Kept once the broker took it: the runtime saves its offset right after this
        # returns (no await in between), so a crash after it repeats nothing. A crash
        # in the middle of a burst may repeat up to a second of lines (docs/logs.md).
        world.lines.append(line)

    app1, runtime1 = world.deployer(sink=publish)
    task, gate = world.gated("echo b1; echo b2; date +%s.%N; exit 3", runtime=runtime1)
    config = world.tmp / "config"
    config.mkdir()
    local = {
        "scratch_root": str(world.tmp / "scratch"),
        "volumes_root": str(world.tmp / "volumes"),
        "images": {"bash-only": "/usr"},
        "grace_s": 2.0,
    }
    (config / "runtime.yaml").write_text(json.dumps({"local": local}))
    ctx = ServiceContext(dsn=world.dsn, kafka=kafka, data_dir=world.tmp, config_dir=config)
    running: asyncio.Task[None] | None = None
    try:
        task = spec("echo a1; echo a2; " + task.command, mounts=task.mounts)
        await world.launch(app1, "crash", task)
        await world.until("crash", lambda s: s.status == "running")
        for _ in range(500):
            if len(world.lines) == 2:
                break
            await asyncio.sleep(0.02)
        assert [x.line for x in world.lines] == ["a1", "a2"]
        pids = list(runtime1.pids(("crash", 1, 1)).values())
        app1.detach()  # kill -9: the worker goes on, nobody follows it
        gate.touch()
        await gone(pids)  # it exited while no deployer ran
        await asyncio.sleep(1.5)  # a restart clearly later than the exit
        assert (world.tmp / "scratch" / "crash" / "run1-a1" / "w0" / "exit_status").exists()

        running = asyncio.create_task(service.run(ctx))
        state = await world.until("crash", lambda s: s.finished)
        assert state.status == "failed"
        records = await read_logs(kafka, "crash", at_least=5)
    finally:
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        await producer.stop()
    texts = [r["line"] for r in records]
    assert texts[:4] == ["a1", "a2", "b1", "b2"] and len(texts) == 5  # each line once
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    (exited,) = exits(await world.events("crash"))
    assert isinstance(exited.event, WorkerExited) and exited.event.exit_code == 3
    assert abs((exited.occurred_at - printed_time(texts)).total_seconds()) < 1.0
    # No log service said it stored the lines: the output files stay (nothing else).
    kept = world.tmp / "scratch" / "crash" / "run1-a1"
    assert json.loads((kept / "state.json").read_text())["phase"] == "finished"
    assert sorted(p.name for p in (kept / "w0").iterdir()) == [
        "exit_status",
        "offsets.json",
        "stderr.log",
        "stdout.log",
    ]


async def read_logs(kafka: KafkaSettings, task_id: str, *, at_least: int) -> list[dict[str, Any]]:
    """Every record of the task on the logs topic (and whatever comes a moment later)."""
    consumer = AIOKafkaConsumer(
        kafka.topics.logs, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    found: list[dict[str, Any]] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        extra = 0
        while loop.time() < deadline and extra < 3:
            batches = await consumer.getmany(timeout_ms=300)
            for records in batches.values():
                for record in records:
                    body = json.loads(record.value)
                    if body["task_id"] == task_id:
                        found.append(body)
            if len(found) >= at_least:
                extra += 1  # a few more polls: a repeat would show up now
    finally:
        await consumer.stop()
    return found


# --- a store outage at a worker's exit ------------------------------------------------------


@pytest.mark.parametrize("deployer_restarts", [False, True], ids=["same", "restarted"])
async def test_an_exit_during_a_store_outage_is_recorded_once_the_store_is_back(
    world: World, deployer_restarts: bool
) -> None:
    """The store goes away while a worker exits: the exit waits (exit status and output
    kept in the scratch), and is recorded with its own time once the store is back, by
    the same deployer or, after a shutdown during the outage, by the next one. The task
    succeeds: an outage never fails it (no exit code -1)."""
    proxy = Proxy(world.dsn)
    await proxy.restore()
    through_proxy = await PostgresEventStore.connect(proxy.dsn, default_mapper())
    try:
        app, runtime = world.deployer(through_proxy)
        task, gate = world.gated("echo done; date +%s.%N; exit 0", runtime=runtime)
        await world.launch(app, "outage", task)
        await world.until("outage", lambda s: s.status == "running")
        pids = list(runtime.pids(("outage", 1, 1)).values())
        scratch = world.tmp / "scratch" / "outage" / "run1-a1" / "w0"

        await proxy.cut()
        gate.touch()
        await gone(pids)
        await asyncio.sleep(1.0)  # the exit handler keeps trying meanwhile
        assert (scratch / "exit_status").read_text().startswith("0 ")
        assert not exits(await world.events("outage"))
        if deployer_restarts:
            await app.close(record_within_s=0.5)  # shutdown while the store is away
            assert (scratch / "exit_status").exists(), "shutdown kept the unrecorded exit"
            assert (scratch / "stdout.log").exists()
        assert (await world.state("outage")).status == "running"

        await proxy.restore()
        if deployer_restarts:
            app, _ = world.deployer()
            assert await app.reconcile() == ["outage"]
        state = await world.until("outage", lambda s: s.finished)
        await asyncio.wait_for(app.drain(), 10)
    finally:
        await through_proxy.close()
        with contextlib.suppress(Exception):
            await proxy.cut()
    assert state.status == "succeeded"
    (exited,) = exits(await world.events("outage"))
    assert isinstance(exited.event, WorkerExited) and exited.event.exit_code == 0
    lines = [x.line for x in world.lines if x.task_id == "outage"]
    assert lines[0] == "done" and len(lines) == 2
    assert abs((exited.occurred_at - printed_time(lines)).total_seconds()) < 1.0
    assert not scratch.exists()  # removed once everything was recorded


# --- spot preemption --------------------------------------------------------------------------


async def pump(world: World, *apps: Any) -> None:
    """Hand every stored event, in log order, to each app (what their consumers do)."""
    reader = world.store.all_reader(0)
    while True:
        for event in await reader.read(500):
            for app in apps:
                await app.handle(event)
        await asyncio.sleep(0.02)


def one_pool(nodes: int, resource_type: str = "spot") -> Any:
    from runyard.scheduler.config import parse_pools

    return parse_pools(
        {
            "pools": [
                {
                    "id": resource_type,
                    "zone": "z",
                    "resource_type": resource_type,
                    "gpu_model": "A100",
                    "network": "roce",
                    "specs": [{"name": "1gpu", "gpus": 1, "cpus": 8, "memory_gib": 64}],
                    "nodes": {"prefix": "s-", "count": nodes, "gpus": 1},
                }
            ]
        }
    )


async def test_a_preempted_attempt_is_ended_and_recorded_before_its_gpus_are_free(
    world: World,
) -> None:
    """A spot shrink preempts a 2-worker task whose workers take a while to stop: both
    exits are recorded before the task's GPUs are released, the GPU its workers leave is
    given to the next task only after they are gone, and its own attempt 2 starts with no
    process of attempt 1 alive."""
    from runyard.scheduler.app import SchedulerApp

    scheduler = SchedulerApp(world.store, one_pool(2))
    await scheduler.start()
    app, runtime = world.deployer()
    options: dict[str, Any] = {
        "pool": "spot",
        "resource_type": "spot",
        "spot": SpotOptions(max_requeues=3),
    }
    slow_to_stop = (
        'if [ "$RUNYARD_ATTEMPT" = 1 ]; then trap "sleep 0.5; exit 7" TERM; '
        "echo up; sleep 60 & wait; fi; echo done"
    )

    pumping = asyncio.create_task(pump(world, scheduler, app))
    try:
        await world.submit("victim", spec(slow_to_stop, workers=2, **options))
        await world.until("victim", lambda s: s.status == "running")
        for _ in range(500):
            if len(world.lines) == 2:
                break
            await asyncio.sleep(0.02)
        old = list(runtime.pids(("victim", 1, 1)).values())
        assert len(old) == 2
        await world.submit("next", spec("echo next", **options))
        await world.until("next", lambda s: s.status == "queued")

        await scheduler.change_spot_capacity("spot", remove=1, reason="provider reclaimed s-0")
        await world.until("next", lambda s: s.status != "queued")
        assert not any(group_members(p) for p in old), "the GPU was given while they ran"
        await world.until("next", lambda s: s.finished)

        await scheduler.change_spot_capacity("spot", add=("s-8", "s-9"), gpus_per_node=1)
        state = await world.until("victim", lambda s: s.finished)
        await asyncio.wait_for(app.drain(), 10)
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
    assert state.status == "succeeded" and state.preemptions == 1 and state.attempt == 2
    events = await world.events("victim")
    first = [e for e in exits(events) if e.event.attempt == 1]  # type: ignore[attr-defined]
    assert sorted((e.event.worker, e.event.exit_code) for e in first) == [(0, 7), (1, 7)]  # type: ignore[attr-defined]
    released = [e for e in events if isinstance(e.event, ResourcesReleased)]
    assert released[0].event.attempt == 1  # type: ignore[attr-defined]
    last_exit = max(e.global_position for e in first)
    assert last_exit < released[0].global_position
    started_again = [
        e for e in events if isinstance(e.event, WorkerStarted) and e.event.attempt == 2
    ]
    assert len(started_again) == 2 and min(e.global_position for e in started_again) > last_exit
    (placed_next,) = [e for e in await world.events("next") if isinstance(e.event, TaskPlaced)]
    assert placed_next.global_position > last_exit


async def test_the_peers_of_a_failed_worker_hold_their_gpus_until_their_exits_are_recorded(
    world: World,
) -> None:
    """Worker 0 fails; worker 1 takes a while to stop: its exit is recorded after the
    task's failure, the task's GPUs are released after it, and the next task (queued
    for those GPUs) is placed only once no process of the first is alive."""
    from runyard.scheduler.app import SchedulerApp

    scheduler = SchedulerApp(world.store, one_pool(2, "subscription"))
    await scheduler.start()
    app, runtime = world.deployer()
    # worker 1 installs its TERM trap, then lets worker 0 fail (a file on a shared volume)
    where, mount, _ = world.control(runtime)
    fails = (
        'if [ "$RUNYARD_WORKER_INDEX" = 0 ]; then '
        f"while [ ! -e {where}/go ]; do sleep 0.02; done; exit 1; fi; "
        f'trap "sleep 0.5; exit 9" TERM; touch {where}/go; echo up; sleep 60 & wait'
    )
    first = spec(fails, workers=2, pool="subscription", mounts=(mount,))
    pumping = asyncio.create_task(pump(world, scheduler, app))
    try:
        await world.submit("first", first)
        await world.until("first", lambda s: s.status == "running")
        old = list(runtime.pids(("first", 1, 1)).values())
        await world.submit("second", spec("echo second", workers=2, pool="subscription"))
        await world.until("second", lambda s: s.status == "queued")
        await world.until("first", lambda s: s.finished)
        await world.until("second", lambda s: s.status != "queued")
        assert not any(group_members(p) for p in old), "the GPUs were given while it ran"
        await world.until("second", lambda s: s.finished)
        await asyncio.wait_for(app.drain(), 10)
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
    events = await world.events("first")
    kinds = [e.type for e in events]
    assert kinds.count("WorkerExited") == 2
    failed_at = kinds.index("TaskFailed")
    peer = [e for e in exits(events) if e.event.worker == 1]  # type: ignore[attr-defined]
    assert peer[0].event.exit_code == 9  # type: ignore[attr-defined]
    released = [e for e in events if isinstance(e.event, ResourcesReleased)]
    assert events[failed_at].global_position < peer[0].global_position
    assert peer[0].global_position < released[0].global_position
    (placed,) = [e for e in await world.events("second") if isinstance(e.event, TaskPlaced)]
    assert placed.global_position > peer[0].global_position


async def test_a_restart_in_place_records_the_old_peers_exit_and_keeps_the_gpus(
    world: World,
) -> None:
    """Worker 0 fails and auto restart redeploys the same placement; worker 1 of
    attempt 1 takes a while to stop. Its exit is recorded as attempt 1's (it decides
    nothing) before attempt 2 is deployed on the same GPUs; the GPUs stay the task's
    through the restart (the next task, queued for them, is placed only once the
    restarted task has succeeded and released them), and are released once."""
    from runyard.scheduler.app import SchedulerApp

    scheduler = SchedulerApp(world.store, one_pool(2, "subscription"))
    await scheduler.start()
    app, runtime = world.deployer()
    app.max_restart_delay_s = 0.2
    # worker 1 installs its TERM trap, then lets worker 0 fail (a file on a shared volume)
    where, mount, _ = world.control(runtime)
    fails_once = (
        'if [ "$RUNYARD_ATTEMPT" = 1 ]; then '
        'if [ "$RUNYARD_WORKER_INDEX" = 0 ]; then '
        f"while [ ! -e {where}/go ]; do sleep 0.02; done; exit 1; fi; "
        f'trap "sleep 0.5; exit 9" TERM; touch {where}/go; echo up; sleep 60 & wait; fi; '
        "echo done"
    )
    restarting = spec(
        fails_once,
        workers=2,
        pool="subscription",
        mounts=(mount,),
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    pumping = asyncio.create_task(pump(world, scheduler, app))
    try:
        await world.submit("first", restarting)
        await world.until("first", lambda s: s.status == "running")
        old = list(runtime.pids(("first", 1, 1)).values())
        await world.submit("second", spec("echo second", workers=2, pool="subscription"))
        await world.until("second", lambda s: s.status == "queued")
        state = await world.until("first", lambda s: s.finished)
        assert not any(group_members(p) for p in old)
        await world.until("second", lambda s: s.finished)
        await asyncio.wait_for(app.drain(), 10)
        # the scheduler frees the second task's GPUs once the pump hands it the release
        async with asyncio.timeout(30):
            while scheduler.pools["subscription"].state.allocations:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
    assert (state.status, state.attempt, state.restarts, state.held_live) == (
        "succeeded",
        2,
        1,
        (),
    )
    events = await world.events("first")
    kinds = [e.type for e in events]
    old_exits = [e for e in exits(events) if e.event.attempt == 1]  # type: ignore[attr-defined]
    assert [(e.event.worker, e.event.exit_code) for e in old_exits] == [(0, 1), (1, 9)]  # type: ignore[attr-defined]
    restart = kinds.index("TaskRestartScheduled")
    redeployed = next(
        i
        for i, e in enumerate(events)
        if e.type == "DeployStageStarted" and e.event.attempt == 2  # type: ignore[attr-defined]
    )
    assert restart < events.index(old_exits[1]) < redeployed
    assert kinds.count("TaskSucceeded") == 1 and kinds.count("TaskFailed") == 0
    (released,) = [e for e in events if isinstance(e.event, ResourcesReleased)]
    assert released.global_position > max(e.global_position for e in exits(events))
    (placed,) = [e for e in await world.events("second") if isinstance(e.event, TaskPlaced)]
    assert placed.global_position > released.global_position
    assert not scheduler.pools["subscription"].state.allocations
