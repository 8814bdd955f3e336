"""Reschedule a task away from a faulty node (R-31), and release a task's GPUs (R-23).

A reschedule is decided as soon as it is requested, before the queue is
planned again, so it goes ahead of new work. The task's own GPUs on healthy
nodes count as free for it (they are released in the same decision), the
faulty nodes and any node named in `exclude` do not. If the whole gang cannot
be placed on healthy nodes now, the task cannot be recovered: `NoHealthyNode`
says so, and the caller releases its workers and fails the task.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from runyard.contracts.base import Event
from runyard.contracts.pool_events import WorkersReleased
from runyard.scheduler.domain.errors import NoHealthyNode, UnknownAllocation
from runyard.scheduler.domain.placement import Placement, PlacementRequest, can_start, place_in
from runyard.scheduler.domain.pool import Allocation, PoolState
from runyard.scheduler.domain.view import FreeView


@dataclass(frozen=True, slots=True)
class Reschedule:
    """Release the workers, then place them again: two pool events, in this order."""

    release: WorkersReleased
    placement: Placement

    def events(self) -> list[Event]:
        """Pool events in append order."""
        return [self.release, self.placement.event()]


def release(pool: PoolState, task_id: str, reason: str) -> WorkersReleased:
    """The event that gives back every GPU of the task (ended, stopped, preempted)."""
    held = _held(pool, task_id)
    return WorkersReleased(task_id=task_id, run=held.run, attempt=held.attempt, reason=reason)


def plan_reschedule(
    pool: PoolState, task_id: str, *, exclude: Iterable[str] = (), reason: str = "node fault"
) -> Reschedule:
    """Move the task's workers off faulty (and excluded) nodes, as its next attempt."""
    held = _held(pool, task_id)
    view = FreeView(pool)
    for worker in held.workers:
        view.give(worker.node, worker.gpus)
    request = PlacementRequest(
        task_id=task_id,
        worker_gpus=held.worker_gpus,
        run=held.run,
        attempt=held.attempt + 1,
        priority=held.priority,
        resource_type=held.resource_type,
        exclude=_avoid(pool, held, exclude),
    )
    placement = place_in(view, request)
    if placement is None:
        startable = can_start(view, request)
        raise NoHealthyNode(task_id, request.worker_gpus, startable, tuple(sorted(request.exclude)))
    return Reschedule(release(pool, task_id, f"reschedule: {reason}"), placement)


def _held(pool: PoolState, task_id: str) -> Allocation:
    held = pool.allocations.get(task_id)
    if held is None:
        raise UnknownAllocation(task_id)
    return held


def _avoid(pool: PoolState, held: Allocation, exclude: Iterable[str]) -> frozenset[str]:
    """Nodes named by the caller, and the task's nodes that are no longer schedulable."""
    unhealthy = (n for n in held.nodes if not pool.nodes[n].schedulable)
    return frozenset((*exclude, *unhealthy))
