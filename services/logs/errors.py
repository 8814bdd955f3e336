"""Why the log service refuses a request.

LogError                 code, field, message, hint
├── InvalidQuery         a filter or search the service cannot run (HTTP 400)
└── ExportNotFound       no such export for this user (HTTP 404)
"""

from __future__ import annotations


class LogError(Exception):
    """A refused log request: stable `code`, the `field` it concerns, `message`, `hint`."""

    def __init__(self, code: str, message: str, hint: str = "", field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.message = message
        self.hint = hint


class InvalidQuery(LogError):
    """A bad regular expression, an empty word search, a bad cursor or time range."""


class ExportNotFound(LogError):
    """The export does not exist, or belongs to another user."""
