"""The fault-tolerance service on a real Postgres, with real processes where it matters.

Tests drive a task through the domain's `decide` as the submission, scheduler
and deployer services would, hand the stored events to
`FaultToleranceApp.handle` as the Kafka consumer would, feed worker output
lines to `on_log` as the logs consumer would, and move a fake clock for
`tick`. Stack capture commands go straight to a deployer (`DeployerApp`, the
real one) over a runtime that only knows which processes are an attempt's
workers, as the command topic would bring them. Then they read the stream,
the stack report table and the fault-tolerance log back.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.commands import CaptureStacks
from runyard.contracts.pool_events import NodeMarkedFaulty, NodeMarkedHealthy
from runyard.contracts.spec import FaultToleranceOptions, TaskSpec
from runyard.contracts.stacks import ProcessStacks, WorkerStacks
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    EnvCheckFinished,
    EnvCheckItemReported,
    HangDetected,
    ResumeNotObserved,
    ResumeObserved,
    SlowdownDetected,
    StacksCaptured,
    TaskFailed,
    TaskPlaced,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    TaskRunning,
    TaskSucceeded,
    WorkerPlacement,
)
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import group_members
from runyard.deployer.stacks import capture_group, py_spy_binary
from runyard.domain.task import (
    Command,
    CompleteStage,
    ExitWorker,
    StartStage,
    StartWorker,
    Submit,
    decide,
    evolve,
    fold,
)
from runyard.eventstore import PostgresEventStore
from runyard.faulttolerance.app import FaultToleranceApp, StacksUnavailable
from runyard.faulttolerance.bootcheck import FINISHED, ItemResult
from runyard.faulttolerance.ftlog import read_fault_tolerance_log
from runyard.faulttolerance.reports import StackReportStore
from runyard.faulttolerance.watched import WatchedTasks

from tests.log_records import log_record
from tests.unit.test_faulttolerance_slowdown import SEED_LINES, seed_megatron_log

pytestmark = pytest.mark.integration

#: How long the service awaits a capture here (a deployer that does not hold the
#: workers never answers: the tests of that case wait this long).
STACKS_WAIT_S = 0.5


class Clock:
    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


Capture = Callable[..., Awaitable[list[ProcessStacks]]]


async def real_capture(pgid: int, *, native: bool = True) -> list[ProcessStacks]:
    return await capture_group(pgid, group_members, native=native)


class WorkerProcesses:
    """A runtime that holds attempts as worker index -> process group, and captures
    their stacks with `capture` (py-spy by default): what the deployer's
    `capture_stacks` needs of its runtime."""

    def __init__(self, capture: Capture = real_capture) -> None:
        self.by_key: dict[tuple[str, int, int], dict[int, int]] = {}
        self.capture = capture

    def deployments(self) -> list[tuple[str, int, int]]:
        return list(self.by_key)

    async def capture_stacks(
        self, key: tuple[str, int, int], *, native: bool = True
    ) -> tuple[WorkerStacks, ...]:
        pids = self.by_key.get(key, {})
        workers = []
        for i in sorted(pids):
            processes = await self.capture(pids[i], native=native)
            workers.append(WorkerStacks(worker=i, processes=tuple(processes)))
        return tuple(workers)


class CommandsToDeployer:
    """The deployer's command topic, in process: each command is carried out at once by a
    `DeployerApp` over `processes` (an attempt it does not hold: nothing, as a real one)."""

    def __init__(self, store: PostgresEventStore, capture: Capture = real_capture) -> None:
        self.processes = WorkerProcesses(capture)
        self.deployer = DeployerApp(store, self.processes)  # type: ignore[arg-type]
        self.sent: list[CaptureStacks] = []

    async def send(self, command: CaptureStacks) -> None:
        self.sent.append(command)
        await self.deployer.capture_stacks(command)


class Harness:
    def __init__(
        self, store: PostgresEventStore, app: FaultToleranceApp, clock: Clock, reports: Any
    ) -> None:
        self.store, self.app, self.clock, self.reports = store, app, clock, reports
        self.delivered = 0

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def payloads(self, task_id: str, kind: type[Any]) -> list[Any]:
        return [e.event for e in await self.events(task_id) if isinstance(e.event, kind)]

    async def act(self, task_id: str, *commands: Command) -> None:
        """Decide and append as another service would, then deliver everything new."""
        events = await self.events(task_id)
        state = fold(events, task_id=task_id) if events else None
        now = datetime.now(UTC)
        new: list[Event] = []
        for command in commands:
            for event in decide(state, command, now=now, ids=lambda: "x"):
                state = evolve(state, (event, now))
                new.append(event)
        meta = Metadata(actor="service:test")
        await self.store.append(
            f"task-{task_id}", [NewEvent(e, meta, now) for e in new], len(events)
        )
        await self.deliver(task_id)

    async def append(self, task_id: str, *events: Event) -> None:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="service:test")
        now = datetime.now(UTC)
        await self.store.append(stream, [NewEvent(e, meta, now) for e in events], version)
        await self.deliver(task_id)

    async def deliver(self, task_id: str) -> None:
        """Hand every event not yet handed over to the app (FT's own appends included)."""
        while True:
            events = await self.events(task_id)
            fresh = [e for e in events if e.global_position > self.delivered]
            if not fresh:
                return
            for event in fresh:
                self.delivered = max(self.delivered, event.global_position)
                await self.app.handle(event)

    async def launch(self, task_id: str, spec: TaskSpec, attempt: int = 1) -> None:
        """Submit (first attempt), place, run the stages and start every worker."""
        if attempt == 1:
            await self.act(task_id, Submit(task_id, "acme", "alice", spec))
            workers = tuple(
                WorkerPlacement(index=i, node=f"n-{i}", gpus=(i,)) for i in range(spec.worker_count)
            )
            await self.append(task_id, TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
        for stage in DEPLOY_STAGES:
            await self.act(task_id, StartStage(task_id, stage), CompleteStage(task_id, stage))
        if spec.fault_tolerance.env_check:
            return
        await self.start_workers(task_id, spec, attempt)

    async def start_workers(self, task_id: str, spec: TaskSpec, attempt: int) -> None:
        starts = [StartWorker(task_id, 1, attempt, w) for w in range(spec.worker_count)]
        await self.act(task_id, *starts)

    async def lines(self, task_id: str, worker: int, texts: list[str], attempt: int = 1) -> None:
        for text in texts:
            await self.app.on_log(
                log_record(self.clock(), task_id, text, attempt=attempt, worker=worker)
            )
        await self.deliver(task_id)

    @property
    def workers(self) -> dict[tuple[str, int, int], dict[int, int]]:
        """Attempt -> worker index -> process group, as the deployer holds them."""
        deployer = self.app.deployer
        assert isinstance(deployer, CommandsToDeployer)
        return deployer.processes.by_key

    async def tick(self, task_id: str) -> None:
        await self.app.tick()
        await self.app.drain()
        await self.deliver(task_id)


@pytest.fixture
async def h(dsn: str) -> AsyncIterator[Harness]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    reports = StackReportStore(store.pool)
    await reports.migrate()
    clock = Clock()
    app = FaultToleranceApp(
        store,
        reports=reports,
        watched=WatchedTasks(store.pool),
        deployer=CommandsToDeployer(store),
        clock=clock,
        resume_wait_s=60,
        stacks_wait_s=STACKS_WAIT_S,
    )
    try:
        yield Harness(store, app, clock, reports)
    finally:
        await app.drain()
        await store.close()


def spec(workers: int = 1, **options: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="dev",
        worker_spec="1gpu",
        worker_count=workers,
        image="img",
        command="python train.py",
        framework="pytorch_ddp" if workers > 1 else "single",
        fault_tolerance=FaultToleranceOptions(**options),
    )


async def caused_by(h: Harness, task_id: str, kind: type[Any]) -> list[tuple[Any, Any]]:
    """(event of `kind`, the event its causation id names) for each `kind` in the stream."""
    events = await h.events(task_id)
    by_id = {str(e.event_id): e for e in events}
    found = []
    for e in events:
        if isinstance(e.event, kind):
            cause = by_id.get(e.metadata.causation_id or "")
            assert cause is not None, f"{e.type} names no event of the task as its cause"
            assert e.metadata.correlation_id == (
                cause.metadata.correlation_id or str(cause.event_id)
            ), f"{e.type} does not keep its cause's correlation id"
            found.append((e, cause))
    return found


async def test_megatron_slowdown_gives_the_seed_warnings(h: Harness) -> None:
    await h.launch("slow", spec(slowdown_detection=True))
    await h.lines("slow", 0, seed_megatron_log())
    warnings = await h.payloads("slow", SlowdownDetected)  # one per slow window
    assert [w.message for w in warnings] == SEED_LINES
    assert [(w.first_iter, w.last_iter) for w in warnings] == [(83, 87), (88, 92)]
    assert warnings[0].mean_ms == pytest.approx(9465.0)
    assert warnings[0].baseline_ms == pytest.approx(3101)
    ft = await read_fault_tolerance_log(h.store, "slow")
    assert ft.counts()["slowdowns"] == 2
    assert [line.text for line in ft.lines[-2:]] == SEED_LINES
    assert {line.level for line in ft.lines[-2:]} == {"warning"}
    causes = await caused_by(h, "slow", SlowdownDetected)
    assert [type(cause.event) for _, cause in causes] == [TaskRunning, TaskRunning]


async def test_lines_that_come_after_the_task_ended_are_analysed(h: Harness) -> None:
    """A script that prints its log and exits at once: its lines come after its end."""
    await h.launch("brief", spec(slowdown_detection=True))
    await h.act("brief", ExitWorker("brief", 1, 1, 0, 0))
    assert fold(await h.events("brief")).status == "succeeded"
    await h.lines("brief", 0, seed_megatron_log())
    warnings = await h.payloads("brief", SlowdownDetected)
    assert [w.message for w in warnings] == SEED_LINES


async def test_a_task_first_seen_after_it_ended_is_analysed(h: Harness) -> None:
    """The service never saw the task run (its events came while it was down)."""
    await h.launch("unseen", spec(slowdown_detection=True))
    await h.act("unseen", ExitWorker("unseen", 1, 1, 0, 0))
    fresh = FaultToleranceApp(h.store, clock=h.clock)
    for text in seed_megatron_log():
        await fresh.on_log(log_record(h.clock(), "unseen", text))
    warnings = await h.payloads("unseen", SlowdownDetected)
    assert [w.message for w in warnings] == SEED_LINES


async def test_slowdown_off_by_default(h: Harness) -> None:
    await h.launch("quiet", spec())
    await h.lines("quiet", 0, seed_megatron_log())
    assert await h.payloads("quiet", SlowdownDetected) == []


HUNG = """
import time
print("step 1", flush=True)
def wait_for_all_reduce():
    time.sleep(600)
wait_for_all_reduce()
"""


@pytest.fixture
def hung_worker(tmp_path: Path) -> Iterator[int]:
    script = tmp_path / "train.py"
    script.write_text(HUNG)
    proc = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" "{script}"; exit $?'],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"step 1"
    yield proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


@pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")
async def test_hang_is_detected_stacks_captured_and_the_task_restarted(
    h: Harness, hung_worker: int
) -> None:
    h.workers[("hang", 1, 1)] = {0: hung_worker}
    await h.launch("hang", spec(hang_timeout_s=10, auto_restart=True))
    await h.lines("hang", 0, ["step 1"])
    h.clock.advance(5)
    await h.tick("hang")
    assert await h.payloads("hang", HangDetected) == []
    h.clock.advance(6)
    await h.tick("hang")
    (hang,) = await h.payloads("hang", HangDetected)
    assert hang.idle_s >= 10 and hang.last_log_at is not None
    (stacks,) = await h.payloads("hang", StacksCaptured)
    assert stacks.workers == (0,) and "wait_for_all_reduce" in stacks.summary
    report = await h.reports.get(stacks.report_id)
    assert report is not None
    assert report["frames_by_worker"]["0"][0].startswith("wait_for_all_reduce (train.py:")
    assert report["functions"]["wait_for_all_reduce"]["workers"] == [0]
    raw = report["workers"]["0"][0]["threads"][0]["frames"]
    assert "wait_for_all_reduce" in [f["name"] for f in raw]
    (restart,) = await h.payloads("hang", TaskRestartScheduled)
    assert (restart.reason, restart.attempt) == ("hang", 2)
    types = [e.type for e in await h.events("hang")]
    assert types[-3:] == ["HangDetected", "StacksCaptured", "TaskRestartScheduled"]
    ((_, running),) = await caused_by(h, "hang", HangDetected)
    assert isinstance(running.event, TaskRunning)
    for kind in (StacksCaptured, TaskRestartScheduled):
        ((_, cause),) = await caused_by(h, "hang", kind)
        assert isinstance(cause.event, HangDetected)
    ft = await read_fault_tolerance_log(h.store, "hang")
    assert ft.counts() == {"restarts": 1, "reschedules": 0, "hangs": 1, "slowdowns": 0}
    kinds = [line.kind for line in ft.lines]
    assert kinds == ["hang", "stacks", "restart"]
    assert "Restart 1 scheduled after hang: attempt 2" in ft.lines[-1].text


async def test_an_instance_that_takes_a_task_over_watches_it_at_once(h: Harness) -> None:
    """A hung task prints nothing more and gets no event: the instance that takes its
    partition over (its start, a rebalance) sets the hang timer up from the stream
    at once, not at a next line or event that never comes."""
    await h.launch("quiet", spec(hang_timeout_s=10, auto_restart=True))
    await h.launch("brief", spec())
    await h.act("brief", ExitWorker("brief", 1, 1, 0, 0))
    watched = WatchedTasks(h.store.pool)
    assert "quiet" in await watched.all() and "brief" not in await watched.all()

    # The first instance gives the task up; another takes it over.
    assert h.app.drop(lambda task_id: task_id == "quiet") == 1
    h.clock.advance(11)
    await h.tick("quiet")
    assert await h.payloads("quiet", HangDetected) == [], "dropped: no timer here"
    other = FaultToleranceApp(
        h.store,
        reports=h.reports,
        watched=watched,
        deployer=h.app.deployer,
        clock=h.clock,
        stacks_wait_s=STACKS_WAIT_S,
    )
    assert await other.adopt(lambda task_id: task_id == "elsewhere") == 0
    assert await other.adopt(lambda task_id: task_id in {"quiet", "brief"}) == 1
    h.clock.advance(5)
    await other.tick()
    assert await h.payloads("quiet", HangDetected) == [], "the timer counts from the takeover"
    h.clock.advance(6)
    await other.tick()
    await other.drain()
    (hang,) = await h.payloads("quiet", HangDetected)
    assert hang.idle_s >= 10
    (restart,) = await h.payloads("quiet", TaskRestartScheduled)
    assert restart.reason == "hang"


@pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")
async def test_stacks_on_demand_are_recorded(h: Harness, hung_worker: int) -> None:
    h.workers[("ask", 1, 1)] = {0: hung_worker}
    await h.launch("ask", spec())
    asked = Metadata(actor="user:acme/alice", causation_id="req-1", correlation_id="req-1")
    report = await h.app.request_stacks("ask", asked)
    assert report.frames_by_worker[0][0].startswith("wait_for_all_reduce")
    (captured,) = [e for e in await h.events("ask") if isinstance(e.event, StacksCaptured)]
    assert isinstance(captured.event, StacksCaptured)
    assert captured.event.report_id == report.report_id
    assert captured.metadata.actor == "user:acme/alice"
    assert captured.metadata.causation_id == "req-1"
    assert [r["report_id"] for r in await h.reports.for_task("ask")] == [report.report_id]
    with pytest.raises(StacksUnavailable) as refused:
        await h.app.request_stacks("nobody", asked)
    assert not refused.value.timed_out


async def test_an_expired_capture_command_is_not_carried_out(h: Harness) -> None:
    h.workers[("late", 1, 1)] = {0: 4242}
    await h.launch("late", spec())
    deployer = h.app.deployer
    assert isinstance(deployer, CommandsToDeployer)
    now = datetime.now(UTC)
    late = CaptureStacks(
        task_id="late",
        run=1,
        attempt=1,
        report_id="r-late",
        reason="request",
        requested_at=now - timedelta(seconds=30),
        expires_at=now - timedelta(seconds=10),
        actor="user:acme/alice",
    )
    assert await deployer.deployer.capture_stacks(late) is None
    assert await h.payloads("late", StacksCaptured) == []


async def test_stacks_on_demand_time_out_when_no_deployer_holds_the_workers(
    h: Harness,
) -> None:
    await h.launch("elsewhere", spec())
    asked = Metadata(actor="user:acme/alice")
    with pytest.raises(StacksUnavailable) as refused:
        await h.app.request_stacks("elsewhere", asked)
    assert refused.value.timed_out
    assert await h.payloads("elsewhere", StacksCaptured) == []


async def test_hang_without_auto_restart_fails_the_task(h: Harness) -> None:
    await h.launch("stuck", spec(hang_timeout_s=10))
    h.clock.advance(11)
    await h.tick("stuck")
    assert len(await h.payloads("stuck", HangDetected)) == 1
    assert await h.payloads("stuck", StacksCaptured) == []  # no deployer holds its workers
    assert await h.payloads("stuck", TaskRestartScheduled) == []
    (failed,) = await h.payloads("stuck", TaskFailed)
    assert failed.reason == "hang, auto restart is off"
    ft = await read_fault_tolerance_log(h.store, "stuck")
    assert ft.lines[-1].text == "Task failed: hang, auto restart is off"


@pytest.mark.parametrize("max_restarts", [0, 1])
async def test_a_hang_with_no_restart_left_fails_the_task(h: Harness, max_restarts: int) -> None:
    task_id = f"last-{max_restarts}"
    await h.launch(task_id, spec(hang_timeout_s=10, auto_restart=True, max_restarts=max_restarts))
    for attempt in range(1, max_restarts + 2):
        await h.lines(task_id, 0, ["step 1"], attempt=attempt)
        h.clock.advance(11)
        await h.tick(task_id)
        if attempt <= max_restarts:  # restarted: the next attempt runs
            assert fold(await h.events(task_id)).status == "restarting"
            await h.launch(task_id, spec(hang_timeout_s=10), attempt=attempt + 1)
    state = fold(await h.events(task_id))
    assert (state.status, state.restarts) == ("failed", max_restarts)
    (failed,) = await h.payloads(task_id, TaskFailed)
    assert failed.reason == "hang, no restarts left"
    assert failed.attempt == max_restarts + 1
    ((_, cause),) = await caused_by(h, task_id, TaskFailed)
    assert isinstance(cause.event, HangDetected) and cause.event.attempt == max_restarts + 1
    ft = await read_fault_tolerance_log(h.store, task_id)
    assert ft.counts()["hangs"] == max_restarts + 1
    assert ft.lines[-1].text == (
        f"Task failed: hang, no restarts left ({max_restarts} of {max_restarts} restarts used)"
    )
    assert ft.lines[-1].level == "error"


async def test_a_crash_with_no_restart_left_says_so_in_the_ft_log(h: Harness) -> None:
    await h.launch("crash", spec(auto_restart=True, max_restarts=0))
    await h.act("crash", ExitWorker("crash", 1, 1, 0, 3))
    (failed,) = await h.payloads("crash", TaskFailed)
    assert failed.reason == "worker 0 exited with code 3"
    ft = await read_fault_tolerance_log(h.store, "crash")
    assert [line.text for line in ft.lines] == [
        "Task failed: worker 0 exited with code 3; no restarts left (0 of 0 restarts used)"
    ]


async def test_resume_is_observed_after_a_restart(h: Harness) -> None:
    task_spec = spec(auto_restart=True)
    await h.launch("resume", task_spec)
    await h.lines("resume", 0, [" loading checkpoint from /mnt/ckpt at iteration 0"])
    assert await h.payloads("resume", ResumeObserved) == [], "attempt 1 is no resume"
    await h.act("resume", ExitWorker("resume", 1, 1, 0, 1))  # crash: restart scheduled
    assert len(await h.payloads("resume", TaskRestartScheduled)) == 1
    await h.launch("resume", task_spec, attempt=2)
    await h.lines(
        "resume",
        0,
        ["starting", " loading checkpoint from /mnt/ckpt/gpt at iteration 40", "iteration 41"],
        attempt=2,
    )
    (resume,) = await h.payloads("resume", ResumeObserved)
    assert (resume.attempt, resume.step, resume.path) == (2, 40, "/mnt/ckpt/gpt")
    ft = await read_fault_tolerance_log(h.store, "resume")
    assert [line.kind for line in ft.lines] == ["restart", "resume"]
    assert "Resume observed at step 40 from /mnt/ckpt/gpt" in ft.lines[-1].text


async def test_no_checkpoint_load_after_a_restart_warns(h: Harness) -> None:
    task_spec = spec(auto_restart=True)
    await h.launch("fresh", task_spec)
    await h.act("fresh", ExitWorker("fresh", 1, 1, 0, 1))
    await h.launch("fresh", task_spec, attempt=2)
    await h.lines("fresh", 0, ["epoch 0 step 1 loss 9.1"], attempt=2)
    h.clock.advance(h.app.resume_wait_s + 7)  # a late timer: the wait was resume_wait_s
    await h.tick("fresh")
    (missing,) = await h.payloads("fresh", ResumeNotObserved)
    assert (missing.attempt, missing.waited_s) == (2, h.app.resume_wait_s)
    ft = await read_fault_tolerance_log(h.store, "fresh")
    assert ft.lines[-1].level == "warning" and "No checkpoint load seen" in ft.lines[-1].text


async def test_run_ending_before_any_resume_line_warns(h: Harness) -> None:
    task_spec = spec(auto_restart=True)
    await h.launch("short", task_spec)
    await h.act("short", ExitWorker("short", 1, 1, 0, 1))
    await h.launch("short", task_spec, attempt=2)
    await h.act("short", ExitWorker("short", 1, 2, 0, 0))  # succeeded, never loaded
    # its lines may still be on their way (they travel apart from events): not yet
    assert await h.payloads("short", ResumeNotObserved) == []
    h.clock.advance(h.app.late_lines_s + 1)
    await h.tick("short")
    # what it says is how long the attempt ran without one (moments here, by the
    # events' times), not that and the wait for its late lines
    [missing] = await h.payloads("short", ResumeNotObserved)
    assert missing.waited_s < h.app.late_lines_s, missing
    await h.tick("short")
    assert len(await h.payloads("short", ResumeNotObserved)) == 1
    assert "short" not in h.app._watches


async def test_every_restarted_attempt_gets_its_resume_verdict(h: Harness) -> None:
    """R-32 after each restart, not only the last: attempt 2 crashes before the
    resume wait is over and its load line comes after the restart (lines travel apart
    from events): observed; attempt 3 crashes without one: not observed, once late
    lines had their time."""
    task_spec = spec(auto_restart=True, max_restarts=3)
    await h.launch("loop", task_spec)
    await h.act("loop", ExitWorker("loop", 1, 1, 0, 1))
    await h.launch("loop", task_spec, attempt=2)
    await h.act("loop", ExitWorker("loop", 1, 2, 0, 1))
    await h.lines("loop", 0, [" loading checkpoint from /ckpt at iteration 40"], attempt=2)
    (resume,) = await h.payloads("loop", ResumeObserved)
    assert (resume.attempt, resume.step) == (2, 40)
    await h.launch("loop", task_spec, attempt=3)
    await h.lines("loop", 0, ["epoch 0 step 1 loss 9.1"], attempt=3)
    await h.act("loop", ExitWorker("loop", 1, 3, 0, 1))
    assert await h.payloads("loop", ResumeNotObserved) == [], "its lines may still come"
    h.clock.advance(h.app.late_lines_s + 1)
    await h.tick("loop")
    await h.tick("loop")
    (missing,) = await h.payloads("loop", ResumeNotObserved)
    assert missing.attempt == 3
    ft = await read_fault_tolerance_log(h.store, "loop")
    assert [line.kind for line in ft.lines if line.kind.startswith("resume")] == [
        "resume",
        "resume",
    ], [(line.kind, line.text) for line in ft.lines]


async def test_a_checkpoint_line_that_comes_after_the_run_ended_still_counts(
    h: Harness,
) -> None:
    task_spec = spec(auto_restart=True)
    await h.launch("late", task_spec)
    await h.act("late", ExitWorker("late", 1, 1, 0, 1))
    await h.launch("late", task_spec, attempt=2)
    await h.act("late", ExitWorker("late", 1, 2, 0, 0))
    await h.lines("late", 0, ["Loading checkpoint from /ckpt/step_50.pt (step 50)"], attempt=2)
    (resume,) = await h.payloads("late", ResumeObserved)
    assert (resume.attempt, resume.step, resume.path) == (2, 50, "/ckpt/step_50.pt")
    h.clock.advance(h.app.late_lines_s + 1)
    await h.tick("late")
    assert await h.payloads("late", ResumeNotObserved) == []


async def test_a_checkpoint_line_before_task_running_is_seen_counts_once(h: Harness) -> None:
    task_spec = spec(auto_restart=True)
    await h.launch("early", task_spec)
    await h.act("early", ExitWorker("early", 1, 1, 0, 1))
    for stage in DEPLOY_STAGES:
        await h.act("early", StartStage("early", stage), CompleteStage("early", stage))
    # the worker prints before its start is recorded
    await h.lines("early", 0, ["=> loading checkpoint '/ckpt/step_7.pt'"], attempt=2)
    assert await h.payloads("early", ResumeObserved) == []
    await h.start_workers("early", task_spec, 2)
    (resume,) = await h.payloads("early", ResumeObserved)
    assert (resume.attempt, resume.path) == (2, "/ckpt/step_7.pt")
    await h.lines("early", 0, ["=> loading checkpoint '/ckpt/step_8.pt'"], attempt=2)
    h.clock.advance(61)
    await h.tick("early")
    assert len(await h.payloads("early", ResumeObserved)) == 1
    assert await h.payloads("early", ResumeNotObserved) == []


async def test_env_check_items_become_events_and_a_gpu_fault_reschedules(h: Harness) -> None:
    await h.launch("check", spec(workers=2, env_check=True))
    types = [e.type for e in await h.events("check")]
    assert types[-1] == "EnvCheckStarted"
    # worker 0: the real program's output; worker 1: a node whose GPU dropped
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "runyard.faulttolerance.bootcheck", "--worker", "0"),
        *("--io-mb", "1"),
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    stdout, _ = await asyncio.wait_for(proc.communicate(), 120)
    await h.lines("check", 0, stdout.decode().splitlines())
    assert await h.payloads("check", EnvCheckFinished) == [], "worker 1 has not finished"
    dropped = ItemResult(1, "gpu", "fail", "1 GPU(s) answer, 2 expected", blocking=True)
    await h.lines("check", 1, [dropped.to_line(), FINISHED])
    items = await h.payloads("check", EnvCheckItemReported)
    assert {(i.worker, i.item) for i in items} >= {
        (0, "gpu"),
        (0, "rdma"),
        (0, "storage_io"),
        (0, "communication"),
        (0, "runtime"),
        (1, "gpu"),
    }
    (finished,) = await h.payloads("check", EnvCheckFinished)
    assert (finished.result, finished.blocking_failures) == ("fail", 1)
    (moved,) = await h.payloads("check", TaskRescheduleRequested)
    assert moved.faulty_nodes == ("n-1",)
    ft = await read_fault_tolerance_log(h.store, "check")
    texts = [line.text for line in ft.lines]
    assert texts[0] == "Bootcheck started"
    assert any(t.startswith("worker 1 gpu: fail (blocking: hardware fault)") for t in texts)
    assert any(t.startswith("Bootcheck Finished: fail") for t in texts)
    assert texts[-2].startswith("Reschedule 1 requested: env check found a hardware fault on n-1")
    assert texts[-1] == "Restart 1 scheduled after hardware fault: attempt 2 on healthy nodes"
    assert ft.counts()["reschedules"] == 1 and ft.counts()["restarts"] == 1


async def test_a_node_marked_faulty_reschedules_its_tasks(h: Harness) -> None:
    await h.launch("busy", spec(workers=2))
    fault = NodeMarkedFaulty(node="n-1", reason="GPU 3 fell off the bus")
    await h.store.append("pool-dev", [NewEvent(fault, Metadata(actor="user:admin"), h.clock())], 0)
    (recorded,) = await h.store.read_stream("pool-dev")
    await h.app.handle(recorded)
    (moved,) = await h.payloads("busy", TaskRescheduleRequested)
    assert moved.faulty_nodes == ("n-1",) and "GPU 3 fell off the bus" in moved.reason
    assert fold(await h.events("busy")).status == "restarting"


async def test_a_node_mark_the_log_does_not_hold_moves_nothing(h: Harness) -> None:
    """A node's fault or recovery is acted on only as the log holds it: a message
    that says another node is faulty (a forged or corrupted copy of a stored mark),
    or a mark that was never stored, reschedules no task."""
    await h.launch("safe", spec(workers=2))
    fault = NodeMarkedFaulty(node="n-9", reason="a real fault elsewhere")
    await h.store.append("pool-dev", [NewEvent(fault, Metadata(actor="user:admin"), h.clock())], 0)
    (real,) = await h.store.read_stream("pool-dev")
    forged = NodeMarkedFaulty(node="n-1", reason="forged")
    for event_id, version in ((real.event_id, real.stream_version), (uuid.uuid4(), 2)):
        message = RecordedEvent(
            event_id, real.stream_id, version, real.global_position + 1,
            real.occurred_at, forged, real.metadata,
        )  # fmt: skip
        await h.app.handle(message)
    assert await h.payloads("safe", TaskRescheduleRequested) == []
    assert "n-1" not in h.app._faulty
    # the stored mark is acted on (no task on n-9: nothing to move)
    await h.app.handle(real)
    assert "n-9" in h.app._faulty


async def test_a_task_event_the_log_does_not_hold_does_not_end_its_watch(h: Harness) -> None:
    """The service folds a delivered task event on what it kept without reading the
    stream again, and never reads that version again: a forged `TaskSucceeded` of the
    next version folded so would have ended the watch of a task that still runs (no
    hang detection, no resume verdict). One that ends the watch is folded only as the
    log holds it."""
    await h.launch("watched", spec(hang_timeout_s=10))
    real = (await h.events("watched"))[-1]
    forged = RecordedEvent(
        uuid.uuid4(), real.stream_id, real.stream_version + 1, real.global_position + 1,
        real.occurred_at, TaskSucceeded(run=1, attempt=1), real.metadata,
    )  # fmt: skip
    await h.app.handle(forged)
    assert "watched" in h.app._watches and h.app._watches["watched"].hang is not None
    h.clock.advance(11)
    await h.tick("watched")
    assert len(await h.payloads("watched", HangDetected)) == 1  # still watched


async def test_a_fault_seen_before_the_tasks_placement_still_moves_it(h: Harness) -> None:
    """Task and pool events come on two topics, in no set order between them: a task
    whose placement reaches fault tolerance after its node's fault is moved all the same,
    once, with the fault as the cause."""
    fault = NodeMarkedFaulty(node="n-1", reason="GPU 3 fell off the bus")
    await h.store.append("pool-dev", [NewEvent(fault, Metadata(actor="user:admin"), h.clock())], 0)
    (recorded,) = await h.store.read_stream("pool-dev")
    await h.app.handle(recorded)  # no task is watched yet
    await h.act("late", Submit("late", "acme", "alice", spec(workers=2)))
    workers = tuple(WorkerPlacement(index=i, node=f"n-{i}", gpus=(i,)) for i in range(2))
    await h.append("late", TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
    (moved,) = await h.payloads("late", TaskRescheduleRequested)
    assert moved.faulty_nodes == ("n-1",) and "GPU 3 fell off the bus" in moved.reason
    (event,) = [e for e in await h.events("late") if isinstance(e.event, TaskRescheduleRequested)]
    assert event.metadata.causation_id == str(recorded.event_id)
    state = fold(await h.events("late"))
    assert (state.status, state.reschedules) == ("restarting", 1)
    # A node marked healthy again moves nothing more.
    healthy = NewEvent(NodeMarkedHealthy(node="n-1"), Metadata(actor="user:admin"), h.clock())
    await h.store.append("pool-dev", [healthy], 1)
    await h.app.handle((await h.store.read_stream("pool-dev"))[-1])
    await h.act("other", Submit("other", "acme", "alice", spec(workers=2)))
    await h.append("other", TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
    assert await h.payloads("other", TaskRescheduleRequested) == []


async def test_a_faulty_node_with_no_restart_left_fails_the_task(h: Harness) -> None:
    await h.launch("stuck-node", spec(max_restarts=0))
    fault = NodeMarkedFaulty(node="n-0", reason="GPU 0 fell off the bus")
    await h.store.append("pool-dev", [NewEvent(fault, Metadata(actor="user:admin"), h.clock())], 0)
    (recorded,) = await h.store.read_stream("pool-dev")
    await h.app.handle(recorded)
    state = fold(await h.events("stuck-node"))
    assert (state.status, state.restarts) == ("failed", 0)
    (failed,) = await h.payloads("stuck-node", TaskFailed)
    assert failed.unrecoverable and "no restart left" in failed.reason
    (failure,) = [e for e in await h.events("stuck-node") if isinstance(e.event, TaskFailed)]
    assert failure.metadata.causation_id == str(recorded.event_id)  # the fault is the cause
    ft = await read_fault_tolerance_log(h.store, "stuck-node")
    assert [line.kind for line in ft.lines] == ["reschedule", "reschedule", "failure"]
    assert ft.lines[-1].text.startswith(
        "Task failed: cannot be recovered: no restart left: it reached its restart limit (0)"
    )


async def test_redelivered_log_lines_do_not_report_twice(h: Harness) -> None:
    await h.launch("again", spec(workers=1, env_check=True))
    line = ItemResult(0, "runtime", "pass", "Python 3.11").to_line()
    await h.lines("again", 0, [line, line])
    assert len(await h.payloads("again", EnvCheckItemReported)) == 1
    await asyncio.sleep(0)


# --- with the real deployer and its local runtime ------------------------------------


#: A launcher that starts the training program in a session of its own, as torchrun
#: starts every rank (`start_new_session`): the rank is not in the worker's process group.
#: The rank imports `threading`, as torch does, so py-spy names its main thread too.
IN_OWN_SESSION = f"""
import subprocess, sys
subprocess.run([sys.executable, "-c", "import threading\\n" + {HUNG!r}], start_new_session=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")
@pytest.mark.parametrize("launch", ["direct", "own-session"])
async def test_hung_worker_of_the_local_runtime_has_its_stack_captured(
    dsn: str, tmp_path: Path, launch: str
) -> None:
    from runyard.deployer.runtime import LocalRuntime, LocalRuntimeConfig, OutputLine

    store = await PostgresEventStore.connect(dsn, default_mapper())
    reports = StackReportStore(store.pool)
    await reports.migrate()
    runtime = LocalRuntime(
        LocalRuntimeConfig(
            scratch_root=tmp_path / "scratch",
            volumes_root=tmp_path / "volumes",
            images={"venv": Path(sys.prefix)},
            grace_s=1.0,
        )
    )
    clock = Clock()

    class Commands:
        """The command topic between the two: the deployer below carries them out."""

        async def send(self, command: CaptureStacks) -> None:
            await deployer.capture_stacks(command)

    ft = FaultToleranceApp(store, reports=reports, deployer=Commands(), clock=clock)
    lines: list[OutputLine] = []

    async def sink(line: OutputLine) -> None:
        lines.append(line)
        await ft.on_log(line.record())

    deployer = DeployerApp(store, runtime, on_output=sink, stop_grace_s=1.0)
    h = Harness(store, ft, clock, reports)
    task_spec = spec(hang_timeout_s=10, auto_restart=True).model_copy(
        # inline: the worker's /tmp is its own scratch when it has a mount namespace
        update={
            "image": "venv",
            "command": f"python -c {shlex.quote(HUNG if launch == 'direct' else IN_OWN_SESSION)}",
        }
    )
    try:
        await h.act("real", Submit("real", "acme", "alice", task_spec))
        placed = TaskPlaced(
            run=1, attempt=1, pool="dev", workers=(WorkerPlacement(index=0, node="n-0", gpus=(0,)),)
        )
        await h.append("real", placed)
        for event in await h.events("real"):
            await deployer.handle(event)

        async def running() -> None:
            while not any(x.line == "step 1" for x in lines):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await h.deliver("real")

        try:
            await asyncio.wait_for(running(), 30)
        except TimeoutError:
            raise AssertionError(
                f"no step line: {[x.line for x in lines]}, events: "
                f"{[e.type for e in await h.events('real')]}"
            ) from None
        clock.advance(11)
        await h.tick("real")
        (stacks,) = await h.payloads("real", StacksCaptured)
        report = await reports.get(stacks.report_id)
        assert report is not None
        frames = report["frames_by_worker"]["0"]
        assert any(f.startswith("wait_for_all_reduce (") for f in frames), frames
        # the summary (the FT log's line) names where the rank is, not where its
        # launcher waits for it
        assert stacks.summary.startswith("worker 0: wait_for_all_reduce ("), stacks.summary
        (restart,) = await h.payloads("real", TaskRestartScheduled)
        assert restart.reason == "hang"
    finally:
        await asyncio.wait_for(deployer.close(), 10)
        await ft.drain()
        await store.close()


async def test_a_worker_that_never_finishes_its_env_check_is_a_warning(h: Harness) -> None:
    h.app.env_check_timeout_s = 30
    await h.launch("silent", spec(workers=2, env_check=True))
    await h.lines("silent", 0, [ItemResult(0, "gpu", "not_applicable", "no driver").to_line()])
    await h.lines("silent", 0, [FINISHED])
    h.clock.advance(31)
    await h.tick("silent")
    items = await h.payloads("silent", EnvCheckItemReported)
    late = [i for i in items if i.worker == 1]
    assert [(i.item, i.result, i.blocking) for i in late] == [("runtime", "fail", False)]
    assert "did not finish within 30 s" in late[0].detail
    (finished,) = await h.payloads("silent", EnvCheckFinished)
    assert finished.result == "warn"  # the launch command still runs
