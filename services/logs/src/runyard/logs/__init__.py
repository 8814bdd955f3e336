"""The log service (R-40..R-42): worker output stored, searched, exported,
and the first error found and classified.

Public surface: the store and its query, the first-error rules, the ingester,
exports, and the gateway router. The topic's record is a contract
(`runyard.contracts.loglines.LogRecord`).
"""

from runyard.logs.errors import ExportNotFound, InvalidQuery, LogError
from runyard.logs.exports import Exports
from runyard.logs.firsterror import (
    Classification,
    Traceback,
    choose_traceback,
    classify,
    error_block,
    is_error,
    is_warning,
    traceback_exception,
)
from runyard.logs.ingest import LogIngester
from runyard.logs.search import LogQuery
from runyard.logs.store import FirstError, LogLine, LogPage, LogStore, logs_migrations

__all__ = [
    "Classification",
    "ExportNotFound",
    "Exports",
    "FirstError",
    "InvalidQuery",
    "LogError",
    "LogIngester",
    "LogLine",
    "LogPage",
    "LogQuery",
    "LogStore",
    "Traceback",
    "choose_traceback",
    "classify",
    "error_block",
    "is_error",
    "is_warning",
    "logs_migrations",
    "traceback_exception",
]
