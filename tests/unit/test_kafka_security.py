"""Kafka clients authenticate as the environment says (docker-compose.yml: SASL/SCRAM)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import make_broker
from runyard.messaging.settings import KafkaConfigError, KafkaSecurity

SCRAM = {
    "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "KAFKA_SASL_USERNAME": "runyard-relay",
    "KAFKA_SASL_PASSWORD": "s3cret-pw",
}


def test_plaintext_by_default_adds_nothing() -> None:
    security = KafkaSecurity.from_env({})
    assert security.protocol == "PLAINTEXT"
    assert security.client_options() == {}
    assert security.faststream() is None
    settings = KafkaSettings(bootstrap="b:9092", security=security)
    assert settings.client_options() == {"bootstrap_servers": "b:9092"}


def test_settings_from_env_read_the_sasl_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SCRAM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    settings = KafkaSettings.from_env()
    assert settings.client_options() == {
        "bootstrap_servers": "kafka:9092",
        "security_protocol": "SASL_PLAINTEXT",
        "ssl_context": None,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "runyard-relay",
        "sasl_plain_password": "s3cret-pw",
    }
    assert "s3cret-pw" not in repr(settings)


async def test_aiokafka_clients_are_built_with_scram() -> None:
    settings = KafkaSettings(bootstrap="kafka:9092", security=KafkaSecurity.from_env(SCRAM))
    producer = AIOKafkaProducer(**settings.client_options())
    consumer = AIOKafkaConsumer("t", **settings.client_options(), **settings.consumer_options())
    admin = AIOKafkaAdminClient(**settings.client_options())
    for client in (producer.client, consumer._client, admin._client):
        assert client._security_protocol == "SASL_PLAINTEXT"
        assert client._sasl_mechanism == "SCRAM-SHA-512"
        assert client._sasl_plain_username == "runyard-relay"
        assert client._sasl_plain_password == "s3cret-pw"
    await producer.stop()
    await consumer.stop()
    await admin.close()


def test_faststream_broker_is_built_with_scram() -> None:
    settings = KafkaSettings(bootstrap="kafka:9092", security=KafkaSecurity.from_env(SCRAM))
    broker = make_broker(settings)
    # FastStream types its builder as any callable; it is a functools.partial.
    options = broker.config.broker_config.builder.keywords  # type: ignore[attr-defined]
    assert options["security_protocol"] == "SASL_PLAINTEXT"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "runyard-relay"
    assert options["sasl_plain_password"] == "s3cret-pw"


def test_sasl_ssl_gets_a_tls_context() -> None:
    security = KafkaSecurity.from_env({**SCRAM, "KAFKA_SECURITY_PROTOCOL": "sasl_ssl"})
    options = security.client_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    fast = security.faststream()
    assert fast is not None and fast.use_ssl


@pytest.mark.parametrize(
    ("env", "hint"),
    [
        ({**SCRAM, "KAFKA_SASL_PASSWORD": ""}, "KAFKA_SASL_PASSWORD"),
        ({**SCRAM, "KAFKA_SASL_USERNAME": ""}, "KAFKA_SASL_USERNAME"),
        ({**SCRAM, "KAFKA_SECURITY_PROTOCOL": "SASL"}, "KAFKA_SECURITY_PROTOCOL='SASL'"),
        ({**SCRAM, "KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM='GSSAPI'"),
    ],
)
def test_incomplete_settings_are_refused_with_the_variable_to_fix(
    env: dict[str, str], hint: str
) -> None:
    with pytest.raises(KafkaConfigError, match=hint):
        KafkaSecurity.from_env(env)


def test_a_service_may_have_a_broker_user_of_its_own() -> None:
    env = {
        **SCRAM,
        "KAFKA_SASL_USERNAME_SCHEDULER": "runyard-scheduler",
        "KAFKA_SASL_PASSWORD_SCHEDULER": "sched-pw",
    }
    shared = KafkaSettings(bootstrap="kafka:9092", security=KafkaSecurity.from_env(env))
    scheduler = shared.security.for_service("scheduler", env)
    assert (scheduler.username, scheduler.password) == ("runyard-scheduler", "sched-pw")
    assert shared.security.for_service("deployer", env) is shared.security
    with pytest.raises(KafkaConfigError, match="KAFKA_SASL_PASSWORD_LOGS"):
        shared.security.for_service("logs", {**SCRAM, "KAFKA_SASL_USERNAME_LOGS": "x"})
    # Without SASL there is no user to swap.
    assert KafkaSecurity().for_service("scheduler", env) == KafkaSecurity()


def test_each_service_of_one_process_gets_its_own_user_and_dsn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from runyard.stack.context import ServiceContext

    monkeypatch.setenv("KAFKA_SASL_USERNAME_DEPLOYER", "runyard-deployer")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD_DEPLOYER", "dep-pw")
    kafka = KafkaSettings(bootstrap="kafka:9092", security=KafkaSecurity.from_env(SCRAM))
    ctx = ServiceContext(
        "postgresql://app@db/runyard",
        kafka,
        tmp_path,
        tmp_path,
        service_dsns={"deployer": "postgresql://secrets@db/runyard"},
    )
    deployer = ctx.for_service("deployer")
    assert deployer.dsn == "postgresql://secrets@db/runyard"
    assert deployer.kafka.security.username == "runyard-deployer"
    assert deployer.settings is ctx.settings  # apps published by one service are seen by all
    assert ctx.for_service("scheduler") is ctx
