"""Kafka client settings, explicit so latency and rebalance times are known.

Measured on the embedded broker (see ARCHITECTURE.md): group joins wait half
the session timeout, so a 3 s session with a 500 ms heartbeat keeps a
rebalance at 2.5-5 s; consumer latency is bounded by fetch_max_wait_ms.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from runyard.messaging.topics import Topics


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = "127.0.0.1:9092"
    topics: Topics = field(default_factory=Topics)
    session_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 500
    fetch_max_wait_ms: int = 10
    request_timeout_ms: int = 10000

    @classmethod
    def from_env(cls) -> KafkaSettings:
        return cls(
            bootstrap=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            topics=Topics(os.environ.get("RUNYARD_TOPIC_PREFIX", "")),
        )

    def consumer_options(self) -> dict[str, int | str | bool]:
        return {
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "fetch_max_wait_ms": self.fetch_max_wait_ms,
            "auto_offset_reset": "earliest",
        }
