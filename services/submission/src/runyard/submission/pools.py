"""The pools the rules check a spec against: the scheduler's read model, else `pools.yaml`.

The scheduler owns pools and writes `scheduler_pool_views(pool_id, view jsonb)`;
before it has written any (or where it does not run), the pool config file is
the fallback. Either shape becomes a `PoolView` by `pool_view_of`.
"""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import yaml
from runyard.contracts.resources import PoolView, pool_view_of

#: What the rules read of each pool: its description, specs and capacity, not its
#: node, occupancy and queue listings (up to a thousand items each, and the rules
#: check every submission). One statement: a missing table is the fallback's case.
_RULES_VIEWS = (
    "SELECT pool_id, view - 'nodes' - 'occupancy' - 'queue' AS view FROM scheduler_pool_views"
)


async def pool_views(
    conn: asyncpg.Pool | asyncpg.Connection, config_dir: Path
) -> dict[str, PoolView]:
    """Every pool by id, from the scheduler's read model if it has any, else the file."""
    try:
        rows = await conn.fetch(_RULES_VIEWS)
    except asyncpg.UndefinedTableError:  # no scheduler has run on this database
        rows = []
    raws = [{"id": r["pool_id"], **_json(r["view"])} for r in rows]
    if not raws:
        path = config_dir / "pools.yaml"
        loaded = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
        raws = list(loaded.get("pools", []) or [])
    views = (pool_view_of(raw) for raw in raws if isinstance(raw, dict))
    return {view.pool_id: view for view in views if view is not None}


def _json(value: object) -> dict[str, object]:
    loaded = value if isinstance(value, dict) else json.loads(str(value))
    return dict(loaded)
