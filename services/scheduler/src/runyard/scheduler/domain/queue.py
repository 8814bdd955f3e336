"""The queue of one pool (R-07): order, backfill, reasons and positions.

Order. Reschedules first (R-31: a task moved off a faulty node goes ahead of
new work), then higher priority, then earlier submission, then task id, so the
order is total. A requeued spot task keeps its submission time: preemption was
not its fault, so it goes back where it would have been.

Backfill rule. `plan_queue` walks the queue in order and places every task
that fits. The first task that does not fit is the *head*, and it gets a
reservation in the plan:

1. each of its workers that fits now reserves, best fit, the GPUs it would take;
2. each worker that does not fit reserves every free GPU of the node with the
   most free GPUs (the node that needs the fewest releases before it fits).

Every later task may start only on the free GPUs left after that reservation
(backfill). It never takes a GPU the head is waiting for, so backfill never
delays the head: the head starts as soon as the running tasks on its reserved
nodes release their GPUs, exactly as it would with backfill off. The
reservation is not an allocation: nothing is held in the pool (R-06) and it is
recomputed by every plan. A head that could not start even on an empty pool
(more workers than the pool has nodes) gets no reservation, since waiting for it
would stop the whole queue; its reason says what to change.

Scale. Waiting tasks are indexed by (rank, priority, worker shape, excluded
nodes); within such a group tasks are in submission order and either the first
fits or none does. A plan merges the groups' first tasks in queue order, drops a
group at its first task that does not fit, and stops when no free GPU is left,
so it costs O(groups + placements), not O(queue), even with 100,000 tasks
waiting.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice

from runyard.contracts.spec import SpotOptions
from runyard.scheduler.domain.errors import describe_workers
from runyard.scheduler.domain.placement import Placement, PlacementRequest, can_start, place_in
from runyard.scheduler.domain.pool import PoolState
from runyard.scheduler.domain.view import FreeView, count_startable

#: (rank, -priority, submitted_at, task_id): smaller is earlier in the queue.
QueueKey = tuple[int, int, datetime, str]
_GroupKey = tuple[int, int, tuple[int, ...], frozenset[str]]
_Item = tuple[datetime, str]


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A task waiting in a pool's queue."""

    request: PlacementRequest
    submitted_at: datetime
    #: When this wait began (submission, requeue, reschedule); the spot queue limit counts from it.
    queued_at: datetime
    spot: SpotOptions | None = None
    requeues: int = 0
    reschedule: bool = False

    @property
    def task_id(self) -> str:
        """The waiting task's id."""
        return self.request.task_id

    @property
    def key(self) -> QueueKey:
        """Where the task stands in queue order."""
        rank = 0 if self.reschedule else 1
        return (rank, -self.request.priority, self.submitted_at, self.task_id)

    @property
    def deadline(self) -> datetime | None:
        """When a spot task has waited its max single queue duration (R-08); None otherwise."""
        if self.spot is None:
            return None
        return self.queued_at + timedelta(seconds=self.spot.max_queue_duration_s)

    def waited(self, now: datetime) -> timedelta:
        """How long this wait has lasted at `now`."""
        return now - self.queued_at


class _Group:
    """Tasks of one (rank, priority, shape, exclusions), in submission order."""

    __slots__ = ("items", "key", "start")

    def __init__(self, key: _GroupKey) -> None:
        self.key = key
        self.items: list[_Item] = []
        # Items before `start` were removed from the front: removing the first
        # task (the usual case: it was placed) must not shift the whole list.
        self.start = 0

    def add(self, item: _Item) -> None:
        """Insert in submission order (usually at the end)."""
        insort(self.items, item, lo=self.start)

    def remove(self, item: _Item) -> None:
        """Take an item out; the first one without shifting the list."""
        i = bisect_left(self.items, item, lo=self.start)
        if i == self.start:
            self.start += 1
            if self.start > 64 and 2 * self.start > len(self.items):
                del self.items[: self.start]
                self.start = 0
        else:
            del self.items[i]

    def at(self, i: int) -> _Item | None:
        """The i-th waiting item of the group, or None past the end."""
        j = self.start + i
        return self.items[j] if j < len(self.items) else None

    def count_before(self, item: _Item) -> int:
        """How many items of the group come before `item`."""
        return bisect_left(self.items, item, lo=self.start) - self.start

    def keys(self) -> Iterator[QueueKey]:
        """Queue keys of the group's items, in order."""
        rank, neg_priority = self.key[0], self.key[1]
        for submitted_at, task_id in islice(self.items, self.start, None):
            yield (rank, neg_priority, submitted_at, task_id)

    def __len__(self) -> int:
        return len(self.items) - self.start


class WaitingQueue:
    """The waiting tasks of one pool, indexed for planning, positions and time limits."""

    def __init__(self) -> None:
        self._tasks: dict[str, QueuedTask] = {}
        self._groups: dict[_GroupKey, _Group] = {}
        # Heaps with lazy deletion: (time, task id), valid while the task is queued.
        self._since: list[_Item] = []
        self._deadlines: list[_Item] = []
        self._gpus = 0

    def add(self, task: QueuedTask) -> None:
        """Queue the task (replacing its earlier entry, if any)."""
        self.remove(task.task_id)
        self._tasks[task.task_id] = task
        self._group_of(task, create=True).add((task.submitted_at, task.task_id))
        heapq.heappush(self._since, (task.queued_at, task.task_id))
        if task.deadline is not None:
            heapq.heappush(self._deadlines, (task.deadline, task.task_id))
        self._gpus += task.request.gpus

    def remove(self, task_id: str) -> QueuedTask | None:
        """Take the task out (placed, stopped, abnormal); returns it, or None if absent."""
        task = self._tasks.pop(task_id, None)
        if task is None:
            return None
        group = self._group_of(task)
        group.remove((task.submitted_at, task_id))
        if not group:
            del self._groups[group.key]
        self._gpus -= task.request.gpus
        self._tidy()
        return task

    def get(self, task_id: str) -> QueuedTask | None:
        """The waiting task, or None if it is not queued."""
        return self._tasks.get(task_id)

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __iter__(self) -> Iterator[QueuedTask]:
        """Waiting tasks in queue order."""
        merged = heapq.merge(*(g.keys() for g in self._groups.values()))
        return (self._tasks[key[3]] for key in merged)

    @property
    def gpus(self) -> int:
        """GPUs asked for by all waiting tasks together."""
        return self._gpus

    def head(self) -> QueuedTask | None:
        """The first task in queue order."""
        firsts = [_first_key(g) for g in self._groups.values()]
        return self._tasks[min(firsts)[3]] if firsts else None

    def position(self, task_id: str) -> int:
        """1-based place of the task in queue order (KeyError if it is not queued)."""
        task = self._tasks[task_id]
        rank, neg_priority, submitted_at, _ = task.key
        ahead = 0
        for group in self._groups.values():
            if group.key[:2] < (rank, neg_priority):
                ahead += len(group)
            elif group.key[:2] == (rank, neg_priority):
                ahead += group.count_before((submitted_at, task_id))
        return ahead + 1

    def oldest(self) -> QueuedTask | None:
        """The task that has waited longest in its current wait."""
        while self._since and not self._valid(self._since[0], "queued_at"):
            heapq.heappop(self._since)
        return self._tasks[self._since[0][1]] if self._since else None

    def timed_out(self, now: datetime) -> list[QueuedTask]:
        """Spot tasks past their max single queue duration at `now`, earliest deadline first."""
        found: dict[str, _Item] = {}
        heap, stack = self._deadlines, [0]
        while stack:
            i = stack.pop()
            if i < len(heap) and heap[i][0] <= now:
                if self._valid(heap[i], "deadline"):
                    found[heap[i][1]] = heap[i]
                stack += (2 * i + 1, 2 * i + 2)
        return [self._tasks[t] for _, t in sorted(found.values())]

    def groups(self) -> list[_Group]:
        """The index the planner walks (internal to this package)."""
        return list(self._groups.values())

    def _group_of(self, task: QueuedTask, *, create: bool = False) -> _Group:
        rank, neg_priority, _, _ = task.key
        key = (rank, neg_priority, task.request.worker_gpus, task.request.exclude)
        group = self._groups.get(key)
        if group is None and create:
            group = self._groups[key] = _Group(key)
        assert group is not None
        return group

    def _valid(self, item: _Item, attribute: str) -> bool:
        task = self._tasks.get(item[1])
        return task is not None and getattr(task, attribute) == item[0]

    def _tidy(self) -> None:
        """Rebuild the lazy heaps when stale entries outnumber live ones."""
        if len(self._since) > 2 * len(self._tasks) + 64:
            self._since = [(t.queued_at, t.task_id) for t in self._tasks.values()]
            heapq.heapify(self._since)
            self._deadlines = [
                (t.deadline, t.task_id) for t in self._tasks.values() if t.deadline is not None
            ]
            heapq.heapify(self._deadlines)


def _first_key(group: _Group) -> QueueKey:
    item = group.at(0)
    assert item is not None
    return (group.key[0], group.key[1], item[0], item[1])


@dataclass(frozen=True, slots=True)
class Reservation:
    """What the blocked head task holds back from backfill in one plan (not an allocation)."""

    task_id: str
    #: (node, free GPUs held back on it) for each reserved node.
    nodes: tuple[tuple[str, int], ...]

    @property
    def gpus(self) -> int:
        """GPUs held back in all."""
        return sum(n for _, n in self.nodes)


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """The outcome of one pass over the queue: tasks to place now, and the head's reservation."""

    placements: tuple[Placement, ...]
    reservation: Reservation | None

    @property
    def head(self) -> str | None:
        """The first task that could not start, for which backfill holds GPUs back."""
        return self.reservation.task_id if self.reservation else None


def plan_queue(
    pool: PoolState, queue: WaitingQueue, *, max_placements: int | None = None
) -> QueuePlan:
    """Decide which waiting tasks start now, in queue order, with backfill behind the head.

    Pure: neither the pool nor the queue changes. The caller appends one
    `WorkersAllocated` per placement (and `TaskPlaced`), then removes the
    placed tasks from the queue. Requests are assumed checked (`check_request`)
    when they were queued.
    """
    view = FreeView(pool)
    groups = queue.groups()
    heap = [(_first_key(g), 0, n) for n, g in enumerate(groups)]
    heapq.heapify(heap)
    placements: list[Placement] = []
    reservation: Reservation | None = None
    limit = max_placements if max_placements is not None else len(queue)
    while heap and view.free_gpus > 0 and len(placements) < limit:
        key, i, n = heapq.heappop(heap)
        task = queue.get(key[3])
        assert task is not None
        placement = place_in(view, task.request)
        if placement is not None:
            placements.append(placement)
            _push_next(heap, groups[n], i + 1, n)
        elif reservation is None and _could_ever_start(pool, task.request):
            reservation = _reserve(view, task.request)
    return QueuePlan(tuple(placements), reservation)


def _push_next(heap: list[tuple[QueueKey, int, int]], group: _Group, i: int, n: int) -> None:
    item = group.at(i)
    if item is not None:
        heapq.heappush(heap, ((group.key[0], group.key[1], item[0], item[1]), i, n))


def _could_ever_start(pool: PoolState, request: PlacementRequest) -> bool:
    """Would the workers fit on this pool's schedulable nodes if they were all empty?"""
    return count_startable(pool.size_counts(), request.worker_gpus) == len(request.worker_gpus)


def _reserve(view: FreeView, request: PlacementRequest) -> Reservation:
    """Hold back, in the view, the GPUs the head is waiting for (see the module docstring)."""
    planned: dict[str, int] = {}
    held: dict[str, int] = {}
    unusable = set(request.exclude)
    for gpus in sorted(request.worker_gpus, reverse=True):
        node = view.pick(gpus, unusable) or view.pick_most_free(gpus, unusable)
        if node is None:
            continue
        held[node] = held.get(node, 0) + len(view.take(node, gpus))
        planned[node] = planned.get(node, 0) + gpus
        if view.pool.nodes[node].gpus - planned[node] < gpus:
            unusable.add(node)
    return Reservation(request.task_id, tuple((n, g) for n, g in held.items() if g))


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Why a task waits, where it stands, and how much of it could start now (R-07)."""

    task_id: str
    position: int
    can_start: int
    workers: int
    #: Why it waits, without where it stands (`needs ..., pool can start 2`).
    why: str
    #: The pool could not start it even if idle: it waits for a person, not for capacity.
    blocked: bool = False

    @property
    def ahead(self) -> int:
        """Tasks ahead of it in the queue."""
        return self.position - 1

    @property
    def reason(self) -> str:
        """Why it waits and where it stands: `...; 3 tasks ahead`."""
        return with_place(self.why, self.ahead)


def with_place(why: str, ahead: int) -> str:
    """A waiting reason with the task's place: `why; first in queue` or `why; N tasks ahead`.

    The place is derived from the queue at the moment it is read, so readers
    of the queue read model join it to a stored `why` themselves.
    """
    return f"{why}; {_ahead(ahead)}"


def explain(
    pool: PoolState, queue: WaitingQueue, task_id: str, plan: QueuePlan | None = None
) -> QueueStatus:
    """The status of one waiting task; pass the last plan to name the head it waits behind."""
    task = queue.get(task_id)
    if task is None:
        raise KeyError(task_id)
    return _Explainer(pool, plan).status(task, queue.position(task_id))


def queue_status(
    pool: PoolState, queue: WaitingQueue, plan: QueuePlan | None = None, *, limit: int | None = None
) -> list[QueueStatus]:
    """Statuses of the waiting tasks in queue order (the first `limit` ones)."""
    explainer = _Explainer(pool, plan)
    tasks = islice(queue, limit) if limit is not None else iter(queue)
    return [explainer.status(t, n) for n, t in enumerate(tasks, start=1)]


class _Explainer:
    """Reasons for waiting tasks, computed once per worker shape."""

    def __init__(self, pool: PoolState, plan: QueuePlan | None) -> None:
        self.pool = pool
        self.head = plan.head if plan is not None else None
        self.placed = {p.task_id for p in plan.placements} if plan is not None else set()
        self._shapes: dict[tuple[tuple[int, ...], frozenset[str]], tuple[int, int]] = {}

    def status(self, task: QueuedTask, position: int) -> QueueStatus:
        """The task's status at this position."""
        request = task.request
        startable, most = self._counts(request)
        workers = len(request.worker_gpus)
        why = self._why(request, startable, most)
        return QueueStatus(task.task_id, position, startable, workers, why, most < workers)

    def _counts(self, request: PlacementRequest) -> tuple[int, int]:
        """(workers that could start now, workers that could start on the idle pool)."""
        shape = (request.worker_gpus, request.exclude)
        if shape not in self._shapes:
            now = can_start(FreeView(self.pool), request)
            self._shapes[shape] = (now, count_startable(self.pool.size_counts(), shape[0]))
        return self._shapes[shape]

    def _why(self, request: PlacementRequest, startable: int, most: int) -> str:
        needs = f"needs {describe_workers(request.worker_gpus)}"
        workers = len(request.worker_gpus)
        if request.task_id in self.placed:
            return f"{needs}; placed by this scheduling pass"
        if most < workers:
            return (
                f"{needs}, but the pool's {self.pool.schedulable_nodes} schedulable nodes could "
                f"start only {most} even if idle; reduce the worker count, add nodes or choose "
                "another pool"
            )
        if startable < workers:
            return f"{needs}, pool can start {startable}"
        if self.head is not None and self.head != request.task_id:
            # The head may be another tenant's task: its id is not named here.
            return (
                f"{needs}, pool can start {startable}, but those GPUs are held for the task "
                "at the head of the queue (backfill never delays the head)"
            )
        return f"{needs}, pool can start {startable}; it starts at the next scheduling pass"


def _ahead(ahead: int) -> str:
    if ahead == 0:
        return "first in queue"
    return f"{ahead} task{'s' if ahead != 1 else ''} ahead"
