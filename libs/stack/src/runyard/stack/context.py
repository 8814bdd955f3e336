"""What every service gets when the stack starts it.

A service is a module with `async def run(ctx: ServiceContext) -> None` that
runs until cancelled. `runyard up` starts each of them in one process on the
embedded stack; in production each runs as its own deployable with the same
context built from the environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from runyard.contracts import EventMapper, default_mapper
from runyard.messaging import KafkaSettings


@dataclass
class ServiceContext:
    #: Postgres DSN of the event store and the read models.
    dsn: str
    kafka: KafkaSettings
    #: Where services keep files (exports, worker scratch space, ...).
    data_dir: Path
    #: Folder of YAML configuration files (pools.yaml, catalogue.yaml, ...).
    config_dir: Path
    mapper: EventMapper = field(default_factory=default_mapper)
    #: Extra settings (ports, tokens) given by whoever starts the service.
    settings: dict[str, Any] = field(default_factory=dict)
    #: A DSN of its own for a service (by name, e.g. "gateway"), which then
    #: connects as a role with other rights (runyard.stack.roles); others use `dsn`.
    service_dsns: dict[str, str] = field(default_factory=dict)
    #: Where each service's HTTP API answers (name -> base URL). In one process a
    #: service publishes its URL here once bound (`runyard.api.service`); apart,
    #: whoever starts them gives them all (RUNYARD_ENDPOINTS, a JSON object).
    endpoints: dict[str, str] = field(default_factory=dict)

    def for_service(self, name: str) -> ServiceContext:
        """This context as service `name` sees it: its own DSN and broker user,
        if it has them. Settings are shared (services publish their apps there)."""
        dsn = self.service_dsns.get(name, self.dsn)
        kafka = self.kafka.for_service(name)
        if dsn == self.dsn and kafka is self.kafka:
            return self
        return dataclasses.replace(self, dsn=dsn, kafka=kafka)

    def config(self, name: str) -> dict[str, Any]:
        """The parsed YAML file `name` of the config folder ({} when absent)."""
        path = self.config_dir / name
        if not path.exists():
            return {}
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        return loaded

    @classmethod
    def from_env(cls) -> ServiceContext:
        root = Path(os.environ.get("RUNYARD_HOME", ".runyard"))
        return cls(
            dsn=os.environ["DATABASE_URL"],
            kafka=KafkaSettings.from_env(),
            data_dir=root,
            config_dir=Path(os.environ.get("RUNYARD_CONFIG", "infra/config")),
            service_dsns=service_dsns_from_env(),
            settings=_json_object("RUNYARD_SETTINGS"),
            endpoints={str(k): str(v) for k, v in _json_object("RUNYARD_ENDPOINTS").items()},
        )


def _json_object(variable: str) -> dict[str, Any]:
    """The JSON object in environment variable `variable` ({} when unset)."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return {}
    loaded = json.loads(raw)
    if not isinstance(loaded, dict):
        raise ValueError(f"{variable}: expected a JSON object, got {type(loaded).__name__}")
    return loaded


#: Environment variables naming the DSN of a role with other rights than
#: DATABASE_URL's (see runyard.stack.roles): role -> variable.
ROLE_DSN_VARIABLES = {
    "secrets": "RUNYARD_SECRETS_DATABASE_URL",
    "logs": "RUNYARD_LOGS_DATABASE_URL",
}


def service_dsns_from_env() -> dict[str, str]:
    """Per-service DSNs from RUNYARD_SECRETS_DATABASE_URL / RUNYARD_LOGS_DATABASE_URL
    (each service not named, or whose variable is unset, uses DATABASE_URL)."""
    from runyard.stack.roles import SERVICE_ROLES

    dsns: dict[str, str] = {}
    for service, role in SERVICE_ROLES.items():
        variable = ROLE_DSN_VARIABLES[role.removeprefix("runyard_")]
        if value := os.environ.get(variable):
            dsns[service] = value
    return dsns
