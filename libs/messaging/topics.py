"""Kafka topics of Runyard and their partition counts.

Every topic is created explicitly at start with its intended partition count:
a broker that auto-creates topics picks its own count (Tansu: 4; a FastStream
subscriber: 1), and partitions cannot be added later without reordering keys.
One task's events share a key (its stream id), so they stay in one partition.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

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
        missing = [
            NewTopic(name, partitions, 1)
            for name, partitions in topics.all().items()
            if name not in existing
        ]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
        return [t.name for t in missing]
    finally:
        await admin.close()


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
