"""The scheduler's pure core: pool state, capacity, placement, queue, spot, reschedule.

Nothing here does I/O, reads a clock or draws a random number: time and ids
come in as arguments, the pool state is a fold of pool events
(`evolve_pool`), and every decision reads that state and returns what to
append. The application layer loads a pool's stream, calls these functions,
appends the events with the stream's expected version, and folds them.

    pool.py        PoolState, evolve_pool: nodes, health, GPU owners, free-GPU buckets
    capacity.py    launchable counts (R-03), custom-count maximum (R-04), occupancy and
                   queue load (R-05)
    placement.py   gang placement, best fit, RDMA rule (R-06, R-09)
    queue.py       queue order, backfill behind the head, reasons and positions (R-07)
    spot.py        spot shrink, preemption order, requeue or abnormal (R-08)
    reschedule.py  reschedule away from faulty nodes (R-31), release (R-23)
    whatif.py      what-if: a window of a pool's history played again on other nodes or
                   with another queue policy, on a virtual clock (R-61)
    history.py     what the log says about that window, as the what-if's input
    errors.py      typed errors with code and hint
"""

from runyard.scheduler.domain.capacity import (
    NodeOccupancy,
    PoolCapacity,
    PoolOccupancy,
    QueueLoad,
    TaskOccupancy,
    WaitingTask,
    capacity,
    custom_gpus_max,
    launchable,
    launchable_by_spec,
    occupancy,
    queue_load,
    startable_workers,
)
from runyard.scheduler.domain.errors import (
    InvalidCapacityChange,
    InvalidRequest,
    InvalidWorkerShape,
    NoCapacity,
    NoHealthyNode,
    NotASpotPool,
    PoolEventRejected,
    RdmaNotAllowed,
    SchedulerError,
    UnknownAllocation,
    UnknownWorkerSpec,
    describe_workers,
)
from runyard.scheduler.domain.placement import (
    Placement,
    PlacementRequest,
    check_rdma,
    check_request,
    place,
    request_for,
    worker_resources,
)
from runyard.scheduler.domain.pool import (
    Allocation,
    Health,
    NodeState,
    PoolState,
    evolve_pool,
    fold_pool,
)
from runyard.scheduler.domain.queue import (
    QueuedTask,
    QueuePlan,
    QueueStatus,
    Reservation,
    WaitingQueue,
    explain,
    plan_queue,
    queue_status,
    with_place,
)
from runyard.scheduler.domain.reschedule import Reschedule, plan_reschedule, release
from runyard.scheduler.domain.spot import (
    NEXT_STEPS,
    Abnormal,
    Preemption,
    Requeue,
    SpotShrink,
    decide_after_preemption,
    decide_queue_timeout,
    plan_spot_reclaim,
    plan_spot_shrink,
    timed_out,
)

__all__ = [
    "NEXT_STEPS",
    "Abnormal",
    "Allocation",
    "Health",
    "InvalidCapacityChange",
    "InvalidRequest",
    "InvalidWorkerShape",
    "NoCapacity",
    "NoHealthyNode",
    "NodeOccupancy",
    "NodeState",
    "NotASpotPool",
    "Placement",
    "PlacementRequest",
    "PoolCapacity",
    "PoolEventRejected",
    "PoolOccupancy",
    "PoolState",
    "Preemption",
    "QueueLoad",
    "QueuePlan",
    "QueueStatus",
    "QueuedTask",
    "RdmaNotAllowed",
    "Requeue",
    "Reschedule",
    "Reservation",
    "SchedulerError",
    "SpotShrink",
    "TaskOccupancy",
    "UnknownAllocation",
    "UnknownWorkerSpec",
    "WaitingQueue",
    "WaitingTask",
    "capacity",
    "check_rdma",
    "check_request",
    "custom_gpus_max",
    "decide_after_preemption",
    "decide_queue_timeout",
    "describe_workers",
    "evolve_pool",
    "explain",
    "fold_pool",
    "launchable",
    "launchable_by_spec",
    "occupancy",
    "place",
    "plan_queue",
    "plan_reschedule",
    "plan_spot_reclaim",
    "plan_spot_shrink",
    "queue_load",
    "queue_status",
    "release",
    "request_for",
    "startable_workers",
    "timed_out",
    "with_place",
    "worker_resources",
]
