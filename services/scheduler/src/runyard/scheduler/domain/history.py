"""What the log says about one pool's window, as the what-if simulation's input.

Pure, like the rest of the domain: the caller reads the pool stream and the
task streams of the pool's tasks and passes their events in.

- `runs_of`: the runs of one task stream (submission or rerun, placement,
  preemption, end), each with its arrival, first placement and end;
- `pool_holds`: how long each (task, run) held GPUs in the window, from the
  pool stream's allocations and releases (what the simulation replays);
- `sim_runs`: the runs not ended by the window's start, as `SimRun`s (a run the
  pool cannot place is left out and counted);
- `setup_events`: the simulated pool at the start: the log's registration, the
  given nodes (or the real ones), with the health those nodes had then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from runyard.contracts.base import Event
from runyard.contracts.envelope import RecordedEvent
from runyard.contracts.pool_events import (
    NodeAdded,
    NodeCordoned,
    NodeMarkedFaulty,
    PoolRegistered,
    WorkersAllocated,
    WorkersReleased,
)
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    TaskFailed,
    TaskMarkedAbnormal,
    TaskPlaced,
    TaskPreempted,
    TaskRerunRequested,
    TaskStopped,
    TaskSubmitted,
    TaskSucceeded,
)
from runyard.scheduler.domain.errors import InvalidRequest
from runyard.scheduler.domain.placement import check_request, request_for
from runyard.scheduler.domain.pool import PoolState
from runyard.scheduler.domain.whatif import SimRun

_TERMINAL = (TaskSucceeded, TaskFailed, TaskStopped, TaskMarkedAbnormal)


@dataclass
class RunHistory:
    """One run of a task as the log tells it, within the window."""

    task_id: str
    run: int
    spec: TaskSpec
    submitted_at: datetime
    arrived_at: datetime
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    hold_s: float = 0.0
    holding_since: datetime | None = None

    @property
    def key(self) -> str:
        return f"{self.task_id}/{self.run}"

    def hold(self, at: datetime) -> None:
        """Placed (a reschedule's new placement continues the same hold)."""
        if self.holding_since is None:
            self.holding_since = at
        if self.placed_at is None:
            self.placed_at = at

    def free(self, at: datetime, start: datetime) -> None:
        """Its workers are gone (preempted, ended): count the hold since `start`."""
        if self.holding_since is not None:
            self.hold_s += max(0.0, (at - max(self.holding_since, start)).total_seconds())
            self.holding_since = None


def runs_of(events: Sequence[RecordedEvent[Event]], start: datetime) -> list[RunHistory]:
    """The runs of one task stream (its events up to the window's end), as held time
    counted from `start`."""
    runs: list[RunHistory] = []
    submitted: datetime | None = None
    for recorded in events:
        event, at = recorded.event, recorded.occurred_at
        if isinstance(event, TaskSubmitted):
            submitted = at
            runs.append(RunHistory(event.task_id, 1, event.spec, at, at))
        elif isinstance(event, TaskRerunRequested) and runs:
            runs.append(RunHistory(runs[0].task_id, event.run, event.spec, submitted or at, at))
        elif not runs:
            continue
        elif isinstance(event, TaskPlaced):
            runs[-1].hold(at)
        elif isinstance(event, TaskPreempted):
            runs[-1].free(at, start)
        elif isinstance(event, _TERMINAL):
            runs[-1].free(at, start)
            runs[-1].ended_at = at
    return runs


def pool_holds(
    start_state: PoolState,
    changes: Sequence[tuple[datetime, Event]],
    start: datetime,
    end: datetime,
) -> dict[tuple[str, int], float]:
    """Seconds each (task, run) held GPUs in the window, from the pool stream: from its
    allocation (or `start`) to its release (or `end`). The pool's own record, so the
    simulated pool frees GPUs when the real one did, not when the task's end was stamped."""
    since = {(a.task_id, a.run): start for a in start_state.allocations.values()}
    held: dict[tuple[str, int], float] = {}
    for at, event in changes:
        if isinstance(event, WorkersAllocated):
            since.setdefault((event.task_id, event.run), at)
        elif isinstance(event, WorkersReleased) and (event.task_id, event.run) in since:
            key = (event.task_id, event.run)
            held[key] = held.get(key, 0.0) + (at - since.pop(key)).total_seconds()
    for key, at in since.items():
        held[key] = held.get(key, 0.0) + (end - at).total_seconds()
    return held


def spec_label(spec: TaskSpec) -> str:
    """How a run's worker spec is named in the answer: the pool's spec, or `custom-N`."""
    return spec.worker_spec or f"custom-{spec.custom_gpus}"


def sim_runs(
    pool: PoolState, runs: Sequence[RunHistory], start: datetime
) -> tuple[list[RunHistory], list[SimRun], int]:
    """The runs the simulation plays (those not ended by `start`), their inputs, and how
    many were left out because the pool cannot place their spec."""
    kept, played, skipped = [], [], 0
    for history in runs:
        if history.ended_at is not None and history.ended_at <= start:
            continue
        try:
            request = request_for(pool, history.key, history.spec, run=history.run)
            check_request(pool, request)
        except InvalidRequest:
            skipped += 1
            continue
        held = pool.allocations.get(history.task_id)
        ended = history.ended_at is not None
        kept.append(history)
        played.append(
            SimRun(
                key=history.key,
                spec=spec_label(history.spec),
                request=request,
                submitted_at=history.submitted_at,
                arrived_at=history.arrived_at,
                hold_s=history.hold_s if ended and history.placed_at is not None else None,
                stop_at=history.ended_at if ended and history.placed_at is None else None,
                held=held.workers if held is not None and held.run == history.run else (),
            )
        )
    return kept, played, skipped


def setup_events(real: PoolState, nodes: Sequence[tuple[str, int]] | None) -> list[Event]:
    """The simulated pool at the start: the log's registration, the given nodes (or the
    real ones), each with the health the node of that name had then."""
    registered = PoolRegistered(
        pool_id=real.pool_id,
        zone=real.zone,
        resource_type=real.resource_type,
        gpu_model=real.gpu_model,
        network=real.network,
        specs=tuple(real.specs.values()),
    )
    listed = nodes if nodes is not None else [(n.name, n.gpus) for n in real.nodes.values()]
    events: list[Event] = [registered]
    for name, gpus in listed:
        events.append(NodeAdded(node=name, gpus=gpus))
        was = real.nodes.get(name)
        if was is not None and was.fault is not None:
            events.append(NodeMarkedFaulty(node=name, reason=was.fault))
        if was is not None and was.cordoned:
            events.append(NodeCordoned(node=name))
    return events


__all__ = ["RunHistory", "pool_holds", "runs_of", "setup_events", "sim_runs", "spec_label"]
