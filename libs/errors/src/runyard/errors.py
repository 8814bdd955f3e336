"""The root of every error Runyard raises on purpose, and what the edges read from it.

Each layer keeps its own errors, where they are raised, and every one of them
derives from `RunyardError`: a stable `code` (what scripts, tests and logs match
on), a `message` for a person, a `hint` that says what to do, the `field` of the
request it concerns, and `retryable` (sending the same again may succeed: a
consumer retries instead of dead-lettering, a client waits and sends again).
Each class also says how an edge answers it, `http_status` and `grpc_status`,
so an edge translates it once, the same way wherever it was raised: HTTP in
`runyard.api.service.install_error_handlers`, gRPC in `runyard.api.grpc_errors`.

    RunyardError                            code, message, hint, field, retryable
    ├── DomainError (runyard.domain)        409; TaskNotFound 404, RerunChangeNotAllowed 400
    ├── EventStoreError (runyard.eventstore)
    │   ├── ConcurrencyError                409 ABORTED `conflict` (retryable)
    │   ├── EventTooLarge                   413 `event.too_large`
    │   └── StoreUnavailable                503 UNAVAILABLE `service.unavailable` (retryable)
    ├── GatewayError (runyard.api)          BadRequest 400 ... Unavailable 503 (retryable)
    ├── SchedulerError (runyard.scheduler.domain), SchedulerServiceError (runyard.scheduler)
    ├── SubmissionError (runyard.submission) 400
    ├── LogError (runyard.logs)             InvalidQuery 400, ExportNotFound 404
    └── SubscriptionError (runyard.notification)

An outage (`retry_after_s` set: the database or the broker cannot be reached
now) is a 503 with Retry-After over HTTP and UNAVAILABLE over gRPC, never a 500.
An error whose `http_status` is 500 (the default) is a fault of Runyard, not a
refusal: the edges answer it like any unexpected exception, a bare 500 or
INTERNAL whose text says nothing of it (it is logged instead).

This module imports nothing, so every layer may use it (the pure domain too).
"""

from __future__ import annotations

from typing import Any

#: The gRPC status of each HTTP status an error may have (docs/api.md, "gRPC").
GRPC_STATUS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
#: Seconds an outage's answer asks the client to wait (the Retry-After header).
RETRY_AFTER_S = 2
#: The code, message and hint of an outage, whatever component it hit.
UNAVAILABLE_CODE = "service.unavailable"
UNAVAILABLE_HINT = (
    f"send the request again in {RETRY_AFTER_S} s; the platform resumes by itself"
    " when the outage ends"
)


def outage_message(kind: str) -> str:
    """What an answer says of an outage: the kind of error, never its text (which may
    name hosts, users or a connection string)."""
    return f"the database or the broker cannot be reached now ({kind})"


class RunyardError(Exception):
    """An error Runyard raises on purpose (see the module docstring).

    `str(error)` is `detail` when given (for logs: it may hold internals), else the
    `message`; answers carry only `to_dict()`."""

    code: str = "runyard.error"
    retryable: bool = False
    #: How the edges answer it; 500: a fault of ours, answered as an unexpected error.
    http_status: int = 500
    #: The gRPC status name; empty: the one of `http_status` (`GRPC_STATUS`).
    grpc_code: str = ""
    #: Seconds for the Retry-After header of an outage; None: no header.
    retry_after_s: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        hint: str = "",
        field: str = "",
        detail: str | None = None,
    ) -> None:
        super().__init__(message if detail is None else detail)
        if code is not None:
            self.code = code
        self.message = message
        self.hint = hint
        self.field = field
        #: More members of the answer's body (a task group's `item`, a busy node's `tasks`).
        self.extra: dict[str, Any] = {}

    @property
    def grpc_status(self) -> str:
        """The name of the gRPC status code of the answer (`grpc.StatusCode[name]`)."""
        fallback = "INTERNAL" if self.http_status >= 500 else "INVALID_ARGUMENT"
        return self.grpc_code or GRPC_STATUS.get(self.http_status, fallback)

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of the answer: Retry-After for an outage."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(self.retry_after_s)}

    def to_dict(self) -> dict[str, Any]:
        """The error as every API answers it: `{code, field, message, hint}` and `extra`."""
        body = {
            "code": str(self.code),
            "field": self.field,
            "message": self.message,
            "hint": self.hint,
        }
        return {**body, **self.extra}


__all__ = [
    "GRPC_STATUS",
    "RETRY_AFTER_S",
    "UNAVAILABLE_CODE",
    "UNAVAILABLE_HINT",
    "RunyardError",
    "outage_message",
]
