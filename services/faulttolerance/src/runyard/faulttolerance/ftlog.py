"""The fault-tolerance log of a task (容错日志, SPEC R-35): a pure view of its events.

Every line comes from one event of the task's stream, so the log needs no
table of its own and a replay gives the same lines: env check items and the
`Bootcheck Finished` line, restarts and reschedules with their running counts,
hang detections and stack reports, slowdown warnings (the R-34 line as is),
resume observed or not, an unrecoverable failure, and a failure that ends
fault tolerance: a hang or a crash with auto restart on and no restart left
("Task failed: hang, no restarts left (1 of 1 used)"), or a hang with auto
restart off.

    lines = fault_tolerance_log(await store.read_stream(f"task-{task_id}"))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runyard.contracts import Event, RecordedEvent
from runyard.contracts.task_events import (
    EnvCheckFinished,
    EnvCheckItemReported,
    EnvCheckStarted,
    HangDetected,
    ResumeNotObserved,
    ResumeObserved,
    SlowdownDetected,
    StacksCaptured,
    TaskFailed,
    TaskPlaced,
    TaskRerunRequested,
    TaskRescheduleFailed,
    TaskRescheduleRequested,
    TaskRestartScheduled,
)
from runyard.domain.task import TaskState, evolve
from runyard.eventstore import EventStore


@dataclass(frozen=True, slots=True)
class FaultToleranceLine:
    at: datetime
    run: int
    attempt: int | None
    kind: str
    """`env_check`, `restart`, `reschedule`, `hang`, `stacks`, `slowdown`, `resume`, `failure`."""
    level: str
    """`info`, `warning` or `error`."""
    text: str

    def render(self) -> str:
        attempt = f" attempt {self.attempt}" if self.attempt is not None else ""
        return f"{self.at.isoformat()} [run {self.run}{attempt}] {self.level.upper()} {self.text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "run": self.run,
            "attempt": self.attempt,
            "kind": self.kind,
            "level": self.level,
            "text": self.text,
        }


@dataclass
class FaultToleranceLog:
    """The lines, and the counts of the current run (R-35)."""

    lines: list[FaultToleranceLine] = field(default_factory=list)
    run: int = 1
    restarts: int = 0
    reschedules: int = 0
    hangs: int = 0
    slowdowns: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "restarts": self.restarts,
            "reschedules": self.reschedules,
            "hangs": self.hangs,
            "slowdowns": self.slowdowns,
        }


def fault_tolerance_log(events: Iterable[RecordedEvent[Event]]) -> FaultToleranceLog:
    """The fault-tolerance log of one task's stream (events in stream order)."""
    log = FaultToleranceLog()
    state: TaskState | None = None
    for recorded in events:
        if isinstance(recorded.event, TaskFailed) and state is not None:
            _failure(log, recorded.event, recorded.occurred_at, state)
        else:
            _apply(log, recorded.event, recorded.occurred_at)
        state = evolve(state, recorded)
    return log


def _failure(log: FaultToleranceLog, e: TaskFailed, at: datetime, before: TaskState) -> None:
    """A failure in the FT log: unrecoverable, or fault tolerance had no restart left."""
    options = before.spec.fault_tolerance
    # the failures a restart would have answered: a worker's exit, a hang
    restartable = e.worker is not None or e.reason.startswith("hang")
    exhausted = restartable and options.auto_restart and before.restarts >= options.max_restarts
    if e.unrecoverable:
        text = f"Task failed: {e.reason}"
    elif exhausted:
        left = "" if "no restarts left" in e.reason else "; no restarts left"
        text = (
            f"Task failed: {e.reason}{left} "
            f"({before.restarts} of {options.max_restarts} restarts used)"
        )
    elif e.reason.startswith("hang"):
        text = f"Task failed: {e.reason}"
    else:
        return
    line = FaultToleranceLine(at, log.run, e.attempt or None, "failure", "error", text)
    log.lines.append(line)


def _apply(log: FaultToleranceLog, e: Event, at: datetime) -> None:
    def add(kind: str, level: str, text: str, attempt: int | None = None) -> None:
        log.lines.append(FaultToleranceLine(at, log.run, attempt, kind, level, text))

    if isinstance(e, TaskRerunRequested):
        log.run, log.restarts, log.reschedules, log.hangs, log.slowdowns = e.run, 0, 0, 0, 0
    elif isinstance(e, EnvCheckStarted):
        add("env_check", "info", "Bootcheck started", e.attempt)
    elif isinstance(e, EnvCheckItemReported):
        level = {"fail": "error" if e.blocking else "warning", "warn": "warning"}.get(
            e.result, "info"
        )
        blocking = " (blocking: hardware fault)" if e.blocking else ""
        text = f"worker {e.worker} {e.item}: {e.result}{blocking} - {e.detail}"
        add("env_check", level, text, e.attempt)
    elif isinstance(e, EnvCheckFinished):
        level = {"fail": "error", "warn": "warning"}.get(e.result, "info")
        text = (
            f"Bootcheck Finished: {e.result} "
            f"({e.blocking_failures} blocking failure(s), {e.warnings} warning(s))"
        )
        add("env_check", level, text, e.attempt)
    elif isinstance(e, TaskRestartScheduled):
        log.restarts += 1
        when = "on healthy nodes" if e.reason == "hardware_fault" else f"in {e.delay_s:.0f} s"
        text = (
            f"Restart {log.restarts} scheduled after {e.reason.replace('_', ' ')}: "
            f"attempt {e.attempt} {when}"
        )
        add("restart", "warning", text, e.attempt)
    elif isinstance(e, TaskRescheduleRequested):
        log.reschedules += 1
        nodes = f" (faulty: {', '.join(e.faulty_nodes)})" if e.faulty_nodes else ""
        add(
            "reschedule",
            "warning",
            f"Reschedule {log.reschedules} requested: {e.reason}{nodes}",
            e.attempt,
        )
    elif isinstance(e, TaskPlaced) and log.reschedules:
        nodes = ", ".join(sorted({w.node for w in e.workers}))
        add("reschedule", "info", f"Placed again on {nodes}", e.attempt)
    elif isinstance(e, TaskRescheduleFailed):
        add("reschedule", "error", f"Reschedule failed: {e.reason}")
    else:
        _apply_observation(log, e, add)


def _apply_observation(log: FaultToleranceLog, e: Event, add: Any) -> None:
    if isinstance(e, HangDetected):
        log.hangs += 1
        seen = f", last log line at {e.last_log_at.isoformat()}" if e.last_log_at else ""
        add("hang", "error", f"Hang detected: no progress for {e.idle_s:.0f} s{seen}", e.attempt)
    elif isinstance(e, StacksCaptured):
        workers = ", ".join(str(w) for w in e.workers) or "none"
        text = f"Stacks captured (workers {workers}; report {e.report_id}): {e.summary}"
        add("stacks", "info", text, e.attempt)
    elif isinstance(e, SlowdownDetected):
        log.slowdowns += 1
        add("slowdown", "warning", e.message)
    elif isinstance(e, ResumeObserved):
        where = "".join(
            part
            for part in (
                f" at step {e.step}" if e.step is not None else "",
                f" from {e.path}" if e.path else "",
            )
        )
        add("resume", "info", f"Resume observed{where}: {e.line}", e.attempt)
    elif isinstance(e, ResumeNotObserved):
        text = (
            f"No checkpoint load seen in the logs within {e.waited_s:.0f} s after the restart: "
            "the training may have started from scratch"
        )
        add("resume", "warning", text, e.attempt)


async def read_fault_tolerance_log(store: EventStore, task_id: str) -> FaultToleranceLog:
    """The fault-tolerance log of `task_id` as its stream says now (for the gateway, CLI)."""
    return fault_tolerance_log(await store.read_stream(f"task-{task_id}"))
