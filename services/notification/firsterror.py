"""The first error of a run (R-42) for an alert card, as the log service finds it.

The log service owns the first error: `LogStore.first_error(task_id, run)`
(its public surface, the same call behind `GET /v1/tasks/{id}/first-error`)
picks the line, the exception a traceback names and the likely layer. This
module only asks it, when it builds the card of a `failed` or `abnormal`
alert (so the last lines the workers wrote have had the group window to
arrive), and turns the answer into what a card shows: no rules of its own.

A lookup never fails an alert: when the log service never ran (no
`log_lines` table), when the run has no logs or no error line, when the
query fails or takes longer than `timeout_s`, the first error is unknown
(None) and the card goes without it.
"""

from __future__ import annotations

import asyncio
import logging
import re

import asyncpg
from runyard.logs import FirstError, LogStore
from runyard.notification.feishu import MAX_LINE_CHARS, FirstErrorFact

log = logging.getLogger("runyard.notification")

#: Terminal escapes (colours, cursor moves) and other control characters but tab.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


async def lookup(
    db: asyncpg.Pool, task_id: str, run: int, *, timeout_s: float
) -> FirstErrorFact | None:
    """The first error of `run` of `task_id`, or None when unknown (never raises)."""
    try:
        async with asyncio.timeout(timeout_s):
            if not await db.fetchval("SELECT to_regclass('log_lines') IS NOT NULL"):
                return None  # the log service never ran on this database
            found = await LogStore(db).first_error(task_id, run)
    except Exception as exc:  # the alert goes without it
        log.warning(
            "first error of task %s run %s unknown: %s: %s", task_id, run, type(exc).__name__, exc
        )
        return None
    return None if found is None else fact(found)


def fact(found: FirstError) -> FirstErrorFact:
    """What a card says of the log service's answer: the line (clean, cut), its worker
    and attempt, the layer with its rule, and a traceback's exception line."""
    c = found.classification
    exception = found.exception
    return FirstErrorFact(
        line=clean(found.line.line),
        worker=found.line.worker,
        attempt=found.line.attempt,
        layer=c.layer,
        rule=c.rule,
        why=c.why,
        exception=clean(exception.line) if exception is not None else None,
    )


def clean(line: str, chars: int = MAX_LINE_CHARS) -> str:
    """A log line as a card can show it: no terminal escapes or control characters,
    no trailing blanks, at most `chars` characters (cut with `…`)."""
    text = _CONTROL.sub(" ", _ANSI.sub("", line)).rstrip()
    return text if len(text) <= chars else text[: chars - 1] + "…"
