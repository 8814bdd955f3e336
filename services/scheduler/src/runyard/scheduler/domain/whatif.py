"""What-if scheduling: a window of a pool's history replayed through the pure core.

`simulate` takes what the log says happened to one pool between two instants
(the runs that held GPUs or waited at the start, the runs that arrived, the
node changes, each at its time) and plays it again on other nodes or with
another queue policy, on a virtual clock: no I/O, no clock read, no random
number. The same input gives the same result, placement by placement.

Clock. Events are taken in time order. At one instant, ends and stops go
first (they free GPUs), then node changes, then arrivals; ties keep the input
order. After each instant one planning pass places what the policy allows, as
the scheduler plans after every event it consumes:

    backfill   the scheduler's own rule (`plan_queue`): queue order, and later
               tasks start on GPUs the blocked head does not need
    fifo       strict queue order: the first task that does not fit stops the pass

Durations. A run holds its GPUs in the simulation as long as it held them in
reality (`hold_s`: from each placement to the release that ended it, summed
over the run), wherever and whenever the simulation places it. A run with no
known end (still holding or waiting at the window's end) holds them until the
end of the window. A run that left without being placed (stopped while
waiting, refused, timed out) leaves at the same wall time (`stop_at`); if the
simulation placed it earlier, it runs until then.

Node changes are applied by name with the pool fold; a change that does not
apply to the simulated nodes (a node the changed pool lacks, one it has
already) is skipped and counted. A run whose node is removed waits again with
the hold it has left; a run on a node marked faulty is moved like a
reschedule (first in the queue).

Utilisation is GPU-seconds held over GPU-seconds of the pool's nodes (every
node, whatever its health) between the window's start and end.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from runyard.contracts.base import Event
from runyard.contracts.pool_events import (
    AllocatedWorker,
    NodeMarkedFaulty,
    WorkersAllocated,
    WorkersReleased,
)
from runyard.scheduler.domain.errors import PoolEventRejected
from runyard.scheduler.domain.placement import Placement, PlacementRequest, place_in
from runyard.scheduler.domain.pool import PoolState, evolve_pool, fold_pool
from runyard.scheduler.domain.queue import QueuedTask, WaitingQueue, plan_queue
from runyard.scheduler.domain.reschedule import release
from runyard.scheduler.domain.view import FreeView

Policy = Literal["backfill", "fifo"]
POLICIES: Final[tuple[Policy, ...]] = ("backfill", "fifo")
#: Order of event kinds at one instant: what frees GPUs first.
_END, _STOP, _NODE, _ARRIVAL = range(4)


@dataclass(frozen=True, slots=True)
class SimRun:
    """One run of a task, as the simulation plays it."""

    #: Unique among the runs (`<task>/<run>`); the request's task id is this key.
    key: str
    spec: str
    request: PlacementRequest
    #: Queue order (a requeue keeps it), and when this wait began (waits count from it).
    submitted_at: datetime
    arrived_at: datetime
    #: Seconds of GPU holding it needs; None: until the window's end (or `stop_at`).
    hold_s: float | None = None
    #: When it left in reality without running on (a stop while waiting): same wall time.
    stop_at: datetime | None = None
    #: Its workers at the window's start, when it held GPUs then.
    held: tuple[AllocatedWorker, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeChange:
    """A pool event that changes nodes (added, removed, cordoned, health, spot), at its time."""

    at: datetime
    event: Event


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one run in the simulation."""

    key: str
    placed_at: datetime | None = None
    #: Left the queue without being placed (stopped while waiting).
    left_at: datetime | None = None
    #: It could not be placed where it held GPUs at the start, and waited again.
    displaced: bool = False


@dataclass(slots=True)
class Usage:
    """GPU-seconds held (in all and by spec) and GPU-seconds of the pool's nodes."""

    held_s: float = 0.0
    capacity_s: float = 0.0
    by_spec: dict[str, float] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        """Held over capacity, 0 when the pool had no GPU."""
        return self.held_s / self.capacity_s if self.capacity_s else 0.0


class UsageMeter:
    """Integrates a pool's held and total GPUs over time. Every change of the pool goes
    through `apply`, which keeps the totals as they change, so `advance` costs the
    number of specs, not of allocations or nodes."""

    def __init__(self, start: datetime, pool: PoolState, labels: Mapping[str, str]) -> None:
        self.usage = Usage()
        self.labels = labels
        self._last = start
        self._capacity = sum(n.gpus for n in pool.nodes.values())
        self._held: dict[str, int] = {}
        for allocation in pool.allocations.values():
            self._count(allocation.task_id, allocation.gpus)

    def advance(self, now: datetime) -> None:
        """Count the time since the last call with the totals as they were during it."""
        seconds = (now - self._last).total_seconds()
        if seconds <= 0:
            return
        self._last = now
        self.usage.capacity_s += seconds * self._capacity
        for label, gpus in self._held.items():
            self.usage.held_s += gpus * seconds
            self.usage.by_spec[label] = self.usage.by_spec.get(label, 0.0) + gpus * seconds

    def apply(self, pool: PoolState, event: Event) -> None:
        """Fold `event` into `pool` (PoolEventRejected as the fold raises it), keeping the
        totals: allocations added and gone, and the nodes' GPUs after a node change."""
        if isinstance(event, WorkersAllocated | WorkersReleased):
            held = pool.allocations.get(event.task_id)
            before = {event.task_id: held} if held is not None else {}
        else:
            before = dict(pool.allocations)
        evolve_pool(pool, event)
        for key, allocation in before.items():
            if pool.allocations.get(key) is not allocation:
                self._count(key, -allocation.gpus)
        if isinstance(event, WorkersAllocated):
            self._count(event.task_id, pool.allocations[event.task_id].gpus)
        elif not isinstance(event, WorkersReleased):
            self._capacity = sum(n.gpus for n in pool.nodes.values())

    def _count(self, task_id: str, gpus: int) -> None:
        label = self.labels.get(task_id, "?")
        self._held[label] = self._held.get(label, 0) + gpus


def real_usage(
    start_state: PoolState,
    changes: Iterable[tuple[datetime, Event]],
    *,
    start: datetime,
    end: datetime,
    labels: Mapping[str, str],
) -> Usage:
    """The usage the log records: the pool at `start`, then its events up to `end`."""
    meter = UsageMeter(start, start_state, labels)
    for at, event in changes:
        meter.advance(min(max(at, start), end))
        meter.apply(start_state, event)
    meter.advance(end)
    return meter.usage


@dataclass(frozen=True, slots=True)
class SimResult:
    """Each run's outcome, the pool's usage, and the node changes that did not apply."""

    outcomes: dict[str, Outcome]
    usage: Usage
    skipped_changes: int


def simulate(
    setup: Sequence[Event],
    runs: Sequence[SimRun],
    changes: Sequence[NodeChange],
    *,
    start: datetime,
    end: datetime,
    policy: Policy = "backfill",
) -> SimResult:
    """Play the window [start, end] on the pool that `setup` (its registration and
    nodes) folds into; see the module docstring for the rules."""
    return _Simulation(fold_pool(setup), runs, start, end, policy).run(changes)


class _Simulation:
    def __init__(
        self,
        pool: PoolState,
        runs: Sequence[SimRun],
        start: datetime,
        end: datetime,
        policy: Policy,
    ) -> None:
        self.pool = pool
        self.runs = {r.key: r for r in runs}
        self.start, self.end, self.policy = start, end, policy
        self.queue = WaitingQueue()
        self.meter = UsageMeter(start, pool, {r.key: r.spec for r in runs})
        self.outcomes = {r.key: Outcome(r.key) for r in runs}
        self.left = {r.key: r.hold_s for r in runs}
        self.since: dict[str, datetime] = {}
        self.generation: dict[str, int] = {}
        self.attempts: dict[str, int] = {}
        self.skipped = 0
        self._heap: list[tuple[datetime, int, int, object]] = []
        self._seq = 0

    def run(self, changes: Sequence[NodeChange]) -> SimResult:
        for sim_run in self.runs.values():
            if sim_run.held:
                self._resume(sim_run)
            elif sim_run.arrived_at <= self.start:
                self._enqueue(sim_run, self.start)
            else:
                self._push(sim_run.arrived_at, _ARRIVAL, sim_run.key)
            if sim_run.stop_at is not None:
                self._push(max(sim_run.stop_at, self.start), _STOP, sim_run.key)
        for change in changes:
            self._push(max(change.at, self.start), _NODE, change.event)
        self._plan(self.start)
        while self._heap and self._heap[0][0] <= self.end:
            now = self._heap[0][0]
            self.meter.advance(now)
            while self._heap and self._heap[0][0] == now:
                _, kind, _, item = heapq.heappop(self._heap)
                self._handle(kind, item, now)
            self._plan(now)
        self.meter.advance(self.end)
        return SimResult(self.outcomes, self.meter.usage, self.skipped)

    def _push(self, at: datetime, kind: int, item: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, kind, self._seq, item))

    def _handle(self, kind: int, item: object, now: datetime) -> None:
        if isinstance(item, Event):
            self._change(item, now)
        elif isinstance(item, tuple):
            key, generation = item
            if self.generation.get(key) == generation:  # not moved or stopped since
                self._release(key, now)
        elif kind == _STOP:
            self._stop(str(item), now)
        else:
            self._enqueue(self.runs[str(item)], now)

    # -- runs ------------------------------------------------------------------------

    def _resume(self, sim_run: SimRun) -> None:
        """A run that held GPUs at the start keeps its nodes when the simulated pool has
        them free, else is placed best fit, else waits again (displaced)."""
        event = _allocated(sim_run.request, sim_run.held)
        try:
            self.meter.apply(self.pool, event)
        except PoolEventRejected:
            placement = place_in(FreeView(self.pool), sim_run.request)
            if placement is None:
                self.outcomes[sim_run.key] = replace(self.outcomes[sim_run.key], displaced=True)
                self._enqueue(sim_run, self.start, reschedule=True)
                return
            event = placement.event()
            self.meter.apply(self.pool, event)
        self._started(sim_run.key, self.start, count=False)

    def _enqueue(self, sim_run: SimRun, now: datetime, *, reschedule: bool = False) -> None:
        if self.outcomes[sim_run.key].left_at is not None:
            return
        self.queue.add(
            QueuedTask(
                request=sim_run.request,
                submitted_at=sim_run.submitted_at,
                queued_at=now,
                reschedule=reschedule,
            )
        )

    def _plan(self, now: datetime) -> None:
        for placement in self._placements():
            self.queue.remove(placement.task_id)
            attempt = self.attempts.get(placement.task_id, 0) + 1
            self.meter.apply(self.pool, replace(placement, attempt=attempt).event())
            self._started(placement.task_id, now, count=True)

    def _placements(self) -> Sequence[Placement]:
        if self.policy == "backfill":
            planned: Sequence[Placement] = plan_queue(self.pool, self.queue).placements
            return planned
        view, placed = FreeView(self.pool), list[Placement]()
        for task in self.queue:
            placement = place_in(view, task.request)
            if placement is None:
                break
            placed.append(placement)
        return placed

    def _started(self, key: str, now: datetime, *, count: bool) -> None:
        self.attempts[key] = self.pool.allocations[key].attempt
        outcome = self.outcomes[key]
        if count and outcome.placed_at is None:
            self.outcomes[key] = replace(outcome, placed_at=now)
        self.since[key] = now
        generation = self.generation[key] = self.generation.get(key, 0) + 1
        left = self.left[key]
        if left is not None:
            self._push(now + timedelta(seconds=left), _END, (key, generation))

    def _release(self, key: str, now: datetime) -> None:
        """Give back the run's GPUs; the hold it has left is kept (for a requeue)."""
        self.generation[key] = self.generation.get(key, 0) + 1
        left = self.left[key]
        if left is not None:
            self.left[key] = max(0.0, left - (now - self.since[key]).total_seconds())
        if key in self.pool.allocations:
            self.meter.apply(self.pool, release(self.pool, key, "what-if"))

    def _stop(self, key: str, now: datetime) -> None:
        """The run stops at the wall time it stopped in reality: out of the queue (it
        left without a placement, unless it had one before), or its GPUs given back."""
        if key in self.pool.allocations:
            self._release(key, now)
            return
        self.queue.remove(key)
        outcome = self.outcomes[key]
        if outcome.placed_at is None and key not in self.since:
            self.outcomes[key] = replace(outcome, left_at=now)

    # -- nodes -------------------------------------------------------------------------

    def _change(self, event: Event, now: datetime) -> None:
        before = dict(self.pool.allocations)
        try:
            self.meter.apply(self.pool, event)
        except PoolEventRejected:
            self.skipped += 1
            return
        lost = [key for key in before if key not in self.pool.allocations]
        if isinstance(event, NodeMarkedFaulty):
            lost += [
                key
                for key, held in before.items()
                if key in self.pool.allocations and event.node in held.nodes
            ]
        for key in lost:
            self._release(key, now)  # a removed node's fold already took the GPUs back
            self._enqueue(self.runs[key], now, reschedule=isinstance(event, NodeMarkedFaulty))


def _allocated(request: PlacementRequest, workers: tuple[AllocatedWorker, ...]) -> WorkersAllocated:
    return WorkersAllocated(
        task_id=request.task_id,
        run=request.run,
        attempt=1,
        workers=workers,
        priority=request.priority,
        resource_type=request.resource_type,
    )


# -- statistics ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wait:
    """One run's wait: from its arrival to its placement, or still waiting at the end,
    or gone without a placement (not counted in the percentiles)."""

    arrived_at: datetime
    placed_at: datetime | None
    left: bool = False


@dataclass(frozen=True, slots=True)
class WaitStats:
    """Queue-time percentiles (nearest rank, seconds) of placed runs and of runs still
    waiting at the end (their wait so far counts: a lower bound)."""

    runs: int
    placed: int
    waiting_at_end: int
    left_queue: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    mean_s: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "runs": self.runs,
            "placed": self.placed,
            "waiting_at_end": self.waiting_at_end,
            "left_queue": self.left_queue,
            "p50_s": self.p50_s,
            "p90_s": self.p90_s,
            "p99_s": self.p99_s,
            "max_s": self.max_s,
            "mean_s": self.mean_s,
        }


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of ascending values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def wait_stats(waits: Iterable[Wait], end: datetime) -> WaitStats:
    """Percentiles of the waits; a run still waiting counts with its wait up to `end`."""
    values: list[float] = []
    runs = placed = waiting = left = 0
    for wait in waits:
        runs += 1
        if wait.left:
            left += 1
            continue
        if wait.placed_at is None:
            waiting += 1
        else:
            placed += 1
        stop = wait.placed_at if wait.placed_at is not None else end
        values.append(max(0.0, (stop - wait.arrived_at).total_seconds()))
    values.sort()

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return WaitStats(
        runs=runs,
        placed=placed,
        waiting_at_end=waiting,
        left_queue=left,
        p50_s=rounded(percentile(values, 50)),
        p90_s=rounded(percentile(values, 90)),
        p99_s=rounded(percentile(values, 99)),
        max_s=rounded(values[-1] if values else None),
        mean_s=rounded(sum(values) / len(values) if values else None),
    )


__all__ = [
    "POLICIES",
    "NodeChange",
    "Outcome",
    "Policy",
    "SimResult",
    "SimRun",
    "Usage",
    "UsageMeter",
    "Wait",
    "WaitStats",
    "percentile",
    "real_usage",
    "simulate",
    "wait_stats",
]
