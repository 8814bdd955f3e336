"""The task aggregate: its state as a pure fold of its events, and its decisions.

    state = fold(events)                              # TaskState
    new_events = decide(state, command, now=..., ids=...)
    state = evolve(state, (event, occurred_at))      # or a RecordedEvent

Nothing here reads a clock, draws an id or does I/O: time (`now`, and each
event's `occurred_at`) and ids (`ids()`) come in as arguments, so a replay of
the log gives the same state, byte for byte, in every service.

Life of a task (statuses in brackets; terminal ones end with `*`):

    [new] --queue--> [queued] --place--> [deploying] --stages, env check-->
    [env_checking] --all workers started--> [running] --all exited 0--> [succeeded*]
    a worker exits non-zero --> [restarting] (auto restart, new attempt) or [failed*]
    hardware fault --reschedule + restart--> [restarting] --place on healthy nodes--> [deploying]
    spot preemption --> [queued] (requeue) or [abnormal*]
    stop --> [stopped*];  rerun of a terminal task --> [new] as the next run

`run` counts executions of the task (a rerun adds one); `attempt` counts tries
within a run, 0 before the first placement: a placement or a restart starts
the next attempt (a restart after a reschedule announces the attempt that the
scheduler's placement then fills in, so it is counted once). Counters
(restarts, reschedules, requeues, preemptions, hangs, slowdowns) are per run:
a rerun starts them again at 0, as it starts the run's limits (max restarts,
max requeues) again.

`decide` appends what follows from a fact in the same list when the domain
can tell: the last worker to start brings `TaskRunning`, a worker's exit
brings the run's outcome (R-21: exit codes alone decide it), a preemption
brings the requeue or the abnormal state, a reschedule the hardware-fault
restart of the workers on the nodes the scheduler picks next (or the failure
when no restart is left), a failed reschedule the failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final, TypeAlias, TypeVar

from runyard.contracts.base import Event
from runyard.contracts.envelope import RecordedEvent
from runyard.contracts.spec import RERUN_CHANGEABLE, SpotOptions, TaskSpec, split_custom_gpus
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    AlertDelivered,
    AlertFailed,
    DeployStageCompleted,
    DeployStageFailed,
    DeployStageName,
    DeployStageStarted,
    EnvCheckFinished,
    EnvCheckItemName,
    EnvCheckItemReported,
    EnvCheckItemResult,
    EnvCheckResult,
    EnvCheckStarted,
    HangDetected,
    ResourcesReleased,
    RestartReason,
    ResumeNotObserved,
    ResumeObserved,
    SlowdownDetected,
    StacksCaptured,
    SubmissionWarning,
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
    TaskStatus,
    TaskStopped,
    TaskStopRequested,
    TaskSubmitted,
    TaskSucceeded,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)
from runyard.domain.errors import (
    InconsistentHistory,
    InvalidCommand,
    InvalidTransition,
    RerunChangeNotAllowed,
    RestartNotAllowed,
    StaleAttempt,
    TaskAlreadyExists,
    TaskAlreadyFinished,
    TaskNotFound,
    TaskStopping,
)

TERMINAL_STATUSES: Final[frozenset[TaskStatus]] = frozenset(
    {"succeeded", "failed", "stopped", "abnormal"}
)
#: Statuses in which the task has (or is getting) workers on nodes.
PLACED_STATUSES: Final[frozenset[TaskStatus]] = frozenset(
    {"deploying", "env_checking", "running", "restarting"}
)
#: What a person can do with an abnormal spot task (R-08).
SPOT_NEXT_STEPS: Final[tuple[str, ...]] = (
    "retry the task",
    "change its spec or zone",
    "resubmit it",
    "move it to subscription resources",
)
RESTART_BACKOFF_S: Final = 10.0
RESTART_BACKOFF_MAX_S: Final = 300.0

#: Makes a fresh id (e.g. a new task id for a clone); passed in, never drawn here.
IdFactory: TypeAlias = Callable[[], str]
#: What `evolve` folds: a stored event, or an event with its time of occurrence.
Folded: TypeAlias = RecordedEvent[Event] | tuple[Event, datetime]


def is_terminal(status: TaskStatus) -> bool:
    """Whether `status` ends a run: succeeded, failed, stopped or abnormal."""
    return status in TERMINAL_STATUSES


# --- state ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the workers of one attempt run: the pool, and each worker's node and GPUs."""

    run: int
    attempt: int
    pool: str
    workers: tuple[WorkerPlacement, ...]


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker of the current attempt: where it runs and whether it started and exited."""

    index: int
    node: str
    gpus: tuple[int, ...]
    started: bool = False
    exit_code: int | None = None

    @property
    def exited(self) -> bool:
        return self.exit_code is not None


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """Why the task waits, as its last TaskQueued said (R-07).

    The values are those of the moment the event was appended (the start of
    the wait, or a change of its kind); the current position and reason are
    derived data in the scheduler's queue read model, not in the fold.
    """

    reason: str
    position: int
    gpus_needed: int
    launchable: int
    #: The pool could not start the task even if idle: it waits for a person.
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class EnvCheckState:
    """The current attempt's env check: items seen so far, and the result once finished."""

    items: int = 0
    blocking_failures: int = 0
    warnings: int = 0
    result: EnvCheckResult | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None


@dataclass(frozen=True, slots=True)
class TaskState:
    """A task as its events say it is now; see the module docstring for the words."""

    task_id: str
    tenant: str
    creator: str
    spec: TaskSpec
    submitted_at: datetime
    status: TaskStatus = "new"
    run: int = 1
    attempt: int = 0
    #: The deploy stage in progress, and when it started.
    stage: DeployStageName | None = None
    stage_started_at: datetime | None = None
    #: Deploy stages completed in this attempt, in order.
    stages_done: tuple[DeployStageName, ...] = ()
    #: Placement of the current attempt; None while waiting for one.
    placement: Placement | None = None
    #: The placement whose GPUs are still allocated, until ResourcesReleased.
    held: Placement | None = None
    #: Workers of the held placement that started and have not exited although their
    #: attempt is over (restarted, preempted, rescheduled, or the run failed): its GPUs
    #: stay held until the deployer has ended them and recorded their exits
    #: (`WorkerExited` of that attempt). After a restart in place the new attempt has
    #: the same placement: the deployer starts it once these exits are recorded.
    held_live: tuple[int, ...] = ()
    #: (run, attempt) of the workers in `held_live`.
    held_live_of: tuple[int, int] = (0, 0)
    workers: tuple[WorkerState, ...] = ()
    env_check: EnvCheckState | None = None
    #: The current attempt was started by a restart after a reschedule and waits for the
    #: scheduler's placement, which takes its number (instead of starting another one).
    attempt_unplaced: bool = False
    restarts: int = 0
    reschedules: int = 0
    requeues: int = 0
    preemptions: int = 0
    hangs: int = 0
    slowdowns: int = 0
    stop_requested: bool = False
    #: Who asked to stop the run and in what role (`stopped by bob (member)`).
    stop_reason: str | None = None
    queue: QueueInfo | None = None
    last_failure_reason: str | None = None
    warnings: tuple[SubmissionWarning, ...] = ()
    group_id: str | None = None
    cloned_from: str | None = None
    clones: tuple[str, ...] = ()
    #: Start of the current queue wait (first TaskQueued, or the last requeue).
    queued_at: datetime | None = None
    #: When the run first ran (its first TaskRunning).
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: Stream version of the last event folded (= number of events).
    version: int = 0

    @property
    def finished(self) -> bool:
        return is_terminal(self.status)

    @property
    def queue_reason(self) -> str | None:
        return self.queue.reason if self.queue else None

    @property
    def queue_position(self) -> int | None:
        """Tasks ahead when the last TaskQueued was appended (the current place is in
        the scheduler's queue read model)."""
        return self.queue.position if self.queue else None


# --- replace, specialised ---------------------------------------------------

D = TypeVar("D")


def _replacer(cls: type[D]) -> Callable[[D, dict[str, Any]], D]:
    """`dataclasses.replace` specialised to the frozen dataclass `cls`: a new instance
    with every field of `s` copied, then `changes` set, as its generated `__init__`
    sets fields (`object.__setattr__`). The generic `replace` walks the fields'
    metadata and calls `__init__` by keyword on every call, which was 90% of a fold's
    time; this one gives the same value (tests/unit/test_task_fold.py checks it over
    random histories). Made once per class from source, as `dataclasses` makes
    `__init__`; only for classes whose `__init__` does nothing else."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields(cls)):  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__}: its __init__ must only set its fields")
    copied = "".join(f"    put(new, {n!r}, s.{n})\n" for n in names)
    source = (
        "def replace(s, changes):\n"
        "    if not changes.keys() <= known:\n"
        "        raise TypeError(f'{cls.__name__} has no field {set(changes) - known}')\n"
        "    new = make(cls)\n"
        f"{copied}"
        "    for name, value in changes.items():\n"
        "        put(new, name, value)\n"
        "    return new\n"
    )
    scope: dict[str, Any] = {
        "cls": cls,
        "known": frozenset(names),
        "make": object.__new__,
        "put": object.__setattr__,
    }
    exec(source, scope)  # our own field names only
    made: Callable[[D, dict[str, Any]], D] = scope["replace"]
    return made


_REPLACERS: dict[type[Any], Callable[[Any, dict[str, Any]], Any]] = {
    cls: _replacer(cls) for cls in (TaskState, WorkerState, EnvCheckState)
}


def _replace(obj: D, /, **changes: Any) -> D:
    """`dataclasses.replace(obj, **changes)` for the task's state classes, faster."""
    return _REPLACERS[type(obj)](obj, changes)  # type: ignore[no-any-return]


# --- evolve -----------------------------------------------------------------

S = TypeVar("S", bound=Event)
_Applier: TypeAlias = Callable[[TaskState, Any, datetime], TaskState]
_APPLIERS: dict[type[Event], _Applier] = {}


def _applies(
    kind: type[S],
) -> Callable[[Callable[[TaskState, S, datetime], TaskState]], Callable[..., TaskState]]:
    def register(fn: Callable[[TaskState, S, datetime], TaskState]) -> Callable[..., TaskState]:
        _APPLIERS[kind] = fn
        return fn

    return register


def evolve(state: TaskState | None, event: Folded) -> TaskState:
    """The task after `event`: a pure function of the state before and the event.

    `event` is a RecordedEvent (its stream version becomes the state's
    version) or `(event, occurred_at)` (the version counts up by one). The
    first event of a task is its TaskSubmitted, folded onto `None`.
    """
    payload, at, version = _unpack(state, event)
    if state is None:
        return _stamped(_start(payload, at), version, state)
    if isinstance(payload, TaskSubmitted):
        raise InconsistentHistory(state.task_id, "TaskSubmitted after the first event")
    applier = _APPLIERS.get(type(payload))
    if applier is None:
        raise InconsistentHistory(state.task_id, f"{payload.type_name()} is not a task event")
    return _stamped(applier(state, payload, at), version, state)


def _stamped(new: TaskState, version: int, before: TaskState | None) -> TaskState:
    """`new` with `version`. An applier answers the state it was given (nothing
    changed) or a state it has just made, which nobody else holds yet: that one gets
    its version in place, one copy of the state fewer per event."""
    if new is before:
        return _replace(new, version=version)
    object.__setattr__(new, "version", version)  # frozen for everyone after this
    return new


def fold(events: Iterable[Folded], *, task_id: str = "") -> TaskState:
    """The task after all of `events`, in order; raises TaskNotFound when there are none."""
    state: TaskState | None = None
    for event in events:
        state = evolve(state, event)
    if state is None:
        raise TaskNotFound(task_id)
    return state


def _unpack(state: TaskState | None, event: Folded) -> tuple[Event, datetime, int]:
    if isinstance(event, RecordedEvent):
        return event.event, event.occurred_at, event.stream_version
    payload, at = event
    return payload, at, (state.version if state else 0) + 1


def _start(event: Event, at: datetime) -> TaskState:
    if not isinstance(event, TaskSubmitted):
        raise InconsistentHistory("?", f"the stream starts with {event.type_name()}")
    return TaskState(
        task_id=event.task_id,
        tenant=event.tenant,
        creator=event.creator,
        spec=event.spec,
        submitted_at=at,
        warnings=event.warnings,
        group_id=event.group_id,
        cloned_from=event.cloned_from,
    )


def _fresh_workers(placement: Placement | None) -> tuple[WorkerState, ...]:
    if placement is None:
        return ()
    return tuple(WorkerState(w.index, w.node, w.gpus) for w in placement.workers)


def _new_attempt(s: TaskState, attempt: int, placement: Placement | None) -> TaskState:
    """Everything of an attempt starts afresh: workers, stages, env check."""
    return _replace(
        s,
        attempt=attempt,
        placement=placement,
        workers=_fresh_workers(placement),
        stage=None,
        stage_started_at=None,
        stages_done=(),
        env_check=None,
    )


def _finish(s: TaskState, status: TaskStatus, at: datetime) -> TaskState:
    return _replace(s, status=status, finished_at=at)


def _set_worker(s: TaskState, index: int, **changes: Any) -> TaskState:
    workers = tuple(_replace(w, **changes) if w.index == index else w for w in s.workers)
    return _replace(s, workers=workers)


@_applies(TaskCloned)
def _cloned(s: TaskState, e: TaskCloned, at: datetime) -> TaskState:
    return _replace(s, clones=(*s.clones, e.new_task_id))


@_applies(TaskRerunRequested)
def _rerun(s: TaskState, e: TaskRerunRequested, at: datetime) -> TaskState:
    fresh = TaskState(
        task_id=s.task_id,
        tenant=s.tenant,
        creator=s.creator,
        spec=e.spec,
        submitted_at=s.submitted_at,
        run=e.run,
        held=s.held,
        held_live=s.held_live,
        held_live_of=s.held_live_of,
        warnings=s.warnings,
        group_id=s.group_id,
        cloned_from=s.cloned_from,
        clones=s.clones,
    )
    return fresh


@_applies(TaskQueued)
def _queued(s: TaskState, e: TaskQueued, at: datetime) -> TaskState:
    info = QueueInfo(e.reason, e.position, e.gpus_needed, e.launchable, e.blocked)
    since = s.queued_at if s.status == "queued" and s.queued_at else at
    return _replace(s, status="queued", queue=info, queued_at=since)


@_applies(TaskPlaced)
def _placed(s: TaskState, e: TaskPlaced, at: datetime) -> TaskState:
    placement = Placement(e.run, e.attempt, e.pool, e.workers)
    moved = _new_attempt(s, e.attempt, placement)
    return _replace(moved, status="deploying", held=placement, queue=None, attempt_unplaced=False)


@_applies(DeployStageStarted)
def _stage_started(s: TaskState, e: DeployStageStarted, at: datetime) -> TaskState:
    return _replace(s, status="deploying", stage=e.stage, stage_started_at=at)


@_applies(DeployStageCompleted)
def _stage_completed(s: TaskState, e: DeployStageCompleted, at: datetime) -> TaskState:
    done = (*s.stages_done, e.stage)
    return _replace(s, stage=None, stage_started_at=None, stages_done=done)


@_applies(DeployStageFailed)
def _stage_failed(s: TaskState, e: DeployStageFailed, at: datetime) -> TaskState:
    return _replace(s, stage=None, stage_started_at=None, last_failure_reason=e.reason)


@_applies(EnvCheckStarted)
def _env_check_started(s: TaskState, e: EnvCheckStarted, at: datetime) -> TaskState:
    return _replace(s, status="env_checking", env_check=EnvCheckState())


@_applies(EnvCheckItemReported)
def _env_check_item(s: TaskState, e: EnvCheckItemReported, at: datetime) -> TaskState:
    check = s.env_check or EnvCheckState()
    blocking = e.result == "fail" and e.blocking
    warning = e.result == "warn" or (e.result == "fail" and not e.blocking)
    counted = _replace(
        check,
        items=check.items + 1,
        blocking_failures=check.blocking_failures + blocking,
        warnings=check.warnings + warning,
    )
    return _replace(s, env_check=counted)


@_applies(EnvCheckFinished)
def _env_check_finished(s: TaskState, e: EnvCheckFinished, at: datetime) -> TaskState:
    return _replace(s, env_check=_replace(s.env_check or EnvCheckState(), result=e.result))


@_applies(WorkerStarted)
def _worker_started(s: TaskState, e: WorkerStarted, at: datetime) -> TaskState:
    return _set_worker(s, e.worker, started=True)


@_applies(WorkerExited)
def _worker_exited(s: TaskState, e: WorkerExited, at: datetime) -> TaskState:
    if _withdrawn(s, e.run, e.attempt):
        s = _replace(s, held_live=tuple(w for w in s.held_live if w != e.worker))
        if (e.run, e.attempt) != (s.run, s.attempt):
            return s  # the task has moved on from that attempt
    return _set_worker(s, e.worker, exit_code=e.exit_code)


def _withdrawn(s: TaskState, run: int, attempt: int) -> bool:
    """Whether (run, attempt) is an attempt that is over (restarted, preempted,
    rescheduled, or its run failed) with workers whose exits are not recorded yet."""
    return bool(s.held_live) and (run, attempt) == s.held_live_of


def _still_live(s: TaskState) -> dict[str, Any]:
    """`held_live` for the current attempt, now over: its started, unexited workers."""
    live = tuple(w.index for w in s.workers if w.started and not w.exited)
    if s.held_live and not live:
        return {}  # an earlier attempt's workers are still being ended: keep those
    return {"held_live": live, "held_live_of": (s.run, s.attempt)}


@_applies(TaskRunning)
def _running(s: TaskState, e: TaskRunning, at: datetime) -> TaskState:
    return _replace(s, status="running", started_at=s.started_at or at)


@_applies(TaskSucceeded)
def _succeeded(s: TaskState, e: TaskSucceeded, at: datetime) -> TaskState:
    return _finish(s, "succeeded", at)


@_applies(TaskFailed)
def _failed(s: TaskState, e: TaskFailed, at: datetime) -> TaskState:
    # the peers of a failing worker (or every worker, for a failure decided elsewhere)
    # are still being ended: their GPUs stay held until their exits are recorded
    return _replace(_finish(s, "failed", at), last_failure_reason=e.reason, **_still_live(s))


@_applies(TaskStopRequested)
def _stop_requested(s: TaskState, e: TaskStopRequested, at: datetime) -> TaskState:
    return _replace(s, stop_requested=True, stop_reason=e.reason)


@_applies(TaskStopped)
def _stopped(s: TaskState, e: TaskStopped, at: datetime) -> TaskState:
    return _finish(s, "stopped", at)


@_applies(TaskRestartScheduled)
def _restart_scheduled(s: TaskState, e: TaskRestartScheduled, at: datetime) -> TaskState:
    restarted = _new_attempt(s, e.attempt, s.placement)
    failed = [w for w in s.workers if w.exit_code not in (None, 0)]
    return _replace(
        restarted,
        status="restarting",
        restarts=s.restarts + 1,
        # the replaced attempt's peers (of a failing worker) or every worker (a hang)
        # are still being ended: their exits are recorded as that attempt's
        **_still_live(s),
        # after a reschedule the workers have no placement: the scheduler's fills this attempt
        attempt_unplaced=s.placement is None,
        # what the attempt died of, in TaskFailed's words (the workers start afresh)
        last_failure_reason=(
            f"worker {failed[0].index} exited with code {failed[0].exit_code}"
            if e.reason == "failure" and failed
            else s.last_failure_reason
        ),
    )


@_applies(TaskRescheduleRequested)
def _reschedule_requested(s: TaskState, e: TaskRescheduleRequested, at: datetime) -> TaskState:
    moved = _new_attempt(s, s.attempt, None)
    return _replace(
        moved,
        status="restarting",
        reschedules=s.reschedules + 1,
        last_failure_reason=e.reason,
        **_still_live(s),
    )


@_applies(TaskRescheduleFailed)
def _reschedule_failed(s: TaskState, e: TaskRescheduleFailed, at: datetime) -> TaskState:
    return _replace(s, last_failure_reason=e.reason)


@_applies(TaskPreempted)
def _preempted(s: TaskState, e: TaskPreempted, at: datetime) -> TaskState:
    waiting = _new_attempt(s, s.attempt, None)
    return _replace(
        waiting,
        status="queued",
        queue=None,
        queued_at=at,
        preemptions=s.preemptions + 1,
        last_failure_reason=e.reason,
        **_still_live(s),
    )


@_applies(TaskRequeued)
def _requeued(s: TaskState, e: TaskRequeued, at: datetime) -> TaskState:
    return _replace(s, status="queued", queued_at=at, requeues=s.requeues + 1)


@_applies(TaskMarkedAbnormal)
def _abnormal(s: TaskState, e: TaskMarkedAbnormal, at: datetime) -> TaskState:
    return _replace(_finish(s, "abnormal", at), last_failure_reason=e.reason)


@_applies(ResourcesReleased)
def _released(s: TaskState, e: ResourcesReleased, at: datetime) -> TaskState:
    return _replace(s, held=None, held_live=())


@_applies(HangDetected)
def _hang(s: TaskState, e: HangDetected, at: datetime) -> TaskState:
    return _replace(s, hangs=s.hangs + 1)


@_applies(SlowdownDetected)
def _slowdown(s: TaskState, e: SlowdownDetected, at: datetime) -> TaskState:
    return _replace(s, slowdowns=s.slowdowns + 1)


def _unchanged(s: TaskState, e: Event, at: datetime) -> TaskState:
    """Events kept for the timeline and read models; they change no state."""
    return s


for _kind in (StacksCaptured, ResumeObserved, ResumeNotObserved, AlertDelivered, AlertFailed):
    _APPLIERS[_kind] = _unchanged


# --- commands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """Accept a task whose spec the submission rules have checked."""

    task_id: str
    tenant: str
    creator: str
    spec: TaskSpec
    warnings: tuple[SubmissionWarning, ...] = ()
    group_id: str | None = None
    cloned_from: str | None = None


@dataclass(frozen=True, slots=True)
class Clone:
    """Record on the source task that a new task is created from its spec (id from `ids`)."""

    task_id: str


@dataclass(frozen=True, slots=True)
class Rerun:
    """Run a finished task again, with its spec or a spec with the allowed changes."""

    task_id: str
    spec: TaskSpec | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    """The task waits in its pool's queue, for this reason (see `_queue` for when
    that is a new event)."""

    task_id: str
    reason: str
    position: int
    gpus_needed: int
    launchable: int
    #: The pool could not start it even if idle (a person must change something).
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class Place:
    """Give every worker a node and GPUs at once (gang placement)."""

    task_id: str
    pool: str
    workers: tuple[WorkerPlacement, ...]


@dataclass(frozen=True, slots=True)
class StartStage:
    """Begin a deploy stage."""

    task_id: str
    stage: DeployStageName


@dataclass(frozen=True, slots=True)
class CompleteStage:
    """End the running deploy stage well."""

    task_id: str
    stage: DeployStageName


@dataclass(frozen=True, slots=True)
class FailStage:
    """End the running deploy stage with a failure: the run fails."""

    task_id: str
    stage: DeployStageName
    reason: str


@dataclass(frozen=True, slots=True)
class StartEnvCheck:
    """Begin the env check of the current attempt."""

    task_id: str


@dataclass(frozen=True, slots=True)
class ReportEnvCheckItem:
    """Record one env check item's result on one worker."""

    task_id: str
    worker: int
    item: EnvCheckItemName
    result: EnvCheckItemResult
    detail: str = ""
    blocking: bool = False


@dataclass(frozen=True, slots=True)
class FinishEnvCheck:
    """End the env check; its result follows from the items reported."""

    task_id: str


@dataclass(frozen=True, slots=True)
class StartWorker:
    """A worker's launch command started (`gpus`: the GPUs its runtime gave it, where
    they are not the placement's)."""

    task_id: str
    run: int
    attempt: int
    worker: int
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ExitWorker:
    """A worker's launch command ended with `exit_code`."""

    task_id: str
    run: int
    attempt: int
    worker: int
    exit_code: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Fail the run for a reason other than a worker's exit (which ExitWorker decides)."""

    task_id: str
    reason: str
    unrecoverable: bool = False


@dataclass(frozen=True, slots=True)
class RequestStop:
    """A person (or service account) asks to stop the task.

    `by` and `role` name who asked and in what role; the event's reason is
    built from them (`stop_reason`) unless `reason` is given.
    """

    task_id: str
    reason: str = ""
    by: str | None = None
    role: str | None = None
    #: The task group stopped as a whole, when the stop came with a group stop.
    group_id: str | None = None


def stop_reason(by: str | None, role: str | None, group_id: str | None = None) -> str:
    """`stopped by alice (member)`: who stopped a task and in what role, never a guess
    (a stop by another member of the tenant must not read as the creator's own)."""
    who = f"stopped by {by} ({role})" if by and role else f"stopped by {by}" if by else ""
    if not who:
        who = "stop requested"
    return f"{who} with task group {group_id}" if group_id else who


@dataclass(frozen=True, slots=True)
class ConfirmStop:
    """The workers of a task being stopped are gone."""

    task_id: str


@dataclass(frozen=True, slots=True)
class ScheduleRestart:
    """Restart the workers in place as a new attempt (default delay: the backoff)."""

    task_id: str
    reason: RestartReason
    delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class RequestReschedule:
    """Move the workers off faulty nodes: the scheduler must place them again."""

    task_id: str
    reason: str
    faulty_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FailReschedule:
    """No healthy node can take the rescheduled workers: the run fails, unrecoverable."""

    task_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Take a spot task's GPUs back; it is requeued, or abnormal past its requeue limit."""

    task_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class MarkAbnormal:
    """Hand the task to a person (default next steps: SPOT_NEXT_STEPS)."""

    task_id: str
    reason: str
    next_steps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReleaseResources:
    """The GPUs of the held placement are free again."""

    task_id: str
    reason: str


Observation: TypeAlias = (
    HangDetected
    | StacksCaptured
    | SlowdownDetected
    | ResumeObserved
    | ResumeNotObserved
    | AlertDelivered
    | AlertFailed
)


@dataclass(frozen=True, slots=True)
class Record:
    """Record an observation about the task (hang, stacks, slowdown, resume, alert)."""

    task_id: str
    event: Observation


Command: TypeAlias = (
    Submit
    | Clone
    | Rerun
    | Queue
    | Place
    | StartStage
    | CompleteStage
    | FailStage
    | StartEnvCheck
    | ReportEnvCheckItem
    | FinishEnvCheck
    | StartWorker
    | ExitWorker
    | Fail
    | RequestStop
    | ConfirmStop
    | ScheduleRestart
    | RequestReschedule
    | FailReschedule
    | Preempt
    | MarkAbnormal
    | ReleaseResources
    | Record
)


# --- policies -----------------------------------------------------------------


def restart_refusal(state: TaskState, reason: RestartReason) -> str | None:
    """Why the task may not restart now, or None when it may (R-32).

    Restarts after a failure or a hang need auto restart on; a hardware-fault
    restart is the platform's own doing and does not. All count against
    `max_restarts` of the run.
    """
    options = state.spec.fault_tolerance
    if reason != "hardware_fault" and not options.auto_restart:
        return "auto restart is off for this task"
    if state.restarts >= options.max_restarts:
        return f"it reached its restart limit ({options.max_restarts})"
    return None


def next_attempt(state: TaskState) -> int:
    """The attempt number the task's next placement carries.

    Normally the one after the current attempt; after a reschedule, the attempt its
    hardware-fault restart already announced.
    """
    return state.attempt if state.attempt_unplaced else state.attempt + 1


def restart_delay_s(restarts: int) -> float:
    """Backoff before the next restart: 10 s, doubling per restart, at most 5 minutes."""
    return min(RESTART_BACKOFF_S * 2.0**restarts, RESTART_BACKOFF_MAX_S)


def queue_expired(state: TaskState, now: datetime) -> bool:
    """Whether a queued spot task has waited longer than its max single queue duration (R-08)."""
    if state.status != "queued" or state.queued_at is None or not _is_spot(state):
        return False
    return (now - state.queued_at).total_seconds() > _spot(state).max_queue_duration_s


def worker_count(spec: TaskSpec) -> int:
    """How many workers a run of `spec` has (R-04 for a custom GPU count)."""
    if spec.custom_gpus is not None:
        return len(split_custom_gpus(spec.custom_gpus))
    return spec.worker_count


def _is_spot(state: TaskState) -> bool:
    return state.spec.resource_type == "spot"


def _spot(state: TaskState) -> SpotOptions:
    return state.spec.spot or SpotOptions()


# --- decide -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    now: datetime
    ids: IdFactory


C = TypeVar("C")
_Decider: TypeAlias = Callable[[TaskState, Any, _Context], list[Event]]
_DECIDERS: dict[type[Any], _Decider] = {}


def _decides(
    kind: type[C],
) -> Callable[[Callable[[TaskState, C, _Context], list[Event]]], Callable[..., list[Event]]]:
    def register(fn: Callable[[TaskState, C, _Context], list[Event]]) -> Callable[..., list[Event]]:
        _DECIDERS[kind] = fn
        return fn

    return register


def decide(
    state: TaskState | None, command: Command, *, now: datetime, ids: IdFactory
) -> list[Event]:
    """The events that `command` causes on the task in `state`, or a DomainError.

    Pure: the same state, command, `now` and `ids` give the same events. An
    empty list means the command is already satisfied (e.g. a second stop).
    """
    if isinstance(command, Submit):
        return _submit(state, command)
    if state is None:
        raise TaskNotFound(command.task_id)
    if command.task_id != state.task_id:
        raise InvalidCommand(state.task_id, "apply", f"the command is for {command.task_id!r}")
    return _DECIDERS[type(command)](state, command, _Context(now, ids))


def decide_all(
    state: TaskState | None, commands: Sequence[Command], *, now: datetime, ids: IdFactory
) -> list[Event]:
    """The events of several commands decided one after the other, each on the
    state the events before it left (all or nothing: a refusal raises)."""
    events: list[Event] = []
    for command in commands:
        new = decide(state, command, now=now, ids=ids)
        for event in new:
            state = evolve(state, (event, now))
        events.extend(new)
    return events


# guards


def _require_open(s: TaskState, action: str) -> None:
    if is_terminal(s.status):
        raise TaskAlreadyFinished(s.task_id, s.status, action)


def _require_status(s: TaskState, action: str, allowed: frozenset[TaskStatus]) -> None:
    _require_open(s, action)
    if s.status not in allowed:
        raise InvalidTransition(s.task_id, s.status, action)


def _require_not_stopping(s: TaskState, action: str) -> None:
    if s.stop_requested:
        raise TaskStopping(s.task_id, s.status, action)


def _require_current(s: TaskState, run: int, attempt: int) -> None:
    if (run, attempt) != (s.run, s.attempt):
        raise StaleAttempt(s.task_id, run, attempt, (s.run, s.attempt))


def _require_placement(s: TaskState, action: str) -> Placement:
    if s.placement is None:
        raise InvalidCommand(s.task_id, action, "its workers are waiting for a placement")
    return s.placement


def _require_no_stage(s: TaskState, action: str) -> None:
    if s.stage is not None:
        raise InvalidCommand(s.task_id, action, f"deploy stage {s.stage} is still running")


def _worker(s: TaskState, index: int, action: str) -> WorkerState:
    for worker in s.workers:
        if worker.index == index:
            return worker
    raise InvalidCommand(s.task_id, action, f"it has no worker {index}")


def _require_placed(s: TaskState, action: str) -> Placement:
    """Guards shared by commands that act on the workers of the current attempt."""
    _require_status(s, action, PLACED_STATUSES)
    _require_not_stopping(s, action)
    return _require_placement(s, action)


# submission


def _submit(state: TaskState | None, c: Submit) -> list[Event]:
    if state is not None:
        raise TaskAlreadyExists(c.task_id)
    submitted = TaskSubmitted(
        task_id=c.task_id,
        tenant=c.tenant,
        creator=c.creator,
        spec=c.spec,
        warnings=c.warnings,
        group_id=c.group_id,
        cloned_from=c.cloned_from,
    )
    return [submitted]


@_decides(Clone)
def _clone(s: TaskState, c: Clone, ctx: _Context) -> list[Event]:
    return [TaskCloned(new_task_id=ctx.ids())]


@_decides(Rerun)
def _decide_rerun(s: TaskState, c: Rerun, ctx: _Context) -> list[Event]:
    if not is_terminal(s.status):
        hint = "stop it first, or wait until it finishes"
        raise InvalidTransition(s.task_id, s.status, "rerun", hint)
    spec = c.spec or s.spec
    changes = tuple(
        name for name in TaskSpec.model_fields if getattr(spec, name) != getattr(s.spec, name)
    )
    refused = tuple(name for name in changes if name not in RERUN_CHANGEABLE)
    if refused:
        raise RerunChangeNotAllowed(s.task_id, refused)
    return [TaskRerunRequested(run=s.run + 1, spec=spec, changes=changes)]


@_decides(RequestStop)
def _request_stop(s: TaskState, c: RequestStop, ctx: _Context) -> list[Event]:
    _require_open(s, "stop")
    if s.stop_requested:
        return []
    requested = TaskStopRequested(
        reason=c.reason or stop_reason(c.by, c.role, c.group_id),
        stopped_by=c.by,
        role=c.role,
        group_id=c.group_id,
    )
    if s.placement is None:
        return [requested, TaskStopped(run=s.run)]
    return [requested]


@_decides(ConfirmStop)
def _confirm_stop(s: TaskState, c: ConfirmStop, ctx: _Context) -> list[Event]:
    _require_open(s, "confirm the stop of")
    if not s.stop_requested:
        raise InvalidCommand(s.task_id, "confirm the stop of", "nobody asked to stop it")
    return [TaskStopped(run=s.run)]


# scheduler


@_decides(Queue)
def _queue(s: TaskState, c: Queue, ctx: _Context) -> list[Event]:
    """TaskQueued when a wait starts (new, rerun, requeued) or changes kind (`blocked`);
    nothing for a new reason or position in the same wait: those are derived data."""
    _require_status(s, "queue", frozenset({"new", "queued"}))
    _require_not_stopping(s, "queue")
    if queue_expired(s, ctx.now):
        limit = _spot(s).max_queue_duration_s
        return [_abnormal_event(s, f"queued longer than its limit of {limit} s")]
    if s.status == "queued" and s.queue is not None and s.queue.blocked == c.blocked:
        return []  # same wait, same kind: position and reason live in the read model
    queued = TaskQueued(
        run=s.run,
        reason=c.reason,
        position=c.position,
        gpus_needed=c.gpus_needed,
        launchable=c.launchable,
        blocked=c.blocked,
    )
    return [queued]


@_decides(Place)
def _place(s: TaskState, c: Place, ctx: _Context) -> list[Event]:
    action = "place"
    _require_status(s, action, frozenset({"new", "queued", "restarting"}))
    _require_not_stopping(s, action)
    if s.placement is not None:
        raise InvalidCommand(s.task_id, action, "it is already placed")
    if s.held is not None:
        reason = f"the GPUs of run {s.held.run} attempt {s.held.attempt} are still held"
        raise InvalidCommand(s.task_id, action, reason, "release them first (R-06)")
    _check_workers(s, c)
    return [TaskPlaced(run=s.run, attempt=next_attempt(s), pool=c.pool, workers=c.workers)]


def _check_workers(s: TaskState, c: Place) -> None:
    if c.pool != s.spec.pool:
        raise InvalidCommand(s.task_id, "place", f"its pool is {s.spec.pool!r}, not {c.pool!r}")
    indexes = tuple(w.index for w in c.workers)
    if indexes != tuple(range(worker_count(s.spec))):
        reason = f"it needs workers 0..{worker_count(s.spec) - 1} in order, got {indexes}"
        raise InvalidCommand(s.task_id, "place", reason)
    if s.spec.custom_gpus is not None:
        gpus = tuple(len(w.gpus) for w in c.workers)
        if gpus != split_custom_gpus(s.spec.custom_gpus):
            raise InvalidCommand(s.task_id, "place", f"GPUs per worker {gpus} do not match R-04")


@_decides(Preempt)
def _preempt(s: TaskState, c: Preempt, ctx: _Context) -> list[Event]:
    _require_placed(s, "preempt")
    if not _is_spot(s):
        raise InvalidCommand(s.task_id, "preempt", "only spot tasks are preempted (R-08)")
    preempted = TaskPreempted(run=s.run, reason=c.reason)
    limit = _spot(s).max_requeues
    if s.requeues >= limit:
        reason = f"preempted after {s.requeues} requeues, the limit of the task"
        return [preempted, _abnormal_event(s, reason)]
    return [preempted, TaskRequeued(run=s.run, requeue_count=s.requeues + 1)]


@_decides(MarkAbnormal)
def _mark_abnormal(s: TaskState, c: MarkAbnormal, ctx: _Context) -> list[Event]:
    _require_open(s, "mark abnormal")
    return [_abnormal_event(s, c.reason, c.next_steps)]


def _abnormal_event(s: TaskState, reason: str, steps: tuple[str, ...] = ()) -> TaskMarkedAbnormal:
    return TaskMarkedAbnormal(run=s.run, reason=reason, next_steps=steps or SPOT_NEXT_STEPS)


@_decides(ReleaseResources)
def _release(s: TaskState, c: ReleaseResources, ctx: _Context) -> list[Event]:
    action = "release the resources of"
    if s.held is None:
        raise InvalidCommand(s.task_id, action, "it holds no GPUs")
    if s.held == s.placement and not is_terminal(s.status):
        raise InvalidCommand(s.task_id, action, "its workers still use them")
    if s.held_live:
        live = ", ".join(str(w) for w in s.held_live)
        why = (
            f"worker(s) {live} of run {s.held_live_of[0]} attempt {s.held_live_of[1]}, which "
            "is over, have no recorded exit yet: the deployer ends them and records their "
            "exits first"
        )
        raise InvalidCommand(s.task_id, action, why)
    return [ResourcesReleased(run=s.held.run, attempt=s.held.attempt, reason=c.reason)]


@_decides(FailReschedule)
def _fail_reschedule(s: TaskState, c: FailReschedule, ctx: _Context) -> list[Event]:
    action = "fail the reschedule of"
    _require_status(s, action, frozenset({"restarting"}))
    if s.placement is not None:
        raise InvalidCommand(s.task_id, action, "it is not waiting for a reschedule")
    return _unrecoverable(s, c.reason)


def _unrecoverable(s: TaskState, reason: str) -> list[Event]:
    """R-31: the reschedule cannot happen; the run fails with why, and why it was needed."""
    why = f"cannot be recovered: {reason}"
    if s.last_failure_reason and s.last_failure_reason not in reason:
        why = f"{why} (rescheduled because {s.last_failure_reason})"
    failed = TaskFailed(run=s.run, attempt=s.attempt, reason=why, unrecoverable=True)
    return [TaskRescheduleFailed(run=s.run, reason=reason), failed]


# deployer


@_decides(StartStage)
def _start_stage(s: TaskState, c: StartStage, ctx: _Context) -> list[Event]:
    action = f"start deploy stage {c.stage} of"
    _require_status(s, action, frozenset({"deploying", "restarting"}))
    _require_not_stopping(s, action)
    _require_placement(s, action)
    _require_no_stage(s, action)
    if s.stages_done and DEPLOY_STAGES.index(c.stage) <= DEPLOY_STAGES.index(s.stages_done[-1]):
        reason = f"stages run in the order {', '.join(DEPLOY_STAGES)}"
        raise InvalidCommand(s.task_id, action, f"{s.stages_done[-1]} is done; {reason}")
    return [DeployStageStarted(run=s.run, attempt=s.attempt, stage=c.stage)]


def _require_stage(s: TaskState, stage: DeployStageName, action: str) -> None:
    _require_status(s, action, frozenset({"deploying"}))
    if s.stage != stage:
        raise InvalidCommand(s.task_id, action, f"deploy stage {stage} is not running")


def _duration_ms(since: datetime | None, now: datetime) -> int:
    if since is None:
        return 0
    return max(0, round((now - since).total_seconds() * 1000))


@_decides(CompleteStage)
def _complete_stage(s: TaskState, c: CompleteStage, ctx: _Context) -> list[Event]:
    _require_stage(s, c.stage, f"complete deploy stage {c.stage} of")
    duration = _duration_ms(s.stage_started_at, ctx.now)
    return [DeployStageCompleted(run=s.run, attempt=s.attempt, stage=c.stage, duration_ms=duration)]


@_decides(FailStage)
def _fail_stage(s: TaskState, c: FailStage, ctx: _Context) -> list[Event]:
    _require_stage(s, c.stage, f"fail deploy stage {c.stage} of")
    failed_stage = DeployStageFailed(
        run=s.run,
        attempt=s.attempt,
        stage=c.stage,
        reason=c.reason,
        duration_ms=_duration_ms(s.stage_started_at, ctx.now),
    )
    if s.stop_requested:
        return [failed_stage]
    reason = f"deploy stage {c.stage} failed: {c.reason}"
    return [failed_stage, TaskFailed(run=s.run, attempt=s.attempt, reason=reason)]


@_decides(StartWorker)
def _start_worker(s: TaskState, c: StartWorker, ctx: _Context) -> list[Event]:
    action = f"start worker {c.worker} of"
    _require_status(s, action, frozenset({"deploying", "env_checking", "restarting"}))
    _require_not_stopping(s, action)
    _require_current(s, c.run, c.attempt)
    _require_placement(s, action)
    _require_no_stage(s, action)
    _require_env_check_passed(s, action)
    worker = _worker(s, c.worker, action)
    if worker.started:
        raise InvalidCommand(s.task_id, action, f"worker {c.worker} already started")
    gpus = c.gpus if c.gpus is not None and c.gpus != worker.gpus else None
    started = WorkerStarted(
        run=s.run, attempt=s.attempt, worker=c.worker, node=worker.node, gpus=gpus
    )
    if all(w.started for w in s.workers if w.index != c.worker):
        return [started, TaskRunning(run=s.run, attempt=s.attempt)]
    return [started]


def _require_env_check_passed(s: TaskState, action: str) -> None:
    check = s.env_check
    if check is not None and check.result == "fail":
        raise InvalidCommand(s.task_id, action, "its env check found a blocking failure")
    if s.spec.fault_tolerance.env_check and (check is None or not check.finished):
        hint = "run the env check of this attempt first (R-30)"
        raise InvalidCommand(s.task_id, action, "its env check has not finished", hint)


@_decides(ExitWorker)
def _exit_worker(s: TaskState, c: ExitWorker, ctx: _Context) -> list[Event]:
    action = f"record the exit of worker {c.worker} of"
    if _withdrawn(s, c.run, c.attempt) and c.worker in s.held_live:
        # a worker of a restarted, preempted, rescheduled or failed attempt, ended by the
        # deployer: its exit decides nothing (the attempt is over); the last one frees
        # its GPUs (or, after a restart in place, lets the new attempt have them)
        return [WorkerExited(run=c.run, attempt=c.attempt, worker=c.worker, exit_code=c.exit_code)]
    _require_status(s, action, PLACED_STATUSES)
    _require_current(s, c.run, c.attempt)
    worker = _worker(s, c.worker, action)
    if not worker.started or worker.exited:
        state = "already exited" if worker.exited else "has not started"
        raise InvalidCommand(s.task_id, action, f"worker {c.worker} {state}")
    exited = WorkerExited(run=s.run, attempt=s.attempt, worker=c.worker, exit_code=c.exit_code)
    return [exited, *_outcome_after_exit(s, c)]


def _outcome_after_exit(s: TaskState, c: ExitWorker) -> list[Event]:
    """R-21: success only when every worker exited 0; any non-zero exit ends the attempt."""
    if s.stop_requested:
        return []
    if c.exit_code != 0:
        return [_restart_or_fail(s, c.worker, c.exit_code)]
    if all(w.exit_code == 0 for w in s.workers if w.index != c.worker):
        return [TaskSucceeded(run=s.run, attempt=s.attempt)]
    return []


def _restart_or_fail(s: TaskState, worker: int, exit_code: int) -> Event:
    if restart_refusal(s, "failure") is None:
        return _restart_event(s, "failure", None)
    return TaskFailed(
        run=s.run,
        attempt=s.attempt,
        reason=f"worker {worker} exited with code {exit_code}",
        worker=worker,
        exit_code=exit_code,
    )


@_decides(Fail)
def _fail(s: TaskState, c: Fail, ctx: _Context) -> list[Event]:
    _require_open(s, "fail")
    return [
        TaskFailed(run=s.run, attempt=s.attempt, reason=c.reason, unrecoverable=c.unrecoverable)
    ]


# fault tolerance


@_decides(StartEnvCheck)
def _start_env_check(s: TaskState, c: StartEnvCheck, ctx: _Context) -> list[Event]:
    action = "start the env check of"
    _require_status(s, action, frozenset({"deploying", "restarting"}))
    _require_not_stopping(s, action)
    _require_placement(s, action)
    _require_no_stage(s, action)
    if not s.spec.fault_tolerance.env_check:
        raise InvalidCommand(s.task_id, action, "its spec does not ask for one")
    if s.env_check is not None or any(w.started for w in s.workers):
        raise InvalidCommand(s.task_id, action, "this attempt is past its env check")
    return [EnvCheckStarted(run=s.run, attempt=s.attempt)]


@_decides(ReportEnvCheckItem)
def _report_env_check_item(s: TaskState, c: ReportEnvCheckItem, ctx: _Context) -> list[Event]:
    action = f"report env check item {c.item} of"
    _require_running_env_check(s, action)
    _worker(s, c.worker, action)
    if c.blocking and c.result != "fail":
        raise InvalidCommand(s.task_id, action, "only a failed item can be blocking")
    item = EnvCheckItemReported(
        run=s.run,
        attempt=s.attempt,
        worker=c.worker,
        item=c.item,
        result=c.result,
        detail=c.detail,
        blocking=c.blocking,
    )
    return [item]


@_decides(FinishEnvCheck)
def _finish_env_check(s: TaskState, c: FinishEnvCheck, ctx: _Context) -> list[Event]:
    check = _require_running_env_check(s, "finish the env check of")
    result: EnvCheckResult = "pass"
    if check.blocking_failures:
        result = "fail"
    elif check.warnings:
        result = "warn"
    finished = EnvCheckFinished(
        run=s.run,
        attempt=s.attempt,
        result=result,
        blocking_failures=check.blocking_failures,
        warnings=check.warnings,
    )
    return [finished]


def _require_running_env_check(s: TaskState, action: str) -> EnvCheckState:
    _require_status(s, action, frozenset({"env_checking"}))
    if s.env_check is None or s.env_check.finished:
        raise InvalidCommand(s.task_id, action, "no env check is running")
    return s.env_check


@_decides(ScheduleRestart)
def _schedule_restart(s: TaskState, c: ScheduleRestart, ctx: _Context) -> list[Event]:
    _require_placed(s, "restart")
    refusal = restart_refusal(s, c.reason)
    if refusal is not None:
        raise RestartNotAllowed(s.task_id, refusal)
    return [_restart_event(s, c.reason, c.delay_s)]


def _restart_event(
    s: TaskState, reason: RestartReason, delay_s: float | None
) -> TaskRestartScheduled:
    delay = restart_delay_s(s.restarts) if delay_s is None else delay_s
    return TaskRestartScheduled(run=s.run, attempt=s.attempt + 1, reason=reason, delay_s=delay)


@_decides(RequestReschedule)
def _request_reschedule(s: TaskState, c: RequestReschedule, ctx: _Context) -> list[Event]:
    """R-31: the workers leave the faulty nodes and restart as a new attempt elsewhere.

    One reschedule and one restart (reason `hardware_fault`, no delay): the restart's
    attempt has no placement; the scheduler's `TaskPlaced` gives it one. Without a
    restart left (`max_restarts`) the run cannot be recovered and fails at once.
    """
    _require_placed(s, "reschedule")
    requested = TaskRescheduleRequested(
        run=s.run, attempt=s.attempt, reason=c.reason, faulty_nodes=c.faulty_nodes
    )
    moved = evolve(s, (requested, ctx.now))
    refusal = restart_refusal(moved, "hardware_fault")
    if refusal is not None:
        return [requested, *_unrecoverable(moved, f"no restart left: {refusal}")]
    return [requested, _restart_event(moved, "hardware_fault", 0.0)]


@_decides(Record)
def _record(s: TaskState, c: Record, ctx: _Context) -> list[Event]:
    event = c.event
    if isinstance(event, AlertDelivered | AlertFailed):
        return [event]
    if isinstance(event, HangDetected):
        _require_status(s, f"record {event.type_name()} for", frozenset({"running"}))
    if isinstance(event, SlowdownDetected):
        # judged on the run's lines, which may come after its end (a script that
        # prints its log and exits at once): any status once the run was placed
        _require_current(s, event.run, s.attempt)
        if s.status in ("new", "queued"):
            raise InvalidCommand(s.task_id, "record SlowdownDetected for", "it has not run")
    elif isinstance(event, ResumeObserved | ResumeNotObserved):
        # an attempt's resume is judged on its lines, which may come after a restart
        # began the next attempt of the run
        if event.run != s.run or event.attempt > s.attempt:
            raise StaleAttempt(s.task_id, event.run, event.attempt, (s.run, s.attempt))
    else:
        _require_current(s, event.run, event.attempt)
    return [event]
