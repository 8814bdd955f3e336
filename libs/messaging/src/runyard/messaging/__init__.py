"""Kafka plumbing shared by services: topics, settings, the event codec and
the idempotent consumer with its dead-letter topic."""

from runyard.messaging.codec import UndecodableMessage, decode, encode
from runyard.messaging.settings import KafkaSettings
from runyard.messaging.topics import Topics, ensure_topics, event_topic, list_topics

__all__ = [
    "KafkaSettings",
    "Topics",
    "UndecodableMessage",
    "decode",
    "encode",
    "ensure_topics",
    "event_topic",
    "list_topics",
]
