"""Why the log service refuses a request.

Each is a `RunyardError` (runyard.errors): the HTTP and gRPC edges answer it
with its status, code, field and hint, wherever it is raised.

RunyardError
└── LogError             code, field, message, hint
    ├── InvalidQuery     a filter or search the service cannot run (HTTP 400)
    ├── ExportNotFound   no such export for this user (HTTP 404)
    └── LogBusy          the searches that may run at once are running (HTTP 429)
"""

from __future__ import annotations

from runyard.errors import RunyardError


class LogError(RunyardError):
    """A refused log request: stable `code`, the `field` it concerns, `message`, `hint`."""

    http_status = 400

    def __init__(self, code: str, message: str, hint: str = "", field: str = "") -> None:
        super().__init__(message, code=code, hint=hint, field=field)


class InvalidQuery(LogError):
    """A bad regular expression, an empty word search, a bad cursor or time range."""


class ExportNotFound(LogError):
    """The export does not exist, or belongs to another user."""

    http_status = 404


class LogBusy(LogError):
    """Searches of the caller's tenant (or of all tenants) that may run at once are
    running, and none ended in time (`runyard.logs.slots`): send it again shortly."""

    http_status = 429
    retryable = True
    retry_after_s = 2

    def __init__(self, message: str) -> None:
        super().__init__(
            "logs.busy",
            message,
            "send it again in a few seconds; a search narrowed to a worker, a run or a"
            " time range, or of words or a phrase rather than a regular expression,"
            " ends sooner",
        )
