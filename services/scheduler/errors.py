"""Typed errors of the scheduler's application layer (admin requests, configuration).

The pure core has its own errors (`runyard.scheduler.domain.errors`); these are
about requests the service gets: a pool or node it does not know, a node that
cannot be removed while workers run on it, a bad pools file. Each carries a
`code` and a `hint` the gateway can show as is.
"""

from __future__ import annotations

from typing import ClassVar


class SchedulerServiceError(Exception):
    """Base of the service's errors: a stable code, a message and what to do."""

    code: ClassVar[str] = "scheduler.error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class PoolConfigError(SchedulerServiceError, ValueError):
    """The pools file is malformed."""

    code = "scheduler.config_invalid"


class UnknownPool(SchedulerServiceError, KeyError):
    """No pool of that id is managed by this scheduler."""

    code = "scheduler.pool_unknown"

    def __init__(self, pool_id: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown pool {pool_id!r}", f"known pools: {', '.join(known) or 'none'}")
        self.pool_id = pool_id

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.message


class UnknownNode(SchedulerServiceError, KeyError):
    """The pool has no node of that name."""

    code = "scheduler.node_unknown"

    def __init__(self, pool_id: str, node: str) -> None:
        super().__init__(f"pool {pool_id} has no node {node!r}", "list the pool's nodes first")
        self.node = node

    def __str__(self) -> str:
        return self.message


class NodeExists(SchedulerServiceError):
    """A node of that name is already in the pool."""

    code = "scheduler.node_exists"


class NodeBusy(SchedulerServiceError):
    """The node still runs workers, so it cannot be removed."""

    code = "scheduler.node_busy"

    def __init__(self, pool_id: str, node: str, tasks: tuple[str, ...]) -> None:
        super().__init__(
            f"node {node} of pool {pool_id} still runs workers of {', '.join(tasks)}",
            "cordon the node and wait for its tasks to end, or mark it faulty so they are "
            "rescheduled, then remove it",
        )
        self.tasks = tasks


class ConflictPersisted(SchedulerServiceError):
    """Another writer kept changing the same streams; the decision was given up for now."""

    code = "scheduler.conflict"
    retryable: ClassVar[bool] = True
