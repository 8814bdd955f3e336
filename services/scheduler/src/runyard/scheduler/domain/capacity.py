"""What a pool can start now, who holds what, and what waits (R-03, R-04, R-05).

The launchable count of a spec is computed from the free GPUs of each
schedulable node, never from the pool's total of free GPUs: four nodes with 6
free GPUs each have 24 free GPUs and can start no 8-GPU worker. The pool state
keeps schedulable nodes bucketed by free GPUs, so every count here is a sum over
9 buckets, whatever the number of nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from runyard.contracts.pool_events import GPUS_PER_NODE, AllocatedWorker, ResourceType
from runyard.scheduler.domain.pool import Health, PoolState
from runyard.scheduler.domain.queue import WaitingQueue
from runyard.scheduler.domain.view import count_startable


def launchable(pool: PoolState, gpus_per_worker: int) -> int:
    """R-03: workers of `gpus_per_worker` GPUs that can start now: sum of floor(free/k)."""
    sizes = pool.bucket_sizes()
    return sum(sizes[f] * (f // gpus_per_worker) for f in range(gpus_per_worker, len(sizes)))


def launchable_by_spec(pool: PoolState) -> dict[str, int]:
    """Launchable count of each predefined worker spec of the pool, by spec name."""
    return {name: launchable(pool, spec.gpus) for name, spec in pool.specs.items()}


def startable_workers(pool: PoolState, worker_gpus: tuple[int, ...]) -> int:
    """How many of these workers could start now (best fit, biggest first)."""
    return count_startable(pool.bucket_sizes(), worker_gpus)


def custom_gpus_max(pool: PoolState) -> int:
    """R-04: the largest custom GPU count that can start now.

    A count n starts as n//8 full 8-GPU workers plus one n%8 worker, so the best
    is every fully free node for the 8-GPU workers plus the partly free node
    with the most free GPUs for the rest.
    """
    sizes = pool.bucket_sizes()
    partly = next((f for f in range(GPUS_PER_NODE - 1, 0, -1) if sizes[f]), 0)
    return GPUS_PER_NODE * sizes[GPUS_PER_NODE] + partly


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """The numbers a capacity page shows for a pool."""

    pool_id: str
    nodes: int
    schedulable_nodes: int
    schedulable_gpus: int
    free_gpus: int
    #: Launchable workers by GPUs per worker (1, 2, 4, 8).
    launchable: dict[int, int]
    custom_gpus_max: int


def capacity(pool: PoolState) -> PoolCapacity:
    """The pool's capacity now, in O(1) of the number of nodes."""
    return PoolCapacity(
        pool_id=pool.pool_id,
        nodes=len(pool.nodes),
        schedulable_nodes=pool.schedulable_nodes,
        schedulable_gpus=pool.schedulable_gpus,
        free_gpus=pool.free_gpus,
        launchable={k: launchable(pool, k) for k in (1, 2, 4, 8)},
        custom_gpus_max=custom_gpus_max(pool),
    )


@dataclass(frozen=True, slots=True)
class NodeOccupancy:
    """One node: health and which task holds each GPU (None: free)."""

    node: str
    health: Health
    fault: str | None
    free: int
    owners: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class TaskOccupancy:
    """One task's workers in the pool."""

    task_id: str
    run: int
    attempt: int
    priority: int
    resource_type: ResourceType
    gpus: int
    workers: tuple[AllocatedWorker, ...]


@dataclass(frozen=True, slots=True)
class PoolOccupancy:
    """R-05: which tasks hold which GPUs on which node."""

    tasks: tuple[TaskOccupancy, ...]
    nodes: tuple[NodeOccupancy, ...]

    @property
    def allocated_gpus(self) -> int:
        """GPUs held by tasks, on any node."""
        return sum(t.gpus for t in self.tasks)


def occupancy(pool: PoolState) -> PoolOccupancy:
    """Occupancy of every node and task (a listing: linear in the pool's size)."""
    tasks = tuple(
        TaskOccupancy(a.task_id, a.run, a.attempt, a.priority, a.resource_type, a.gpus, a.workers)
        for a in sorted(pool.allocations.values(), key=lambda a: a.seq)
    )
    nodes = tuple(
        NodeOccupancy(n.name, n.health, n.fault, n.free, tuple(n.owners))
        for n in pool.nodes.values()
    )
    return PoolOccupancy(tasks, nodes)


@dataclass(frozen=True, slots=True)
class WaitingTask:
    """One waiting task in the queue load."""

    task_id: str
    position: int
    priority: int
    worker_gpus: tuple[int, ...]
    gpus: int
    waited_s: float


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """R-05: what is waiting, for how many GPUs, and for how long."""

    waiting: int
    gpus: int
    oldest_wait_s: float
    tasks: tuple[WaitingTask, ...]


def queue_load(queue: WaitingQueue, *, now: datetime, limit: int = 100) -> QueueLoad:
    """Totals of the queue, and its first `limit` tasks in queue order."""
    oldest = queue.oldest()
    tasks = []
    for position, task in enumerate(queue, start=1):
        if position > limit:
            break
        request = task.request
        waited = task.waited(now).total_seconds()
        tasks.append(
            WaitingTask(
                task.task_id, position, request.priority, request.worker_gpus, request.gpus, waited
            )
        )
    return QueueLoad(
        waiting=len(queue),
        gpus=queue.gpus,
        oldest_wait_s=oldest.waited(now).total_seconds() if oldest else 0.0,
        tasks=tuple(tasks),
    )
