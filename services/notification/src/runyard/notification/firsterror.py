"""The first error of a run (R-42) for an alert card, as the log service finds it.

The log service owns the first error: its internal route
`GET /internal/v1/tasks/{id}/runs/{run}/first-error` (the same lookup behind
`GET /v1/tasks/{id}/first-error`, called with the platform's service
credential, `runyard.contracts.rpc.credential`) picks the line, the exception
a traceback names and the likely layer. This module only asks it, when it
builds the card of a `failed` or `abnormal` alert (so the last lines the
workers wrote have had the group window to arrive), and turns the answer into
what a card shows: no rules of its own.

A lookup never fails an alert: when no log service is known (no `logs`
endpoint), when it is down, refuses, answers something else or takes longer
than `timeout_s`, or when the run has no error line, the first error is
unknown (None) and the card goes without it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from runyard.api.internal import ServiceClient
from runyard.notification.feishu import MAX_LINE_CHARS, FirstErrorFact

log = logging.getLogger("runyard.notification")

#: The endpoint name of the log service (`ServiceContext.endpoints`).
LOGS = "logs"
#: The most of the log service's answer that is read (a line and its context).
MAX_ANSWER_BYTES = 4 * 1024 * 1024

#: Terminal escapes (colours, cursor moves) and other control characters but tab.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class LogService:
    """The log service's first-error route (`runyard.api.internal.ServiceClient`)."""

    def __init__(self, endpoints: Mapping[str, str], token: str, *, timeout_s: float = 5.0):
        self.service = ServiceClient(endpoints, LOGS, token, max_answer_bytes=MAX_ANSWER_BYTES)
        self.timeout_s = timeout_s

    async def lookup(self, task_id: str, run: int) -> FirstErrorFact | None:
        """The first error of `run` of `task_id`, or None when unknown (never raises)."""
        if not self.service.known:
            return None  # no log service on this platform
        path = f"/internal/v1/tasks/{quote(task_id, safe='')}/runs/{int(run)}/first-error"
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self.service.get(path)
            return fact(body) if body.get("found") else None
        except Exception as exc:  # the alert goes without it
            log.warning(
                "first error of task %s run %s unknown: %s: %s",
                task_id,
                run,
                type(exc).__name__,
                exc,
            )
            return None

    async def aclose(self) -> None:
        await self.service.aclose()


def fact(found: Mapping[str, Any]) -> FirstErrorFact:
    """What a card says of the log service's answer (its `first-error` JSON): the line
    (clean, cut), its worker and attempt, the layer with its rule, and a traceback's
    exception line."""
    line = found["line"]
    exception = found.get("exception")
    return FirstErrorFact(
        line=clean(str(line["line"])),
        worker=int(line["worker"]),
        attempt=int(line["attempt"]),
        layer=str(found["layer"]),
        rule=str(found["rule"]),
        why=str(found["why"]),
        exception=clean(str(exception["line"])) if exception else None,
    )


def clean(line: str, chars: int = MAX_LINE_CHARS) -> str:
    """A log line as a card can show it: no terminal escapes or control characters,
    no trailing blanks, at most `chars` characters (cut with `…`)."""
    text = _CONTROL.sub(" ", _ANSI.sub("", line)).rstrip()
    return text if len(text) <= chars else text[: chars - 1] + "…"
