"""The causation view: the chain of reactions an event or a task belongs to, as a tree.

Every event names its cause (`causation_id`: the event, request or configuration
that made a service write it) and the chain it belongs to (`correlation_id`: the
id of the chain's root, e.g. a submission's request id or an admin's action),
`runyard.contracts.envelope.Metadata`. A chain crosses streams: a placement on a
task and the allocation it caused on the pool, a node marked faulty and every
reschedule it caused on other tasks.

`trace_chain` collects, from its seeds, every event of the seeds' chains (by
correlation id) and every event caused by one of those (by causation id, for
events written before correlation ids were kept), and `build_tree` hangs each
event under its cause: a root is an event whose cause is no collected event (a
request id, `config:pools/<id>`). Each event carries the OpenTelemetry trace id
of the span that wrote it (from `traceparent`), to open in a trace viewer.

A chain is bounded: at most `MAX_TRACE_EVENTS` events are collected (oldest
first), and `truncated` says when more matched, so one huge chain (a node
fault on a pool of thousands of tasks) cannot stall the caller.

Reads: `events` by its `event_id` unique key, its `(stream_id, stream_version)`
key, and the `events_correlation_idx` and `events_causation_idx` expression
indexes (migration 0005); the tenant of each task stream from `audit_tasks`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final
from uuid import UUID

import asyncpg

#: The most events one trace collects (docs/limits.md).
MAX_TRACE_EVENTS: Final = 500
#: How many causes up from an event the walk to its chain's root follows at most.
MAX_TRACE_DEPTH: Final = 100

_COLUMNS = (
    "e.global_position, e.event_id, e.stream_id, e.stream_version, e.event_type,"
    " e.metadata::text AS metadata, e.occurred_at,"
    " coalesce(t.tenant, tp.tenant,"
    " CASE WHEN e.stream_id LIKE 'access-%' THEN e.data->>'tenant' END) AS tenant,"
    " e.data->>'task_id' AS named_task"
)
_FROM = (
    "FROM events e LEFT JOIN audit_tasks t ON t.stream_id = e.stream_id"
    " LEFT JOIN audit_tasks tp ON e.stream_id LIKE 'pool-%'"
    " AND tp.stream_id = 'task-' || (e.data->>'task_id')"
)


_INNER = ("tenant", "children")


@dataclass(slots=True)
class TraceNode:
    """One event of a chain and the events it caused."""

    position: int
    event_id: str
    stream_id: str
    version: int
    type: str
    occurred_at: str
    actor: str
    causation_id: str | None
    correlation_id: str | None
    trace_id: str | None
    #: The tenant of the task the event is about, or of the token an access event is
    #: about (None: a pool or catalogue event on no task).
    tenant: str | None = None
    redacted: bool = False
    children: list[TraceNode] = field(default_factory=list, repr=False)

    def as_json(self, depth: int, parent: str | None) -> dict[str, Any]:
        """The event without its children, with its depth in the tree and its parent's id."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _INNER}
        return {**data, "depth": depth, "parent": parent}


@dataclass(frozen=True, slots=True)
class Trace:
    """A chain as a forest (oldest root first), with what it was asked for."""

    roots: list[TraceNode]
    correlation_ids: list[str]
    trace_ids: list[str]
    events: int
    truncated: bool
    limit: int

    def as_json(self) -> dict[str, Any]:
        return {
            "correlation_ids": self.correlation_ids,
            "trace_ids": self.trace_ids,
            "events": self.events,
            "truncated": self.truncated,
            "limit": self.limit,
            "tree": [
                node.as_json(depth, parent.event_id if parent else None)
                for node, depth, parent in walk(self.roots)
            ],
        }


def trace_id_of(trace_context: dict[str, Any]) -> str | None:
    """The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`)."""
    parts = str(trace_context.get("traceparent", "")).split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return None


def _node(record: asyncpg.Record) -> TraceNode:
    metadata = json.loads(record["metadata"])
    return TraceNode(
        position=record["global_position"],
        event_id=str(record["event_id"]),
        stream_id=record["stream_id"],
        version=record["stream_version"],
        type=record["event_type"],
        occurred_at=record["occurred_at"].isoformat(),
        actor=str(metadata.get("actor", "")),
        causation_id=metadata.get("causation_id"),
        correlation_id=metadata.get("correlation_id"),
        trace_id=trace_id_of(metadata.get("trace_context") or {}),
        tenant=record["tenant"],
    )


async def event_by_id(conn: asyncpg.Connection | asyncpg.Pool, event_id: str) -> TraceNode | None:
    """The event with this id, or None (also for a text that is no UUID)."""
    try:
        uuid = UUID(event_id)
    except ValueError:
        return None
    row = await conn.fetchrow(f"SELECT {_COLUMNS} {_FROM} WHERE e.event_id = $1", uuid)
    return _node(row) if row is not None else None


async def task_events(conn: asyncpg.Connection | asyncpg.Pool, task_id: str) -> list[TraceNode]:
    """The events of the task's stream, oldest first (empty: no such task)."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} {_FROM} WHERE e.stream_id = $1 ORDER BY e.stream_version",
        f"task-{task_id}",
    )
    return [_node(r) for r in rows]


async def trace_chain(
    conn: asyncpg.Connection | asyncpg.Pool,
    seeds: Sequence[TraceNode],
    *,
    limit: int = MAX_TRACE_EVENTS,
) -> Trace:
    """The chains the seeds belong to, as a tree (see the module docstring)."""
    found: dict[str, TraceNode] = {}
    correlations = list(dict.fromkeys(s.correlation_id or s.event_id for s in seeds))
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} {_FROM} WHERE e.metadata->>'correlation_id' = ANY($1::text[])"
        " ORDER BY e.global_position LIMIT $2",
        correlations,
        limit + 1,
    )
    truncated = len(rows) > limit
    for row in rows[:limit]:
        node = _node(row)
        found[node.event_id] = node
    for seed in seeds:  # events without a correlation id are in no chain's rows
        if seed.event_id not in found:
            if len(found) >= limit:
                truncated = True
                break
            found[seed.event_id] = seed
    frontier = list(found)
    while frontier and not truncated:
        # events caused by a collected one but not in its chain (no correlation id kept)
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} {_FROM} WHERE e.metadata->>'causation_id' = ANY($1::text[])"
            " AND NOT e.event_id = ANY($2::uuid[]) ORDER BY e.global_position LIMIT $3",
            frontier,
            [UUID(i) for i in found],
            limit + 1 - len(found),
        )
        frontier = []
        for row in rows:
            if len(found) >= limit:
                truncated = True
                break
            node = _node(row)
            found[node.event_id] = node
            frontier.append(node.event_id)
    roots = build_tree(found.values())
    trace_ids = list(dict.fromkeys(n.trace_id for n, _, _ in walk(roots) if n.trace_id))
    return Trace(roots, correlations, trace_ids, len(found), truncated, limit)


async def root_cause(conn: asyncpg.Connection | asyncpg.Pool, event: TraceNode) -> TraceNode:
    """The first event of `event`'s chain up its causes (itself when its cause is no event)."""
    current = event
    for _ in range(MAX_TRACE_DEPTH):
        cause = await event_by_id(conn, current.causation_id or "")
        if cause is None:
            return current
        current = cause
    return current


def build_tree(nodes: Iterable[TraceNode]) -> list[TraceNode]:
    """Each node under the node of its cause, in position order; the rest are roots."""
    ordered = sorted(nodes, key=lambda n: n.position)
    by_id = {n.event_id: n for n in ordered}
    roots = []
    for node in ordered:
        node.children = []
    for node in ordered:
        parent = by_id.get(node.causation_id or "")
        if parent is not None and parent is not node and parent.position < node.position:
            parent.children.append(node)
        else:
            roots.append(node)
    return roots


def redact(roots: Sequence[TraceNode], visible: Any) -> None:
    """Hide the identity of every event about a task whose tenant `visible(tenant)`
    refuses: its stream, event id, actor and ids become `(another tenant)`; its type,
    position and place in the tree stay, so the shape of the chain is still seen."""
    for node, _, _ in walk(roots):
        if node.tenant is not None and not visible(node.tenant):
            node.redacted = True
            node.stream_id = node.event_id = node.actor = HIDDEN
            node.causation_id = node.correlation_id = node.trace_id = None


#: How a redacted event's identity is shown.
HIDDEN: Final = "(another tenant)"


def walk(
    roots: Sequence[TraceNode],
) -> Iterable[tuple[TraceNode, int, TraceNode | None]]:
    """Every node in pre-order, with its depth and its parent (no recursion: a chain
    can be as deep as it is long). The JSON answer is this flat list, for the same reason."""
    stack: list[tuple[TraceNode, int, TraceNode | None]] = [(r, 0, None) for r in reversed(roots)]
    while stack:
        node, depth, parent = stack.pop()
        yield node, depth, parent
        stack.extend((c, depth + 1, node) for c in reversed(node.children))


__all__ = [
    "HIDDEN",
    "MAX_TRACE_DEPTH",
    "MAX_TRACE_EVENTS",
    "Trace",
    "TraceNode",
    "build_tree",
    "event_by_id",
    "redact",
    "root_cause",
    "task_events",
    "trace_chain",
    "trace_id_of",
    "walk",
]
