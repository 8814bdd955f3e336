"""Who calls the HTTP API: the bearer token, checked strictly, and the role's reach.

`caller_dependency` is the one FastAPI dependency every protected route uses
(the gateway's own and the routers it includes), so the OpenAPI document
declares the `HTTPBearer` security scheme on each of them, the header is
parsed one way (`Bearer <token>`, nothing else), and a read-only role (sre)
is refused any method but GET/HEAD/OPTIONS before a handler runs (unless the
route says it only reads: `reads_only`). Operator routes (`operator=True`:
read-model rebuilds, which change how the log is read, never a task) take the
sre and platform_admin roles only, with any method.

(No `from __future__ import annotations` here: FastAPI must see the closure's
own `Depends(bearer)` when it reads `caller`'s signature.)
"""

from typing import Annotated, Any, Protocol

import asyncpg
from fastapi import Depends
from fastapi import Request as HttpRequest
from fastapi.security import HTTPBearer
from runyard.api.auth import BEARER_HINT, Principal, authenticate, bearer_of

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class StrictBearer(HTTPBearer):
    """The `HTTPBearer` scheme of the OpenAPI document, with strict parsing: FastAPI's
    own accepts any case of `bearer` and extra spaces."""

    def __init__(self) -> None:
        super().__init__(scheme_name="HTTPBearer", description=BEARER_HINT, auto_error=False)

    async def __call__(self, request: HttpRequest) -> str | None:  # type: ignore[override]
        return bearer_of(request.headers.getlist("authorization"))


class Authenticator(Protocol):
    async def authenticate(self, token: str | None) -> Principal: ...


class TokenAuthenticator:
    """Bearer tokens checked against the tokens table (hashed, with expiry and
    revocation): what a service that serves routes of its own authenticates with."""

    def __init__(self, db: asyncpg.Pool) -> None:
        self.db = db

    async def authenticate(self, token: str | None) -> Principal:
        return await authenticate(self.db, token)


def caller_dependency(
    gateway: Authenticator, *, reads_only: bool = False, operator: bool = False
) -> Any:
    """A dependency answering the caller's `Principal` (401 without a valid token;
    403 for a change asked with a read-only role). `reads_only`: the route changes
    nothing whatever its method (a query too big for a URL, sent as a POST body), so a
    read-only role may call it. `operator`: 403 for every role but sre and
    platform_admin, whatever the method."""
    bearer = StrictBearer()

    async def caller(
        request: HttpRequest, token: Annotated[str | None, Depends(bearer)]
    ) -> Principal:
        principal = await gateway.authenticate(token)
        if operator:
            principal.require_operator()
        elif request.method not in READ_METHODS and not reads_only:
            principal.require_write()
        return principal

    return Depends(caller)
