"""Pool information for the pool API: one small adapter.

The scheduler owns pools. Its read model (`scheduler_pool_views(pool_id,
view jsonb, updated_at)`) is read when the table exists; otherwise the pool
config file (`pools.yaml`: pools with id, zone, resource_type, network,
nodes, specs name -> GPUs) is the fallback. `load_pools` is the gateway's only
place that reads either source; `pool_view_of` (runyard.contracts.resources)
reads either shape, as the submission service does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import yaml
from runyard.contracts.resources import PoolView, pool_view_of


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """A pool as the gateway shows it: the rules' view plus whatever capacity is known."""

    view: PoolView
    source: str
    raw: dict[str, Any] = field(default_factory=dict)


async def load_pools(
    conn: asyncpg.Pool | asyncpg.Connection, config_dir: Path
) -> dict[str, PoolInfo]:
    """Every pool by id: the scheduler's read model if it has any, else `pools.yaml`."""
    from_scheduler = await _scheduler_views(conn)
    if from_scheduler:
        return from_scheduler
    return _config_pools(config_dir / "pools.yaml")


async def _scheduler_views(conn: asyncpg.Pool | asyncpg.Connection) -> dict[str, PoolInfo]:
    exists = await conn.fetchval("SELECT to_regclass('scheduler_pool_views') IS NOT NULL")
    if not exists:
        return {}
    pools: dict[str, PoolInfo] = {}
    # By id: the scheduler rewrites a row on each change, which moves it in the table.
    rows = await conn.fetch("SELECT pool_id, view FROM scheduler_pool_views ORDER BY pool_id")
    for row in rows:
        raw = row["view"] if isinstance(row["view"], dict) else json.loads(row["view"])
        info = _pool_info({"id": row["pool_id"], **raw}, "scheduler")
        if info is not None:
            pools[info.view.pool_id] = info
    return pools


def _config_pools(path: Path) -> dict[str, PoolInfo]:
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text()) or {}
    pools: dict[str, PoolInfo] = {}
    for raw in loaded.get("pools", []) or []:
        info = _pool_info(raw, "config")
        if info is not None:
            pools[info.view.pool_id] = info
    return pools


def _pool_info(raw: dict[str, Any], source: str) -> PoolInfo | None:
    """A PoolInfo from either shape; None for an entry the rules cannot use."""
    view = pool_view_of(raw)
    return None if view is None else PoolInfo(view, source, raw)


def capacity(info: PoolInfo) -> dict[str, Any]:
    """Launchable count per spec, custom-count maximum, occupancy and queue load.

    The scheduler's view may carry a `capacity` object; it is passed through.
    Otherwise only the pool's size is known, so free = total and occupancy is unknown.
    """
    view = info.view
    raw = info.raw
    if isinstance(raw.get("capacity"), dict):
        extra = {k: raw.get(k) for k in ("occupancy", "queue", "as_of")}
        return {
            "pool_id": view.pool_id,
            "source": info.source,
            "total_gpus": view.total_gpus,
            **raw["capacity"],
            **extra,
        }
    total = view.total_gpus or 0
    launchable = {name: total // gpus for name, gpus in sorted(view.specs.items())}
    return {
        "pool_id": view.pool_id,
        "source": info.source,
        "total_gpus": view.total_gpus,
        "launchable": launchable,
        "custom_gpus_max": total,
        "occupancy": None,
        "queued_tasks": None,
    }


def describe(info: PoolInfo) -> dict[str, Any]:
    """A pool as `GET /v1/pools` answers it."""
    return {**info.view.model_dump(mode="json"), "source": info.source}
