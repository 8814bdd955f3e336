"""The task aggregate: each transition, each refusal, and properties of the fold."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runyard.contracts.base import Event
from runyard.contracts.envelope import Metadata, RecordedEvent
from runyard.contracts.registry import default_mapper
from runyard.contracts.spec import FaultToleranceOptions, SpotOptions, TaskSpec
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    TASK_EVENTS,
    AlertDelivered,
    AlertFailed,
    DeployStageCompleted,
    DeployStageFailed,
    DeployStageStarted,
    EnvCheckFinished,
    EnvCheckItemResult,
    EnvCheckStarted,
    HangDetected,
    ResourcesReleased,
    RestartReason,
    ResumeNotObserved,
    ResumeObserved,
    SlowdownDetected,
    StacksCaptured,
    TaskCloned,
    TaskFailed,
    TaskMarkedAbnormal,
    TaskPlaced,
    TaskPreempted,
    TaskQueued,
    TaskRequeued,
    TaskRerunRequested,
    TaskRescheduleFailed,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    TaskRunning,
    TaskStopped,
    TaskStopRequested,
    TaskSubmitted,
    TaskSucceeded,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)
from runyard.domain import (
    SPOT_NEXT_STEPS,
    Clone,
    Command,
    CompleteStage,
    ConfirmStop,
    DomainError,
    ExitWorker,
    Fail,
    FailReschedule,
    FailStage,
    FinishEnvCheck,
    InconsistentHistory,
    InvalidCommand,
    InvalidTransition,
    MarkAbnormal,
    Observation,
    Place,
    Preempt,
    Queue,
    Record,
    ReleaseResources,
    ReportEnvCheckItem,
    RequestReschedule,
    RequestStop,
    Rerun,
    RerunChangeNotAllowed,
    RestartNotAllowed,
    ScheduleRestart,
    StaleAttempt,
    StartEnvCheck,
    StartStage,
    StartWorker,
    Submit,
    TaskAlreadyExists,
    TaskAlreadyFinished,
    TaskNotFound,
    TaskState,
    TaskStopping,
    decide,
    evolve,
    fold,
    is_terminal,
    queue_expired,
    restart_delay_s,
)
from runyard.domain import task as task_module
from runyard.domain.task import next_attempt

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
TASK = "t-1"


def make_spec(
    *,
    workers: int = 2,
    spot: bool = False,
    env_check: bool = False,
    auto_restart: bool = False,
    max_restarts: int = 2,
    max_requeues: int = 1,
    max_queue_s: int = 60,
) -> TaskSpec:
    return TaskSpec(
        name="llama-sft",
        pool="pool-a",
        worker_spec="8gpu",
        worker_count=workers,
        image="registry/train:1",
        command="torchrun train.py",
        resource_type="spot" if spot else "subscription",
        fault_tolerance=FaultToleranceOptions(
            env_check=env_check, auto_restart=auto_restart, max_restarts=max_restarts
        ),
        spot=SpotOptions(max_queue_duration_s=max_queue_s, max_requeues=max_requeues)
        if spot
        else None,
    )


def workers_for(spec: TaskSpec, node_prefix: str = "node") -> tuple[WorkerPlacement, ...]:
    return tuple(
        WorkerPlacement(index=i, node=f"{node_prefix}-{i}", gpus=tuple(range(8)))
        for i in range(spec.worker_count)
    )


class Story:
    """A task's stream in memory: decide on the folded state, append what comes out."""

    def __init__(self, spec: TaskSpec | None = None) -> None:
        self.events: list[tuple[Event, datetime]] = []
        self.now = T0
        self._ids = itertools.count(1)
        self._state: TaskState | None = None
        self.do(Submit(task_id=TASK, tenant="ml", creator="ml/alice", spec=spec or make_spec()))

    @property
    def state(self) -> TaskState:
        assert self._state is not None
        return self._state

    def status(self) -> str:
        return self.state.status

    def new_id(self) -> str:
        return f"t-clone-{next(self._ids)}"

    def do(self, command: Command, *, after_s: float = 1.0) -> list[Event]:
        self.now += timedelta(seconds=after_s)
        new = decide(self._state, command, now=self.now, ids=self.new_id)
        for event in new:
            self.events.append((event, self.now))
            self._state = evolve(self._state, (event, self.now))
        return new

    def refuse(self, command: Command, error: type[DomainError]) -> DomainError:
        before = list(self.events)
        with pytest.raises(error) as raised:
            self.do(command)
        assert self.events == before
        assert fold(self.events) == self.state
        return raised.value

    # common paths

    def queue(self) -> Story:
        self.do(Queue(TASK, "needs 2 x 8-GPU workers, pool can start 1", 0, 16, 1))
        return self

    def place(self, prefix: str = "node") -> Story:
        self.do(Place(TASK, "pool-a", workers_for(self.state.spec, prefix)))
        return self

    def start_all(self) -> Story:
        s = self.state
        for w in s.workers:
            self.do(StartWorker(TASK, s.run, s.attempt, w.index))
        return self

    def running(self) -> Story:
        return self.queue().place().start_all()

    def exit(self, worker: int, code: int) -> list[Event]:
        s = self.state
        return self.do(ExitWorker(TASK, s.run, s.attempt, worker, code))


def types_of(events: list[Event]) -> tuple[type[Event], ...]:
    return tuple(type(e) for e in events)


# --- submission and lookup --------------------------------------------------


def test_submit_starts_a_new_task() -> None:
    story = Story()
    s = story.state
    assert types_of([e for e, _ in story.events]) == (TaskSubmitted,)
    assert (s.status, s.run, s.attempt, s.version) == ("new", 1, 0, 1)
    assert s.submitted_at == T0 + timedelta(seconds=1)
    assert (s.tenant, s.creator) == ("ml", "ml/alice")


def test_submit_twice_is_refused() -> None:
    Story().refuse(Submit(TASK, "ml", "ml/alice", make_spec()), TaskAlreadyExists)


def test_a_command_for_a_missing_task_is_refused() -> None:
    with pytest.raises(TaskNotFound) as raised:
        decide(None, RequestStop("nope"), now=T0, ids=lambda: "x")
    assert raised.value.code == "task_not_found" and raised.value.hint


def test_a_command_for_another_task_is_refused() -> None:
    Story().refuse(RequestStop("t-other"), InvalidCommand)


# --- queue --------------------------------------------------------------------


def test_queue_records_the_start_of_a_wait_and_changes_of_its_kind_only() -> None:
    story = Story().queue()
    s = story.state
    assert s.status == "queued" and s.queue_position == 0
    assert s.queue_reason == "needs 2 x 8-GPU workers, pool can start 1"
    first_queued_at = s.queued_at
    assert story.do(Queue(TASK, "needs 2 x 8-GPU workers, pool can start 1", 0, 16, 1)) == []
    # a new position or reason in the same wait is derived data: no event
    assert story.do(Queue(TASK, "3 tasks ahead", 3, 16, 0)) == []
    assert story.state.queue_position == 0
    # the pool can no longer start it even if idle: the wait changed kind
    blocked = story.do(Queue(TASK, "even if idle", 3, 16, 0, blocked=True))
    assert isinstance(blocked[0], TaskQueued) and blocked[0].blocked
    assert types_of(blocked) == (TaskQueued,)
    assert story.do(Queue(TASK, "even if idle; 2 tasks ahead", 2, 16, 0, blocked=True)) == []
    assert types_of(story.do(Queue(TASK, "can start", 2, 16, 1))) == (TaskQueued,)
    assert story.state.queue is not None
    assert story.state.queue_position == 2 and not story.state.queue.blocked
    assert story.state.queued_at == first_queued_at


def test_a_spot_task_queued_past_its_limit_becomes_abnormal() -> None:
    story = Story(make_spec(spot=True, max_queue_s=60)).queue()
    assert not queue_expired(story.state, story.now + timedelta(seconds=59))
    events = story.do(Queue(TASK, "still waiting", 0, 16, 0), after_s=61)
    assert types_of(events) == (TaskMarkedAbnormal,)
    assert isinstance(events[0], TaskMarkedAbnormal)
    assert events[0].next_steps == SPOT_NEXT_STEPS
    assert story.status() == "abnormal" and story.state.finished_at == story.now


def test_a_placed_task_cannot_be_queued() -> None:
    Story().queue().place().refuse(Queue(TASK, "x", 0, 16, 0), InvalidTransition)


# --- placement ----------------------------------------------------------------


def test_place_starts_attempt_one_on_the_nodes() -> None:
    story = Story().queue().place()
    s = story.state
    assert (s.status, s.attempt, s.queue) == ("deploying", 1, None)
    assert s.placement is not None and s.held == s.placement
    assert [w.node for w in s.workers] == ["node-0", "node-1"]
    assert not any(w.started for w in s.workers)


@pytest.mark.parametrize(
    "workers",
    [
        (WorkerPlacement(index=0, node="n", gpus=(0,)),),
        (
            WorkerPlacement(index=1, node="n", gpus=(0,)),
            WorkerPlacement(index=0, node="n", gpus=(1,)),
        ),
    ],
)
def test_place_needs_every_worker_in_order(workers: tuple[WorkerPlacement, ...]) -> None:
    Story().queue().refuse(Place(TASK, "pool-a", workers), InvalidCommand)


def test_place_in_another_pool_is_refused() -> None:
    story = Story().queue()
    story.refuse(Place(TASK, "pool-b", workers_for(story.state.spec)), InvalidCommand)


def test_custom_gpu_count_placement_follows_r04() -> None:
    spec = make_spec(workers=1).model_copy(update={"worker_spec": None, "custom_gpus": 12})
    story = Story(spec)
    uneven = (
        WorkerPlacement(index=0, node="a", gpus=tuple(range(8))),
        WorkerPlacement(index=1, node="b", gpus=tuple(range(4))),
    )
    wrong = (uneven[0], WorkerPlacement(index=1, node="b", gpus=tuple(range(8))))
    story.refuse(Place(TASK, "pool-a", wrong), InvalidCommand)
    assert types_of(story.do(Place(TASK, "pool-a", uneven))) == (TaskPlaced,)


def test_placing_a_placed_task_is_refused() -> None:
    story = Story().queue().place()
    story.refuse(Place(TASK, "pool-a", workers_for(story.state.spec)), InvalidTransition)


def test_placing_a_stopped_task_is_refused() -> None:
    story = Story().queue()
    story.do(RequestStop(TASK))
    story.refuse(Place(TASK, "pool-a", workers_for(story.state.spec)), TaskAlreadyFinished)


# --- deploy stages ------------------------------------------------------------


def test_stages_run_in_order_with_durations() -> None:
    story = Story().queue().place()
    assert types_of(story.do(StartStage(TASK, "image_pull"))) == (DeployStageStarted,)
    assert story.state.stage == "image_pull"
    events = story.do(CompleteStage(TASK, "image_pull"), after_s=2.5)
    assert isinstance(events[0], DeployStageCompleted) and events[0].duration_ms == 2500
    s = story.state
    assert (s.stage, s.stages_done) == (None, ("image_pull",))
    story.refuse(StartStage(TASK, "resource_allocation"), InvalidCommand)
    story.do(StartStage(TASK, "env_init"))
    story.refuse(StartStage(TASK, "storage_mount"), InvalidCommand)
    story.refuse(CompleteStage(TASK, "storage_mount"), InvalidCommand)


def test_a_failed_stage_fails_the_run() -> None:
    story = Story().queue().place()
    story.do(StartStage(TASK, "image_pull"))
    events = story.do(FailStage(TASK, "image_pull", "manifest unknown"), after_s=3)
    assert types_of(events) == (
        DeployStageFailed,
        TaskFailed,
    )
    assert isinstance(events[0], DeployStageFailed) and events[0].duration_ms == 3000
    s = story.state
    assert (
        s.status == "failed"
        and s.last_failure_reason == "deploy stage image_pull failed: manifest unknown"
    )


def test_a_stage_cannot_start_before_placement() -> None:
    Story().queue().refuse(StartStage(TASK, "image_pull"), InvalidTransition)


def test_workers_cannot_start_while_a_stage_runs() -> None:
    story = Story().queue().place()
    story.do(StartStage(TASK, "storage_mount"))
    story.refuse(StartWorker(TASK, 1, 1, 0), InvalidCommand)


def test_a_start_records_the_gpus_a_worker_got_where_they_are_not_the_placements() -> None:
    story = Story().queue().place()
    placed = story.state.workers[0].gpus
    other = tuple(g + 1 for g in placed)
    (started,) = story.do(StartWorker(TASK, 1, 1, 0, gpus=other))
    assert isinstance(started, WorkerStarted) and started.gpus == other
    (started, *_) = story.do(StartWorker(TASK, 1, 1, 1, gpus=story.state.workers[1].gpus))
    assert isinstance(started, WorkerStarted) and started.gpus is None
    assert story.state.workers[0].gpus == placed  # the placement's, as the pool holds


# --- env check ----------------------------------------------------------------


def test_env_check_with_warnings_lets_the_workers_start() -> None:
    story = Story(make_spec(env_check=True)).queue().place()
    story.refuse(StartWorker(TASK, 1, 1, 0), InvalidCommand)
    assert types_of(story.do(StartEnvCheck(TASK))) == (EnvCheckStarted,)
    assert story.status() == "env_checking"
    story.do(ReportEnvCheckItem(TASK, 0, "gpu", "pass"))
    story.do(ReportEnvCheckItem(TASK, 1, "rdma", "fail", "link down"))
    story.do(ReportEnvCheckItem(TASK, 1, "storage_io", "warn", "slow"))
    story.refuse(StartWorker(TASK, 1, 1, 0), InvalidCommand)
    events = story.do(FinishEnvCheck(TASK))
    assert events == [
        EnvCheckFinished(run=1, attempt=1, result="warn", blocking_failures=0, warnings=2)
    ]
    story.start_all()
    assert story.status() == "running"


def test_a_blocking_env_check_failure_keeps_the_launch_command_from_running() -> None:
    story = Story(make_spec(env_check=True)).queue().place()
    story.do(StartEnvCheck(TASK))
    story.do(ReportEnvCheckItem(TASK, 0, "gpu", "fail", "GPU 3 dropped", blocking=True))
    (finished,) = story.do(FinishEnvCheck(TASK))
    assert isinstance(finished, EnvCheckFinished) and finished.result == "fail"
    story.refuse(StartWorker(TASK, 1, 1, 0), InvalidCommand)
    story.refuse(ReportEnvCheckItem(TASK, 0, "gpu", "pass"), InvalidCommand)
    story.refuse(FinishEnvCheck(TASK), InvalidCommand)


def test_env_check_refusals() -> None:
    story = Story().queue().place()
    story.refuse(StartEnvCheck(TASK), InvalidCommand)  # not asked for by the spec
    story = Story(make_spec(env_check=True)).queue().place()
    story.do(StartEnvCheck(TASK))
    story.refuse(StartEnvCheck(TASK), InvalidTransition)
    story.refuse(ReportEnvCheckItem(TASK, 0, "gpu", "warn", blocking=True), InvalidCommand)
    story.refuse(ReportEnvCheckItem(TASK, 7, "gpu", "pass"), InvalidCommand)


def test_all_pass_env_check_passes() -> None:
    story = Story(make_spec(env_check=True, workers=1)).queue().place()
    story.do(StartEnvCheck(TASK))
    story.do(ReportEnvCheckItem(TASK, 0, "runtime", "not_applicable"))
    (finished,) = story.do(FinishEnvCheck(TASK))
    assert isinstance(finished, EnvCheckFinished) and finished.result == "pass"


# --- workers, success, failure ------------------------------------------------


def test_the_last_worker_to_start_makes_the_task_running() -> None:
    story = Story().queue().place()
    assert types_of(story.do(StartWorker(TASK, 1, 1, 0))) == (WorkerStarted,)
    assert story.status() == "deploying"
    assert types_of(story.do(StartWorker(TASK, 1, 1, 1))) == (
        WorkerStarted,
        TaskRunning,
    )
    assert story.status() == "running" and story.state.started_at == story.now


def test_worker_start_refusals() -> None:
    story = Story().queue().place()
    story.do(StartWorker(TASK, 1, 1, 0))
    story.refuse(StartWorker(TASK, 1, 1, 0), InvalidCommand)
    story.refuse(StartWorker(TASK, 1, 1, 5), InvalidCommand)
    story.refuse(StartWorker(TASK, 1, 2, 1), StaleAttempt)
    story.refuse(StartWorker(TASK, 2, 1, 1), StaleAttempt)
    Story().queue().refuse(StartWorker(TASK, 1, 0, 0), InvalidTransition)


def test_success_needs_every_worker_to_exit_zero() -> None:
    story = Story().running()
    assert types_of(story.exit(0, 0)) == (WorkerExited,)
    assert story.status() == "running"
    assert types_of(story.exit(1, 0)) == (
        WorkerExited,
        TaskSucceeded,
    )
    s = story.state
    assert s.status == "succeeded" and is_terminal(s.status) and s.finished_at == story.now
    assert all(w.exit_code == 0 for w in s.workers)


def test_one_failing_worker_fails_the_task() -> None:
    story = Story().running()
    story.exit(0, 0)
    events = story.exit(1, 2)
    assert types_of(events) == (
        WorkerExited,
        TaskFailed,
    )
    failed = events[1]
    assert isinstance(failed, TaskFailed)
    assert (failed.worker, failed.exit_code, failed.unrecoverable) == (1, 2, False)
    assert story.state.last_failure_reason == "worker 1 exited with code 2"


def test_worker_exit_refusals() -> None:
    story = Story().queue().place()
    story.do(StartWorker(TASK, 1, 1, 0))
    story.refuse(ExitWorker(TASK, 1, 1, 1, 0), InvalidCommand)  # never started
    story.exit(0, 0)
    story.refuse(ExitWorker(TASK, 1, 1, 0, 0), InvalidCommand)  # already exited
    story.refuse(ExitWorker(TASK, 1, 0, 0, 0), StaleAttempt)


def test_explicit_failure_and_finished_task_refusals() -> None:
    story = Story().queue()
    assert types_of(story.do(Fail(TASK, "pool removed", unrecoverable=True))) == (TaskFailed,)
    assert story.status() == "failed"
    for command in (
        Fail(TASK, "again"),
        RequestStop(TASK),
        Queue(TASK, "x", 0, 8, 0),
        ScheduleRestart(TASK, "failure"),
        MarkAbnormal(TASK, "x"),
        ConfirmStop(TASK),
    ):
        error = story.refuse(command, TaskAlreadyFinished)
        assert error.code == "task_already_finished"


# --- restarts -----------------------------------------------------------------


def test_a_failing_worker_with_auto_restart_restarts_in_place() -> None:
    story = Story(make_spec(auto_restart=True, max_restarts=1)).running()
    events = story.exit(0, 1)
    assert types_of(events) == (
        WorkerExited,
        TaskRestartScheduled,
    )
    assert events[1] == TaskRestartScheduled(run=1, attempt=2, reason="failure", delay_s=10.0)
    s = story.state
    assert (s.status, s.attempt, s.restarts) == ("restarting", 2, 1)
    assert s.placement is not None and s.placement.attempt == 1
    assert not any(w.started or w.exited for w in s.workers)
    assert (s.held_live, s.held_live_of) == ((1,), (1, 1))  # worker 1 is being ended
    story.refuse(ExitWorker(TASK, 1, 1, 0, 1), StaleAttempt)  # already recorded
    # the old attempt's worker, ended by the deployer: its exit is its attempt's
    assert story.do(ExitWorker(TASK, 1, 1, 1, 143)) == [
        WorkerExited(run=1, attempt=1, worker=1, exit_code=143)
    ]
    s = story.state
    assert (s.status, s.attempt, s.restarts, s.held_live) == ("restarting", 2, 1, ())
    assert not any(w.started or w.exited for w in s.workers)
    story.refuse(ExitWorker(TASK, 1, 1, 1, 143), StaleAttempt)  # recorded once
    story.start_all()
    assert story.status() == "running"
    assert types_of(story.exit(1, 1)) == (
        WorkerExited,
        TaskFailed,
    )  # limit reached


@pytest.mark.parametrize("code", [0, 1, 143])
def test_an_exit_of_a_restarted_attempts_worker_decides_nothing(code: int) -> None:
    story = Story(make_spec(workers=3, auto_restart=True, max_restarts=1)).running()
    story.exit(2, 7)
    story.do(ExitWorker(TASK, 1, 1, 0, code))
    s = story.state
    assert (s.status, s.attempt, s.restarts, s.held_live) == ("restarting", 2, 1, (1,))
    assert s.last_failure_reason == "worker 2 exited with code 7"
    assert s.held == s.placement  # the same placement: its GPUs are the new attempt's
    story.refuse(ReleaseResources(TASK, "x"), InvalidCommand)
    story.start_all()
    # even once the new attempt runs (the deployer waits for the exits first), a late
    # exit is the old attempt's: the new attempt's workers, status and outcome stay
    before = story.state
    assert story.do(ExitWorker(TASK, 1, 1, 1, code)) == [
        WorkerExited(run=1, attempt=1, worker=1, exit_code=code)
    ]
    after = story.state
    assert (after.status, after.workers, after.restarts) == ("running", before.workers, 1)
    assert after.held_live == ()
    for worker in range(3):
        story.exit(worker, 0)
    assert (story.status(), story.state.attempt) == ("succeeded", 2)


def test_a_hang_restart_keeps_every_started_worker_until_its_exit_is_recorded() -> None:
    story = Story(make_spec(workers=2, auto_restart=True)).running()
    story.do(ScheduleRestart(TASK, "hang"))
    assert (story.state.held_live, story.state.held_live_of) == ((0, 1), (1, 1))
    # a reschedule of the new attempt (nothing of it started) keeps them listed
    story.do(RequestReschedule(TASK, "GPU dropped", ("node-1",)))
    s = story.state
    assert (s.held_live, s.held_live_of, s.attempt) == ((0, 1), (1, 1), 3)
    story.refuse(ReleaseResources(TASK, "reschedule"), InvalidCommand)
    for worker in (0, 1):
        assert types_of(story.do(ExitWorker(TASK, 1, 1, worker, 143))) == (WorkerExited,)
    assert story.state.held_live == () and story.status() == "restarting"
    story.do(ReleaseResources(TASK, "reschedule"))


def test_a_stop_while_restarting_holds_the_gpus_until_the_old_exits_are_recorded() -> None:
    story = Story(make_spec(workers=2, auto_restart=True)).running()
    story.exit(0, 1)
    story.do(RequestStop(TASK))
    story.do(ConfirmStop(TASK))
    assert story.status() == "stopped" and story.state.held_live == (1,)
    story.refuse(ReleaseResources(TASK, "task stopped"), InvalidCommand)
    assert types_of(story.do(ExitWorker(TASK, 1, 1, 1, 143))) == (WorkerExited,)
    assert story.status() == "stopped"
    story.do(ReleaseResources(TASK, "task stopped"))


def test_restart_backoff_doubles_up_to_five_minutes() -> None:
    assert [restart_delay_s(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]


def test_a_hang_restart_needs_auto_restart() -> None:
    story = Story().running()
    error = story.refuse(ScheduleRestart(TASK, "hang"), RestartNotAllowed)
    assert "auto restart is off" in str(error)
    events = story.do(ScheduleRestart(TASK, "hardware_fault", delay_s=0))
    assert events == [TaskRestartScheduled(run=1, attempt=2, reason="hardware_fault", delay_s=0)]


def test_restarts_stop_at_the_limit() -> None:
    story = Story(make_spec(auto_restart=True, max_restarts=1)).running()
    story.do(ScheduleRestart(TASK, "hang"))
    story.refuse(ScheduleRestart(TASK, "hang"), RestartNotAllowed)


def test_a_restart_repeats_the_env_check() -> None:
    story = Story(make_spec(env_check=True, auto_restart=True, workers=1)).queue().place()
    story.do(StartEnvCheck(TASK))
    story.do(FinishEnvCheck(TASK))
    story.start_all()
    story.exit(0, 1)
    story.refuse(StartWorker(TASK, 1, 2, 0), InvalidCommand)
    story.do(StartStage(TASK, "env_init"))
    story.do(CompleteStage(TASK, "env_init"))
    story.do(StartEnvCheck(TASK))
    story.do(FinishEnvCheck(TASK))
    story.start_all()
    assert (story.status(), story.state.attempt) == ("running", 2)


# --- stop ---------------------------------------------------------------------


def test_stopping_a_queued_task_stops_it_at_once() -> None:
    story = Story().queue()
    assert types_of(story.do(RequestStop(TASK))) == (
        TaskStopRequested,
        TaskStopped,
    )
    assert story.status() == "stopped"


def test_a_stop_names_who_asked_and_in_what_role() -> None:
    by_member = Story().queue().do(RequestStop(TASK, by="bob", role="member"))[0]
    assert isinstance(by_member, TaskStopRequested)
    assert by_member.reason == "stopped by bob (member)"
    assert (by_member.stopped_by, by_member.role, by_member.group_id) == ("bob", "member", None)
    grouped = (
        Story()
        .running()
        .do(RequestStop(TASK, by="carol", role="tenant_admin", group_id="sweep-1"))[0]
    )
    assert isinstance(grouped, TaskStopRequested)
    assert grouped.reason == "stopped by carol (tenant_admin) with task group sweep-1"
    anonymous = Story().queue().do(RequestStop(TASK))[0]
    assert isinstance(anonymous, TaskStopRequested)
    assert anonymous.reason == "stop requested" and "owner" not in anonymous.reason


def test_stopping_a_running_task_waits_for_its_workers() -> None:
    story = Story().running()
    assert types_of(story.do(RequestStop(TASK, "wrong data"))) == (TaskStopRequested,)
    assert story.state.stop_requested and story.status() == "running"
    assert story.do(RequestStop(TASK)) == []
    assert types_of(story.exit(0, 143)) == (WorkerExited,)  # killed: not a failure
    story.refuse(ScheduleRestart(TASK, "hardware_fault"), TaskStopping)
    story.refuse(RequestReschedule(TASK, "x"), TaskStopping)
    assert types_of(story.do(ConfirmStop(TASK))) == (TaskStopped,)
    assert story.status() == "stopped"
    story.refuse(RequestStop(TASK), TaskAlreadyFinished)


def test_nothing_new_starts_while_stopping() -> None:
    story = Story(make_spec(spot=True)).queue().place()
    story.do(RequestStop(TASK))
    error = story.refuse(StartStage(TASK, "image_pull"), TaskStopping)
    assert error.code == "task_stopping"
    story.refuse(StartWorker(TASK, 1, 1, 0), TaskStopping)
    story.refuse(Preempt(TASK, "capacity"), TaskStopping)


def test_a_stage_failing_while_stopping_does_not_fail_the_task() -> None:
    story = Story().queue().place()
    story.do(StartStage(TASK, "image_pull"))
    story.do(RequestStop(TASK))
    assert types_of(story.do(FailStage(TASK, "image_pull", "cancelled"))) == (DeployStageFailed,)
    assert story.status() == "deploying"


def test_confirming_a_stop_nobody_asked_for_is_refused() -> None:
    Story().running().refuse(ConfirmStop(TASK), InvalidCommand)


# --- reschedule and resources -------------------------------------------------


def test_a_reschedule_moves_the_workers_to_new_nodes_as_a_restart() -> None:
    story = Story().running()
    events = story.do(RequestReschedule(TASK, "GPU dropped", ("node-1",)))
    assert types_of(events) == (TaskRescheduleRequested, TaskRestartScheduled)
    requested, restart = events
    assert isinstance(requested, TaskRescheduleRequested) and requested.attempt == 1
    assert isinstance(restart, TaskRestartScheduled)
    assert (restart.reason, restart.attempt, restart.delay_s) == ("hardware_fault", 2, 0.0)
    s = story.state
    assert (s.status, s.reschedules, s.restarts, s.placement, s.workers) == (
        "restarting",
        1,
        1,
        None,
        (),
    )
    assert (s.attempt, s.attempt_unplaced, next_attempt(s)) == (2, True, 2)
    story.refuse(ScheduleRestart(TASK, "hang"), InvalidCommand)  # nothing placed to restart
    story.refuse(Place(TASK, "pool-a", workers_for(s.spec, "spare")), InvalidCommand)  # held
    # attempt 1's workers still run: its GPUs stay held until their exits are recorded
    assert s.held_live == (0, 1)
    story.refuse(ReleaseResources(TASK, "rescheduled"), InvalidCommand)
    assert types_of(story.do(ExitWorker(TASK, 1, 1, 0, 143))) == (WorkerExited,)
    story.refuse(ReleaseResources(TASK, "rescheduled"), InvalidCommand)
    story.do(ExitWorker(TASK, 1, 1, 1, 143))
    story.refuse(ExitWorker(TASK, 1, 1, 1, 143), StaleAttempt)  # recorded once
    assert (story.state.held_live, story.state.status, story.state.workers) == (
        (),
        "restarting",
        (),
    )
    story.do(ReleaseResources(TASK, "rescheduled"))
    assert story.state.held is None
    ((placed, _),) = story.place("spare").events[-1:]
    assert isinstance(placed, TaskPlaced) and placed.attempt == 2  # the restart's attempt
    s = story.state
    assert (s.status, s.attempt, s.attempt_unplaced, s.restarts, s.reschedules) == (
        "deploying",
        2,
        False,
        1,
        1,
    )
    assert [w.node for w in s.workers] == ["spare-0", "spare-1"]
    assert next_attempt(s) == 3


def test_a_reschedule_needs_no_auto_restart_but_a_restart_left() -> None:
    story = Story(make_spec(max_restarts=0)).running()
    events = story.do(RequestReschedule(TASK, "GPU dropped", ("node-1",)))
    assert types_of(events) == (TaskRescheduleRequested, TaskRescheduleFailed, TaskFailed)
    failed = events[-1]
    assert isinstance(failed, TaskFailed) and failed.unrecoverable
    assert failed.reason.startswith("cannot be recovered: no restart left: it reached its")
    assert "GPU dropped" in failed.reason
    s = story.state
    assert (s.status, s.restarts, s.reschedules) == ("failed", 0, 1)


def test_a_reschedule_without_healthy_nodes_fails_unrecoverably() -> None:
    story = Story().running()
    story.refuse(FailReschedule(TASK, "no spare"), InvalidTransition)
    story.do(RequestReschedule(TASK, "GPU dropped", ("node-0",)))
    events = story.do(FailReschedule(TASK, "no healthy spare node"))
    assert types_of(events) == (
        TaskRescheduleFailed,
        TaskFailed,
    )
    failed = events[1]
    assert isinstance(failed, TaskFailed) and failed.unrecoverable
    assert failed.reason == (
        "cannot be recovered: no healthy spare node (rescheduled because GPU dropped)"
    )
    assert story.status() == "failed"


def test_resources_are_released_only_when_no_worker_uses_them() -> None:
    story = Story().queue()
    story.refuse(ReleaseResources(TASK, "x"), InvalidCommand)  # holds nothing
    story.place().start_all()
    story.refuse(ReleaseResources(TASK, "x"), InvalidCommand)  # workers use them
    story.exit(0, 0)
    story.exit(1, 0)
    events = story.do(ReleaseResources(TASK, "task finished"))
    assert events == [ResourcesReleased(run=1, attempt=1, reason="task finished")]
    story.refuse(ReleaseResources(TASK, "again"), InvalidCommand)


# --- preemption ---------------------------------------------------------------


def test_a_preempted_spot_task_is_requeued_then_abnormal_past_its_limit() -> None:
    story = Story(make_spec(spot=True, max_requeues=1)).running()
    assert types_of(story.do(Preempt(TASK, "capacity shrank"))) == (
        TaskPreempted,
        TaskRequeued,
    )
    s = story.state
    assert (s.status, s.preemptions, s.requeues, s.placement) == ("queued", 1, 1, None)
    assert s.queued_at == story.now
    assert s.held_live == (0, 1)  # its GPUs stay held until the workers' exits are recorded
    story.refuse(ReleaseResources(TASK, "preempted"), InvalidCommand)
    for worker in (0, 1):
        (exited,) = story.do(ExitWorker(TASK, 1, 1, worker, 137))
        assert isinstance(exited, WorkerExited) and exited.attempt == 1
    assert story.state.status == "queued"  # an exit of a withdrawn attempt decides nothing
    story.do(ReleaseResources(TASK, "preempted"))
    story.queue().place().start_all()
    assert story.state.attempt == 2
    events = story.do(Preempt(TASK, "capacity shrank again"))
    assert types_of(events) == (
        TaskPreempted,
        TaskMarkedAbnormal,
    )
    s = story.state
    assert (s.status, s.preemptions, s.requeues) == ("abnormal", 2, 1)


def test_only_placed_spot_tasks_are_preempted() -> None:
    Story().running().refuse(Preempt(TASK, "x"), InvalidCommand)
    Story(make_spec(spot=True)).queue().refuse(Preempt(TASK, "x"), InvalidTransition)


def test_mark_abnormal_uses_the_given_next_steps() -> None:
    story = Story().queue()
    (event,) = story.do(MarkAbnormal(TASK, "quota revoked", ("ask an admin",)))
    assert isinstance(event, TaskMarkedAbnormal) and event.next_steps == ("ask an admin",)
    assert story.state.last_failure_reason == "quota revoked"


# --- rerun and clone ----------------------------------------------------------


def test_rerun_starts_the_next_run_with_fresh_counters() -> None:
    story = Story(make_spec(auto_restart=True, max_restarts=1)).running()
    story.exit(0, 1)
    story.start_all()
    story.exit(0, 1)
    assert (story.status(), story.state.restarts) == ("failed", 1)
    # worker 1 is still being ended: the run's GPUs stay held until its exit is recorded
    assert story.state.held_live == (1,)
    story.refuse(ReleaseResources(TASK, "run 1 finished"), InvalidCommand)
    (exited,) = story.do(ExitWorker(TASK, 1, 2, 1, 143))
    assert isinstance(exited, WorkerExited) and not story.state.held_live
    assert story.state.workers[1].exit_code == 143 and story.status() == "failed"
    new_spec = story.state.spec.model_copy(update={"command": "torchrun train.py --fix"})
    events = story.do(Rerun(TASK, new_spec))
    assert events == [TaskRerunRequested(run=2, spec=new_spec, changes=("command",))]
    s = story.state
    assert (s.status, s.run, s.attempt, s.restarts, s.finished_at) == ("new", 2, 0, 0, None)
    assert s.spec == new_spec and s.held is not None  # run 1's GPUs are not released yet
    story.do(ReleaseResources(TASK, "run 1 finished"))
    story.running()
    assert (story.state.run, story.state.attempt, story.status()) == (2, 1, "running")


def test_rerun_needs_a_finished_task() -> None:
    Story().running().refuse(Rerun(TASK), InvalidTransition)


def test_rerun_cannot_change_the_pool_or_the_name() -> None:
    story = Story().queue()
    story.do(RequestStop(TASK))
    changed = story.state.spec.model_copy(
        update={"pool": "pool-b", "name": "other", "image": "i:2"}
    )
    error = story.refuse(Rerun(TASK, changed), RerunChangeNotAllowed)
    assert isinstance(error, RerunChangeNotAllowed) and error.fields == ("name", "pool")
    assert "clone" in error.hint


def test_rerun_with_the_same_spec_lists_no_changes() -> None:
    story = Story().queue()
    story.do(RequestStop(TASK))
    (event,) = story.do(Rerun(TASK))
    assert isinstance(event, TaskRerunRequested) and event.changes == ()


def test_clone_records_the_new_task_on_the_source() -> None:
    story = Story().running()
    assert story.do(Clone(TASK)) == [TaskCloned(new_task_id="t-clone-1")]
    assert story.state.clones == ("t-clone-1",)
    assert story.status() == "running"


# --- observations -------------------------------------------------------------


def test_observations_are_recorded_and_counted() -> None:
    story = Story().running()
    story.do(Record(TASK, HangDetected(run=1, attempt=1, idle_s=900)))
    slow = SlowdownDetected(
        run=1, first_iter=83, last_iter=87, mean_ms=9465, baseline_ms=3101, ratio=2.05, message="m"
    )
    story.do(Record(TASK, slow))
    story.do(
        Record(TASK, StacksCaptured(run=1, attempt=1, workers=(0, 1), report_id="r", summary=""))
    )
    story.do(Record(TASK, ResumeObserved(run=1, attempt=1, step=10, path=None, line="loaded")))
    story.do(Record(TASK, ResumeNotObserved(run=1, attempt=1, waited_s=60)))
    assert (story.state.hangs, story.state.slowdowns) == (1, 1)
    story.refuse(Record(TASK, HangDetected(run=1, attempt=2, idle_s=1)), StaleAttempt)
    story.refuse(Record(TASK, ResumeNotObserved(run=2, attempt=1, waited_s=1)), StaleAttempt)


def test_hangs_are_recorded_only_while_running_but_alerts_always() -> None:
    story = Story().queue()
    story.refuse(Record(TASK, HangDetected(run=1, attempt=1, idle_s=1)), InvalidTransition)
    story.do(RequestStop(TASK))
    story.do(Record(TASK, AlertDelivered(alert="stopped", channel="feishu:s1", attempt=1)))
    failed = AlertFailed(
        alert="stopped", channel="feishu:s1", reason="429", code=429, retryable=True
    )
    assert story.do(Record(TASK, failed)) == [failed]


# --- evolve and fold ------------------------------------------------------------


def test_evolve_takes_the_version_from_a_recorded_event() -> None:
    story = Story().queue()
    recorded = [
        RecordedEvent(
            event_id=uuid4(),
            stream_id=f"task-{TASK}",
            stream_version=version,
            global_position=100 + version,
            occurred_at=at,
            event=event,
            metadata=Metadata(actor="service:test"),
        )
        for version, (event, at) in enumerate(story.events, start=1)
    ]
    assert fold(recorded) == story.state
    assert fold(recorded).version == 2


def test_fold_refuses_broken_histories() -> None:
    with pytest.raises(TaskNotFound):
        fold([], task_id=TASK)
    with pytest.raises(InconsistentHistory):
        fold([(TaskStopped(run=1), T0)])
    story = Story()
    with pytest.raises(InconsistentHistory):
        evolve(story.state, story.events[0])


def test_every_task_event_changes_state_through_evolve() -> None:
    assert set(task_module._APPLIERS) | {TaskSubmitted} == set(TASK_EVENTS)


def test_errors_carry_code_message_and_hint() -> None:
    error = TaskAlreadyFinished(TASK, "failed", "stop")
    assert isinstance(error, InvalidTransition) and isinstance(error, DomainError)
    assert (error.code, error.status, error.action) == ("task_already_finished", "failed", "stop")
    assert "rerun" in str(error) and error.message in str(error)


# --- properties -----------------------------------------------------------------
#
# A walk drives `decide` with commands picked at random among all kinds, most
# of them aimed at the current run and attempt. When the picked command is
# refused (and the refusal must leave the stream as it was), another is drawn,
# so nearly every step moves the task on and walks reach the far states
# (restarts after reschedules, requeues, reruns) instead of stalling.

Builder = Callable[[TaskState, random.Random], Command]
RESTART_REASONS: list[RestartReason] = ["failure", "hang", "hardware_fault"]
ITEM_RESULTS: list[EnvCheckItemResult] = ["pass", "warn", "fail", "not_applicable"]


def _worker_index(s: TaskState, rnd: random.Random) -> int:
    return rnd.randrange(max(len(s.workers), 1))


def _queue(s: TaskState, rnd: random.Random) -> Command:
    reason = rnd.choice(["pool can start 1", "3 tasks ahead"])
    return Queue(TASK, reason, rnd.randrange(3), 16, rnd.randrange(2), rnd.random() < 0.2)


def _place(s: TaskState, rnd: random.Random) -> Command:
    return Place(TASK, s.spec.pool, workers_for(s.spec, rnd.choice("ab")))


def _start_stage(s: TaskState, rnd: random.Random) -> Command:
    return StartStage(TASK, rnd.choice(DEPLOY_STAGES))


def _complete_stage(s: TaskState, rnd: random.Random) -> Command:
    return CompleteStage(TASK, s.stage or "image_pull")


def _env_item(s: TaskState, rnd: random.Random) -> Command:
    result = rnd.choice(ITEM_RESULTS)
    blocking = result == "fail" and rnd.random() < 0.5
    return ReportEnvCheckItem(TASK, _worker_index(s, rnd), "gpu", result, "", blocking)


def _start_worker(s: TaskState, rnd: random.Random) -> Command:
    return StartWorker(TASK, s.run, s.attempt, _worker_index(s, rnd))


def _exit_worker(s: TaskState, rnd: random.Random) -> Command:
    code = rnd.choice([0, 0, 0, 0, 1, 137])
    return ExitWorker(TASK, s.run, s.attempt, _worker_index(s, rnd), code)


def _withdrawn_exit(s: TaskState, rnd: random.Random) -> Command:
    """The exit of a worker of an attempt that is over, which the deployer ends."""
    worker = rnd.choice(s.held_live) if s.held_live else _worker_index(s, rnd)
    return ExitWorker(TASK, *s.held_live_of, worker, rnd.choice([0, 1, 143]))


def _observation(s: TaskState, rnd: random.Random) -> Command:
    run, attempt = s.run, max(s.attempt, 1)
    events: list[Observation] = [
        StacksCaptured(run=run, attempt=attempt, workers=(0,), report_id="r", summary=""),
        ResumeObserved(run=run, attempt=attempt, line="loaded checkpoint"),
        ResumeNotObserved(run=run, attempt=attempt, waited_s=60),
        AlertDelivered(alert="failed", channel="feishu:s", attempt=1),
        AlertFailed(alert="failed", channel="feishu:s", reason="429", retryable=True),
    ]
    return Record(TASK, rnd.choice(events))


def _progress_warning(s: TaskState, rnd: random.Random) -> Command:
    run, attempt = s.run, max(s.attempt, 1)
    if rnd.random() < 0.5:
        return Record(TASK, HangDetected(run=run, attempt=attempt, idle_s=600))
    slow = SlowdownDetected(
        run=run, first_iter=1, last_iter=5, mean_ms=9, baseline_ms=3, ratio=2, message=""
    )
    return Record(TASK, slow)


def _rerun(s: TaskState, rnd: random.Random) -> Command:
    return Rerun(TASK, s.spec.model_copy(update={"command": f"python {rnd.choice('ab')}.py"}))


#: (builder, weight): the weight is how many slots the kind has in the pool.
WEIGHTED: list[tuple[Builder, int]] = [
    (_queue, 3),
    (_place, 3),
    (_start_stage, 3),
    (_complete_stage, 4),
    (lambda s, r: FailStage(TASK, s.stage or "image_pull", "pull failed"), 1),
    (lambda s, r: StartEnvCheck(TASK), 3),
    (_env_item, 3),
    (lambda s, r: FinishEnvCheck(TASK), 3),
    (_start_worker, 12),
    (_exit_worker, 10),
    (_withdrawn_exit, 4),
    (lambda s, r: Fail(TASK, "platform error"), 1),
    (lambda s, r: RequestStop(TASK), 1),
    (lambda s, r: ConfirmStop(TASK), 2),
    (lambda s, r: ScheduleRestart(TASK, r.choice(RESTART_REASONS)), 2),
    (lambda s, r: RequestReschedule(TASK, "GPU dropped", ("a-0",)), 1),
    (lambda s, r: FailReschedule(TASK, "no spare"), 1),
    (lambda s, r: Preempt(TASK, "capacity"), 2),
    (lambda s, r: MarkAbnormal(TASK, "needs a person"), 1),
    (lambda s, r: ReleaseResources(TASK, "done"), 3),
    (_rerun, 2),
    (lambda s, r: Clone(TASK), 1),
    (_observation, 3),
    (_progress_warning, 4),
]
POOL: list[Builder] = [builder for builder, weight in WEIGHTED for _ in range(weight)]

specs = st.builds(
    make_spec,
    workers=st.integers(1, 3),
    spot=st.booleans(),
    env_check=st.booleans(),
    auto_restart=st.booleans(),
    max_restarts=st.integers(0, 3),
    max_requeues=st.integers(0, 2),
    max_queue_s=st.integers(5, 120),
)


def step(story: Story, rnd: random.Random) -> None:
    """Apply a random command that decide accepts (giving up after a few refusals)."""
    state = story.state
    for _ in range(12):
        command = rnd.choice(POOL)(state, rnd)
        try:
            story.do(command, after_s=rnd.choice([0.0, 1.0, 30.0]))
            return
        except DomainError:
            assert story.state == state and story.state.version == len(story.events)


def walk(spec: TaskSpec, data: st.DataObject) -> list[tuple[Event, datetime]]:
    """A random, valid history of one task, grown by `decide` alone."""
    rnd = data.draw(st.randoms(use_true_random=False))
    story = Story(spec)
    for _ in range(data.draw(st.integers(0, 60))):
        step(story, rnd)
    return story.events


def since_last_run(events: list[tuple[Event, datetime]]) -> list[Event]:
    reruns = [i for i, (e, _) in enumerate(events) if isinstance(e, TaskRerunRequested)]
    return [e for e, _ in events[(reruns[-1] + 1 if reruns else 0) :]]


PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(spec=specs, data=st.data())
def test_folding_is_deterministic_and_counts_every_counted_event(
    spec: TaskSpec, data: st.DataObject
) -> None:
    events = walk(spec, data)
    state = fold(events)
    assert fold(events) == state
    assert fold(list(events)) == fold(tuple(events))
    assert state.version == len(events)
    run_events = since_last_run(events)
    for counter, kind in (
        ("restarts", TaskRestartScheduled),
        ("reschedules", TaskRescheduleRequested),
        ("requeues", TaskRequeued),
        ("preemptions", TaskPreempted),
        ("hangs", HangDetected),
        ("slowdowns", SlowdownDetected),
    ):
        assert getattr(state, counter) == sum(isinstance(e, kind) for e in run_events), counter


@PROPERTIES
@given(spec=specs, data=st.data())
def test_state_invariants_hold_after_any_walk(spec: TaskSpec, data: st.DataObject) -> None:
    events = walk(spec, data)
    state: TaskState | None = None
    for event in events:
        before, state = state, evolve(state, event)
        exited = event[0]
        if (
            isinstance(exited, WorkerExited)
            and before is not None
            and (exited.run, exited.attempt) != (before.run, before.attempt)
        ):
            # a late exit of an attempt that is over decides nothing for the current one
            assert (state.status, state.attempt, state.workers) == (
                before.status,
                before.attempt,
                before.workers,
            )
            assert exited.worker in before.held_live
        assert is_terminal(state.status) == (state.finished_at is not None)
        if state.status == "succeeded":
            assert state.workers and all(w.exit_code == 0 for w in state.workers)
        if state.status == "running":
            assert state.workers and all(w.started for w in state.workers)
        assert state.restarts <= state.spec.fault_tolerance.max_restarts
    assert state is not None and state == fold(events)


@settings(max_examples=50, deadline=None)
@given(spec=specs, data=st.data())
def test_a_walk_survives_the_mapper(spec: TaskSpec, data: st.DataObject) -> None:
    mapper = default_mapper()
    events = walk(spec, data)
    decoded = [(mapper.decode(*mapper.encode(e)), at) for e, at in events]
    assert decoded == events
    assert fold(decoded) == fold(events)


def test_states_are_values() -> None:
    state = Story().running().state
    assert replace(state) == state and hash(replace(state)) == hash(state)
    assert replace(state, hangs=1) != state
