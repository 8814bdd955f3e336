"""Events of a task: stream `task-<task_id>` (SPEC R-60).

One stream per task holds every run of it: the submission, each run's
queueing, placement, deploy stages, env check, workers, restarts,
reschedules, preemptions and requeues, its final state, and the alerts sent
about it. The task's state (`runyard.domain.TaskState`) is a fold of these
events, and the decisions that append them live in `runyard.domain.decide`,
so every service that reacts to a task agrees on what it is.

Words: a *run* is one execution of the task (a rerun adds a run, numbered from
1); an *attempt* is one try of a run on placed workers (a placement or a
restart starts a new attempt, numbered from 1 within the run); a *worker* is
one replica of the task on one node, known by its index (its rank).

Time of occurrence lives in the envelope (`occurred_at`); a payload repeats a
time only when it is about another moment (`HangDetected.last_log_at`).
`emitted_by` names the service that usually appends an event; when a
decision appends it together with another event, the docstring says so.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from runyard.contracts.base import Event
from runyard.contracts.mapper import Upcaster
from runyard.contracts.spec import TaskSpec
from runyard.contracts.stacks import WorkerStacks

#: Services that append or react to events (the catalogue's vocabulary).
SERVICES = (
    "gateway",
    "submission",
    "scheduler",
    "deployer",
    "faulttolerance",
    "logs",
    "notification",
)

#: Where a task is in its lifecycle: what folding its events gives
#: (`runyard.domain.task`), and what the APIs answer.
TaskStatus = Literal[
    "new",
    "queued",
    "deploying",
    "env_checking",
    "running",
    "restarting",
    "succeeded",
    "failed",
    "stopped",
    "abnormal",
]
DeployStageName = Literal["resource_allocation", "image_pull", "storage_mount", "env_init"]
#: The deploy stages in the order they run (R-20).
DEPLOY_STAGES: tuple[DeployStageName, ...] = (
    "resource_allocation",
    "image_pull",
    "storage_mount",
    "env_init",
)
EnvCheckItemName = Literal["gpu", "rdma", "storage_io", "communication", "runtime"]
EnvCheckItemResult = Literal["pass", "warn", "fail", "not_applicable"]
EnvCheckResult = Literal["pass", "warn", "fail"]
RestartReason = Literal["failure", "hang", "hardware_fault"]

Run = Annotated[int, Field(ge=1)]
Attempt = Annotated[int, Field(ge=1)]
WorkerIndex = Annotated[int, Field(ge=0)]
Text = Annotated[str, Field(min_length=1)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class SubmissionWarning(_Frozen):
    """Something the submission rules accepted but a person should know (R-13, R-14)."""

    code: Text
    """Stable machine code, e.g. `storage.local_output`."""
    field: str
    """Dotted path of the spec field it concerns (`command`, `mounts[0]`), or `spec`."""
    message: Text
    """What is wrong and what to do about it."""


class WorkerPlacement(_Frozen):
    """Where one worker runs: its index (rank), its node and the GPU indexes it holds
    there, with the CPUs and memory its worker spec gives it (R-02)."""

    index: WorkerIndex
    node: Text
    gpus: tuple[int, ...] = Field(min_length=1)
    cpus: int | None = Field(default=None, ge=1)
    """CPUs of the worker's spec (a custom GPU count: see docs/scheduler.md); absent in
    placements recorded before it was."""
    memory_gib: int | None = Field(default=None, ge=1)
    """Memory of the worker's spec, in GiB; absent as `cpus`."""


class _TaskEvent(Event):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    category = "task"


# --- submission -------------------------------------------------------------


class TaskSubmitted(_TaskEvent):
    """A task was accepted: the first event of its stream, and the spec of run 1.

    When: the submission rules accepted a spec (directly, as part of a task
    group, or as a clone). Rejected specs never become events.

    v2 (current): `warnings` are structured and `group_id` exists. v1 carried
    warnings as plain strings and no group; `upcast_task_submitted_v1` lifts it.
    """

    schema_version = 2
    emitted_by = "submission"
    reacted_by = ("scheduler",)

    task_id: Text
    tenant: Text
    creator: Text
    """The person who submitted it: the only one who sees creator-only values (R-12)."""
    spec: TaskSpec
    warnings: tuple[SubmissionWarning, ...] = ()
    group_id: str | None = None
    """The task group (R-17) it was submitted with, if any."""
    cloned_from: str | None = None
    """The task whose spec it was cloned from (R-16), if any."""


class TaskCloned(_TaskEvent):
    """A new task was created from this task's spec (on the source task's stream).

    When: a person clones the task; the new task's own stream starts with a
    `TaskSubmitted` whose `cloned_from` points back here.
    """

    emitted_by = "submission"
    reacted_by = ()

    new_task_id: Text


class TaskRerunRequested(_TaskEvent):
    """A finished task runs again as a new run, with the same spec or allowed changes (R-16).

    When: a person reruns a succeeded, failed, stopped or abnormal task. Only
    the launch command, worker spec, worker count (or custom GPU count) and
    image may change; `changes` names the fields that did.
    """

    emitted_by = "submission"
    reacted_by = ("scheduler",)

    run: Run
    """The new run's number."""
    spec: TaskSpec
    """The spec of the new run, after the changes."""
    changes: tuple[str, ...] = ()


class TaskStopRequested(_TaskEvent):
    """A person asked to stop the task (R-23).

    When: a stop of a queued, deploying, env-checking, running or restarting
    task is accepted. For a task that holds no workers the submission service
    appends `TaskStopped` with it.

    v2 (current): `stopped_by`, `role` and `group_id` name who asked;
    `upcast_task_stop_requested_v1` lifts a v1 event (reason only) with them
    unknown (None).
    """

    schema_version = 2
    emitted_by = "submission"
    reacted_by = ("scheduler", "deployer")

    reason: str
    """Who stopped it and in what role, e.g. `stopped by alice (member)`."""
    stopped_by: str | None = None
    """The user or service account that asked (None in events written before it was kept)."""
    role: str | None = None
    """Its role when it asked: member, tenant_admin, platform_admin or service."""
    group_id: str | None = None
    """The task group it was stopped with (a group stop, R-17), if any."""


# --- scheduler --------------------------------------------------------------


class TaskQueued(_TaskEvent):
    """The task waits for resources, with a reason a person can act on (R-07).

    When: a wait starts (the scheduler could not place a new, rerun or requeued
    task at once), and again only when the wait changes kind: the pool's
    schedulable nodes could no longer start the task even if idle (`blocked`:
    a person must act), or could again. Position, reason and launchable count
    move as other tasks come and go; they are derived data, kept current in the
    scheduler's queue read model (`GET /v1/tasks/{id}` shows them), never
    appended here. Logs written before this rule hold a TaskQueued per change
    of reason or position; they fold the same way.

    v2 (current): `blocked` exists; `upcast_task_queued_v1` lifts a v1 event.
    """

    schema_version = 2
    emitted_by = "scheduler"
    reacted_by = ("notification",)

    run: Run
    reason: Text
    """When appended, e.g. `needs 4 x 8-GPU workers, pool can start 2; 3 tasks ahead`."""
    position: int = Field(ge=0)
    """Tasks ahead of it in its pool's queue when appended."""
    gpus_needed: int = Field(ge=1)
    launchable: int = Field(ge=0)
    """Workers of its spec the pool could start when appended (R-03)."""
    blocked: bool = False
    """The pool could not start it even if idle: it waits for a person, not for capacity."""


class TaskPlaced(_TaskEvent):
    """Every worker of the task has a node and GPUs (gang placement, R-06); an attempt begins.

    When: the scheduler found room for all workers at once: from the queue, or
    on healthy nodes after a reschedule.
    """

    emitted_by = "scheduler"
    reacted_by = ("deployer", "notification")

    run: Run
    attempt: Attempt
    pool: Text
    workers: tuple[WorkerPlacement, ...] = Field(min_length=1)


class TaskRescheduleFailed(_TaskEvent):
    """No healthy spare node exists for a reschedule: the task cannot be recovered (R-31).

    When: the scheduler cannot place the workers of a rescheduled task. The
    task fails with it (`TaskFailed`, `unrecoverable`), in the same append.
    """

    emitted_by = "scheduler"
    reacted_by = ()

    run: Run
    reason: Text


class TaskPreempted(_TaskEvent):
    """Spot capacity shrank and the task's workers must give their GPUs back (R-08).

    When: the scheduler preempts a placed spot task. In the same append it
    either requeues the task (`TaskRequeued`) or, past the spec's max requeue
    count, marks it abnormal (`TaskMarkedAbnormal`).
    """

    emitted_by = "scheduler"
    reacted_by = ("deployer",)

    run: Run
    reason: Text


class TaskRequeued(_TaskEvent):
    """A preempted spot task is back in the queue (R-08); a new queue wait starts.

    When: together with `TaskPreempted`, while the requeue count stays within
    the spec's limit.
    """

    emitted_by = "scheduler"
    reacted_by = ("notification",)

    run: Run
    requeue_count: int = Field(ge=1)
    """Requeues of this run so far, this one included."""


class TaskMarkedAbnormal(_TaskEvent):
    """The task needs a person (异常, R-08): the platform stops trying on its own.

    When: a spot task queued longer than its max single queue duration, or was
    preempted more often than its max requeue count.
    """

    emitted_by = "scheduler"
    reacted_by = ("notification",)

    run: Run
    reason: Text
    next_steps: tuple[str, ...] = ()
    """What a person can do: retry, change spec or zone, resubmit, move to subscription."""


class ResourcesReleased(_TaskEvent):
    """The GPUs of one attempt's placement are free again.

    When: after the task finished, was preempted or rescheduled, once its
    workers are gone. Until then the scheduler counts them as held.
    """

    emitted_by = "scheduler"
    reacted_by = ()

    run: Run
    attempt: Attempt
    reason: Text


# --- deployer ---------------------------------------------------------------


class DeployStageStarted(_TaskEvent):
    """A deploy stage began (R-20), so "stuck in deploying" shows where."""

    emitted_by = "deployer"
    reacted_by = ()

    run: Run
    attempt: Attempt
    stage: DeployStageName


class DeployStageCompleted(_TaskEvent):
    """A deploy stage ended well, with how long it took."""

    emitted_by = "deployer"
    reacted_by = ()

    run: Run
    attempt: Attempt
    stage: DeployStageName
    duration_ms: int = Field(ge=0)


class DeployStageFailed(_TaskEvent):
    """A deploy stage failed, with the reason and how long it ran.

    When: e.g. the image cannot be pulled or a volume cannot be mounted. The
    task fails with it (`TaskFailed`), in the same append, unless a stop is
    pending.
    """

    emitted_by = "deployer"
    reacted_by = ()

    run: Run
    attempt: Attempt
    stage: DeployStageName
    reason: Text
    duration_ms: int = Field(ge=0)


class WorkerStarted(_TaskEvent):
    """One worker's launch command started on its node (`bash --login -c`, R-21).

    When: the runtime started the worker's process. With env check on, only
    after the attempt's env check finished without a blocking failure.
    """

    emitted_by = "deployer"
    reacted_by = ("faulttolerance", "logs")

    run: Run
    attempt: Attempt
    worker: WorkerIndex
    node: Text
    gpus: tuple[int, ...] | None = None
    """The GPU indexes the worker got on its node where its runtime picks them and they
    are not the placement's (Slurm gives a job any free GPUs of the count asked for:
    `SLURM_STEP_GPUS`); absent: the placement's (`TaskPlaced`)."""


class WorkerExited(_TaskEvent):
    """One worker's launch command ended, with its exit status (R-21).

    When: the runtime saw the process end. The same append carries what
    follows from it: `TaskSucceeded` when every worker has exited 0, and for a
    non-zero status `TaskRestartScheduled` or `TaskFailed`. A worker of an
    attempt that is over (restarted, preempted, rescheduled, or its run
    failed), ended by the deployer, is recorded with that attempt's number;
    such an exit decides nothing.
    """

    emitted_by = "deployer"
    reacted_by = ("faulttolerance",)

    run: Run
    attempt: Attempt
    worker: WorkerIndex
    exit_code: int


class TaskRunning(_TaskEvent):
    """Every worker of the attempt has started: the task is running.

    When: appended with the `WorkerStarted` of the last worker to start.
    """

    emitted_by = "deployer"
    reacted_by = ("faulttolerance",)

    run: Run
    attempt: Attempt


class TaskSucceeded(_TaskEvent):
    """The run succeeded: every worker's launch command exited 0 (R-21). Terminal.

    When: appended with the `WorkerExited` of the last worker to exit.
    """

    emitted_by = "deployer"
    reacted_by = ("scheduler", "notification")

    run: Run
    attempt: Attempt


class TaskFailed(_TaskEvent):
    """The run failed. Terminal.

    When: a worker exited non-zero and no restart is allowed; a deploy stage
    failed; a reschedule found no healthy node (then appended by the
    scheduler, with `unrecoverable` set); or the task hung and may not restart
    (then appended by fault tolerance with `HangDetected`'s id as its cause,
    reason "hang, no restarts left": the deployer ends the workers).
    """

    emitted_by = "deployer"
    reacted_by = ("deployer", "scheduler", "notification")

    run: Run
    attempt: int = Field(ge=0)
    """0 when the run failed before its first placement."""
    reason: Text
    worker: WorkerIndex | None = None
    """The worker whose exit failed the run, if one did."""
    exit_code: int | None = None
    unrecoverable: bool = False
    """True when the platform cannot recover it (no healthy node to move to)."""


class TaskStopped(_TaskEvent):
    """The task stopped at a person's request: its workers are gone (R-23). Terminal.

    When: the deployer ended the workers' processes; or at once, together with
    `TaskStopRequested`, for a task that had no workers (queued).
    """

    emitted_by = "deployer"
    reacted_by = ("scheduler", "notification")

    run: Run


# --- fault tolerance --------------------------------------------------------


class EnvCheckStarted(_TaskEvent):
    """The env check (Bootcheck, R-30) began, before the launch command runs."""

    emitted_by = "faulttolerance"
    reacted_by = ()

    run: Run
    attempt: Attempt


class EnvCheckItemReported(_TaskEvent):
    """One env check item's result on one worker (R-30), as the fault-tolerance log shows it.

    `blocking` marks a hardware fault that must keep the launch command from
    running (R-31); other failures are warnings.
    """

    emitted_by = "faulttolerance"
    reacted_by = ()

    run: Run
    attempt: Attempt
    worker: WorkerIndex
    item: EnvCheckItemName
    result: EnvCheckItemResult
    detail: str
    blocking: bool = False


class EnvCheckFinished(_TaskEvent):
    """The env check ended (`Bootcheck Finished`): `fail` if any blocking item failed.

    When: every worker reported its items. After `fail` the fault-tolerance
    service asks for a reschedule; after `pass` or `warn` the launch command runs.
    """

    emitted_by = "faulttolerance"
    reacted_by = ("deployer",)

    run: Run
    attempt: Attempt
    result: EnvCheckResult
    blocking_failures: int = Field(ge=0)
    warnings: int = Field(ge=0)


class TaskRestartScheduled(_TaskEvent):
    """The task's workers restart as a new attempt (R-32), after `delay_s`.

    When: a worker failed or the task hung, auto restart is on and the
    restart limit is not reached (the workers restart in place, on the same
    placement); or a node turned faulty (reason `hardware_fault`): then it is
    appended together with `TaskRescheduleRequested`, and the new attempt
    starts where the scheduler places it next (R-31). After a worker failure
    it is appended with that `WorkerExited`.
    """

    emitted_by = "faulttolerance"
    reacted_by = ("deployer", "scheduler", "notification")

    run: Run
    attempt: Attempt
    """The new attempt's number."""
    reason: RestartReason
    delay_s: float = Field(ge=0)


class TaskRescheduleRequested(_TaskEvent):
    """The workers must move to healthy nodes (R-31): the scheduler places them again.

    When: a hardware fault (e.g. a dropped GPU) blocks the task, at env check
    or while it runs.
    """

    emitted_by = "faulttolerance"
    reacted_by = ("scheduler", "deployer", "notification")

    run: Run
    attempt: Attempt
    """The attempt that hit the fault."""
    reason: Text
    faulty_nodes: tuple[str, ...] = ()


class HangDetected(_TaskEvent):
    """The task made no progress (no new log line, no step advance) for too long (R-33)."""

    emitted_by = "faulttolerance"
    reacted_by = ("notification",)

    run: Run
    attempt: Attempt
    idle_s: float = Field(ge=0)
    last_log_at: datetime | None = None
    """When the last log line was seen, if ever."""


class StacksCaptured(_TaskEvent):
    """Process stacks of workers were captured (R-33).

    When: the deployer holding the attempt's workers carried out a
    `CaptureStacks` command (runyard.contracts.commands), sent by the
    fault-tolerance service after a hang or on a person's request; the metadata
    is the command's (the asker as actor, `HangDetected` or the request as
    cause). The fault-tolerance service keeps the report built from `stacks`.
    """

    emitted_by = "deployer"
    reacted_by = ("faulttolerance",)

    run: Run
    attempt: Attempt
    workers: tuple[int, ...]
    report_id: Text
    """Id of the report (per-function statistics plus raw per-thread stacks)."""
    summary: str
    stacks: tuple[WorkerStacks, ...] = ()
    """The raw stacks per worker, trimmed to fit the event (see `note`)."""
    note: str = ""
    """What was cut from `stacks` to keep the event under its size limit ("" if nothing)."""


class SlowdownDetected(_TaskEvent):
    """Step time rose well above the run's baseline (R-34).

    When: a window's smoothed mean is more than 0.8 above the fastest window
    seen so far in the run.
    """

    emitted_by = "faulttolerance"
    reacted_by = ("notification",)

    run: Run
    first_iter: int = Field(ge=0)
    last_iter: int = Field(ge=0)
    mean_ms: float = Field(ge=0)
    baseline_ms: float = Field(gt=0)
    ratio: float
    """(mean - baseline) / baseline."""
    message: str
    """The R-34 warning line, e.g. `Smoothed mean (iters 83-87: 9465.00 ms, baseline:
    3101.00 ms), threshold ratio:2.05. Warning`."""


class ResumeObserved(_TaskEvent):
    """After a restart, the logs showed the training code loading its checkpoint (R-32)."""

    emitted_by = "faulttolerance"
    reacted_by = ()

    run: Run
    attempt: Attempt
    step: int | None = None
    path: str | None = None
    line: str
    """The log line that matched."""


class ResumeNotObserved(_TaskEvent):
    """After a restart, no checkpoint-load line appeared within the wait (R-32)."""

    emitted_by = "faulttolerance"
    reacted_by = ()

    run: Run
    attempt: Attempt
    waited_s: float = Field(ge=0)


# --- notification -----------------------------------------------------------


class AlertDelivered(_TaskEvent):
    """An alert about the task reached a subscriber's channel (R-50)."""

    emitted_by = "notification"
    reacted_by = ()

    alert: Text
    """Which alert: its kind (`failed`, `hang`, ...) and the event it reports."""
    channel: Text
    """Where it went, e.g. `feishu:<subscription id>`; never a secret."""
    attempt: int = Field(ge=1)
    """Delivery attempt that succeeded."""


class AlertFailed(_TaskEvent):
    """Alert delivery attempts failed (R-50); `retryable` says whether another follows.

    Failures to one webhook are coalesced: one event per webhook and window
    (on the task of the window's first failed alert), with how many attempts
    and tasks it stands for.
    """

    emitted_by = "notification"
    reacted_by = ()

    alert: Text
    channel: Text
    reason: Text
    """Fixed words for the failure (never the remote end's own text)."""
    code: int | None = None
    """HTTP status or Feishu error code, if the channel gave one."""
    retryable: bool
    count: int = Field(default=1, ge=1)
    """Failed attempts to this webhook the event stands for (this one included)."""
    tasks: int = Field(default=1, ge=1)
    """Distinct tasks among them."""


#: Every task event, in the order of a task's life.
TASK_EVENTS: tuple[type[Event], ...] = (
    TaskSubmitted,
    TaskCloned,
    TaskRerunRequested,
    TaskQueued,
    TaskPlaced,
    DeployStageStarted,
    DeployStageCompleted,
    DeployStageFailed,
    EnvCheckStarted,
    EnvCheckItemReported,
    EnvCheckFinished,
    WorkerStarted,
    WorkerExited,
    TaskRunning,
    TaskSucceeded,
    TaskFailed,
    TaskStopRequested,
    TaskStopped,
    TaskRestartScheduled,
    TaskRescheduleRequested,
    TaskRescheduleFailed,
    TaskPreempted,
    TaskRequeued,
    TaskMarkedAbnormal,
    ResourcesReleased,
    HangDetected,
    StacksCaptured,
    SlowdownDetected,
    ResumeObserved,
    ResumeNotObserved,
    AlertDelivered,
    AlertFailed,
)

#: Any task event. Stored events are told apart by their type name in the
#: envelope, not by a payload field, so this union is for typing and matching.
TaskEvent = (
    TaskSubmitted
    | TaskCloned
    | TaskRerunRequested
    | TaskQueued
    | TaskPlaced
    | DeployStageStarted
    | DeployStageCompleted
    | DeployStageFailed
    | EnvCheckStarted
    | EnvCheckItemReported
    | EnvCheckFinished
    | WorkerStarted
    | WorkerExited
    | TaskRunning
    | TaskSucceeded
    | TaskFailed
    | TaskStopRequested
    | TaskStopped
    | TaskRestartScheduled
    | TaskRescheduleRequested
    | TaskRescheduleFailed
    | TaskPreempted
    | TaskRequeued
    | TaskMarkedAbnormal
    | ResourcesReleased
    | HangDetected
    | StacksCaptured
    | SlowdownDetected
    | ResumeObserved
    | ResumeNotObserved
    | AlertDelivered
    | AlertFailed
)


def upcast_task_submitted_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """TaskSubmitted v1 -> v2.

    v1 (the first draft of the contract) carried `warnings` as plain message
    strings and had no task groups. v2 makes each warning a `SubmissionWarning`
    (code, field, message) so the gateway and CLI can point at the field, and
    adds `group_id` (R-17). A v1 warning did not say which rule or field it
    came from: it becomes code `legacy.unstructured` on field `spec`.
    """
    lifted = dict(payload)
    lifted["warnings"] = [
        {"code": "legacy.unstructured", "field": "spec", "message": message}
        for message in payload.get("warnings", [])
    ]
    lifted.setdefault("group_id", None)
    return lifted


def upcast_task_queued_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """TaskQueued v1 -> v2: `blocked` added.

    A v1 event was appended for every change of reason or position, so it did
    not need to say which kind of wait it was. Its reason did: the scheduler
    wrote `... even if idle; ...` exactly when the pool could not start the
    task at all, which is what `blocked` means.
    """
    lifted = dict(payload)
    lifted.setdefault("blocked", " even if idle" in str(payload.get("reason", "")))
    return lifted


def upcast_task_stop_requested_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """TaskStopRequested v1 -> v2: who asked (`stopped_by`, `role`, `group_id`) added.

    A v1 event named nobody (its reason was a fixed text); the envelope's actor
    still says who asked. The new fields stay unknown rather than guessed.
    """
    lifted = dict(payload)
    for name in ("stopped_by", "role", "group_id"):
        lifted.setdefault(name, None)
    return lifted


#: (type name, from version, upcaster) for every old task event shape still readable.
TASK_UPCASTERS: tuple[tuple[str, int, Upcaster], ...] = (
    (TaskSubmitted.type_name(), 1, upcast_task_submitted_v1),
    (TaskQueued.type_name(), 1, upcast_task_queued_v1),
    (TaskStopRequested.type_name(), 1, upcast_task_stop_requested_v1),
)
