"""How far every reader of the log has got: read models and consumer groups.

Two records say it, both in Postgres. A reader that follows the whole log
(the relay, the task list projector) keeps one position in `checkpoints`;
its lag is the number of events after it. A consumer group writes the highest
global position it handled per topic partition in `consumer_positions`
(`runyard.messaging.positions`); its lag is the number of events of the
topics it reads that lie after its position in their own partition. An
event's partition is computed as the producer computes it (murmur2 of the
stream id over the topic's partition count: the broker's, when the caller
read it, else the count Runyard creates the topic with), so the count is
exact without reading the topics.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from aiokafka.partitioner import murmur2
from runyard.contracts.envelope import stream_category
from runyard.messaging.topics import PARTITIONS, event_topic

_TOPIC = re.compile(r"runyard\.([a-z0-9_]+)-events$")


@dataclass(frozen=True)
class ReaderProgress:
    """One reader of the log: where it is, the log's end, how many events behind."""

    name: str
    kind: str  # "checkpoint" (a read model, the relay), "shadow" (a rebuild) or "consumer"
    position: int
    log_end: int
    lag: int
    updated_at: datetime | None
    last_error: str | None = None
    #: A consumer's position per "topic[partition]".
    partitions: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["updated_at"] = self.updated_at.isoformat() if self.updated_at else None
        return data


def partition_of(stream_id: str, partitions: int) -> int:
    """The partition the producer picks for a message keyed by `stream_id`."""
    return (int(murmur2(stream_id.encode())) & 0x7FFFFFFF) % partitions


async def read_progress(
    conn: asyncpg.Connection, partitions: Mapping[str, int] | None = None
) -> list[ReaderProgress]:
    """Every checkpoint and every consumer group, with its lag behind the log's end.

    `partitions`: topic -> partition count as the broker has it (`partition_counts`)."""
    log_end = int(await conn.fetchval("SELECT coalesce(max(global_position), 0) FROM events"))
    found = [await _checkpoint(conn, row, log_end) for row in await conn.fetch(_CHECKPOINTS)]
    rows = await conn.fetch(_CONSUMERS)
    for consumer in dict.fromkeys(r["consumer"] for r in rows):
        mine = [r for r in rows if r["consumer"] == consumer]
        found.append(await _consumer(conn, consumer, mine, log_end, partitions or {}))
    return found


_CHECKPOINTS = "SELECT name, position, updated_at FROM checkpoints ORDER BY name"
_CONSUMERS = """SELECT consumer, topic, partition, position, updated_at
                FROM consumer_positions ORDER BY consumer, topic, partition"""
_AFTER = "SELECT count(*) FROM events WHERE global_position > $1"
_STREAMS_AFTER = "SELECT global_position, stream_id FROM events WHERE global_position > $1"


async def _checkpoint(
    conn: asyncpg.Connection, row: asyncpg.Record, log_end: int
) -> ReaderProgress:
    lag = int(await conn.fetchval(_AFTER, row["position"]))
    kind = "shadow" if row["name"].startswith("shadow:") else "checkpoint"
    return ReaderProgress(row["name"], kind, row["position"], log_end, lag, row["updated_at"])


async def _consumer(
    conn: asyncpg.Connection,
    name: str,
    rows: list[asyncpg.Record],
    log_end: int,
    partitions: Mapping[str, int],
) -> ReaderProgress:
    """A consumer group's lag: events of its topics after its position in their partition."""
    positions = {(r["topic"], r["partition"]): r["position"] for r in rows}
    topics = {c: t for t in {t for t, _ in positions} if (c := _category(t))}
    counts = {c: partitions.get(t) or PARTITIONS.get(event_topic(c), 4) for c, t in topics.items()}
    # A partition it never handled counts from the start of the log.
    seen = [sum(1 for t, _ in positions if t == topics[c]) for c in topics]
    complete = all(n >= counts[c] for n, c in zip(seen, topics, strict=True))
    lowest = min(positions.values()) if complete else 0
    lag = 0
    for position, stream_id in await conn.fetch(_STREAMS_AFTER, lowest):
        category = stream_category(stream_id)
        if category in topics:
            partition = partition_of(stream_id, counts[category])
            lag += position > positions.get((topics[category], partition), 0)
    return ReaderProgress(
        name,
        "consumer",
        max(positions.values()),
        log_end,
        lag,
        max(r["updated_at"] for r in rows),
        partitions={f"{t}[{p}]": v for (t, p), v in positions.items()},
    )


def _category(topic: str) -> str | None:
    match = _TOPIC.search(topic)
    return match.group(1) if match else None
