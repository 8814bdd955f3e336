"""Kafka topics of Runyard and their partition counts.

Every topic is created explicitly at start with its intended partition count:
a broker that auto-creates topics picks its own count (Tansu: 4; a FastStream
subscriber: 1), and partitions cannot be added later without reordering keys.
One task's events share a key (its stream id), so they stay in one partition.

Partitions are also what instances of one consumer group share: N instances of
a stateless consumer (logs, notification) each take some partitions of its
topics, so a topic they read needs at least as many partitions as instances
that should work at once. A topic found with fewer partitions than intended
(created by an older release, or auto-created by a broker) is reported, not
changed: adding partitions would move keys, and with them one task's order.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

log = logging.getLogger("runyard.messaging")

TASK_EVENTS = "runyard.task-events"
POOL_EVENTS = "runyard.pool-events"
#: Admin actions: tokens issued and revoked, catalogue changes (audit).
ACCESS_EVENTS = "runyard.access-events"
CATALOGUE_EVENTS = "runyard.catalogue-events"
LOGS = "runyard.logs"
DEAD_LETTER = "runyard.dead-letter"

#: Written once by the relay when it (re)initialises a broker and never by
#: anything else: if it is missing, the broker lost its memory (see relay).
BROKER_EPOCH = "runyard.broker-epoch"

# Four partitions everywhere: it is also what the embedded broker gives a topic
# it auto-creates, so a producer that races a broker restart cannot create a
# topic with another partition count and scatter one stream's events.
PARTITIONS: dict[str, int] = {
    TASK_EVENTS: 4,
    POOL_EVENTS: 4,
    ACCESS_EVENTS: 4,
    CATALOGUE_EVENTS: 4,
    LOGS: 4,
    DEAD_LETTER: 4,
    BROKER_EPOCH: 1,
}


def event_topic(category: str) -> str:
    """The topic that carries a stream category's events (`task` -> runyard.task-events)."""
    return f"runyard.{category}-events"


@dataclass(frozen=True)
class Topics:
    """Topic names under an optional prefix (tests isolate themselves with one)."""

    prefix: str = ""

    def name(self, topic: str) -> str:
        return f"{self.prefix}{topic}"

    def for_category(self, category: str) -> str:
        return self.name(event_topic(category))

    @property
    def task_events(self) -> str:
        return self.name(TASK_EVENTS)

    @property
    def pool_events(self) -> str:
        return self.name(POOL_EVENTS)

    @property
    def logs(self) -> str:
        return self.name(LOGS)

    @property
    def dead_letter(self) -> str:
        return self.name(DEAD_LETTER)

    @property
    def broker_epoch(self) -> str:
        return self.name(BROKER_EPOCH)

    def all(self) -> dict[str, int]:
        """Every topic but the broker-epoch marker, which only the relay creates."""
        return {self.name(t): n for t, n in PARTITIONS.items() if t != BROKER_EPOCH}


async def ensure_topics(bootstrap: str, topics: Topics, **security: Any) -> list[str]:
    """Create the missing topics with their partition counts; return those created.

    `security`: the client's SASL/TLS options (KafkaSettings.security.client_options())."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = topics.all()
        missing = [NewTopic(n, count, 1) for n, count in wanted.items() if n not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
        found = [n for n in wanted if n in existing]
        if found:
            _report_few_partitions(await admin.describe_topics(found), wanted)
        return [t.name for t in missing]
    finally:
        await admin.close()


def _report_few_partitions(described: list[dict[str, Any]], wanted: dict[str, int]) -> None:
    for topic in described:
        name, count = topic.get("topic"), len(topic.get("partitions") or ())
        if name in wanted and 0 < count < wanted[name]:
            log.warning(
                "topic %s has %d partitions, not %d: at most %d instances of a consumer"
                " group share it",
                name,
                count,
                wanted[name],
                count,
            )


async def create_marker(bootstrap: str, topics: Topics, **security: Any) -> None:
    """Create the broker-epoch marker topic (the relay's job, once per broker life)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security)
    await admin.start()
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([NewTopic(topics.broker_epoch, 1, 1)])
    finally:
        await admin.close()


async def list_topics(bootstrap: str, **security: Any) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def partition_counts(bootstrap: str, **security: Any) -> dict[str, int]:
    """topic -> its partition count, as the broker has it, for every topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security)
    await admin.start()
    try:
        described = await admin.describe_topics(list(await admin.list_topics()))
        return {t["topic"]: len(t.get("partitions") or ()) for t in described}
    finally:
        await admin.close()
