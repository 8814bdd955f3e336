"""Kafka client settings, explicit so latency and rebalance times are known.

Measured on the embedded broker (see ARCHITECTURE.md): group joins wait half
the session timeout, so a 3 s session with a 500 ms heartbeat keeps a
rebalance at 2.5-5 s; consumer latency is bounded by fetch_max_wait_ms.

Authentication comes from the environment (docker-compose.yml sets it):
KAFKA_SECURITY_PROTOCOL (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL),
KAFKA_SASL_MECHANISM (SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN),
KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and, for TLS, KAFKA_SSL_CAFILE.
Every client Runyard builds (aiokafka producers, consumers and admin
clients, FastStream brokers) takes them from `KafkaSettings`. Where several
services share one process (`runyard up`), each may authenticate as a user of
its own: KAFKA_SASL_USERNAME_<SERVICE> / KAFKA_SASL_PASSWORD_<SERVICE>
(e.g. _SCHEDULER) replace the shared pair for that service.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runyard.messaging.topics import Topics

if TYPE_CHECKING:
    from faststream.security import BaseSecurity

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


class KafkaConfigError(ValueError):
    """The Kafka security settings are incomplete or contradict each other."""


@dataclass(frozen=True)
class KafkaSecurity:
    """How clients authenticate to the broker (nothing, by default)."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str = ""
    password: str = field(default="", repr=False)
    #: CA bundle for SSL / SASL_SSL ("" : the system's).
    ssl_cafile: str = ""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise KafkaConfigError(
                f"KAFKA_SECURITY_PROTOCOL={self.protocol!r} is not one of {', '.join(PROTOCOLS)}"
            )
        if not self.sasl:
            return
        if self.mechanism not in MECHANISMS:
            raise KafkaConfigError(
                f"KAFKA_SASL_MECHANISM={self.mechanism!r} is not one of {', '.join(MECHANISMS)}"
            )
        if not self.username or not self.password:
            raise KafkaConfigError(
                f"KAFKA_SECURITY_PROTOCOL={self.protocol} needs KAFKA_SASL_USERNAME and"
                " KAFKA_SASL_PASSWORD: set both to the service's broker user"
            )

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KafkaSecurity:
        env = os.environ if env is None else env
        return cls(
            protocol=env.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").strip().upper(),
            mechanism=env.get("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512").strip().upper(),
            username=env.get("KAFKA_SASL_USERNAME", ""),
            password=env.get("KAFKA_SASL_PASSWORD", ""),
            ssl_cafile=env.get("KAFKA_SSL_CAFILE", ""),
        )

    def for_service(self, service: str, env: Mapping[str, str] | None = None) -> KafkaSecurity:
        """The user `service` authenticates as: KAFKA_SASL_USERNAME_<SERVICE> and
        KAFKA_SASL_PASSWORD_<SERVICE> when set, else the shared one."""
        env = os.environ if env is None else env
        suffix = service.upper().replace("-", "_")
        username = env.get(f"KAFKA_SASL_USERNAME_{suffix}", "")
        password = env.get(f"KAFKA_SASL_PASSWORD_{suffix}", "")
        if not self.sasl or not (username or password):
            return self
        if not (username and password):
            raise KafkaConfigError(
                f"set both KAFKA_SASL_USERNAME_{suffix} and KAFKA_SASL_PASSWORD_{suffix}"
                f" (only one is set), or neither to share KAFKA_SASL_USERNAME"
            )
        return dataclasses.replace(self, username=username, password=password)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        return ssl.create_default_context(cafile=self.ssl_cafile or None)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of aiokafka's producer, consumer and admin client."""
        if self.protocol == "PLAINTEXT":
            return {}
        options: dict[str, Any] = {
            "security_protocol": self.protocol,
            "ssl_context": self.ssl_context(),
        }
        if self.sasl:
            options.update(
                sasl_mechanism=self.mechanism,
                sasl_plain_username=self.username,
                sasl_plain_password=self.password,
            )
        return options

    def faststream(self) -> BaseSecurity | None:
        """The same, as FastStream's `KafkaBroker(security=...)` takes it."""
        from faststream.security import (
            BaseSecurity,
            SASLPlaintext,
            SASLScram256,
            SASLScram512,
        )

        if self.protocol == "PLAINTEXT":
            return None
        if not self.sasl:
            return BaseSecurity(ssl_context=self.ssl_context(), use_ssl=True)
        kind = {
            "SCRAM-SHA-512": SASLScram512,
            "SCRAM-SHA-256": SASLScram256,
            "PLAIN": SASLPlaintext,
        }[self.mechanism]
        return kind(
            username=self.username,
            password=self.password,
            ssl_context=self.ssl_context(),
            use_ssl=self.tls,
        )


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = "127.0.0.1:9092"
    topics: Topics = field(default_factory=Topics)
    session_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 500
    fetch_max_wait_ms: int = 50
    request_timeout_ms: int = 10000
    security: KafkaSecurity = field(default_factory=KafkaSecurity)

    @classmethod
    def from_env(cls) -> KafkaSettings:
        return cls(
            bootstrap=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            topics=Topics(os.environ.get("RUNYARD_TOPIC_PREFIX", "")),
            security=KafkaSecurity.from_env(),
        )

    def for_service(self, service: str) -> KafkaSettings:
        """These settings as `service` uses them (its own broker user, if it has one)."""
        security = self.security.for_service(service)
        return self if security == self.security else dataclasses.replace(self, security=security)

    def client_options(self) -> dict[str, Any]:
        """`bootstrap_servers` and the security options of an aiokafka client."""
        return {"bootstrap_servers": self.bootstrap, **self.security.client_options()}

    def consumer_options(self) -> dict[str, int | str | bool]:
        return {
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "fetch_max_wait_ms": self.fetch_max_wait_ms,
            "auto_offset_reset": "earliest",
        }
