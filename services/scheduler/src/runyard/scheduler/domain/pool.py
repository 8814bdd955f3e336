"""A pool's state as a fold of its events (R-01, R-05).

`evolve_pool(state, event)` applies one pool event. The state keeps, besides
the nodes and who holds each GPU, an index that capacity and placement read
without scanning nodes: schedulable nodes (healthy and not cordoned) bucketed
by their number of free GPUs, 0 to 8. Every event moves at most the nodes it
names between buckets, so a launchable count is a sum over 9 buckets and
picking the best-fitting node is a look at the top of a bucket, whether the
pool has 8 nodes or 10,000.

The state is mutable and owned by its fold: `evolve_pool` changes it in place
and returns it. Copying a 10,000-node pool for every placement would cost more
than the placement itself. The fold is still pure in the sense that matters
for replay: no I/O, no clock, no randomness, and the same events give the same
state, bucket order included. Decisions (placement, queue, spot) only read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import singledispatch
from typing import Literal

from runyard.contracts.base import Event
from runyard.contracts.pool_events import (
    GPUS_PER_NODE,
    AllocatedWorker,
    Network,
    NodeAdded,
    NodeCordoned,
    NodeMarkedFaulty,
    NodeMarkedHealthy,
    NodeRemoved,
    NodeUncordoned,
    PoolRegistered,
    ResourceType,
    SpotCapacityChanged,
    WorkersAllocated,
    WorkerSpec,
    WorkersReleased,
)
from runyard.scheduler.domain.errors import PoolEventRejected

Health = Literal["healthy", "faulty", "cordoned"]


class NodeStack:
    """An ordered set of node names with O(1) add, remove and look at the top."""

    __slots__ = ("_items", "_pos")

    def __init__(self) -> None:
        self._items: list[str] = []
        self._pos: dict[str, int] = {}

    def add(self, name: str) -> None:
        """Put `name` on top."""
        self._pos[name] = len(self._items)
        self._items.append(name)

    def discard(self, name: str) -> None:
        """Remove `name` if present; the last node takes its slot."""
        i = self._pos.pop(name, None)
        if i is None:
            return
        last = self._items.pop()
        if last != name:
            self._items[i] = last
            self._pos[last] = i

    def from_top(self, depth: int) -> str | None:
        """The node `depth` places below the top, or None past the bottom."""
        return self._items[-1 - depth] if depth < len(self._items) else None

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._pos

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)


@dataclass(slots=True)
class NodeState:
    """One node: its GPUs, who holds each of them, and its health."""

    name: str
    gpus: int
    #: Task id holding each GPU index, or None when free.
    owners: list[str | None]
    free: int
    #: Why the node is faulty, or None when it is not.
    fault: str | None = None
    cordoned: bool = False

    @classmethod
    def new(cls, name: str, gpus: int = GPUS_PER_NODE) -> NodeState:
        """A healthy node with every GPU free."""
        return cls(name=name, gpus=gpus, owners=[None] * gpus, free=gpus)

    @property
    def health(self) -> Health:
        """`faulty` wins over `cordoned`: a faulty node needs repair either way."""
        if self.fault is not None:
            return "faulty"
        return "cordoned" if self.cordoned else "healthy"

    @property
    def schedulable(self) -> bool:
        """New workers may go here: healthy and not cordoned."""
        return self.fault is None and not self.cordoned

    def free_indexes(self) -> list[int]:
        """Indexes of the free GPUs, lowest first."""
        return [i for i, owner in enumerate(self.owners) if owner is None]


@dataclass(frozen=True, slots=True)
class Allocation:
    """The GPUs a task's workers hold in the pool (one gang, placed at once)."""

    task_id: str
    run: int
    attempt: int
    priority: int
    resource_type: ResourceType
    workers: tuple[AllocatedWorker, ...]
    #: Order of placement in this pool: higher is newer (spot preempts newest first).
    seq: int

    @property
    def gpus(self) -> int:
        """GPUs held in all."""
        return sum(len(w.gpus) for w in self.workers)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes the workers are on, each once, in worker order."""
        return tuple(dict.fromkeys(w.node for w in self.workers))

    @property
    def worker_gpus(self) -> tuple[int, ...]:
        """GPUs of each worker, in worker-index order."""
        return tuple(len(w.gpus) for w in sorted(self.workers, key=lambda w: w.index))


@dataclass(slots=True)
class PoolState:
    """Everything the scheduler knows about one pool; build it with `evolve_pool`."""

    pool_id: str = ""
    zone: str = ""
    resource_type: ResourceType = "subscription"
    gpu_model: str = ""
    network: Network = "ethernet"
    specs: dict[str, WorkerSpec] = field(default_factory=dict)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    registered: bool = False
    _buckets: list[NodeStack] = field(
        default_factory=lambda: [NodeStack() for _ in range(GPUS_PER_NODE + 1)]
    )
    _sizes: list[int] = field(default_factory=lambda: [0] * (GPUS_PER_NODE + 1))
    _capacity: int = 0
    _free: int = 0
    _seq: int = 0

    @property
    def schedulable_gpus(self) -> int:
        """GPUs of healthy, non-cordoned nodes (free or not)."""
        return self._capacity

    @property
    def free_gpus(self) -> int:
        """Free GPUs on healthy, non-cordoned nodes."""
        return self._free

    def bucket(self, free: int) -> NodeStack:
        """Schedulable nodes with exactly `free` free GPUs."""
        return self._buckets[free]

    def bucket_sizes(self) -> tuple[int, ...]:
        """How many schedulable nodes have 0, 1, ... 8 free GPUs."""
        return tuple(len(b) for b in self._buckets)

    def size_counts(self) -> tuple[int, ...]:
        """How many schedulable nodes have 0, 1, ... 8 GPUs in all: the pool if it were empty."""
        return tuple(self._sizes)

    @property
    def schedulable_nodes(self) -> int:
        """Healthy, non-cordoned nodes."""
        return sum(self._sizes)

    def node(self, name: str, event_type: str) -> NodeState:
        """The node, or PoolEventRejected naming the event that asked for it."""
        found = self.nodes.get(name)
        if found is None:
            raise PoolEventRejected(event_type, f"pool {self.pool_id} has no node {name!r}")
        return found

    def unlist(self, node: NodeState) -> None:
        """Take the node out of the index before changing it."""
        if node.schedulable:
            self._buckets[node.free].discard(node.name)
            self._sizes[node.gpus] -= 1
            self._capacity -= node.gpus
            self._free -= node.free

    def relist(self, node: NodeState) -> None:
        """Put the node back into the index after changing it."""
        if node.schedulable:
            self._buckets[node.free].add(node.name)
            self._sizes[node.gpus] += 1
            self._capacity += node.gpus
            self._free += node.free

    def next_seq(self) -> int:
        """The placement order number of the next allocation."""
        self._seq += 1
        return self._seq


def evolve_pool(state: PoolState, event: Event) -> PoolState:
    """Apply one pool event to `state` (in place) and return it."""
    _apply(event, state)
    return state


def fold_pool(events: Iterable[Event], state: PoolState | None = None) -> PoolState:
    """The state after `events`, from an empty pool unless `state` is given."""
    state = state if state is not None else PoolState()
    for event in events:
        _apply(event, state)
    return state


@singledispatch
def _apply(event: Event, state: PoolState) -> None:
    raise PoolEventRejected(event.type_name(), "not a pool event")


@_apply.register
def _(event: PoolRegistered, state: PoolState) -> None:
    state.pool_id = event.pool_id
    state.zone = event.zone
    state.resource_type = event.resource_type
    state.gpu_model = event.gpu_model
    state.network = event.network
    state.specs = {spec.name: spec for spec in event.specs}
    state.registered = True


@_apply.register
def _(event: NodeAdded, state: PoolState) -> None:
    _add_node(state, event.node, event.gpus, event.type_name())


@_apply.register
def _(event: NodeRemoved, state: PoolState) -> None:
    _remove_node(state, event.node, event.type_name())


@_apply.register
def _(event: NodeCordoned, state: PoolState) -> None:
    _unlisted(state, event.node, event).cordoned = True
    state.relist(state.nodes[event.node])


@_apply.register
def _(event: NodeUncordoned, state: PoolState) -> None:
    _unlisted(state, event.node, event).cordoned = False
    state.relist(state.nodes[event.node])


@_apply.register
def _(event: NodeMarkedFaulty, state: PoolState) -> None:
    _unlisted(state, event.node, event).fault = event.reason
    state.relist(state.nodes[event.node])


@_apply.register
def _(event: NodeMarkedHealthy, state: PoolState) -> None:
    _unlisted(state, event.node, event).fault = None
    state.relist(state.nodes[event.node])


@_apply.register
def _(event: SpotCapacityChanged, state: PoolState) -> None:
    for name in event.removed:
        _remove_node(state, name, event.type_name())
    for name in event.added:
        _add_node(state, name, event.gpus_per_node, event.type_name())


@_apply.register
def _(event: WorkersAllocated, state: PoolState) -> None:
    if event.task_id in state.allocations:
        raise PoolEventRejected(event.type_name(), f"task {event.task_id} already holds GPUs")
    _check_free(state, event)
    for worker in event.workers:
        _set_owner(state, worker, event.task_id)
    state.allocations[event.task_id] = Allocation(
        task_id=event.task_id,
        run=event.run,
        attempt=event.attempt,
        priority=event.priority,
        resource_type=event.resource_type,
        workers=event.workers,
        seq=state.next_seq(),
    )


@_apply.register
def _(event: WorkersReleased, state: PoolState) -> None:
    held = state.allocations.get(event.task_id)
    # Releasing twice (a stop racing the task's end) or an older attempt is a no-op.
    if held is not None and (held.run, held.attempt) == (event.run, event.attempt):
        _release(state, event.task_id)


def _release(state: PoolState, task_id: str) -> None:
    """Give back every GPU of the task's allocation (part of the fold)."""
    held = state.allocations.pop(task_id)
    for worker in held.workers:
        node = state.nodes.get(worker.node)
        if node is not None:
            _set_owner(state, worker, None, node)


def _add_node(state: PoolState, name: str, gpus: int, event_type: str) -> None:
    if name in state.nodes:
        raise PoolEventRejected(event_type, f"node {name!r} is already in the pool")
    node = NodeState.new(name, gpus)
    state.nodes[name] = node
    state.relist(node)


def _remove_node(state: PoolState, name: str, event_type: str) -> None:
    node = state.node(name, event_type)
    # A gang cannot run in part: a task with a worker here loses all its GPUs.
    for task_id in dict.fromkeys(o for o in node.owners if o is not None):
        _release(state, task_id)
    state.unlist(node)
    del state.nodes[name]


def _unlisted(state: PoolState, name: str, event: Event) -> NodeState:
    """The node, taken out of the index so the caller can change its health."""
    node = state.node(name, event.type_name())
    state.unlist(node)
    return node


def _check_free(state: PoolState, event: WorkersAllocated) -> None:
    seen: set[tuple[str, int]] = set()
    for worker in event.workers:
        node = state.node(worker.node, event.type_name())
        for gpu in worker.gpus:
            if not 0 <= gpu < node.gpus or (worker.node, gpu) in seen:
                raise PoolEventRejected(event.type_name(), f"GPU {worker.node}/{gpu} is invalid")
            if node.owners[gpu] is not None:
                raise PoolEventRejected(
                    event.type_name(),
                    f"GPU {worker.node}/{gpu} is already held by task {node.owners[gpu]}",
                )
            seen.add((worker.node, gpu))


def _set_owner(
    state: PoolState, worker: AllocatedWorker, owner: str | None, node: NodeState | None = None
) -> None:
    node = node if node is not None else state.nodes[worker.node]
    state.unlist(node)
    for gpu in worker.gpus:
        node.owners[gpu] = owner
    node.free += -len(worker.gpus) if owner is not None else len(worker.gpus)
    state.relist(node)
