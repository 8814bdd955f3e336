"""Where a task's workers go (R-06, R-09): the whole gang or nothing.

Policy, chosen to keep fragmentation low:

- workers are placed biggest first;
- each worker goes to the *fullest* schedulable node that still fits it (best
  fit), so small workers fill partly used nodes and whole free nodes stay
  whole for 8-GPU workers;
- among equally full nodes the most recently listed one is taken (a stack),
  which keeps decisions deterministic for a given history of events.

For the shapes a task can have (R-02: every worker the same size; R-04: full
8-GPU workers plus one smaller worker) best fit places a gang whenever any
placement exists, and the number of workers it could place is exactly the
launchable arithmetic of R-03. A gang that does not fit is refused before any
node is looked at, and nothing is held for it.

RDMA (R-09) is allowed only on a RoCE or IB pool and only when every worker
has 8 GPUs; anything else is refused with `RdmaNotAllowed`, never placed.
"""

from __future__ import annotations

from dataclasses import dataclass

from runyard.contracts.pool_events import (
    GPUS_PER_NODE,
    AllocatedWorker,
    ResourceType,
    WorkersAllocated,
)
from runyard.contracts.spec import TaskSpec
from runyard.scheduler.domain.errors import (
    InvalidWorkerShape,
    NoCapacity,
    RdmaNotAllowed,
    UnknownWorkerSpec,
)
from runyard.scheduler.domain.pool import PoolState
from runyard.scheduler.domain.view import FreeView

RDMA_NETWORKS = frozenset({"roce", "ib"})


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What placement needs to know about a task: its workers and constraints."""

    task_id: str
    worker_gpus: tuple[int, ...]
    run: int = 1
    attempt: int = 1
    priority: int = 0
    resource_type: ResourceType = "subscription"
    rdma: bool = False
    #: Nodes this task must not use (a reschedule away from a faulty node).
    exclude: frozenset[str] = frozenset()

    @property
    def gpus(self) -> int:
        """GPUs of all workers together."""
        return sum(self.worker_gpus)


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: every worker of the task on a node, with its GPU indexes."""

    task_id: str
    run: int
    attempt: int
    priority: int
    resource_type: ResourceType
    workers: tuple[AllocatedWorker, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes used, each once, in worker order."""
        return tuple(dict.fromkeys(w.node for w in self.workers))

    def event(self) -> WorkersAllocated:
        """The pool event that records this placement."""
        return WorkersAllocated(
            task_id=self.task_id,
            run=self.run,
            attempt=self.attempt,
            workers=self.workers,
            priority=self.priority,
            resource_type=self.resource_type,
        )


def request_for(
    pool: PoolState, task_id: str, spec: TaskSpec, *, run: int = 1, attempt: int = 1
) -> PlacementRequest:
    """The placement request of a task spec: its spec's GPUs per worker, or R-04's split."""
    spec_gpus = None
    if spec.custom_gpus is None:
        found = pool.specs.get(spec.worker_spec or "")
        if found is None:
            raise UnknownWorkerSpec(pool.pool_id, spec.worker_spec, tuple(pool.specs))
        spec_gpus = found.gpus
    return PlacementRequest(
        task_id=task_id,
        worker_gpus=spec.worker_gpus(spec_gpus),
        run=run,
        attempt=attempt,
        priority=spec.priority,
        resource_type=spec.resource_type,
        rdma=spec.rdma,
    )


def worker_resources(pool: PoolState, spec: TaskSpec, gpus: int) -> tuple[int, int] | None:
    """The CPUs and memory (GiB) of a worker of `spec` with `gpus` GPUs (R-02): those of
    its worker spec; for a custom GPU count (R-04), those of the pool's spec with that
    many GPUs, else the largest spec's per GPU times `gpus` (rounded up). None when the
    pool defines no spec."""
    if spec.custom_gpus is None and (named := pool.specs.get(spec.worker_spec or "")):
        return named.cpus, named.memory_gib
    same = [s for s in pool.specs.values() if s.gpus == gpus]
    if same:
        return same[0].cpus, same[0].memory_gib
    if not pool.specs:
        return None
    big = max(pool.specs.values(), key=lambda s: s.gpus)
    return -(-big.cpus * gpus // big.gpus), -(-big.memory_gib * gpus // big.gpus)


def check_rdma(network: str, worker_gpus: tuple[int, ...]) -> None:
    """R-09: raise RdmaNotAllowed unless the network is RoCE/IB and every worker has 8 GPUs."""
    if network not in RDMA_NETWORKS or any(g != 8 for g in worker_gpus):
        raise RdmaNotAllowed(network, worker_gpus)


def check_request(pool: PoolState, request: PlacementRequest) -> None:
    """Refuse a request that could never be placed in this pool, whatever frees up."""
    shape = request.worker_gpus
    if not shape:
        raise InvalidWorkerShape(shape, "a task needs at least one worker")
    if any(not 1 <= g <= GPUS_PER_NODE for g in shape):
        raise InvalidWorkerShape(shape, f"a worker has 1 to {GPUS_PER_NODE} GPUs (one node)")
    if request.rdma:
        check_rdma(pool.network, shape)


def place(pool: PoolState, request: PlacementRequest) -> Placement:
    """Place the whole gang now, or raise NoCapacity saying how many workers could start."""
    check_request(pool, request)
    view = FreeView(pool)
    placement = place_in(view, request)
    if placement is None:
        raise NoCapacity(request.task_id, request.worker_gpus, can_start(view, request))
    return placement


def can_start(view: FreeView, request: PlacementRequest) -> int:
    """How many of the request's workers could start in the view (its exclusions counted)."""
    if not request.exclude:
        return view.startable(request.worker_gpus)
    taken = _take_workers(view, request, stop_at_first_miss=False)
    _give_back(view, taken)
    return len(taken)


def place_in(view: FreeView, request: PlacementRequest) -> Placement | None:
    """Place the gang in the view (taking its GPUs there), or None with the view unchanged."""
    if not request.exclude and view.startable(request.worker_gpus) < len(request.worker_gpus):
        return None
    taken = _take_workers(view, request, stop_at_first_miss=True)
    if len(taken) < len(request.worker_gpus):
        _give_back(view, taken)
        return None
    return Placement(
        task_id=request.task_id,
        run=request.run,
        attempt=request.attempt,
        priority=request.priority,
        resource_type=request.resource_type,
        workers=tuple(sorted(taken, key=lambda w: w.index)),
    )


def _take_workers(
    view: FreeView, request: PlacementRequest, *, stop_at_first_miss: bool
) -> list[AllocatedWorker]:
    """Best fit, biggest worker first; the workers that found a node."""
    order = sorted(range(len(request.worker_gpus)), key=lambda i: -request.worker_gpus[i])
    taken: list[AllocatedWorker] = []
    for index in order:
        gpus = request.worker_gpus[index]
        node = view.pick(gpus, request.exclude)
        if node is None:
            if stop_at_first_miss:
                break
            continue
        taken.append(AllocatedWorker(index=index, node=node, gpus=view.take(node, gpus)))
    return taken


def _give_back(view: FreeView, workers: list[AllocatedWorker]) -> None:
    for worker in workers:
        view.give(worker.node, worker.gpus)
