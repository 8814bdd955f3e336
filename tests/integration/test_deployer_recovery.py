"""The deployer across its own restarts, task restarts, reschedules, and volumes.

Real Postgres, real worker processes. Where the deployer must react to events
it appended itself (restarts), a pump hands every stored event to
`DeployerApp.handle` in log order, as the Kafka consumer would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    DeployStageStarted,
    TaskFailed,
    TaskPlaced,
    TaskRestartScheduled,
    TaskSucceeded,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import (
    Deployment,
    LocalRuntime,
    LocalRuntimeConfig,
    OutputLine,
    group_members,
)
from runyard.domain.task import (
    Command,
    Place,
    ReleaseResources,
    RequestReschedule,
    ScheduleRestart,
    StartStage,
    Submit,
    TaskState,
    decide,
    evolve,
    fold,
)
from runyard.eventstore import PostgresEventStore

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)


def make_spec(command: str, *, workers: int = 1, **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="dev",
        worker_spec="1gpu",
        worker_count=workers,
        image="bash-only",
        command=command,
        **kw,
    )


def placement(count: int, node: str = "n") -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement(index=i, node=f"{node}-{i}", gpus=(i,)) for i in range(count))


@dataclass
class World:
    store: PostgresEventStore
    tmp: Path
    lines: list[OutputLine] = field(default_factory=list)
    apps: list[DeployerApp] = field(default_factory=list)

    def config(self, namespaces: bool | None = None) -> LocalRuntimeConfig:
        return LocalRuntimeConfig(
            namespaces=namespaces,
            scratch_root=self.tmp / "scratch",
            volumes_root=self.tmp / "volumes",
            images={"bash-only": Path("/usr")},
            grace_s=2.0,
        )

    def deployer(self, namespaces: bool | None = None) -> tuple[DeployerApp, LocalRuntime]:
        """A new deployer process, as far as the test can tell: its own app and runtime."""
        runtime = LocalRuntime(self.config(namespaces))

        async def sink(line: OutputLine) -> None:
            self.lines.append(line)

        app = DeployerApp(
            self.store, runtime, on_output=sink, stop_grace_s=1.0, max_restart_delay_s=0.2
        )
        self.apps.append(app)
        return app, runtime

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def state(self, task_id: str) -> TaskState:
        return fold(await self.events(task_id))

    async def do(self, task_id: str, *commands: Command) -> list[RecordedEvent[Event]]:
        """Decide the commands in order on the task's state and append them together."""
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        state = fold(await self.events(task_id)) if version else None
        new: list[Event] = []
        for command in commands:
            events = decide(state, command, now=NOW, ids=lambda: "x")
            for event in events:
                state = evolve(state, (event, NOW))
            new.extend(events)
        meta = Metadata(actor="service:test")
        await self.store.append(
            stream, [NewEvent(e, meta, datetime.now(UTC)) for e in new], version
        )
        return await self.store.read_stream(stream, version + 1)

    async def submit_and_place(self, task_id: str, spec: TaskSpec) -> list[RecordedEvent[Event]]:
        await self.do(task_id, Submit(task_id, "acme", "alice", spec))
        placed = TaskPlaced(run=1, attempt=1, pool="dev", workers=placement(spec.worker_count))
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="service:scheduler")
        await self.store.append(stream, [NewEvent(placed, meta, datetime.now(UTC))], version)
        return await self.store.read_stream(stream, version + 1)

    async def until(self, task_id: str, done: Any, within: float = 8.0) -> TaskState:
        async def poll() -> TaskState:
            while True:
                state = await self.state(task_id)
                if done(state):
                    return state
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(poll(), within)

    def output(self, task_id: str) -> list[str]:
        return [x.line for x in self.lines if x.task_id == task_id]


@pytest.fixture
async def world(dsn: str, tmp_path: Path) -> AsyncIterator[World]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    w = World(store, tmp_path)
    try:
        yield w
    finally:
        for app in w.apps:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(app.close(), 5)
        await store.close()


@contextlib.asynccontextmanager
async def pumping(world: World, app: DeployerApp) -> AsyncIterator[None]:
    """Hand every stored event, in log order, to `app` (the consumer's job)."""

    async def pump() -> None:
        reader = world.store.all_reader(0)
        while True:
            for event in await reader.read(500):
                await app.handle(event)
            await asyncio.sleep(0.02)

    task = asyncio.create_task(pump())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def alive_group(pgid: int) -> bool:
    return bool(group_members(pgid))


def finished(state: TaskState) -> bool:
    return state.finished


# --- reconciliation after a deployer restart ------------------------------------------


async def test_a_new_deployer_adopts_running_workers_and_records_their_exit(world: World) -> None:
    app1, runtime1 = world.deployer()
    placed = await world.submit_and_place(
        "crash", make_spec("echo before; sleep 2; echo after; exit 4")
    )
    for event in placed:
        await app1.handle(event)
    await world.until("crash", lambda s: s.status == "running")
    (pid,) = runtime1.pids(("crash", 1, 1)).values()
    await asyncio.sleep(0.3)
    app1.detach()  # the deployer dies; its worker does not
    assert alive_group(pid)

    app2, runtime2 = world.deployer()
    assert await app2.reconcile() == ["crash"]
    assert runtime2.pids(("crash", 1, 1)) == {0: pid}  # adopted, not started again
    await asyncio.wait_for(app2.drain(), 8)

    state = await world.state("crash")
    assert state.status == "failed"
    events = [e.event for e in await world.events("crash")]
    failed = [e for e in events if isinstance(e, TaskFailed)]
    assert len(failed) == 1 and failed[0].exit_code == 4 and failed[0].worker == 0
    assert sum(isinstance(e, WorkerStarted) for e in events) == 1
    assert sum(isinstance(e, WorkerExited) for e in events) == 1
    assert not alive_group(pid)
    assert world.output("crash") == ["before", "after"]  # each line once
    assert not (world.tmp / "scratch" / "crash").exists()


async def test_an_exit_while_no_deployer_ran_is_recorded_with_its_status(world: World) -> None:
    app1, runtime1 = world.deployer()
    for event in await world.submit_and_place("gone", make_spec("sleep 0.3; exit 6")):
        await app1.handle(event)
    await world.until("gone", lambda s: s.status == "running")
    (pid,) = runtime1.pids(("gone", 1, 1)).values()
    app1.detach()
    deadline = asyncio.get_running_loop().time() + 5
    while alive_group(pid) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert not alive_group(pid)
    assert (await world.state("gone")).status == "running"  # nobody saw the exit yet

    app2, _ = world.deployer()
    await app2.reconcile()
    await asyncio.wait_for(app2.drain(), 8)
    events = [e.event for e in await world.events("gone")]
    failed = [e for e in events if isinstance(e, TaskFailed)]
    assert len(failed) == 1 and failed[0].exit_code == 6
    assert sum(isinstance(e, WorkerStarted) for e in events) == 1


async def test_a_task_placed_while_no_deployer_ran_is_deployed_by_reconcile(world: World) -> None:
    await world.submit_and_place("late", make_spec("echo hello"))
    # Another was cut in the middle of its first stage.
    await world.submit_and_place("cut", make_spec("true"))
    await world.do("cut", StartStage("cut", "resource_allocation"))

    app, _ = world.deployer()
    assert sorted(await app.reconcile()) == ["cut", "late"]
    await asyncio.wait_for(app.drain(), 8)
    assert (await world.state("late")).status == "succeeded"
    assert world.output("late") == ["hello"]
    state = await world.state("cut")
    assert state.status == "succeeded"
    types = [e.type for e in await world.events("cut")]
    assert types.count("DeployStageStarted") == 4 and types.count("DeployStageCompleted") == 4


async def test_reconcile_ends_workers_of_an_attempt_the_log_moved_past(world: World) -> None:
    app1, runtime1 = world.deployer()
    for event in await world.submit_and_place("moved", make_spec("echo up; sleep 30")):
        await app1.handle(event)
    await world.until("moved", lambda s: s.status == "running")
    for _ in range(400):  # the launch command runs (past the sandbox's mounts)
        if world.output("moved"):
            break
        await asyncio.sleep(0.02)
    (pid,) = runtime1.pids(("moved", 1, 1)).values()
    app1.detach()
    # While no deployer runs, the task is rescheduled (its node went bad): its GPUs stay
    # held until the withdrawn attempt's worker is ended and its exit recorded.
    await world.do("moved", RequestReschedule("moved", "GPU dropped", ("n-0",)))
    assert (await world.state("moved")).held_live == (0,)
    app2, _ = world.deployer()
    await app2.reconcile()
    await asyncio.wait_for(app2.drain(), 8)
    assert not alive_group(pid)
    assert not (world.tmp / "scratch" / "moved" / "run1-a1").exists()
    events = [e.event for e in await world.events("moved")]
    exited = [(e.attempt, e.exit_code) for e in events if isinstance(e, WorkerExited)]
    assert exited == [(1, 143)]  # `sleep` ended by SIGTERM, recorded for attempt 1
    state = await world.state("moved")
    assert state.held_live == () and state.status == "restarting"
    await world.do("moved", ReleaseResources("moved", "reschedule"))  # now it may


# --- restarts and reschedules -----------------------------------------------------------


def shared_dir(world: World, runtime: LocalRuntime, mount_path: str) -> str:
    """Where a worker reaches volume `mount_path`: the path itself in a private mount
    namespace, the symlink relative to its working directory otherwise."""
    return mount_path if runtime.namespaces else mount_path.lstrip("/")


async def test_a_deployer_stopped_to_be_replaced_leaves_its_workers_to_the_next(
    world: World,
) -> None:
    """A deployer stopped with `keep_workers_on_stop` (an upgrade) touches no worker:
    the next one adopts the running worker and records its own exit, and the task
    succeeds (a plain stop would have ended it with exit 143 and failed the task)."""
    app1, runtime1 = world.deployer()
    placed = await world.submit_and_place("upgrade", make_spec("sleep 2; echo done"))
    for event in placed:
        await app1.handle(event)
    await world.until("upgrade", lambda s: s.status == "running")
    (pid,) = runtime1.pids(("upgrade", 1, 1)).values()
    await app1.close(keep_workers=True)
    assert alive_group(pid)
    assert (await world.state("upgrade")).status == "running"

    app2, runtime2 = world.deployer()
    assert await app2.reconcile() == ["upgrade"]
    assert runtime2.pids(("upgrade", 1, 1)) == {0: pid}  # adopted, not started again
    await asyncio.wait_for(app2.drain(), 10)
    assert (await world.state("upgrade")).status == "succeeded"


async def test_auto_restart_runs_a_new_attempt_of_the_same_run(world: World) -> None:
    app, runtime = world.deployer()
    mount = f"/mnt/runyard-test-{uuid.uuid4().hex[:8]}"
    where = shared_dir(world, runtime, mount)
    command = (
        f'echo "attempt $RUNYARD_ATTEMPT run $RUNYARD_RUN_ID"; '
        f"if [ -e {where}/marker ]; then exit 0; fi; touch {where}/marker; exit 5"
    )
    spec = make_spec(
        command,
        mounts=({"file_system": "fs", "volume": "ckpt", "mount_path": mount},),
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    async with pumping(world, app):
        await world.submit_and_place("again", spec)
        state = await world.until("again", finished)
        await asyncio.wait_for(app.drain(), 8)
    assert state.status == "succeeded" and state.restarts == 1 and state.attempt == 2
    events = [e.event for e in await world.events("again")]
    started = [(e.attempt, e.worker) for e in events if isinstance(e, WorkerStarted)]
    exited = [(e.attempt, e.exit_code) for e in events if isinstance(e, WorkerExited)]
    assert started == [(1, 0), (2, 0)] and exited == [(1, 5), (2, 0)]
    assert world.output("again") == ["attempt 1 run again-run1", "attempt 2 run again-run1"]
    with contextlib.suppress(OSError):
        os.rmdir(mount)


def old_exits_then_new_attempt(events: list[Event]) -> tuple[list[tuple[int, int, int]], int]:
    """The exits of attempt 1 as (worker, code, place in the log), and the place of the
    first event of attempt 2's deployment."""
    exits = [
        (e.worker, e.exit_code, i)
        for i, e in enumerate(events)
        if isinstance(e, WorkerExited) and e.attempt == 1
    ]
    first = next(
        i for i, e in enumerate(events) if isinstance(e, DeployStageStarted) and e.attempt == 2
    )
    return exits, first


async def test_a_restart_records_the_exits_of_the_old_attempts_workers_before_the_new_starts(
    world: World,
) -> None:
    """Worker 0 fails and auto restart redeploys the same placement: worker 1 of
    attempt 1, still running, is ended and its exit recorded as attempt 1's (it decides
    nothing), before attempt 2 is deployed on the same GPUs; attempt 2 succeeds."""
    app, _ = world.deployer()
    command = (
        'if [ "$RUNYARD_ATTEMPT" = 1 ]; then '
        'if [ "$RUNYARD_WORKER_INDEX" = 0 ]; then exit 5; fi; sleep 30; fi; echo done'
    )
    spec = make_spec(command, workers=2, fault_tolerance={"auto_restart": True, "max_restarts": 1})
    async with pumping(world, app):
        await world.submit_and_place("peers", spec)
        state = await world.until("peers", finished, within=20)
        await asyncio.wait_for(app.drain(), 8)
    assert (state.status, state.attempt, state.restarts) == ("succeeded", 2, 1)
    assert state.held_live == ()
    events = [e.event for e in await world.events("peers")]
    restart = next(i for i, e in enumerate(events) if isinstance(e, TaskRestartScheduled))
    exits, first = old_exits_then_new_attempt(events)
    assert [(w, code) for w, code, _ in exits] == [(0, 5), (1, 143)]
    assert restart < exits[1][2] < first  # ended after the restart, before attempt 2
    later = [
        (e.attempt, e.worker, e.exit_code) for e in events[first:] if isinstance(e, WorkerExited)
    ]
    assert sorted(later) == [(2, 0, 0), (2, 1, 0)]
    assert sum(isinstance(e, TaskSucceeded) for e in events) == 1


async def test_a_deployer_restarted_after_a_task_restart_records_the_old_workers_exits(
    world: World,
) -> None:
    """The task restarts (a hang) while no deployer runs: the next deployer ends the
    replaced attempt's worker, records its exit as attempt 1's, then deploys attempt 2
    on the same placement."""
    app1, runtime1 = world.deployer()
    command = 'echo up; if [ "$RUNYARD_ATTEMPT" = 1 ]; then sleep 30; fi; echo done'
    spec = make_spec(command, fault_tolerance={"auto_restart": True, "max_restarts": 1})
    for event in await world.submit_and_place("hung", spec):
        await app1.handle(event)
    await world.until("hung", lambda s: s.status == "running")
    for _ in range(400):  # the launch command runs (past the sandbox's mounts)
        if world.output("hung"):
            break
        await asyncio.sleep(0.02)
    (pid,) = runtime1.pids(("hung", 1, 1)).values()
    app1.detach()
    await world.do("hung", ScheduleRestart("hung", "hang", delay_s=0))
    assert (await world.state("hung")).held_live == (0,)
    app2, _ = world.deployer()
    await app2.reconcile()
    state = await world.until("hung", finished, within=30)
    await asyncio.wait_for(app2.drain(), 8)
    assert not alive_group(pid)
    assert (state.status, state.attempt, state.held_live) == ("succeeded", 2, ())
    recorded = await world.events("hung")
    exits, first = old_exits_then_new_attempt([e.event for e in recorded])
    assert [(w, code) for w, code, _ in exits] == [(0, 143)]  # `sleep` ended by SIGTERM
    assert exits[0][2] < first
    # its cause is the restart, in the task's correlation
    (restart,) = [e for e in recorded if isinstance(e.event, TaskRestartScheduled)]
    meta = recorded[exits[0][2]].metadata
    assert meta.causation_id == str(restart.event_id)
    assert meta.correlation_id == (restart.metadata.correlation_id or str(restart.event_id))


async def test_a_reschedule_ends_the_old_attempt_and_deploys_the_new_one(world: World) -> None:
    app, runtime = world.deployer()
    command = 'echo "on $RUNYARD_NODE"; if [ "$RUNYARD_ATTEMPT" = 1 ]; then sleep 30; fi'
    async with pumping(world, app):
        await world.submit_and_place("move", make_spec(command, workers=2))
        await world.until("move", lambda s: s.status == "running")
        # both workers of attempt 1 are under way (their first line is out)
        for _ in range(400):
            if len(world.output("move")) == 2:
                break
            await asyncio.sleep(0.02)
        old = list(runtime.pids(("move", 1, 1)).values())
        assert len(old) == 2 and all(alive_group(p) for p in old)
        await world.do("move", RequestReschedule("move", "GPU dropped", ("n-0",)))
        # the scheduler's part: the GPUs go once both exits of attempt 1 are recorded
        await world.until("move", lambda s: s.held_live == ())
        assert not any(alive_group(p) for p in old)
        await world.do(
            "move",
            ReleaseResources("move", "reschedule"),
            Place("move", "dev", placement(2, node="m")),
        )
        state = await world.until("move", finished)
        await asyncio.wait_for(app.drain(), 8)
    assert state.status == "succeeded" and state.attempt == 2 and state.reschedules == 1
    assert not any(alive_group(p) for p in old)
    events = [e.event for e in await world.events("move")]
    started = sorted((e.attempt, e.node) for e in events if isinstance(e, WorkerStarted))
    assert started == [(1, "n-0"), (1, "n-1"), (2, "m-0"), (2, "m-1")]
    exited = sorted((e.attempt, e.worker) for e in events if isinstance(e, WorkerExited))
    assert exited == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert sorted(world.output("move")) == ["on m-0", "on m-1", "on n-0", "on n-1"]


# --- volumes ------------------------------------------------------------------------------


@pytest.mark.parametrize("namespaces", [None, False], ids=["detected", "fallback"])
async def test_volume_files_stay_and_worker_local_files_go(
    world: World, namespaces: bool | None
) -> None:
    app, runtime = world.deployer(namespaces)
    mount = f"/mnt/runyard-test-{uuid.uuid4().hex[:8]}"
    public = f"/mnt/runyard-test-{uuid.uuid4().hex[:8]}"
    where = shared_dir(world, runtime, mount)
    marker = f"runyard-local-{uuid.uuid4().hex[:8]}"
    (world.tmp / "volumes" / "pub" / "data").mkdir(parents=True)
    (world.tmp / "volumes" / "pub" / "data" / "readme").write_text("public\n")
    command = (
        f"echo kept > {where}/result.txt && echo gone > /tmp/{marker} && echo gone > local.txt"
        f" && cat {shared_dir(world, runtime, public)}/readme"
        f" && if touch {shared_dir(world, runtime, public)}/x 2>/dev/null; then echo writable;"
        " else echo read-only; fi"
    )
    spec = make_spec(
        command,
        mounts=(
            {"file_system": "fs", "volume": "out", "mount_path": mount},
            {"file_system": "pub", "volume": "data", "mount_path": public, "read_only": True},
        ),
    )
    for event in await world.submit_and_place("vol", spec):
        await app.handle(event)
    await asyncio.wait_for(app.drain(), 8)
    assert (await world.state("vol")).status == "succeeded", world.output("vol")
    assert (world.tmp / "volumes" / "fs" / "out" / "result.txt").read_text() == "kept\n"
    assert not (world.tmp / "scratch" / "vol").exists()  # working dir and private /tmp gone
    lines = world.output("vol")
    assert lines[0] == "public"
    if runtime.namespaces:
        assert not Path(f"/tmp/{marker}").exists()  # /tmp was the worker's own
        assert lines[1] == "read-only"
        assert not Path(mount, "result.txt").exists()  # the bind mount was the worker's only
    for path in (mount, public):
        with contextlib.suppress(OSError):
            os.rmdir(path)
    with contextlib.suppress(OSError):
        os.remove(f"/tmp/{marker}")


async def spawned_then_crashed(world: World, task_id: str, spec: TaskSpec) -> dict[int, int]:
    """A deployer that deploys `spec` placed on its workers, spawns them and dies; the pids."""
    await world.submit_and_place(task_id, spec)
    runtime = LocalRuntime(world.config())
    d = Deployment(task_id, 1, 1, spec, placement(spec.worker_count))
    for step in (runtime.allocate, runtime.pull_image, runtime.mount_storage, runtime.init_env):
        await step(d)

    async def ignore(*_: Any) -> None:
        return None

    pids = await runtime.start_workers(d, ignore, ignore)
    runtime.detach()
    return pids


async def test_workers_of_a_start_cut_short_are_ended_not_doubled(world: World) -> None:
    # A deployer spawned the workers and died before it wrote their pids.
    (stray,) = (
        await spawned_then_crashed(world, "stray", make_spec("echo started; sleep 2"))
    ).values()
    state_file = world.tmp / "scratch" / "stray" / "run1-a1" / "state.json"
    raw = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**raw, "phase": "starting", "workers": []}))
    assert alive_group(stray)

    app, runtime = world.deployer()
    await app.reconcile()
    assert not alive_group(stray)  # ended, by its environment
    await world.until("stray", lambda s: s.status == "running")
    assert runtime.pids(("stray", 1, 1)) != {0: stray}
    await asyncio.wait_for(app.drain(), 8)
    assert (await world.state("stray")).status == "succeeded"
    types = [e.type for e in await world.events("stray")]
    assert types.count("WorkerStarted") == 1
    assert world.output("stray") == ["started"]  # what the ended gang wrote went with it


async def test_a_start_cut_short_once_every_worker_ran_is_adopted_at_its_start_time(
    world: World,
) -> None:
    # The deployer died after it had written down every worker, before "started" and
    # before the log had the starts: the workers are the attempt's, not strays.
    spec = make_spec("echo up; sleep 1.5; echo done", workers=2)
    pids = await spawned_then_crashed(world, "cut", spec)
    started = datetime.now(UTC)
    state_file = world.tmp / "scratch" / "cut" / "run1-a1" / "state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "phase": "starting"}))
    await asyncio.sleep(0.5)  # the new deployer comes later than the start

    app, runtime = world.deployer()
    await app.reconcile()
    assert runtime.pids(("cut", 1, 1)) == pids  # adopted, not started again
    await asyncio.wait_for(app.drain(), 8)
    assert (await world.state("cut")).status == "succeeded"
    events = await world.events("cut")
    starts = [e for e in events if isinstance(e.event, WorkerStarted)]
    assert len(starts) == 2
    for start in starts:  # when they started, not when they were found
        assert abs((start.occurred_at - started).total_seconds()) < 0.3
    assert sorted(world.output("cut")) == ["done", "done", "up", "up"]
