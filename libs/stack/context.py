"""What every service gets when the stack starts it.

A service is a module with `async def run(ctx: ServiceContext) -> None` that
runs until cancelled. `runyard up` starts each of them in one process on the
embedded stack; in production each runs as its own deployable with the same
context built from the environment.
"""

from __future__ import annotations

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
        )
