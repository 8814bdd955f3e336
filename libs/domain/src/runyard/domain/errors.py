"""Typed errors of the task domain: why `decide` refused a command.

Every error has a stable `code` (for API answers and logs), a `message` that
says what happened, and a `hint` that says what a person can do. Deciding
again on the same state gives the same error, so none of them is worth a
retry; an edge answers them with their status (409 unless said: the task's
state does not allow it), a consumer acks and moves on. `DomainError` is a
`RunyardError` (runyard.errors), so every edge answers it the same way.

    DomainError                  409
     +-- TaskNotFound            404 (field task_id): no stream for that task id
     +-- TaskAlreadyExists       a second TaskSubmitted for one task id
     +-- InvalidTransition       the command does not apply in the task's status
     |    +-- TaskAlreadyFinished    ... because the task is succeeded/failed/stopped/abnormal
     |    +-- TaskStopping           ... because a stop is pending
     +-- StaleAttempt            the command is about an older run or attempt
     +-- InvalidCommand          the command itself is wrong for this task
     |    +-- RerunChangeNotAllowed  400: a rerun changes a field only a clone may change
     |    +-- RestartNotAllowed      auto restart is off or its limit is reached
     +-- InconsistentHistory     a stored stream cannot be folded (a bug, not a user error)
     +-- ReplayRefused           400: a point of the log that cannot be replayed
                                 (runyard.domain.replay)
"""

from __future__ import annotations

from runyard.errors import RunyardError


class DomainError(RunyardError):
    """A command the task domain refuses: a stable `code`, a `message`, and a `hint`."""

    http_status = 409

    def __init__(self, code: str, message: str, hint: str = "", field: str = "") -> None:
        super().__init__(message, code=code, hint=hint, field=field)

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


#: What a user whose task id named no task (or another tenant's) can do next.
TASK_NOT_FOUND_HINT = "check the task id; `runyard ls` lists your tenant's tasks"


class TaskNotFound(DomainError):
    """No event exists for the task id."""

    http_status = 404

    def __init__(self, task_id: str) -> None:
        message = f"task {task_id!r} does not exist"
        super().__init__("task_not_found", message, TASK_NOT_FOUND_HINT, "task_id")
        self.task_id = task_id


class TaskAlreadyExists(DomainError):
    """A task with this id was already submitted."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            "task_already_exists", f"task {task_id!r} already exists", "submit with a new task id"
        )
        self.task_id = task_id


class InvalidTransition(DomainError):
    """The action does not apply to a task in its current status."""

    def __init__(
        self, task_id: str, status: str, action: str, hint: str = "", *, code: str = ""
    ) -> None:
        message = f"cannot {action} task {task_id!r}: it is {status}"
        super().__init__(code or "invalid_transition", message, hint)
        self.task_id = task_id
        self.status = status
        self.action = action


class TaskAlreadyFinished(InvalidTransition):
    """The task is in a terminal status; only a rerun or a clone starts it again."""

    def __init__(self, task_id: str, status: str, action: str) -> None:
        hint = "rerun or clone the task to run it again"
        super().__init__(task_id, status, action, hint, code="task_already_finished")


class TaskStopping(InvalidTransition):
    """A stop is pending: nothing new starts for the task."""

    def __init__(self, task_id: str, status: str, action: str) -> None:
        hint = "wait until it has stopped"
        super().__init__(task_id, f"{status}, stopping", action, hint, code="task_stopping")


class StaleAttempt(DomainError):
    """The command refers to a run or attempt that is no longer the current one."""

    def __init__(self, task_id: str, run: int, attempt: int, current: tuple[int, int]) -> None:
        super().__init__(
            "stale_attempt",
            f"task {task_id!r}: run {run} attempt {attempt} is not current "
            f"(now run {current[0]} attempt {current[1]})",
            "ignore it: a later attempt replaced it",
        )
        self.task_id = task_id
        self.run = run
        self.attempt = attempt
        self.current = current


class InvalidCommand(DomainError):
    """The command is inconsistent with the task (unknown worker, stage out of order, ...)."""

    def __init__(
        self, task_id: str, action: str, reason: str, hint: str = "", *, code: str = ""
    ) -> None:
        message = f"cannot {action} task {task_id!r}: {reason}"
        super().__init__(code or "invalid_command", message, hint)
        self.task_id = task_id
        self.action = action
        self.reason = reason


class RerunChangeNotAllowed(InvalidCommand):
    """A rerun may change only the launch command, worker spec, worker count and image (R-16)."""

    http_status = 400

    def __init__(self, task_id: str, fields: tuple[str, ...]) -> None:
        super().__init__(
            task_id,
            "rerun",
            f"a rerun cannot change {', '.join(fields)}",
            "clone the task instead: a clone may change everything, the pool included",
            code="rerun_change_not_allowed",
        )
        self.fields = fields


class RestartNotAllowed(InvalidCommand):
    """Auto restart is off for the task, or its restart limit is reached (R-32)."""

    def __init__(self, task_id: str, reason: str) -> None:
        hint = "fail the task instead"
        super().__init__(task_id, "restart", reason, hint, code="restart_not_allowed")


class InconsistentHistory(DomainError):
    """A stored stream cannot be folded: a bug or a corrupted log, never a user's mistake."""

    def __init__(self, task_id: str, reason: str) -> None:
        message = f"history of task {task_id!r} is inconsistent: {reason}"
        super().__init__("inconsistent_history", message, "report a bug")
        self.task_id = task_id
        self.reason = reason
