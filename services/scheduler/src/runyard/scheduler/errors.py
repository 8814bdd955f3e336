"""Typed errors of the scheduler's application layer (admin requests, configuration).

The pure core has its own errors (`runyard.scheduler.domain.errors`); these are
about requests the service gets: a pool or node it does not know, a node that
cannot be removed while workers run on it, a bad pools file. Each is a
`RunyardError` (runyard.errors) with a `code`, a `hint` and the field and HTTP
status the edges answer it with:

    RunyardError
    └── SchedulerServiceError      400
        ├── PoolConfigError        scheduler.config_invalid
        ├── UnknownPool            404 scheduler.pool_unknown (field pool_id)
        ├── UnknownNode            404 scheduler.node_unknown (field node)
        ├── NodeExists             409 scheduler.node_exists (field node)
        ├── NodeBusy               409 scheduler.node_busy (field node, `tasks`)
        ├── ConflictPersisted      409 scheduler.conflict (retryable)
        └── AppendRefused          409 scheduler.read_only (a rebuild decides nothing)
"""

from __future__ import annotations

from runyard.errors import RunyardError


class SchedulerServiceError(RunyardError):
    """Base of the service's errors: a stable code, a message and what to do."""

    code = "scheduler.error"
    http_status = 400

    def __init__(self, message: str, hint: str = "", field: str = "") -> None:
        super().__init__(message, hint=hint, field=field)


class PoolConfigError(SchedulerServiceError, ValueError):
    """The pools file is malformed."""

    code = "scheduler.config_invalid"


class UnknownPool(SchedulerServiceError, KeyError):
    """No pool of that id is managed by this scheduler."""

    code = "scheduler.pool_unknown"
    http_status = 404

    def __init__(self, pool_id: str, known: tuple[str, ...]) -> None:
        hint = f"known pools: {', '.join(known) or 'none'}"
        super().__init__(f"unknown pool {pool_id!r}", hint, "pool_id")
        self.pool_id = pool_id

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.message


class UnknownNode(SchedulerServiceError, KeyError):
    """The pool has no node of that name."""

    code = "scheduler.node_unknown"
    http_status = 404

    def __init__(self, pool_id: str, node: str) -> None:
        message = f"pool {pool_id} has no node {node!r}"
        super().__init__(message, "list the pool's nodes first", "node")
        self.node = node

    def __str__(self) -> str:
        return self.message


class NodeExists(SchedulerServiceError):
    """A node of that name is already in the pool."""

    code = "scheduler.node_exists"
    http_status = 409

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message, hint, "node")


class NodeBusy(SchedulerServiceError):
    """The node still runs workers, so it cannot be removed."""

    code = "scheduler.node_busy"
    http_status = 409

    def __init__(self, pool_id: str, node: str, tasks: tuple[str, ...]) -> None:
        super().__init__(
            f"node {node} of pool {pool_id} still runs workers of {', '.join(tasks)}",
            "cordon the node and wait for its tasks to end, or mark it faulty so they are "
            "rescheduled, then remove it",
            "node",
        )
        self.tasks = tasks
        self.extra = {"tasks": list(tasks)}


class ConflictPersisted(SchedulerServiceError):
    """Another writer kept changing the same streams; the decision was given up for now."""

    code = "scheduler.conflict"
    http_status = 409
    retryable = True


class AppendRefused(SchedulerServiceError):
    """A shadow rebuild of the read models reached a decision it would append: it
    reads the log only (`runyard.scheduler.rebuild`)."""

    code = "scheduler.read_only"
    http_status = 409

    def __init__(self, stream_id: str) -> None:
        super().__init__(
            f"a rebuild of the read models would append to {stream_id}",
            "the scheduler has not acted on that stream yet; rebuild again once it has",
        )
