"""The Python client of the Runyard gateway's HTTP API, blocking (`Client`) and asyncio
(`AsyncClient`), typed with the models the gateway answers with
(`runyard.contracts.http`).

    from runyard.client import Client

    with Client("http://127.0.0.1:8080", token) as runyard:
        task = runyard.create_task({"name": "hello", "pool": "pool-a", ...})
        runyard.stop_task(task.task_id)

A body is a mapping, or one of the API's request models (`runyard.contracts.requests`:
`TaskSubmission`, `RerunChanges`, `TaskGroupRequest`, `TokenRequest`, ...), sent with
the fields that were set. A refusal raises `ApiError` (its `status`, and the `Error`
body: code, message, hint, field), a connection that fails `GatewayUnreachable`.
Failures that may pass are sent again (`Retry`): any call whose connection could not
be made; a 429 with Retry-After whose code says nothing was done (`submission.busy`,
`streams.too_many`, `logs.busy`), whatever the call; a 503 or a broken connection only
for calls that may be sent twice (reads, deletes, stops).
"""

from runyard.client._async import AsyncClient
from runyard.client._calls import Call, segment
from runyard.client._errors import (
    ApiError,
    BadRequest,
    ClientError,
    Conflict,
    GatewayUnreachable,
    InvalidId,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    TooBusy,
    Unauthenticated,
    Unavailable,
    refusal,
)
from runyard.client._retry import NO_RETRY, REFUSED_BEFORE_ACTING, Retry
from runyard.client._sync import Client

__all__ = [
    "NO_RETRY",
    "REFUSED_BEFORE_ACTING",
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Call",
    "Client",
    "ClientError",
    "Conflict",
    "GatewayUnreachable",
    "InvalidId",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "Retry",
    "TooBusy",
    "Unauthenticated",
    "Unavailable",
    "refusal",
    "segment",
]
