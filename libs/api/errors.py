"""Why a service refuses a request, and the HTTP status each refusal maps to.

The application layer raises typed errors; the edges (HTTP, gRPC, CLI) map them.
The task domain's and the store's errors are translated here too (the
gateway adds the submission rules'), so every refusal of every service answers
the same JSON shape `{code, field, message, hint}`.

    GatewayError                  code, field, message, hint, status
    ├── BadRequest                400 (request.invalid, ...)
    ├── Unauthenticated           401 (auth.missing_token, auth.invalid_token)
    ├── PermissionDenied          403 (auth.admin_only)
    ├── NotFound                  404 (task_not_found, group.not_found, pool.not_found)
    ├── Conflict                  409 (a domain refusal or a concurrent write)
    ├── PayloadTooLarge           413 (request.too_large: a body over the limit;
    │                                  event.too_large: an event over the store's limit)
    └── Unavailable               503 (service.unavailable: the database or the broker
                                       cannot be reached now; answered with Retry-After)

An outage is not the caller's fault and not a bug: an error that only says the
database or the broker cannot be reached now (`is_transient`) is a 503 with
Retry-After, never a 500; the request can be sent again as it is.

A value the database cannot take (asyncpg `DataError`: a number out of its
column's range, text Postgres cannot store) is the caller's input, so it is a
400 `request.invalid` too, never a 500 — a safety net under every router.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiokafka.errors import KafkaError
from asyncpg.exceptions import _base as asyncpg_base
from runyard.domain import DomainError, RerunChangeNotAllowed, TaskNotFound
from runyard.eventstore import ConcurrencyError, EventTooLarge
from runyard.eventstore.transient import DATABASE_ERRORS, is_transient


class GatewayError(Exception):
    """A refused request: stable `code`, the `field` it concerns, `message`, `hint`."""

    status = 400

    def __init__(self, code: str, message: str, hint: str = "", field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.message = message
        self.hint = hint
        self.extra: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        """The error as the API answers it."""
        body = {"code": self.code, "field": self.field, "message": self.message, "hint": self.hint}
        return {**body, **self.extra}


class BadRequest(GatewayError):
    """The request itself is malformed, or the submission rules refused it."""

    status = 400


class Unauthenticated(GatewayError):
    """No bearer token, or one the gateway does not know."""

    status = 401


class PermissionDenied(GatewayError):
    """The caller is known but may not do this (admin operations)."""

    status = 403


class NotFound(GatewayError):
    """No such task, group or pool visible to the caller's tenant."""

    status = 404


class Conflict(GatewayError):
    """The task's state does not allow the operation, or it changed meanwhile."""

    status = 409


class PayloadTooLarge(GatewayError):
    """A request body, or the event it would write, over a size limit (docs/limits.md)."""

    status = 413


class Unavailable(GatewayError):
    """The database or the broker cannot be reached now; send the request again later."""

    status = 503
    #: Seconds the answer's Retry-After header asks the client to wait.
    retry_after_s = 2

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


#: Errors that may be an outage: their handler answers 503 when `is_transient` says so.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    *DATABASE_ERRORS,
    OSError,
    asyncpg.InterfaceError,
    KafkaError,
)

#: Errors of values the database cannot take (server-side class 22, client-side encoding).
DATA_ERRORS: tuple[type[Exception], ...] = (asyncpg.DataError, asyncpg_base.DataError)


def translate(error: Exception) -> GatewayError | None:
    """The API error for a domain or store error (None: not ours)."""
    if isinstance(error, GatewayError):
        return error
    if isinstance(error, TaskNotFound):
        return NotFound(error.code, error.message, error.hint, "task_id")
    if isinstance(error, RerunChangeNotAllowed):
        return BadRequest(error.code, error.message, error.hint)
    if isinstance(error, DomainError):
        return Conflict(error.code, error.message, error.hint)
    if isinstance(error, EventTooLarge):
        return PayloadTooLarge(
            "event.too_large",
            str(error),
            "shorten the longest texts of the request (command, description, variables)",
        )
    if isinstance(error, ConcurrencyError):
        return Conflict("conflict", str(error), "the task changed meanwhile: try again")
    if is_transient(error):
        return Unavailable(
            "service.unavailable",
            f"the database or the broker cannot be reached now ({type(error).__name__})",
            f"send the request again in {Unavailable.retry_after_s} s; the platform resumes"
            " by itself when the outage ends",
        )
    if isinstance(error, DATA_ERRORS):
        return BadRequest(
            "request.invalid",
            f"a value does not fit: {error}",
            "check the numbers and text sent (range, characters)",
        )
    return None


def task_not_found(task_id: str) -> NotFound:
    """The answer for a task that does not exist or belongs to another tenant."""
    return NotFound("task_not_found", f"task {task_id!r} does not exist", "check the task id")
