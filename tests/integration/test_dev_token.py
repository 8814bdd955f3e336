"""`runyard up`'s dev admin token: created once, written to a file, reused."""

from __future__ import annotations

from pathlib import Path

import asyncpg
from runyard.api.auth import authenticate, ensure_dev_token
from runyard.stack.up import all_migrations


async def test_dev_token_is_created_once_and_reused(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "token"
    first = await ensure_dev_token(dsn, path, all_migrations())
    assert path.read_text().strip() == first
    assert path.stat().st_mode & 0o777 == 0o600
    assert await ensure_dev_token(dsn, path, all_migrations()) == first
    conn = await asyncpg.connect(dsn)
    try:
        principal = await authenticate(conn, first)
    finally:
        await conn.close()
    assert (principal.tenant, principal.user, principal.role) == ("dev", "admin", "platform_admin")
    path.write_text("ry_not-a-real-token\n")
    replaced = await ensure_dev_token(dsn, path, all_migrations())
    assert replaced != first and path.read_text().strip() == replaced
