"""One worker output line as the deployer publishes it on `runyard.logs`.

The record is JSON: `{"at", "task_id", "run", "attempt", "worker", "stream",
"line"}` and, when the publisher numbers lines, `"seq"`: the line's number in
its worker's stream (per task, run, attempt, worker and stream, from 0; the
deployer numbers each output file's lines as it reads them). The dedupe key
makes a redelivered record a no-op: with `seq` it is (task, run, attempt,
worker, stream, seq), so a line published twice with a different time (a
deployer re-reading after a restart) is still one line, and two identical
lines in the same microsecond are two; without it, the message's bytes (the
same line, on the same stream, at the same microsecond, published once and
delivered again), or the fields for a record built in code.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Stream = Literal["stdout", "stderr"]


class MalformedRecord(ValueError):
    """A message on the logs topic that is not a log line (skipped and counted)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    at: datetime
    task_id: str
    run: int
    attempt: int
    worker: int
    stream: Stream
    line: str
    seq: int | None = None
    #: The hash of the message as published, when it came from the topic.
    message_hash: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def dedupe(self) -> uuid.UUID:
        """The identity of this line under redelivery."""
        if self.message_hash is not None and self.seq is None:
            return uuid.UUID(bytes=self.message_hash)
        if self.seq is not None:
            key = (
                f"{self.task_id}\x1f{self.run}\x1f{self.attempt}\x1f{self.worker}"
                f"\x1f{self.stream}\x1f#{self.seq}"
            )
        else:
            key = (
                f"{self.task_id}\x1f{self.run}\x1f{self.attempt}\x1f{self.worker}"
                f"\x1f{self.stream}\x1f{self.at.isoformat()}\x1f{self.line}"
            )
        return uuid.UUID(bytes=hashlib.md5(key.encode(), usedforsecurity=False).digest())

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "at": self.at.isoformat(),
            "task_id": self.task_id,
            "run": self.run,
            "attempt": self.attempt,
            "worker": self.worker,
            "stream": self.stream,
            "line": self.line,
        }
        if self.seq is not None:
            body["seq"] = self.seq
        return body


def parse(raw: bytes | None) -> LogRecord:
    """The log record of a message value, or `MalformedRecord`."""
    try:
        body = json.loads(raw or b"")
        at = datetime.fromisoformat(body["at"])
        if at.tzinfo is None:
            raise MalformedRecord("`at` has no time zone")
        stream = body["stream"]
        if stream not in ("stdout", "stderr"):
            raise MalformedRecord(f"unknown stream {stream!r}")
        seq = body.get("seq")
        return LogRecord(
            at=at,
            task_id=str(body["task_id"]),
            run=int(body["run"]),
            attempt=int(body.get("attempt", 1)),
            worker=int(body["worker"]),
            stream=stream,
            # Postgres text cannot hold NUL; a worker may still print one.
            line=str(body["line"]).replace("\x00", "\ufffd"),
            seq=None if seq is None else int(seq),
            # A redelivered message has the same bytes: hashing them is cheaper
            # than hashing the fields, and identifies the line as well.
            message_hash=hashlib.md5(raw or b"", usedforsecurity=False).digest(),
        )
    except MalformedRecord:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedRecord(f"{type(exc).__name__}: {exc}") from exc
