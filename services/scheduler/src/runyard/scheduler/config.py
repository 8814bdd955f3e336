"""Pools from the configuration file (`infra/config/pools.yaml`), and their registration.

A pool stream is registered once: when `pool-<id>` is empty, the scheduler
appends `PoolRegistered` and one `NodeAdded` per configured node, expecting no
stream and with event ids derived from the pool and node names. Two schedulers
starting together, or one restarting, append the very same events: the store
takes the second append of the same ids as the first (idempotent), and a
stream that already exists is left alone. After registration the admin API is
the source of truth for nodes; the file only seeds empty pools.

    pools:
      - id: dev-a100
        zone: cn-north-1
        resource_type: subscription      # or spot
        gpu_model: A100-80G
        network: roce                    # roce | ib | ethernet
        specs:
          - {name: 1gpu, gpus: 1, cpus: 12, memory_gib: 120}
        nodes: {prefix: dev-a100-node-, count: 4, gpus: 8}   # or a list of names
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from runyard.contracts.base import Event
from runyard.contracts.pool_events import (
    GPUS_PER_NODE,
    NodeAdded,
    PoolRegistered,
    WorkerSpec,
)
from runyard.scheduler.errors import PoolConfigError

#: Namespace of the fixed ids of registration events.
_ID_NAMESPACE = uuid.UUID("6c1b54f2-52a4-4d43-9b0e-52756e796172")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One configured node."""

    name: str
    gpus: int = GPUS_PER_NODE


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One configured pool: what `PoolRegistered` says, and its first nodes."""

    registered: PoolRegistered
    nodes: tuple[NodeConfig, ...]

    @property
    def pool_id(self) -> str:
        """The pool's id (stream `pool-<id>`)."""
        return self.registered.pool_id

    def registration(self) -> list[tuple[uuid.UUID, Event]]:
        """The events that register the pool, each with its fixed event id."""
        events: list[tuple[uuid.UUID, Event]] = [(self._id("registered"), self.registered)]
        for node in self.nodes:
            events.append(
                (self._id(f"node/{node.name}"), NodeAdded(node=node.name, gpus=node.gpus))
            )
        return events

    def _id(self, what: str) -> uuid.UUID:
        return uuid.uuid5(_ID_NAMESPACE, f"pool-{self.pool_id}/{what}")


def pool_stream(pool_id: str) -> str:
    """The stream id of a pool."""
    return f"pool-{pool_id}"


def load_pools_file(path: Path) -> list[PoolConfig]:
    """The pools of a YAML file ([] when the file does not exist)."""
    if not path.exists():
        return []
    return parse_pools(yaml.safe_load(path.read_text()) or {})


def parse_pools(document: Mapping[str, Any]) -> list[PoolConfig]:
    """The pools of a parsed pools document (`{"pools": [...]}`)."""
    raw = document.get("pools") or []
    if not isinstance(raw, list):
        raise PoolConfigError("`pools` must be a list", "see infra/config/pools.yaml")
    pools = [_pool(entry) for entry in raw]
    ids = [p.pool_id for p in pools]
    if len(set(ids)) != len(ids):
        raise PoolConfigError(f"duplicate pool ids in {ids}", "give every pool its own id")
    return pools


def _pool(entry: Mapping[str, Any]) -> PoolConfig:
    try:
        registered = PoolRegistered(
            pool_id=entry["id"],
            zone=entry["zone"],
            resource_type=entry.get("resource_type", "subscription"),
            gpu_model=entry.get("gpu_model", ""),
            network=entry.get("network", "ethernet"),
            specs=tuple(WorkerSpec(**spec) for spec in entry.get("specs", ())),
        )
    except (KeyError, TypeError, ValidationError) as exc:
        raise PoolConfigError(f"pool {entry.get('id', '?')}: {exc}", "fix the pools file") from exc
    return PoolConfig(registered, parse_nodes(registered.pool_id, entry.get("nodes", ())))


def parse_nodes(pool_id: str, raw: Any) -> tuple[NodeConfig, ...]:
    """A pool's `nodes`: `{prefix, count, gpus}` or a list of names or `{name, gpus}`."""
    if isinstance(raw, Mapping):
        gpus = int(raw.get("gpus", GPUS_PER_NODE))
        prefix = str(raw.get("prefix", f"{pool_id}-node-"))
        return tuple(NodeConfig(f"{prefix}{i}", gpus) for i in range(int(raw.get("count", 0))))
    nodes = []
    for item in raw:
        if isinstance(item, str):
            nodes.append(NodeConfig(item))
        else:
            nodes.append(NodeConfig(str(item["name"]), int(item.get("gpus", GPUS_PER_NODE))))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise PoolConfigError(
            f"pool {pool_id}: duplicate node names", "give every node its own name"
        )
    return tuple(nodes)
