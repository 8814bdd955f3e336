"""The bodies of the gateway's HTTP API: what it answers, and the error every refusal is.

The gateway declares these as the response models of its routes (so /openapi.json
describes every answer) and `runyard.client` reads its answers into them: one
description of the wire format for both sides. Answers allow members not named here
(`extra="allow"`): a newer gateway may add a member, and an older client keeps it
instead of refusing the answer. Times are ISO 8601 text as the gateway writes them.

The request bodies (a task spec, overrides, rerun changes, a task group, a token
request, ...) are models too, in `runyard.contracts.requests`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from runyard.contracts.task_events import DeployStageName, TaskStatus

#: Roles of a token (`runyard.api.auth` checks them).
Role = Literal["platform_admin", "tenant_admin", "member", "service", "sre"]
TokenState = Literal["active", "expired", "revoked"]
StageResult = Literal["running", "completed", "failed"]


class Answer(BaseModel):
    """An answer of the API: the members named, and any a newer gateway adds.

    Strict: a value of another JSON type than declared is refused, never converted
    (a count of 2 is not read as `true`), so what is answered is what was built."""

    model_config = ConfigDict(extra="allow", strict=True)


class Error(Answer):
    """Every refusal, whatever its status: a stable `code`, the `field` it concerns
    (empty when none), a `message` and a `hint` saying what to do instead."""

    code: str = Field(description="stable, e.g. task_not_found, spec.invalid, auth.admin_only")
    message: str
    hint: str = ""
    field: str = ""


# --- tasks ------------------------------------------------------------------------


class TaskWarning(Answer):
    """Something the rules accepted but that may not do what the caller meant."""

    code: str
    field: str = ""
    message: str = ""


class QueuePlace(Answer):
    """Where a queued task stands and why (the scheduler's queue read model)."""

    reason: str | None = None
    position: int | None = None
    gpus_needed: int | None = None
    launchable: int | None = None
    blocked: bool | None = None
    queued_at: str | None = None
    as_of: str | None = None


class Counters(Answer):
    """Fault-tolerance counters of the task's current run."""

    restarts: int = 0
    reschedules: int = 0
    requeues: int = 0
    preemptions: int = 0
    hangs: int = 0
    slowdowns: int = 0


class Stage(Answer):
    """One deploy stage of an attempt: start, end, duration and outcome."""

    run: int
    attempt: int | None = None
    stage: DeployStageName
    started_at: str | None = None
    finished_at: str | None = None
    duration_ms: int | None = None
    result: StageResult
    reason: str | None = None


class Task(Answer):
    """A task's detail (`GET /v1/tasks/{task_id}`, and the answer of every change).

    `spec` is the task spec as the caller may see it: a creator-only value is
    `******` for anyone but the task's creator."""

    task_id: str
    tenant: str
    creator: str
    name: str
    status: TaskStatus
    stage: DeployStageName | None = None
    run: int
    attempt: int = 0
    spec: dict[str, Any]
    warnings: list[TaskWarning] = []
    group_id: str | None = None
    cloned_from: str | None = None
    clones: list[str] = []
    submitted_at: str | None = None
    queued_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    queue: QueuePlace | None = None
    last_failure_reason: str | None = None
    stop_reason: str | None = None
    counters: Counters = Counters()
    stages: list[Stage] = []
    version: int


class TaskRow(Answer):
    """A task as the task list shows it."""

    task_id: str
    tenant: str
    creator: str
    name: str
    status: TaskStatus
    stage: DeployStageName | None = None
    pool: str
    tags: list[str] = []
    group_id: str | None = None
    cloned_from: str | None = None
    run: int
    created_at: str
    updated_at: str
    workers: int
    restarts: int
    queue: QueuePlace | None = None


class TaskPage(Answer):
    """A page of tasks, newest first; `next_cursor` asks for the next one (None: the last)."""

    items: list[TaskRow]
    next_cursor: str | None = None


class TaskEvent(Answer):
    """One event of a task's audit timeline, with who caused it."""

    position: int
    event_id: str
    version: int
    type: str
    occurred_at: str | None = None
    actor: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    data: dict[str, Any]


# --- groups -----------------------------------------------------------------------


class Group(Answer):
    """A task group: its tasks and a count per status."""

    group_id: str
    tasks: list[TaskRow]
    status_counts: dict[str, int]


class GroupSummary(Answer):
    """A task group in the list of groups: how many tasks, and a count per status."""

    group_id: str
    tasks: int
    status_counts: dict[str, int]
    created_at: str
    updated_at: str


class GroupPage(Answer):
    """A page of groups, newest first; `next_cursor` asks for the next one (None: the last)."""

    items: list[GroupSummary]
    next_cursor: str | None = None


# --- pools and catalogue ----------------------------------------------------------


class Pool(Answer):
    """A resource pool: zone, resource type, network, worker specs (name -> GPUs)."""

    pool_id: str
    zone: str
    resource_type: str
    network: str
    specs: dict[str, int]
    total_gpus: int | None = None
    source: str


class PoolCapacity(Answer):
    """What a pool can launch now: count per worker spec and the custom-count maximum."""

    pool_id: str
    source: str
    total_gpus: int | None = None
    launchable: dict[str, int] | None = None
    custom_gpus_max: int | None = None
    occupancy: Any = None


class Catalogue(Answer):
    """The images, volumes and public data the submission rules use."""


class CatalogueEntry(Answer):
    """A catalogue entry as the catalogue now holds it."""


# --- tokens -----------------------------------------------------------------------


class TokenInfo(Answer):
    """A token without its secret."""

    token_id: str
    tenant: str
    user: str
    role: Role
    description: str | None = None
    state: TokenState
    created_at: str
    created_by: str | None = None
    expires_at: str
    revoked_at: str | None = None
    revoked_by: str | None = None


class IssuedToken(TokenInfo):
    """A new token: the secret is in this answer only (it is stored hashed)."""

    token: str


class TokenPage(Answer):
    items: list[TokenInfo]
    #: More tokens matched than one listing answers (the newest are listed).
    truncated: bool = False


# --- the whole log ----------------------------------------------------------------


class AuditPage(Answer):
    """Events of the whole log, oldest first; `upto` is the log's end when it was read."""

    items: list[dict[str, Any]]
    next_cursor: str | None = None
    upto: int | None = None


class Trace(Answer):
    """The chains of reactions events belong to, as trees (`of` names what was asked)."""

    of: dict[str, str]


class ReadModelAnswer(Answer):
    """The state of a read model's rebuild, diff or swap."""


class TaskReplay(Answer):
    """A task as it was at a point of the log (`as_of`: where its prefix ends)."""

    task_id: str
    as_of: dict[str, Any]
    task: dict[str, Any]


class TaskReplayDiff(Answer):
    """What changed in a task between two points of the log (`from`, `to`): the fields,
    and the events in between (at most a page of them: `truncated`)."""

    task_id: str
    changes: list[dict[str, Any]]
    events: list[TaskEvent]
    events_between: int
    truncated: bool


# --- what the services behind the gateway answer (routed to them) -----------------


class LogLine(Answer):
    """One stored line of a worker's output."""

    at: str
    run: int
    attempt: int
    worker: int
    stream: str
    line: str


class LogPage(Answer):
    """A page of log lines; `next_cursor` asks for the next page (None: none stored yet),
    `tail_cursor` resumes after the last line once more are stored."""

    lines: list[LogLine]
    next_cursor: str | None = None
    tail_cursor: str | None = None


class WorkerTails(Answer):
    """Each worker of one attempt: how many lines it wrote, and its last ones' size."""

    task_id: str
    run: int
    attempt: int
    workers: list[dict[str, Any]]


class TailLine(Answer):
    at: str
    stream: str
    line: str


class WorkerTail(Answer):
    """The last lines of one worker of one attempt, oldest first."""

    task_id: str
    run: int
    attempt: int
    worker: int
    lines: list[TailLine]


class FirstError(Answer):
    """The earliest error line of a task's run across workers, with its context and its
    likely layer (`found`: false when the logs hold none)."""

    found: bool = False


class LogExport(Answer):
    """A background export of a task's logs: its state and progress."""

    export_id: str
    task_id: str
    format: str
    state: str
    lines_done: int | None = None
    lines_total: int | None = None
    error: str | None = None


class FaultToleranceLog(Answer):
    """A task's fault-tolerance log: env checks, restarts, reschedules, hangs, stack
    reports, slowdowns; `counts` are of the current run."""

    task_id: str
    status: TaskStatus
    run: int
    counts: dict[str, Any]
    lines: list[dict[str, Any]]


class StackReport(Answer):
    """Stacks of every worker of an attempt: frames, function statistics, odd ones out."""

    report_id: str
    task_id: str
    run: int
    attempt: int
    captured_at: str


class StackReports(Answer):
    """A task's stack reports, oldest first."""

    task_id: str
    reports: list[dict[str, Any]]


class AlertSubscription(Answer):
    """A tenant's alert subscription (the webhook's credentials masked)."""

    id: str
    tenant: str
    webhook_url: str
    alerts: list[str]
    signed: bool
    text_only: bool = False


class AlertSubscriptions(Answer):
    items: list[AlertSubscription]


class Deleted(Answer):
    """What was deleted."""

    id: str
    deleted: bool


class PoolChange(Answer):
    """What a pool administration operation changed."""


class PoolsReplay(Answer):
    """Pools as they were at a point of the log: nodes, health, allocations."""


class WhatIf(Answer):
    """A replay of a window of the log on changed pools or another queue policy, with
    queue times and utilisation compared with what happened."""


#: The figures of a what-if answer shown side by side (what happened, what if), with
#: their labels: `runyard whatif` prints them, the console's what-if page shows them.
WHATIF_FIGURES = (
    ("runs", "runs"),
    ("placed", "placed"),
    ("waiting_at_end", "waiting at end"),
    ("left_queue", "left the queue"),
    ("p50_s", "queue p50 (s)"),
    ("p90_s", "queue p90 (s)"),
    ("p99_s", "queue p99 (s)"),
    ("max_s", "queue max (s)"),
    ("utilisation", "utilisation"),
    ("gpu_hours", "GPU hours used"),
)


__all__ = [
    "AlertSubscription",
    "AlertSubscriptions",
    "Answer",
    "AuditPage",
    "Catalogue",
    "CatalogueEntry",
    "Counters",
    "Deleted",
    "Error",
    "FaultToleranceLog",
    "FirstError",
    "Group",
    "GroupPage",
    "GroupSummary",
    "IssuedToken",
    "LogExport",
    "LogLine",
    "LogPage",
    "Pool",
    "PoolCapacity",
    "PoolChange",
    "PoolsReplay",
    "QueuePlace",
    "ReadModelAnswer",
    "Role",
    "StackReport",
    "StackReports",
    "Stage",
    "StageResult",
    "TailLine",
    "Task",
    "TaskEvent",
    "TaskPage",
    "TaskReplay",
    "TaskReplayDiff",
    "TaskRow",
    "TaskStatus",
    "TaskWarning",
    "TokenInfo",
    "TokenPage",
    "TokenState",
    "Trace",
    "WhatIf",
    "WorkerTail",
    "WorkerTails",
]
