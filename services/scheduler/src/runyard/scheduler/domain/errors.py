"""Why the scheduler refuses or cannot do something.

Every error has a stable machine `code`, a `message` for a person, a `hint`
that says what to do, and a `retryable` flag: a retryable error (no capacity
now) goes away by waiting in the queue; the others need a change. Each is a
`RunyardError` (runyard.errors); an edge answers it with 409 unless said.

    RunyardError
    └── SchedulerError             code, message, hint, retryable
        ├── InvalidRequest         (also a ValueError) the task can never be placed as asked
        │   ├── RdmaNotAllowed     rdma.not_allowed: network not RoCE/IB, or a worker below 8 GPUs
        │   ├── InvalidWorkerShape workers.invalid: no workers, or a worker bigger than a node
        │   └── UnknownWorkerSpec  spec.unknown: the pool has no worker spec of that name
        ├── NoCapacity             capacity.insufficient (retryable): not all workers fit now
        ├── NoHealthyNode          reschedule.no_healthy_node: a reschedule cannot be placed
        ├── UnknownAllocation      allocation.unknown: the task holds no GPUs in this pool
        ├── NotASpotPool           spot.not_spot_pool: spot capacity of a subscription pool
        │                          (400, field pool_id)
        ├── InvalidCapacityChange  spot.invalid_change: more nodes than the pool has, ...
        │                          (400, field remove)
        └── PoolEventRejected      pool.event_rejected: the fold met an impossible event
"""

from __future__ import annotations

from collections.abc import Iterable

from runyard.errors import RunyardError


def describe_workers(worker_gpus: Iterable[int]) -> str:
    """`(8, 8, 4)` -> `2 x 8-GPU + 1 x 4-GPU workers`; `(4,)` -> `1 x 4-GPU worker`."""
    counts: dict[int, int] = {}
    for gpus in sorted(worker_gpus, reverse=True):
        counts[gpus] = counts.get(gpus, 0) + 1
    parts = [f"{n} x {gpus}-GPU" for gpus, n in counts.items()]
    noun = "worker" if sum(counts.values()) == 1 else "workers"
    return f"{' + '.join(parts)} {noun}"


class SchedulerError(RunyardError):
    """Base of every scheduler error: a code, a message, a hint."""

    code = "scheduler.error"
    retryable = False
    http_status = 409

    def __init__(self, message: str, hint: str, field: str = "") -> None:
        super().__init__(message, hint=hint, field=field, detail=f"{self.code}: {message}")


class InvalidRequest(SchedulerError, ValueError):
    """The task can never be placed in this pool as it is asked for."""

    code = "request.invalid"


class RdmaNotAllowed(InvalidRequest):
    """R-09: RDMA needs a RoCE or IB pool and 8-GPU workers only."""

    code = "rdma.not_allowed"

    def __init__(self, network: str, worker_gpus: tuple[int, ...]) -> None:
        if network not in ("roce", "ib"):
            why = f"the pool's training network is {network}"
        else:
            small = sorted({g for g in worker_gpus if g != 8})
            why = f"workers with {', '.join(map(str, small))} GPUs are not 8-GPU workers"
        super().__init__(
            f"RDMA cannot be enabled: {why}",
            "RDMA needs 8-GPU workers on a RoCE/IB pool: use an 8-GPU spec on a RoCE or "
            "IB pool, or turn RDMA off",
        )
        self.network = network
        self.worker_gpus = worker_gpus


class InvalidWorkerShape(InvalidRequest):
    """No workers, or a worker that needs more GPUs than a node has."""

    code = "workers.invalid"

    def __init__(self, worker_gpus: tuple[int, ...], reason: str) -> None:
        super().__init__(
            f"cannot place workers {worker_gpus}: {reason}",
            "use a worker spec of the pool (1, 2, 4 or 8 GPUs per worker)",
        )
        self.worker_gpus = worker_gpus
        self.reason = reason


class UnknownWorkerSpec(InvalidRequest):
    """The task names a worker spec the pool does not define (R-02)."""

    code = "spec.unknown"

    def __init__(self, pool_id: str, spec: str | None, known: tuple[str, ...]) -> None:
        super().__init__(
            f"pool {pool_id} has no worker spec {spec!r}",
            f"use one of the pool's specs ({', '.join(known) or 'none defined'}) "
            "or a custom GPU count",
        )
        self.pool_id = pool_id
        self.spec = spec
        self.known = known


class NoCapacity(SchedulerError):
    """Not every worker of the gang fits now; nothing was held (R-06)."""

    code = "capacity.insufficient"
    retryable = True

    def __init__(self, task_id: str, worker_gpus: tuple[int, ...], can_start: int) -> None:
        super().__init__(
            f"task {task_id} needs {describe_workers(worker_gpus)}, pool can start {can_start}",
            "the task waits in the queue until GPUs are released; a smaller worker "
            "count, or another pool, may start sooner",
        )
        self.task_id = task_id
        self.worker_gpus = worker_gpus
        self.can_start = can_start


class NoHealthyNode(SchedulerError):
    """R-31: the task cannot be moved to healthy nodes, so it cannot be recovered."""

    code = "reschedule.no_healthy_node"

    def __init__(
        self, task_id: str, worker_gpus: tuple[int, ...], can_start: int, excluded: tuple[str, ...]
    ) -> None:
        away = f" away from {', '.join(excluded)}" if excluded else ""
        super().__init__(
            f"no healthy node can take task {task_id}{away}: it needs "
            f"{describe_workers(worker_gpus)} and healthy nodes can take {can_start}; "
            "the task cannot be recovered",
            "rerun the task when the faulty nodes are repaired or capacity is free, "
            "or clone it to another pool",
        )
        self.task_id = task_id
        self.worker_gpus = worker_gpus
        self.can_start = can_start
        self.excluded = excluded


class UnknownAllocation(SchedulerError):
    """The task holds no GPUs in this pool."""

    code = "allocation.unknown"

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id} holds no GPUs in this pool",
            "check the task's state: it may already be released or never placed",
        )
        self.task_id = task_id


class NotASpotPool(SchedulerError):
    """Spot capacity changes apply to spot pools only; subscription tasks are never preempted."""

    code = "spot.not_spot_pool"
    http_status = 400

    def __init__(self, pool_id: str) -> None:
        super().__init__(
            f"pool {pool_id} is a subscription pool; its capacity is not spot capacity",
            "remove nodes of a subscription pool with the node admin commands",
            "pool_id",
        )
        self.pool_id = pool_id


class InvalidCapacityChange(SchedulerError):
    """A spot capacity change that cannot be made (too many nodes, unknown nodes)."""

    code = "spot.invalid_change"
    http_status = 400

    def __init__(self, reason: str) -> None:
        hint = "ask for at most as many nodes as the pool has, by name"
        super().__init__(reason, hint, "remove")
        self.reason = reason


class PoolEventRejected(SchedulerError):
    """A pool event that cannot apply to the state (a GPU taken twice, an unknown node).

    The scheduler is the single writer of a pool stream and decides from the
    same state, so this means a bug or a second writer: fail loudly.
    """

    code = "pool.event_rejected"

    def __init__(self, event_type: str, reason: str) -> None:
        super().__init__(
            f"{event_type} cannot apply: {reason}",
            "a pool stream has one writer; check for a second scheduler on this pool",
        )
        self.event_type = event_type
        self.reason = reason
