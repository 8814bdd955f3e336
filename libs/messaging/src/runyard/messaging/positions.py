"""What each consumer group has handled, per partition, and where a replay must start.

A consumer writes, in the transaction of each batch, the highest global position
it handled (or skipped) in each partition of the batch; a batch it only skipped
is written with the next batch, or before the next offset commit
(`IdempotentConsumer.flush_positions`). The relay remembers the
highest position it published to each partition. When the broker loses its
memory, every event some group had not handled yet lies after that group's
position in the event's partition, so the relay publishes again from the lowest
such position (`replay_start`), not from the start of the log
(docs/adr/0003-broker-memory-loss.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg
from aiokafka import ConsumerRecord

#: (topic, partition) -> highest global position.
Positions = dict[tuple[str, int], int]

_SAVE = """
INSERT INTO consumer_positions (consumer, topic, partition, position)
SELECT $1, t, p, pos FROM unnest($2::text[], $3::int[], $4::bigint[]) AS x(t, p, pos)
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET position = GREATEST(consumer_positions.position, EXCLUDED.position), updated_at = now()
"""


def global_position(record: ConsumerRecord[Any, Any]) -> int | None:
    """The event's global position (header `global_position`; None: not from the relay)."""
    return _int_header(record, "global_position")


def previous_position(record: ConsumerRecord[Any, Any]) -> int | None:
    """The position of the event the relay published before this one to the same
    partition (header `prev`; None on the first after the broker was found empty)."""
    return _int_header(record, "prev")


def _int_header(record: ConsumerRecord[Any, Any], name: str) -> int | None:
    for key, value in record.headers or ():
        if key == name:
            try:
                return int(bytes(value))
            except ValueError:
                return None
    return None


async def save_positions(conn: asyncpg.Connection, consumer: str, positions: Positions) -> None:
    """Raise `consumer`'s positions to `positions` (never lower them)."""
    if not positions:
        return
    keys = list(positions)
    await conn.execute(
        _SAVE,
        consumer,
        [t for t, _ in keys],
        [p for _, p in keys],
        [positions[k] for k in keys],
    )


async def load_consumer_positions(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, Positions]:
    """consumer -> its positions, for every consumer group that ever handled a batch."""
    rows = await conn.fetch("SELECT consumer, topic, partition, position FROM consumer_positions")
    found: dict[str, Positions] = {}
    for row in rows:
        found.setdefault(row["consumer"], {})[(row["topic"], row["partition"])] = row["position"]
    return found


def replay_start(
    published: Mapping[tuple[str, int], int], confirmed: Mapping[str, Positions], upto: int
) -> int:
    """The position after which a broker that lost everything must be refilled.

    `published`: the highest position the relay published per partition, complete
    up to `upto` (its checkpoint). A group follows the topics it has rows for (a
    consumer registers each topic it subscribes to as partition -1, position 0);
    in each partition of those topics it has handled everything up to its
    position (the relay publishes a partition in order), so what it may not have
    seen starts after the lowest position it lags at. Nobody lagging: `upto`."""
    start = upto
    for positions in confirmed.values():
        topics = {topic for topic, _ in positions}
        for (topic, partition), last in published.items():
            if topic not in topics:
                continue
            handled = positions.get((topic, partition), 0)
            if handled < last:
                start = min(start, handled)
    return start
