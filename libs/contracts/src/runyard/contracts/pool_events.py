"""Events of a resource pool: stream `pool-<pool_id>` (SPEC R-01 to R-09).

A pool's stream says which nodes it has, their health, and which task holds
which GPUs. The scheduler writes allocations and releases; admin changes
(nodes added, removed, cordoned, marked faulty, spot capacity) are decided by
`runyard.scheduler.admin` in whichever process serves the admin API (the
gateway). Every writer appends with the pool stream's expected version, so
two decisions can never both act on the same GPUs. The scheduler's pool state
(`runyard.scheduler.domain.PoolState`) is a fold of these events.

Spot capacity (`SpotCapacityChanged`) is recorded as a *change*: the nodes that
leave the pool and the nodes that join it, not the full list of nodes after the
change. A pool can have 10,000 nodes, and a capacity change usually touches a
few; a delta keeps events small, and it names exactly the nodes whose workers
were preempted, which is what an SRE replaying the log wants to see.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from runyard.contracts.base import Event

ResourceType = Literal["subscription", "spot"]
Network = Literal["roce", "ib", "ethernet"]
WorkerGpus = Literal[1, 2, 4, 8]

#: GPUs of one node (R-01: nodes of 8 GPUs each).
GPUS_PER_NODE = 8


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkerSpec(_Frozen):
    """A predefined worker spec of a pool (R-02): GPUs, CPUs and memory of one worker."""

    name: str = Field(min_length=1)
    gpus: WorkerGpus
    cpus: int = Field(ge=1)
    memory_gib: int = Field(ge=1)


class AllocatedWorker(_Frozen):
    """One worker of a task: its index (its rank), the node and the GPU indexes it holds."""

    index: int = Field(ge=0)
    node: str = Field(min_length=1)
    gpus: tuple[int, ...] = Field(min_length=1)


class _PoolEvent(Event):
    category = "pool"


class PoolRegistered(_PoolEvent):
    """A pool exists: its zone, resource type, GPU model, network and worker specs.

    When: at start, from the pools config file, or through the admin API.
    Emitted by the scheduler; the gateway's pool read model reacts.
    """

    emitted_by = "scheduler"
    reacted_by = ("gateway",)

    pool_id: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    resource_type: ResourceType
    gpu_model: str
    network: Network
    specs: tuple[WorkerSpec, ...] = ()


class NodeAdded(_PoolEvent):
    """A node joins the pool, healthy, with all its GPUs free.

    When: from the pools config file or an admin request. Emitted by the
    scheduler; the scheduler re-plans its queue, the gateway's read model updates.
    """

    emitted_by = "scheduler"
    reacted_by = ("scheduler", "gateway")

    node: str = Field(min_length=1)
    gpus: int = Field(default=GPUS_PER_NODE, ge=1, le=GPUS_PER_NODE)


class NodeRemoved(_PoolEvent):
    """A node leaves the pool.

    When: an admin removes it. The scheduler releases the workers on it first
    (`WorkersReleased`); a fold that still finds an allocation on the node
    releases that whole task's allocation, since a gang cannot run in part.
    """

    emitted_by = "scheduler"
    reacted_by = ("scheduler", "gateway")

    node: str = Field(min_length=1)


class NodeCordoned(_PoolEvent):
    """No new worker may be placed on the node; running workers stay.

    When: an admin cordons it (maintenance). Emitted by the scheduler; the
    gateway's read model shows it.
    """

    emitted_by = "scheduler"
    reacted_by = ("gateway",)

    node: str = Field(min_length=1)


class NodeUncordoned(_PoolEvent):
    """The node takes new workers again.

    When: an admin uncordons it. The scheduler re-plans its queue.
    """

    emitted_by = "scheduler"
    reacted_by = ("scheduler", "gateway")

    node: str = Field(min_length=1)


class NodeMarkedFaulty(_PoolEvent):
    """The node has a hardware fault (e.g. a GPU dropped): nothing new goes there.

    When: an admin or the fault-tolerance service reports it (also how tests
    inject faults). Running workers stay allocated until their task is
    rescheduled (R-31); fault tolerance reacts by requesting the reschedule.
    """

    emitted_by = "scheduler"
    reacted_by = ("faulttolerance", "gateway")

    node: str = Field(min_length=1)
    reason: str = Field(min_length=1)


class NodeMarkedHealthy(_PoolEvent):
    """The node was repaired and takes new workers again.

    When: an admin marks it healthy. The scheduler re-plans its queue; fault
    tolerance no longer moves tasks off it.
    """

    emitted_by = "scheduler"
    reacted_by = ("scheduler", "gateway", "faulttolerance")

    node: str = Field(min_length=1)


class SpotCapacityChanged(_PoolEvent):
    """The capacity of a spot pool changed: `removed` nodes left, `added` nodes joined.

    A change, not the new total (see the module docstring). When capacity
    shrinks, the scheduler first preempts the spot tasks on the nodes it gives
    back (one `WorkersReleased` each, reason `preempted`), then appends this
    event; added nodes come healthy with `gpus_per_node` free GPUs. Emitted by
    the scheduler on an admin (or provider) request; the scheduler re-plans.
    """

    emitted_by = "scheduler"
    reacted_by = ("scheduler", "gateway")

    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    gpus_per_node: int = Field(default=GPUS_PER_NODE, ge=1, le=GPUS_PER_NODE)
    reason: str = ""


class WorkersAllocated(_PoolEvent):
    """A task's workers hold these GPUs: the whole gang, placed at once (R-06).

    When: the scheduler places a task (from the queue, or on a reschedule).
    Appended to the pool stream with its expected version, so two decisions can
    never take the same GPU. The task stream gets `TaskPlaced` for the same
    decision; the deployer reacts to that. `priority` and `resource_type` are
    kept so spot preemption can choose its victims from the pool alone.
    """

    emitted_by = "scheduler"
    reacted_by = ("gateway",)

    task_id: str = Field(min_length=1)
    run: int = Field(ge=1)
    attempt: int = Field(ge=1)
    workers: tuple[AllocatedWorker, ...] = Field(min_length=1)
    priority: int = 0
    resource_type: ResourceType = "subscription"


class WorkersReleased(_PoolEvent):
    """A task's workers no longer hold GPUs.

    When: the task ended, was stopped (R-23), preempted (R-08) or is being
    rescheduled away from a faulty node (R-31). Emitted by the scheduler; the
    scheduler re-plans its queue at once.
    """

    emitted_by = "scheduler"
    reacted_by = ("scheduler", "gateway")

    task_id: str = Field(min_length=1)
    run: int = Field(ge=1)
    attempt: int = Field(ge=1)
    reason: str = Field(min_length=1)


#: Every event of the `pool` category, for the mapper and the event catalogue.
POOL_EVENTS: tuple[type[Event], ...] = (
    PoolRegistered,
    NodeAdded,
    NodeRemoved,
    NodeCordoned,
    NodeUncordoned,
    NodeMarkedFaulty,
    NodeMarkedHealthy,
    SpotCapacityChanged,
    WorkersAllocated,
    WorkersReleased,
)

PoolEvent = (
    PoolRegistered
    | NodeAdded
    | NodeRemoved
    | NodeCordoned
    | NodeUncordoned
    | NodeMarkedFaulty
    | NodeMarkedHealthy
    | SpotCapacityChanged
    | WorkersAllocated
    | WorkersReleased
)
