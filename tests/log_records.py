"""Log records as tests write them: a worker's line, with what it does not say defaulted."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from runyard.contracts.loglines import LogRecord, Stream


def log_record(
    at: datetime,
    task_id: str,
    line: str,
    *,
    run: int = 1,
    attempt: int = 1,
    worker: int = 0,
    stream: str = "stdout",
    seq: int | None = None,
) -> LogRecord:
    """The record of `line`, written by worker 0 of run 1, attempt 1 to stdout unless said."""
    return LogRecord(
        at=at,
        task_id=task_id,
        run=run,
        attempt=attempt,
        worker=worker,
        stream=cast(Stream, stream),
        line=line,
        seq=seq,
    )
