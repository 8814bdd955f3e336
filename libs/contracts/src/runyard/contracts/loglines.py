"""The record of one worker output line on the `runyard.logs` topic.

The deployer publishes one record per line a worker writes (key: the task id);
the log service stores them and the fault-tolerance service reads them (env
check items, hangs, resumes, slowdowns). A record is not an event: no
envelope, no event store, no inbox; a line delivered twice is stored once
(`dedupe`) and is harmless to detections.

Wire format, UTF-8 JSON (`to_bytes`, `from_bytes`):

    {"schema_version": 1, "at": "2026-11-30T01:02:03.456789+00:00", "task_id": "…",
     "run": 1, "attempt": 1, "worker": 0, "stream": "stdout", "line": "…", "seq": 41}

`seq` is there only when the publisher numbers lines: the line's number in its
worker's stream (per task, run, attempt, worker and stream, from 0).

Evolving it: a new optional field keeps the version (a reader ignores fields it
does not know, so older readers still read newer records); a change an older
reader would misread raises `SCHEMA_VERSION`, and a reader refuses a version
newer than its own instead of misreading it. A record without `schema_version`
(published before the field existed) is version 1. Absent `attempt` is 1.

Decoding is strict about the fields it knows: JSON types as written (a run is a
number, not a string), a time with its zone, the bounds below (the store's
columns, the deployer's longest line, the spec's largest task); whatever is
wrong raises `MalformedLogRecord` naming the field.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from datetime import datetime
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)
from runyard.contracts.spec import MAX_ID, MAX_WORKERS

#: The shape of the record this code writes and the newest it reads.
SCHEMA_VERSION = 1
#: The longest line in characters: the deployer cuts output at 64 KiB of bytes
#: (`runyard.deployer.outputs.LINE_MAX`), which never decodes to more characters.
MAX_LINE = 64 * 1024
#: Run, attempt and worker are 32-bit columns in the log store; seq is 64-bit.
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1

Stream = Literal["stdout", "stderr"]


class MalformedLogRecord(ValueError):
    """A message on the logs topic that is not a log record: `field` says where
    (empty for the message as a whole), `reason` what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason

    @classmethod
    def of(cls, error: ValidationError) -> MalformedLogRecord:
        """The first problem pydantic found, naming the others in the reason."""
        problems = [
            (".".join(map(str, e["loc"])), e["msg"].removeprefix("Value error, "))
            for e in error.errors()
        ]
        field, reason = problems[0]
        others = "; ".join(f"{f}: {r}" if f else r for f, r in problems[1:])
        return cls(field, f"{reason} (also {others})" if others else reason)


class LogRecord(BaseModel):
    """One line a worker wrote (without its newline), as it travels on `runyard.logs`
    from the deployer to the log service and the fault-tolerance service."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", strict=True, use_attribute_docstrings=True
    )

    #: Where it travels (under the platform's topic prefix), keyed by task id.
    topic: ClassVar[str] = "runyard.logs"
    #: Which service publishes it, and which read it (for the event catalogue).
    emitted_by: ClassVar[str] = "deployer"
    reacted_by: ClassVar[tuple[str, ...]] = ("logs", "faulttolerance")

    schema_version: Annotated[int, Field(ge=1)] = SCHEMA_VERSION
    """Shape of the record; absent in records older than the field: 1."""
    at: AwareDatetime
    """When the deployer read the line, with its zone."""
    task_id: Annotated[str, Field(min_length=1, max_length=MAX_ID, pattern=r"^[^\x00-\x1f\x7f]+$")]
    """The task's id (no control characters)."""
    run: Annotated[int, Field(ge=1, le=MAX_INT32)]
    """The run of the task (reruns add runs)."""
    attempt: Annotated[int, Field(ge=1, le=MAX_INT32)] = 1
    """The attempt of the run (restarts add attempts)."""
    worker: Annotated[int, Field(ge=0, lt=MAX_WORKERS)]
    """The worker's index in the task, from 0."""
    stream: Stream
    """The output stream the worker wrote the line to."""
    line: Annotated[str, Field(max_length=MAX_LINE)]
    """The text, without its newline; a NUL (Postgres text cannot hold one) is read as U+FFFD."""
    seq: int | None = Field(default=None, ge=0, le=MAX_INT64)
    """The line's number in its worker's stream, from 0; absent when not numbered."""

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"version {version} is newer than this code reads ({SCHEMA_VERSION});"
                " upgrade Runyard"
            )
        return version

    @field_validator("line")
    @classmethod
    def _no_nul(cls, line: str) -> str:
        return line.replace("\x00", "\ufffd") if "\x00" in line else line

    @field_serializer("at")
    def _at_iso(self, at: datetime) -> str:
        return at.isoformat()  # `+00:00`, as every publisher has always written it

    def __eq__(self, other: object) -> bool:
        # Where a record was decoded from is not part of what it is.
        # (`dedupe`, once known, is kept beside the fields.)
        if not isinstance(other, LogRecord):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        if update:  # another line: its identity is worked out again
            copied.__dict__.pop("dedupe", None)
        return copied

    def to_bytes(self) -> bytes:
        """The message value to publish."""
        return self.model_dump_json(exclude_none=True).encode()

    def key(self) -> bytes:
        """The message key to publish under: the task's stream id, as its events are,
        so a task's lines and events lie in partitions of the same number (fault
        tolerance reads the two together: `runyard.messaging.copartition`)."""
        return f"task-{self.task_id}".encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> LogRecord:
        """The record in a message value, or `MalformedLogRecord` saying what is wrong."""
        if raw is None:
            raise MalformedLogRecord("", "no value")
        try:
            record = cls.model_validate_json(raw)
        except ValidationError as exc:
            raise MalformedLogRecord.of(exc) from None
        if record.seq is None:
            # A redelivered message has the same bytes: hashing them is cheaper
            # than hashing the fields, and identifies the line as well. What
            # `dedupe` computes and keeps is set here (no private attribute: one
            # costs every decoded record about 2 us, most of a decode).
            record.__dict__["dedupe"] = _md5_uuid(raw)
        return record

    @cached_property
    def dedupe(self) -> uuid.UUID:
        """The identity of this line under redelivery, the log store's dedupe key.

        With `seq`: (task, run, attempt, worker, stream, seq), so a line published
        twice with a different time (a deployer reading a file again after a restart)
        is one line, and two identical lines in the same microsecond are two. Without
        it: the hash of the message as published (the same line on the same stream
        at the same microsecond, published once and delivered again), or for a
        record built in code, of its fields."""
        if self.seq is not None:
            stream = numbered_key(self.task_id, self.run, self.attempt, self.worker, self.stream)
            key = f"{stream}{self.seq}"
        else:
            key = (
                f"{self.task_id}\x1f{self.run}\x1f{self.attempt}\x1f{self.worker}"
                f"\x1f{self.stream}\x1f{self.at.isoformat()}\x1f{self.line}"
            )
        return _md5_uuid(key.encode())


_FIELDS = tuple(LogRecord.model_fields)


def numbered_key(task_id: str, run: int, attempt: int, worker: int, stream: str) -> str:
    """The start every numbered line of one worker stream shares in the key its
    identity (`LogRecord.dedupe`) hashes; the line's number follows it."""
    return f"{task_id}\x1f{run}\x1f{attempt}\x1f{worker}\x1f{stream}\x1f#"


def _md5_uuid(data: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=hashlib.md5(data, usedforsecurity=False).digest())
