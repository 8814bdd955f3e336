"""Fixtures shared by the integration tests of one area and another."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.integration.audit_log import AuditLog, built_log


@pytest.fixture
async def log(dsn: str) -> AsyncIterator[AuditLog]:
    """A log of several tenants, pools, nodes and actors (`built_log`), on a fresh database."""
    async with built_log(dsn) as built:
        yield built
