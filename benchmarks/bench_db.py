"""Databases for a benchmark run on a Postgres server it was given or started."""

from __future__ import annotations

import uuid

import asyncpg


async def fresh_database(server_dsn: str) -> str:
    """Create a database of its own name on the server of `server_dsn`; its DSN."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, _ = server_dsn.rpartition("/")
    return f"{base}/{name}"
