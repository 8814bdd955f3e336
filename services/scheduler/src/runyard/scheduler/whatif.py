"""What-if scheduling over a window of the log (R-61), for SREs.

    POST /v1/pools/whatif   {from, to, pools?, policy?, pool?}   (`runyard whatif`)

Reads what happened to each pool between `from` and `to` (ISO 8601 times with
a zone) from the event log, turns it into the simulation's input
(`runyard.scheduler.domain.history`), plays it again through the scheduler's
pure core (`runyard.scheduler.domain.whatif.simulate`) on the nodes of a changed pools
document or with another queue policy, and answers the queue times and the
utilisation of both, side by side, per pool and per worker spec. Nothing is
appended, nothing is sent to the broker, no read model is written: the route
only reads the `events` table.

What is read, per pool:
- the pool stream `pool-<id>`: its prefix at `from` is folded (`fold_pool`, as
  `GET /v1/pools/replay` does) into the nodes, their health and the GPUs each
  task held then; its events in the window are the real allocations, releases
  and node changes;
- the task streams of the pool's tasks that were waiting or running at `from`
  (a run began and had not ended) or have an event in the window, up to `to`:
  each run's submission or rerun, placements, preemptions, stop and end. The
  tasks are found through `audit_facets` (kind `pool`, one index range).

`pools` is the `pools` list of a file in the shape of the scheduler's pools
file (infra/config/pools.yaml, docs/scheduler.md): `[{id, nodes}]`, with
`nodes` a `{prefix, count, gpus}` or a list of names (or `{name, gpus}`).
Only `id` and `nodes` are used; other keys (zone, specs) may be there and are
ignored: the simulated pool keeps the registration the log has. Without
`pools` every pool is replayed on the nodes it had at `from`, which
reproduces what happened (within the scheduler's reaction time, see
docs/operations.md); with it, only the pools it names are replayed.

Each run holds GPUs in the simulation as long as the pool stream says it held
them (allocation to release, within the window); a run whose GPUs were not
released by `to` holds them to the end.

Bounds (docs/limits.md), each refused with a 400 that names it:
`MAX_WINDOW` of log time, `MAX_EVENTS` events read (the pool streams' events
in the window and the task streams up to `to`; a pool stream's prefix up to
`from` is folded as `GET /v1/pools/replay` folds it, and not counted),
`MAX_POOLS` pools and `MAX_NODES` nodes per pool in `pools`.

Who may ask: the sre and platform_admin roles (403 `auth.sre_only` else).

(No `from __future__ import annotations` here: FastAPI must see the route's
`caller_dependency(...)` when it reads the handler's signature.)
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Final

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest, NotFound
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.contracts import Event, RecordedEvent
from runyard.contracts import http as wire
from runyard.contracts.envelope import utcnow
from runyard.contracts.pool_events import (
    NodeAdded,
    WorkersAllocated,
    WorkersReleased,
)
from runyard.domain.replay import ReplayRefused, parse_point, prefix
from runyard.eventstore import EVENT_COLUMNS, PostgresEventStore
from runyard.scheduler.config import parse_nodes, pool_stream
from runyard.scheduler.domain import (
    PoolState,
    fold_pool,
)
from runyard.scheduler.domain.history import (
    RunHistory,
    pool_holds,
    runs_of,
    setup_events,
    sim_runs,
    spec_label,
)
from runyard.scheduler.domain.whatif import (
    POLICIES,
    NodeChange,
    Policy,
    SimResult,
    Usage,
    Wait,
    real_usage,
    simulate,
    wait_stats,
)
from runyard.scheduler.errors import PoolConfigError

#: Longest window of log time one what-if replays.
MAX_WINDOW: Final = timedelta(days=7)
#: Most events (pool and task streams together) one what-if reads.
MAX_EVENTS: Final = 200_000
#: Most pools, and nodes per pool, in a pools document.
MAX_POOLS: Final = 64
MAX_NODES: Final = 10_000
#: Most runs listed one by one in the answer (every run is counted).
MAX_LISTED_RUNS: Final = 1000

_STARTS = ("TaskSubmitted", "TaskRerunRequested")
_ENDS = ("TaskSucceeded", "TaskFailed", "TaskStopped", "TaskMarkedAbnormal")
_NODE_EVENTS = frozenset(
    {
        "NodeAdded",
        "NodeRemoved",
        "NodeCordoned",
        "NodeUncordoned",
        "NodeMarkedFaulty",
        "NodeMarkedHealthy",
        "SpotCapacityChanged",
    }
)
#: The pool's tasks alive at the start (a run began after their last end), and those
#: with an event in the window; `audit_facets` rows of kind `pool` find them.
_TASKS_OF_POOL = """
SELECT e.stream_id
FROM audit_facets f JOIN events e ON e.global_position = f.global_position
WHERE f.kind = 'pool' AND f.value = $1 AND e.stream_id LIKE 'task-%' AND e.occurred_at <= $2
  AND e.event_type = ANY($4::text[] || $5::text[])
GROUP BY e.stream_id
HAVING max(e.global_position) FILTER (WHERE e.event_type = ANY($4::text[]))
     > coalesce(max(e.global_position) FILTER (WHERE e.event_type = ANY($5::text[])), 0)
UNION
SELECT DISTINCT e.stream_id
FROM audit_facets f JOIN events e ON e.global_position = f.global_position
WHERE f.kind = 'pool' AND f.value = $1 AND e.stream_id LIKE 'task-%'
  AND e.occurred_at > $2 AND e.occurred_at <= $3
"""
_COUNT_STREAMS = (
    "SELECT count(*) FROM events WHERE stream_id = ANY($1::text[]) AND occurred_at <= $2"
)
_READ_STREAMS = (
    f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ANY($1::text[]) AND occurred_at <= $2"
    " ORDER BY stream_id, stream_version"
)


class WhatIfBody(BaseModel):
    """A what-if: the window, the changed pools (optional) and the queue policy."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    start: str = Field(alias="from", max_length=64, description="ISO 8601 time with a zone")
    end: str = Field(alias="to", max_length=64, description="ISO 8601 time with a zone")
    pools: list[dict[str, Any]] | None = Field(
        default=None, description="the changed pools, as in the pools file: [{id, nodes}]"
    )
    policy: Policy = "backfill"
    pool: str | None = Field(default=None, max_length=128, description="this pool only")


# -- the answer: real beside simulated, per pool and per spec --------------------------


@dataclass(frozen=True, slots=True)
class PoolWindow:
    """One pool's window: its nodes then (real and simulated), its node changes in the
    window, the runs played, and the runs left out (a spec the pool cannot place)."""

    real_start: PoolState
    simulated: Sequence[Event]
    node_changes: int
    runs: Sequence[RunHistory]
    skipped_runs: int


def pool_answer(
    pool_id: str,
    window: PoolWindow,
    result: SimResult,
    real: Usage,
    *,
    start: datetime,
    end: datetime,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pool's side-by-side figures, and its runs one by one."""
    counted = [r for r in window.runs if r.placed_at is None or r.placed_at > start]
    real_waits: dict[str, Wait] = {}
    sim_waits: dict[str, Wait] = {}
    for history in counted:
        outcome = result.outcomes[history.key]
        left = history.ended_at is not None and history.placed_at is None
        real_waits[history.key] = Wait(history.arrived_at, history.placed_at, left)
        sim_waits[history.key] = Wait(
            history.arrived_at, outcome.placed_at, outcome.left_at is not None
        )
    labels = {r.key: spec_label(r.spec) for r in counted}
    added = [e for e in window.simulated if isinstance(e, NodeAdded)]
    answer = {
        "pool_id": pool_id,
        "nodes": {"real": len(window.real_start.nodes), "simulated": len(added)},
        "gpus": {
            "real": sum(n.gpus for n in window.real_start.nodes.values()),
            "simulated": sum(e.gpus for e in added),
        },
        "real": {**wait_stats(real_waits.values(), end).to_dict(), **_usage(real)},
        "simulated": {
            **wait_stats(sim_waits.values(), end).to_dict(),
            **_usage(result.usage),
        },
        "specs": [
            {
                "spec": label,
                "real": {
                    **wait_stats(_of(real_waits, labels, label), end).to_dict(),
                    "gpu_hours": _hours(real.by_spec.get(label, 0.0)),
                },
                "simulated": {
                    **wait_stats(_of(sim_waits, labels, label), end).to_dict(),
                    "gpu_hours": _hours(result.usage.by_spec.get(label, 0.0)),
                },
            }
            for label in sorted(set(labels.values()))
        ],
        "node_changes": window.node_changes,
        "node_changes_skipped": result.skipped_changes,
        "displaced": sum(1 for o in result.outcomes.values() if o.displaced),
        "runs_skipped": window.skipped_runs,
    }
    listed = [
        {
            "task_id": r.task_id,
            "run": r.run,
            "pool": pool_id,
            "spec": labels[r.key],
            "arrived_at": r.arrived_at.isoformat(),
            "real_placed_at": _iso(r.placed_at),
            "simulated_placed_at": _iso(result.outcomes[r.key].placed_at),
            "real_wait_s": _wait_s(real_waits[r.key], end),
            "simulated_wait_s": _wait_s(sim_waits[r.key], end),
        }
        for r in counted
    ]
    return answer, listed


def _of(waits: Mapping[str, Wait], labels: Mapping[str, str], label: str) -> list[Wait]:
    return [w for key, w in waits.items() if labels[key] == label]


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 4)


def _usage(usage: Usage) -> dict[str, float]:
    return {
        "utilisation": round(usage.utilisation, 4),
        "gpu_hours": _hours(usage.held_s),
        "capacity_gpu_hours": _hours(usage.capacity_s),
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _wait_s(wait: Wait, end: datetime) -> float | None:
    if wait.left:
        return None
    stop = wait.placed_at if wait.placed_at is not None else end
    return round(float((stop - wait.arrived_at).total_seconds()), 3)


# -- inputs --------------------------------------------------------------------------------


def window_of(start: str, end: str) -> tuple[datetime, datetime]:
    """The window's two instants; 400 when either is not a time, out of order or too long."""
    first, last = _instant(start, "from"), _instant(end, "to")
    if last <= first:
        raise BadRequest(
            "whatif.bad_window",
            f"to ({last.isoformat()}) is not after from ({first.isoformat()})",
            "give a `to` later than `from`",
            "to",
        )
    if last - first > MAX_WINDOW:
        raise BadRequest(
            "whatif.window_too_long",
            f"the window is {last - first}, longer than the {MAX_WINDOW.days} days a what-if"
            " replays",
            f"split it into windows of at most {MAX_WINDOW.days} days",
            "to",
        )
    return first, last


#: How far past the scheduler's clock a window may end (the caller's clock runs ahead).
CLOCK_SLACK: Final = timedelta(minutes=1)


def not_after_now(end: datetime, now: datetime) -> None:
    """400 for a window that ends in the future: the log holds nothing of it yet, and the
    runs still going would be counted as holding their GPUs until then (GPU hours and
    utilisation of days that have not been)."""
    if end > now + CLOCK_SLACK:
        raise BadRequest(
            "whatif.future_window",
            f"to ({end.isoformat()}) is in the future (the scheduler's time is"
            f" {now.isoformat(timespec='seconds')})",
            "end the window at now at the latest: --to now (or 0m)",
            "to",
        )


def _instant(text: str, name: str) -> datetime:
    try:
        point = parse_point(text, name)
    except ReplayRefused as exc:
        raise BadRequest("whatif.bad_time", exc.message, exc.hint, name) from exc
    if not isinstance(point, datetime):
        raise BadRequest(
            "whatif.bad_time",
            f"{name}: {text[:64]!r} is a log position; a what-if window is two times",
            "give an ISO 8601 time with a zone, e.g. 2026-12-01T10:00:00Z",
            name,
        )
    return point


def nodes_of_pools(raw: Sequence[Any]) -> dict[str, list[tuple[str, int]]]:
    """Each pool's nodes in the `pools` list of a pools file; 400 naming what is wrong."""
    if not raw:
        raise BadRequest(
            "whatif.bad_pools",
            "`pools` is empty",
            "give [{id: POOL, nodes: {prefix: n-, count: 8, gpus: 8}}] (the `pools` of"
            " infra/config/pools.yaml), or leave `pools` out to replay the real nodes",
            "pools",
        )
    if len(raw) > MAX_POOLS:
        raise BadRequest(
            "whatif.too_many_pools",
            f"the pools document has {len(raw)} pools, at most {MAX_POOLS} are replayed at once",
            "keep only the pools you changed",
            "pools",
        )
    found: dict[str, list[tuple[str, int]]] = {}
    for entry in raw:
        pool_id = entry.get("id") if isinstance(entry, Mapping) else None
        if not isinstance(pool_id, str) or not pool_id:
            raise BadRequest(
                "whatif.bad_pools", "every pool needs an `id`", "add `id: POOL`", "pools"
            )
        found[pool_id] = _nodes(pool_id, entry.get("nodes", ()))
    return found


def _nodes(pool_id: str, raw: Any) -> list[tuple[str, int]]:
    count = raw.get("count", 0) if isinstance(raw, Mapping) else len(raw) if raw else 0
    if isinstance(count, int) and count > MAX_NODES:
        raise BadRequest(
            "whatif.too_many_nodes",
            f"pool {pool_id}: {count} nodes, at most {MAX_NODES} per pool",
            f"give at most {MAX_NODES} nodes",
            "pools",
        )
    try:
        nodes = parse_nodes(pool_id, raw)
    except (PoolConfigError, KeyError, TypeError, ValueError) as exc:
        raise BadRequest(
            "whatif.bad_pools",
            f"pool {pool_id}: nodes are not {{prefix, count, gpus}} or a list of names ({exc})",
            "write nodes as in infra/config/pools.yaml",
            "pools",
        ) from exc
    if any(not 1 <= n.gpus <= 8 for n in nodes):
        raise BadRequest(
            "whatif.bad_pools",
            f"pool {pool_id}: a node has 1 to 8 GPUs",
            "set gpus between 1 and 8",
            "pools",
        )
    if any(not 1 <= len(n.name) <= 128 for n in nodes):
        raise BadRequest(
            "whatif.bad_pools",
            f"pool {pool_id}: a node name has 1 to 128 characters",
            "name every node (a `prefix` of at most 120 characters)",
            "pools",
        )
    return [(n.name, n.gpus) for n in nodes]


# -- the use case --------------------------------------------------------------------------


def require_sre(caller: Principal) -> None:
    """Refuse every role but sre and platform_admin."""
    caller.require_every_tenant_reader(
        "auth.sre_only", "what-if scheduling", "ask a platform admin for an sre token"
    )


class WhatIf:
    """What-if runs over the event store (reads only)."""

    def __init__(self, store: PostgresEventStore) -> None:
        self.store = store

    async def answer(self, caller: Principal, body: WhatIfBody) -> dict[str, Any]:
        require_sre(caller)
        start, end = window_of(body.start, body.end)
        not_after_now(end, utcnow())
        nodes = nodes_of_pools(body.pools) if body.pools is not None else {}
        pool_ids = await self._pool_ids(body.pool, nodes)
        budget = _Budget()
        pools, runs = [], []
        for pool_id in pool_ids:
            answer, listed = await self._pool(pool_id, nodes.get(pool_id), body, budget, start, end)
            pools.append(answer)
            runs.extend(listed)
        return {
            "from": start.isoformat(),
            "to": end.isoformat(),
            "policy": body.policy,
            "events_read": budget.events,
            "pools": pools,
            "runs": runs[:MAX_LISTED_RUNS],
            "runs_listed": min(len(runs), MAX_LISTED_RUNS),
            "runs_total": len(runs),
        }

    async def _pool_ids(self, only: str | None, nodes: Mapping[str, Any]) -> list[str]:
        if only is not None:
            return [only]
        if nodes:
            return list(nodes)
        rows = await self.store.pool.fetch("SELECT pool_id FROM scheduler_pool_views ORDER BY 1")
        return [row["pool_id"] for row in rows]

    async def _pool(
        self,
        pool_id: str,
        nodes: list[tuple[str, int]] | None,
        body: WhatIfBody,
        budget: "_Budget",
        start: datetime,
        end: datetime,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        stream = prefix(await self.store.read_stream(pool_stream(pool_id)), end)
        before = [e for e in stream if e.occurred_at <= start]
        budget.add(len(stream) - len(before))  # the prefix is folded, as `pools --at` does
        if not before:
            field = "pool" if body.pool is not None else "pools"
            if stream:  # registered within the window: it can start there at the earliest
                registered = stream[0].occurred_at.isoformat()
                raise NotFound(
                    "whatif.unknown_pool",
                    f"pool {pool_id!r} was registered at {registered}, after the window's "
                    f"start {start.isoformat()}",
                    f"start the window at or after {registered}",
                    field,
                )
            raise NotFound(
                "whatif.unknown_pool",
                f"pool {pool_id!r} had no event by {end.isoformat()}",
                "choose a pool listed by `runyard pools` and a window after it was registered",
                field,
            )
        real_start = fold_pool(e.event for e in before)
        tasks = await self._task_streams(pool_id, budget, start, end)
        changes = [(e.occurred_at, e.event) for e in stream[len(before) :]]
        holds = pool_holds(fold_pool(e.event for e in before), changes, start, end)
        histories = [run for events in tasks for run in runs_of(events, start)]
        for history in histories:
            history.hold_s = holds.get((history.task_id, history.run), history.hold_s)
        kept, played, skipped = sim_runs(real_start, histories, start)
        node_changes = [NodeChange(at, ev) for at, ev in changes if ev.type_name() in _NODE_EVENTS]
        setup = setup_events(real_start, nodes)
        result = simulate(
            setup,
            played,
            node_changes,
            start=start,
            end=end,
            policy=body.policy,
        )
        labels = {r.task_id: spec_label(r.spec) for r in kept}
        real = real_usage(
            fold_pool(e.event for e in before),
            [(at, ev) for at, ev in changes if _pool_change(ev)],
            start=start,
            end=end,
            labels=labels,
        )
        window = PoolWindow(real_start, setup, len(node_changes), kept, skipped)
        return pool_answer(pool_id, window, result, real, start=start, end=end)

    async def _task_streams(
        self, pool_id: str, budget: "_Budget", start: datetime, end: datetime
    ) -> list[list[RecordedEvent[Event]]]:
        rows = await self.store.pool.fetch(
            _TASKS_OF_POOL, pool_id, start, end, list(_STARTS), list(_ENDS)
        )
        streams = sorted(row["stream_id"] for row in rows)
        budget.add(int(await self.store.pool.fetchval(_COUNT_STREAMS, streams, end)))
        by_stream: dict[str, list[RecordedEvent[Event]]] = {}
        for row in await self.store.pool.fetch(_READ_STREAMS, streams, end):
            by_stream.setdefault(row["stream_id"], []).append(self.store.decode(row))
        return [prefix(events, end) for events in by_stream.values()]


def _pool_change(event: Event) -> bool:
    return isinstance(event, WorkersAllocated | WorkersReleased) or (
        event.type_name() in _NODE_EVENTS
    )


@dataclass
class _Budget:
    """Events read so far; a 400 naming the bound once past `MAX_EVENTS`."""

    events: int = 0

    def add(self, count: int) -> None:
        self.events += count
        if self.events > MAX_EVENTS:
            raise BadRequest(
                "whatif.too_many_events",
                f"the window holds more than {MAX_EVENTS} events of these pools and their tasks",
                "choose a shorter window, or one pool (`pool`), or replay an exported copy of"
                " the log (runyard export-events, import-events)",
                "from",
            )


def whatif_router(store: PostgresEventStore, authenticator: Authenticator) -> APIRouter:
    """POST /v1/pools/whatif (see the module docstring)."""
    whatif = WhatIf(store)
    # A POST for its body (a pools list may not fit in a URL), but it only reads.
    Caller = Annotated[Principal, caller_dependency(authenticator, reads_only=True)]
    router = APIRouter(tags=["replay"], route_class=AnswerRoute)

    @router.post("/v1/pools/whatif", response_model=wire.WhatIf, responses=refusals(403, 413))
    async def what_if(caller: Caller, body: WhatIfBody) -> dict[str, Any]:
        """SRE: replay a window of the log on changed pools or another queue policy and
        compare queue times and utilisation with what happened (changes nothing)."""
        return await whatif.answer(caller, body)

    return router


__all__ = [
    "MAX_EVENTS",
    "MAX_LISTED_RUNS",
    "MAX_NODES",
    "MAX_POOLS",
    "MAX_WINDOW",
    "POLICIES",
    "WhatIf",
    "WhatIfBody",
    "nodes_of_pools",
    "whatif_router",
    "window_of",
]
