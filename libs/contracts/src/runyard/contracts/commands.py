"""Commands: what one service asks another to do, on a Kafka topic of the doer's.

An event says what happened and lives in a stream forever; a command asks for
something to be done now and means nothing once its asker stopped waiting. So
commands travel on a topic of their own (never in the event store), keyed by
task so that one task's commands keep their order, and each carries when it
expires: a doer that was down skips what is stale instead of acting late.
What a command leads to is recorded as events, with the metadata the command
carries (who asked, and the request or event that caused it: R-62).

    runyard.deployer-commands    CaptureStacks (fault tolerance -> deployer)

Wire format: `{"type": <class name>, "data": <fields>}` as UTF-8 JSON.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from runyard.contracts.envelope import Metadata

#: The deployer's command topic (under the platform's topic prefix), keyed by task id.
DEPLOYER_COMMANDS = "runyard.deployer-commands"
DEPLOYER_COMMANDS_PARTITIONS = 4


class Command(BaseModel):
    """Base of every command: immutable, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Who asked (`user:<tenant>/<name>` or `service:<name>`): the actor of what follows.
    actor: str
    #: The request id or event id that caused the command (the cause of what follows).
    causation_id: str | None = None
    correlation_id: str | None = None
    trace_context: dict[str, str] = {}
    requested_at: datetime
    #: After this the asker no longer waits: a doer skips the command.
    expires_at: datetime

    def metadata(self) -> Metadata:
        """The metadata of the events the command leads to."""
        return Metadata(
            actor=self.actor,
            causation_id=self.causation_id,
            correlation_id=self.correlation_id,
            trace_context=dict(self.trace_context),
        )

    def expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def to_bytes(self) -> bytes:
        body = {"type": type(self).__name__, "data": self.model_dump(mode="json")}
        return json.dumps(body).encode()


class CaptureStacks(Command):
    """Dump the stacks of every worker of one attempt and append `StacksCaptured`
    (R-33). Sent by the fault-tolerance service after a hang (`reason` hang) or on a
    person's request; carried out by the deployer that holds the workers."""

    task_id: Annotated[str, Field(min_length=1)]
    run: Annotated[int, Field(ge=1)]
    attempt: Annotated[int, Field(ge=1)]
    #: Id of the report to be: the asker waits for the `StacksCaptured` naming it.
    report_id: Annotated[str, Field(min_length=1)]
    reason: Literal["hang", "request"]


DeployerCommand = CaptureStacks
COMMANDS: dict[str, type[Command]] = {"CaptureStacks": CaptureStacks}


def parse_command(raw: bytes | None) -> Command | None:
    """The command in a record, or None for anything that is not one (skipped)."""
    try:
        body = json.loads(raw or b"")
        kind = COMMANDS.get(str(body.get("type")))
        return kind.model_validate(body["data"]) if kind is not None else None
    except (ValueError, TypeError, KeyError, AttributeError, ValidationError):
        return None
