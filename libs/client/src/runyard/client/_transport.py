"""Where the client sends, with which token, and what a failed connection means."""

from __future__ import annotations

import os

import httpx
from runyard.client._errors import GatewayUnreachable

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0
#: Failures before anything was sent: the call may be sent again whatever it is.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def base_url(url: str | None) -> str:
    """`url`, else RUNYARD_URL, else the gateway of `runyard up`."""
    return url or os.environ.get("RUNYARD_URL") or DEFAULT_URL


def headers(token: str | None) -> dict[str, str]:
    """The Authorization header of `token`, else of RUNYARD_TOKEN (none without either)."""
    token = token or os.environ.get("RUNYARD_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def unreachable(error: httpx.TransportError) -> GatewayUnreachable:
    """The failure, naming the gateway it was sent to (a mistyped URL shows)."""
    reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    try:
        asked = error.request.url
    except RuntimeError:  # no request: nothing to name
        url = ""
    else:
        url = f"{asked.scheme}://{asked.netloc.decode()}" if asked.netloc else str(asked)
    return GatewayUnreachable(reason, sent=not isinstance(error, NOT_SENT), url=url)


__all__ = ["DEFAULT_TIMEOUT_S", "DEFAULT_URL", "base_url", "headers", "unreachable"]
