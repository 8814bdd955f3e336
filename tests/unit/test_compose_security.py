"""docker-compose.yml and its infra scripts agree with the code they secure.

No Docker engine runs here, so these read the files: the broker's users and
ACLs must name the consumer groups and topics the services really use, the
control plane must get a password for every Postgres role and broker user,
and neither server may be published on the host.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from runyard.messaging.settings import KafkaSecurity
from runyard.messaging.topics import PARTITIONS
from runyard.stack import roles

REPO = Path(__file__).resolve().parents[2]
SETUP = (REPO / "infra/kafka/setup.sh").read_text()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def _resolved(env: dict[str, Any]) -> dict[str, str]:
    """The environment with every ${VAR:?...} replaced by a password-like value."""
    return {
        key: re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", lambda m: f"pw-{m.group(1).lower()}", str(v))
        for key, v in env.items()
    }


def _consumers() -> list[tuple[str, str, list[str]]]:
    """The `consumer SERVICE GROUP TOPIC...` lines of infra/kafka/setup.sh."""
    found = []
    for line in SETUP.splitlines():
        if not line.startswith("consumer "):
            continue
        words = shlex.split(line)
        if len(words) >= 4:
            found.append((words[1], words[2], words[3:]))
    return found


def test_acls_name_the_groups_the_services_consume_with() -> None:
    from runyard.deployer.main import CONSUMER as DEPLOYER
    from runyard.faulttolerance.main import CONSUMER as FAULTTOLERANCE
    from runyard.faulttolerance.main import POOLS_GROUP
    from runyard.logs.ingest import GROUP as LOGS
    from runyard.notification.main import CONSUMER as NOTIFICATION
    from runyard.scheduler.main import CONSUMER as SCHEDULER

    groups = {(service, group) for service, group, _ in _consumers()}
    assert groups == {
        ("scheduler", SCHEDULER),
        ("deployer", DEPLOYER),
        ("faulttolerance", FAULTTOLERANCE),
        ("notification", NOTIFICATION),
        ("logs", LOGS),
    }
    # Each fault-tolerance instance reads the pool events in a group of its own.
    pools = f'--group "${{RUNYARD_TOPIC_PREFIX:-}}{POOLS_GROUP}-" --resource-pattern-type prefixed'
    assert pools in SETUP.replace("\\\n  ", "")
    topics = {f"runyard.{t}" for _, _, names in _consumers() for t in names}
    assert topics <= set(PARTITIONS), topics - set(PARTITIONS)


def _service_env(compose: dict[str, Any], service: str) -> dict[str, str]:
    """The environment of the container that runs `service` (`runyard serve <service>`)."""
    return _resolved(compose["services"][service]["environment"])


def test_each_service_gets_the_broker_user_of_its_acls(compose: dict[str, Any]) -> None:
    for service, _, _ in _consumers():
        own = KafkaSecurity.from_env(_service_env(compose, service))
        assert (own.protocol, own.mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
        assert own.username == f"runyard-{service}"
        assert own.password == f"pw-kafka_password_{service}"
    assert KafkaSecurity.from_env(_service_env(compose, "relay")).username == "runyard-relay"
    setup_env = compose["services"]["kafka-setup"]["environment"]
    users = re.search(r"for service in ([A-Z ]+); do", SETUP)
    assert users is not None
    for user in users.group(1).split():
        assert f"KAFKA_PASSWORD_{user}" in setup_env


def test_each_service_gets_its_postgres_role(compose: dict[str, Any]) -> None:
    migrate = _resolved(compose["services"]["migrate"]["environment"])
    assert migrate["RUNYARD_OWNER_DATABASE_URL"].startswith(f"postgresql://{roles.OWNER}:pw-")
    for service in (
        "relay",
        "gateway",
        "submission",
        "scheduler",
        "deployer",
        "faulttolerance",
        "logs",
        "notification",
    ):
        dsn = _service_env(compose, service)["DATABASE_URL"]
        role = roles.SERVICE_ROLES.get(service, roles.APP)
        assert dsn.startswith(f"postgresql://{role}:pw-"), service
        assert dsn.endswith(f"@postgres:5432/{roles.DATABASE}"), service
    script = (REPO / "infra/postgres/init-roles.sh").read_text()
    for role in roles.ROLES:
        assert f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" in script


def test_no_server_is_published_on_the_host(compose: dict[str, Any]) -> None:
    for name in ("postgres", "kafka", "kafka-setup"):
        assert "ports" not in compose["services"][name], name
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    kafka = compose["services"]["kafka"]["environment"]
    protocols = dict(p.split(":") for p in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    for listener in kafka["KAFKA_LISTENERS"].split(","):
        name, _, address = listener.partition("://")
        if protocols[name] == "PLAINTEXT":  # no authentication: loopback only
            assert address.startswith("127.0.0.1:"), listener
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
