"""The audit chain of a whole platform's event store (R-62), checked after each e2e test.

Every event is either a root, or caused by another event: its causation id
names a stored event and its correlation id is that event's. A root's
causation id and correlation id are one id that is no event's: a person's
request or an admin's action (actor `user:...`, the request id), or the
operator's configuration read at start (`config:...`, e.g. the pools the
scheduler registers from pools.yaml), or what a cluster manager said of a
node (`slurm:...`, a node Slurm took out of service or back).
Following causation ids from any event then ends at a root, and the whole
chain shares the root's request id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg


@dataclass(frozen=True, slots=True)
class Stored:
    event_id: str
    stream_id: str
    type: str
    actor: str
    causation_id: str | None
    correlation_id: str | None

    def describe(self) -> str:
        return f"{self.type} on {self.stream_id} by {self.actor} ({self.event_id})"


async def read_all(dsn: str) -> list[Stored]:
    """Every event of the database, in global order."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT event_id, stream_id, event_type, metadata FROM events ORDER BY global_position"
        )
    finally:
        await conn.close()
    events = []
    for row in rows:
        meta: dict[str, Any] = row["metadata"]
        if isinstance(meta, str):
            meta = json.loads(meta)
        events.append(
            Stored(
                str(row["event_id"]),
                row["stream_id"],
                row["event_type"],
                str(meta.get("actor")),
                meta.get("causation_id"),
                meta.get("correlation_id"),
            )
        )
    return events


def chain_breaks(events: list[Stored]) -> list[str]:
    """What breaks the audit chain, one line per event (empty when the chain holds)."""
    by_id = {e.event_id: e for e in events}
    problems = []
    for event in events:
        problem = _problem(event, by_id)
        if problem is not None:
            problems.append(f"{event.describe()}: {problem}")
    return problems


def _problem(event: Stored, by_id: dict[str, Stored]) -> str | None:
    if event.causation_id is None or event.correlation_id is None:
        return (
            f"no causation id or correlation id "
            f"(causation {event.causation_id}, correlation {event.correlation_id})"
        )
    cause = by_id.get(event.causation_id)
    if cause is None:  # a root: a request, an admin's action, the configuration
        person = event.actor.startswith("user:")
        if not person and not event.causation_id.startswith(("config:", "slurm:")):
            return (
                f"names {event.causation_id}, no event, as its cause, but is neither a "
                "person's request, the configuration nor a cluster manager's word"
            )
        if event.correlation_id != event.causation_id:
            return "a request's event whose correlation id is not its request id"
        return None
    if event.correlation_id != cause.correlation_id:
        return (
            f"correlation id {event.correlation_id} differs from its cause's "
            f"({cause.describe()}: {cause.correlation_id})"
        )
    return None


def root_of(event: Stored, by_id: dict[str, Stored]) -> Stored:
    """The request (or admin action) a chain of causes leads back to."""
    seen = set()
    while event.causation_id in by_id and event.event_id not in seen:
        seen.add(event.event_id)
        event = by_id[event.causation_id]
    return event


async def assert_audit_chain(dsn: str) -> None:
    """Fail with every event that breaks the chain."""
    problems = chain_breaks(await read_all(dsn))
    assert not problems, "the audit chain breaks:\n" + "\n".join(problems[:40])
