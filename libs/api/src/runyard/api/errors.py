"""Why a service refuses a request, and the HTTP status each refusal maps to.

The application layer raises typed errors; the edges (HTTP, gRPC, CLI) answer
them. Every error Runyard raises on purpose is a `RunyardError`
(runyard.errors: code, field, message, hint, retryable, and its HTTP and gRPC
status), the task domain's, the store's and each service's included, so every
refusal of every service answers the same JSON shape `{code, field, message,
hint}`. The errors here are the API's own, for refusals of the request itself:

    RunyardError (runyard.errors)
    └── GatewayError              code, field, message, hint, http_status
        ├── BadRequest            400 (request.invalid, ...)
        ├── Unauthenticated       401 (auth.missing_token, auth.invalid_token)
        ├── PermissionDenied      403 (auth.admin_only)
        ├── NotFound              404 (task_not_found, group.not_found, pool.not_found)
        ├── Conflict              409 (the state does not allow it: group.nothing_to_rerun)
        ├── PayloadTooLarge       413 (request.too_large: a body over the limit)
        ├── TooBusy               429 (streams.too_many, submission.busy: the caller's
        │                              tenant has its share of this at once; retryable,
        │                              answered with Retry-After)
        └── Unavailable           503 (service.unavailable: the database, the broker or
                                       another service cannot be reached now; retryable,
                                       answered with Retry-After)

`translate` is what both edges call: a `RunyardError` is answered as it says;
driver errors that reach an edge untranslated are mapped here once. An outage
is not the caller's fault and not a bug: an error that only says the database
or the broker cannot be reached now (`is_transient`) is a 503 with
Retry-After, never a 500; the request can be sent again as it is.

A value the database cannot take (asyncpg `DataError`: a number out of its
column's range, text Postgres cannot store) is the caller's input, so it is a
400 `request.invalid` too, never a 500 — a safety net under every router.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg
from aiokafka.errors import KafkaError
from asyncpg.exceptions import _base as asyncpg_base
from runyard.domain.errors import TASK_NOT_FOUND_HINT
from runyard.errors import (
    RETRY_AFTER_S,
    UNAVAILABLE_CODE,
    UNAVAILABLE_HINT,
    RunyardError,
    outage_message,
)
from runyard.eventstore.transient import DATABASE_ERRORS, is_transient


class GatewayError(RunyardError):
    """A refused request: stable `code`, the `field` it concerns, `message`, `hint`."""

    http_status = 400

    def __init__(self, code: str, message: str, hint: str = "", field: str = "") -> None:
        super().__init__(message, code=code, hint=hint, field=field)


class BadRequest(GatewayError):
    """The request itself is malformed, or the submission rules refused it."""

    http_status = 400


class Unauthenticated(GatewayError):
    """No bearer token, or one the gateway does not know."""

    http_status = 401


class PermissionDenied(GatewayError):
    """The caller is known but may not do this (admin operations)."""

    http_status = 403


class NotFound(GatewayError):
    """No such task, group or pool visible to the caller's tenant."""

    http_status = 404


class Conflict(GatewayError):
    """The task's state does not allow the operation, or it changed meanwhile."""

    http_status = 409


class PayloadTooLarge(GatewayError):
    """A request body, or the event it would write, over a size limit (docs/limits.md)."""

    http_status = 413


class TooBusy(GatewayError):
    """The caller's tenant uses its share of this work at once (open streams, submissions
    in flight: `runyard.api.slots`); send it again shortly."""

    http_status = 429
    retryable = True
    retry_after_s = 2


class Unavailable(GatewayError):
    """The database, the broker or another service cannot be reached now; send the
    request again later."""

    http_status = 503
    retryable = True
    retry_after_s = RETRY_AFTER_S


#: Errors that may be an outage: their handler answers 503 when `is_transient` says so.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    *DATABASE_ERRORS,
    OSError,
    asyncpg.InterfaceError,
    KafkaError,
)

#: Errors of values the database cannot take (server-side class 22, client-side encoding).
DATA_ERRORS: tuple[type[Exception], ...] = (asyncpg.DataError, asyncpg_base.DataError)


#: The API error of each HTTP status (a refusal another service answered).
_OF_STATUS: dict[int, type[GatewayError]] = {
    kind.http_status: kind
    for kind in (
        BadRequest,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        Conflict,
        PayloadTooLarge,
        TooBusy,
        Unavailable,
    )
}


def translate(error: BaseException) -> RunyardError | None:
    """The error an edge answers for `error`; None: a fault of ours (a bare 500 or
    INTERNAL, its text logged, never answered)."""
    if isinstance(error, RunyardError):
        return None if error.http_status == 500 else error
    if is_transient(error):
        return Unavailable(UNAVAILABLE_CODE, outage_message(type(error).__name__), UNAVAILABLE_HINT)
    if isinstance(error, DATA_ERRORS):
        return BadRequest(
            "request.invalid",
            f"a value does not fit: {error}",
            "check the numbers and text sent (range, characters)",
        )
    return None


def error_of(status: int, body: Mapping[str, Any]) -> GatewayError:
    """Another service's refusal, answered with `status` and the error `body`
    `{code, field, message, hint, ...}`, as the same error here (extra members too)."""
    kind = _OF_STATUS.get(status)
    if kind is None:
        kind = type("OwnerError", (GatewayError,), {"http_status": status})
    known = ("code", "field", "message", "hint")
    error = kind(
        str(body.get("code") or "request.refused"),
        str(body.get("message") or ""),
        str(body.get("hint") or ""),
        str(body.get("field") or ""),
    )
    error.extra = {k: v for k, v in body.items() if k not in known}
    return error


def task_not_found(task_id: str) -> NotFound:
    """The answer for a task that does not exist or belongs to another tenant."""
    return NotFound(
        "task_not_found", f"task {task_id!r} does not exist", TASK_NOT_FOUND_HINT, "task_id"
    )
