"""Text the store cannot hold: Postgres text and jsonb refuse the NUL character.

Every edge (HTTP path, query, headers used, JSON bodies; gRPC fields) checks
its input with `reject_nul` before the application layer sees it, so such a
request is a 400 `request.invalid` naming the field, never a 500.
"""

from __future__ import annotations

from typing import Any

from runyard.gateway.errors import BadRequest

NUL = "\x00"


def find_nul(value: Any, field: str = "") -> str | None:
    """The path of the first string (or key) holding a NUL character, if any."""
    if isinstance(value, str):
        return field or "request" if NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{field}.{key}" if field else str(key)
            if isinstance(key, str) and NUL in key:
                return field or "request"
            if (found := find_nul(item, path)) is not None:
                return found
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := find_nul(item, f"{field}[{i}]")) is not None:
                return found
    return None


def reject_nul(value: Any, field: str = "") -> None:
    """Refuse `value` (400 request.invalid) if any string in it holds a NUL character."""
    found = find_nul(value, field)
    if found is not None:
        raise BadRequest(
            "request.invalid",
            f"{found}: the NUL character (\\u0000) is not allowed",
            "remove the NUL character",
            found,
        )
