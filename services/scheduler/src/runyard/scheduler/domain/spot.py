"""Spot capacity, preemption and requeue (R-08).

When a spot pool must give nodes back, the scheduler chooses which nodes go
and which running tasks are preempted for that:

- nodes with nothing running go first (faulty, then cordoned, then healthy);
- if that is not enough, running spot tasks are preempted lowest priority
  first, then newest placement first, until enough nodes are empty; a victim
  whose preemption turned out not to be needed (its nodes stay busy anyway) is
  spared again, highest priority first;
- subscription tasks are never preempted, and a subscription pool has no spot
  capacity to shrink.

A preempted task is requeued automatically unless it has reached its max
requeue count; a queued spot task that waits longer than its max single queue
duration is not requeued again. Either way it goes to the abnormal state with
the reason and what a person can do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from runyard.contracts.base import Event
from runyard.contracts.pool_events import SpotCapacityChanged, WorkersReleased
from runyard.contracts.spec import SpotOptions
from runyard.scheduler.domain.errors import InvalidCapacityChange, NotASpotPool
from runyard.scheduler.domain.pool import Allocation, NodeState, PoolState
from runyard.scheduler.domain.queue import QueuedTask, WaitingQueue

#: What a person can do with an abnormal spot task (R-08).
NEXT_STEPS = (
    "retry: rerun the task when spot capacity is back",
    "change the worker spec or zone to one with free capacity",
    "resubmit the task later",
    "move the task to a subscription pool, where tasks are never preempted",
)


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running spot task that loses its workers."""

    task_id: str
    run: int
    attempt: int
    priority: int
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SpotShrink:
    """A spot capacity decrease: the tasks preempted and the nodes given back."""

    preempted: tuple[Preemption, ...]
    removed_nodes: tuple[str, ...]

    def events(self, reason: str = "spot capacity reclaimed") -> list[Event]:
        """Pool events in append order: every release first, then the capacity change."""
        released: list[Event] = [
            WorkersReleased(
                task_id=p.task_id, run=p.run, attempt=p.attempt, reason=f"preempted: {reason}"
            )
            for p in self.preempted
        ]
        change = SpotCapacityChanged(removed=self.removed_nodes, reason=reason)
        return [*released, change]


@dataclass(frozen=True, slots=True)
class Requeue:
    """The preempted task goes back to the queue; `requeues` counts this one."""

    task_id: str
    requeues: int


@dataclass(frozen=True, slots=True)
class Abnormal:
    """The task needs a person: why, and what they can do."""

    task_id: str
    reason: str
    next_steps: tuple[str, ...] = NEXT_STEPS


def plan_spot_shrink(pool: PoolState, *, remove: int) -> SpotShrink:
    """Give back `remove` nodes of a spot pool, preempting as little as the order allows."""
    _check_spot(pool)
    if not 0 < remove <= len(pool.nodes):
        raise InvalidCapacityChange(
            f"cannot give back {remove} nodes: pool {pool.pool_id} has {len(pool.nodes)}"
        )
    idle = _idle_nodes(pool)
    if len(idle) >= remove:
        return SpotShrink((), tuple(idle[:remove]))
    victims, freed = _preempt_until(pool, remove - len(idle))
    return SpotShrink(tuple(_preemption(a) for a in victims), (*idle, *freed[: remove - len(idle)]))


def plan_spot_reclaim(pool: PoolState, nodes: Iterable[str]) -> SpotShrink:
    """The provider takes these nodes back: every task with a worker on them is preempted."""
    _check_spot(pool)
    names = tuple(dict.fromkeys(nodes))
    unknown = [n for n in names if n not in pool.nodes]
    if unknown:
        raise InvalidCapacityChange(f"pool {pool.pool_id} has no nodes {', '.join(unknown)}")
    hit = {o for n in names for o in pool.nodes[n].owners if o is not None}
    victims = sorted((pool.allocations[t] for t in hit), key=_victim_order)
    return SpotShrink(tuple(_preemption(a) for a in victims), names)


def decide_after_preemption(
    task_id: str, *, requeues: int, limits: SpotOptions
) -> Requeue | Abnormal:
    """Requeue a preempted task, unless it was already requeued `max_requeues` times."""
    if requeues >= limits.max_requeues:
        return Abnormal(
            task_id,
            f"preempted {requeues + 1} times: spot capacity was reclaimed and the task "
            f"reached its max requeue count ({limits.max_requeues})",
        )
    return Requeue(task_id, requeues + 1)


def decide_queue_timeout(task: QueuedTask, now: datetime) -> Abnormal | None:
    """Abnormal if the spot task has waited past its max single queue duration at `now`."""
    deadline = task.deadline
    if deadline is None or task.spot is None or now < deadline:
        return None
    waited = int(task.waited(now).total_seconds())
    return Abnormal(
        task.task_id,
        f"waited {_duration(waited)} in the queue, past its max single queue duration "
        f"({_duration(task.spot.max_queue_duration_s)}): spot capacity did not free up",
    )


def timed_out(queue: WaitingQueue, now: datetime) -> list[Abnormal]:
    """Every queued spot task past its max single queue duration at `now`."""
    found = (decide_queue_timeout(t, now) for t in queue.timed_out(now))
    return [a for a in found if a is not None]


def _check_spot(pool: PoolState) -> None:
    if pool.resource_type != "spot":
        raise NotASpotPool(pool.pool_id)


def _idle_nodes(pool: PoolState) -> list[str]:
    """Nodes with nothing running, in the order they are given back."""
    idle = [n for n in pool.nodes.values() if n.free == n.gpus]
    return [n.name for n in sorted(idle, key=_give_back_order)]


def _give_back_order(node: NodeState) -> int:
    return {"faulty": 0, "cordoned": 1, "healthy": 2}[node.health]


def _victim_order(allocation: Allocation) -> tuple[int, int]:
    """Lowest priority first, then the newest placement first."""
    return (allocation.priority, -allocation.seq)


def _preempt_until(pool: PoolState, needed: int) -> tuple[list[Allocation], list[str]]:
    """Victims, in preemption order, and the nodes they leave empty, in order."""
    holders = {name: {o for o in n.owners if o is not None} for name, n in pool.nodes.items()}
    candidates = sorted(
        (a for a in pool.allocations.values() if a.resource_type == "spot"), key=_victim_order
    )
    victims: list[Allocation] = []
    freed: list[str] = []
    for victim in candidates:
        victims.append(victim)
        for name in victim.nodes:
            holders[name].discard(victim.task_id)
            if not holders[name]:
                freed.append(name)
        if len(freed) >= needed:
            return _spare(victims, freed, needed)
    raise InvalidCapacityChange(
        f"preempting every spot task empties only {len(freed)} of the {needed} more nodes "
        "needed; subscription tasks are never preempted"
    )


def _spare(
    victims: list[Allocation], freed: list[str], needed: int
) -> tuple[list[Allocation], list[str]]:
    """Spare victims whose preemption empties no node that is still needed."""
    empty = dict.fromkeys(freed)
    kept: list[Allocation] = []
    for victim in reversed(victims):
        own = [n for n in victim.nodes if n in empty]
        if len(empty) - len(own) >= needed:
            for name in own:
                del empty[name]
        else:
            kept.append(victim)
    return kept[::-1], list(empty)


def _preemption(allocation: Allocation) -> Preemption:
    return Preemption(
        task_id=allocation.task_id,
        run=allocation.run,
        attempt=allocation.attempt,
        priority=allocation.priority,
        nodes=allocation.nodes,
    )


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
