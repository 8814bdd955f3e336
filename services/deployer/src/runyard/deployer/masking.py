"""Creator-only values kept out of the worker output the platform publishes (R-12).

A worker may print its own creator-only variable (`echo $WANDB_API_KEY`, a
connection string in a traceback). Its line would then reach every reader of
the task's logs, its searches and exports, the fault-tolerance service and
the alert cards: any member of the tenant, not only the creator. So before a
line leaves the deployer (`OutputLine.record`, in every publishing path: the
pump, a line published again after a failure or after the broker lost its
memory), each creator-only value of the task is replaced by `******`, for
everyone, its creator included, as CI systems mask their secrets in job logs.
The worker's own files in its scratch keep what it wrote.

The values are those of the task's creator-only variables in the secret store
of its tenant, whoever started the run (another member's run has them unset,
but may print a value some other way it learned it). They are read once per
task and kept for the last `KEPT_TASKS` tasks; a task without creator-only
variables costs one read of its stream, then a dictionary lookup per line.
Values shorter than `MIN_MASKED_LENGTH` are not masked (they would mask
ordinary words). A value split over two lines, or printed encoded, is not
found: the worker's own code decides what it prints.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Final

from runyard.deployer.app import MIN_MASKED_LENGTH, task_stream
from runyard.deployer.retry import until_done
from runyard.deployer.runtime import OutputLine
from runyard.domain.task import fold
from runyard.eventstore import PostgresEventStore

MASK: Final = "******"
#: Tasks whose values (or whose having none) are kept in memory, the oldest read first out.
KEPT_TASKS: Final = 4096

Mask = Callable[[str], str]


def masker(values: Iterable[str]) -> Mask | None:
    """A function replacing every value (the longest first) by `******`; None for none."""
    kept = sorted({v for v in values if len(v) >= MIN_MASKED_LENGTH}, key=len, reverse=True)
    if not kept:
        return None
    pattern = re.compile("|".join(map(re.escape, kept)))
    return lambda text: pattern.sub(MASK, text)


class SecretMasks:
    """The mask of each task's creator-only values, read from the store when first asked."""

    def __init__(self, store: PostgresEventStore, kept: int = KEPT_TASKS) -> None:
        self.store = store
        self.kept = kept
        self._masks: dict[str, Mask | None] = {}

    async def masked(self, line: OutputLine) -> OutputLine:
        """`line` with its task's creator-only values masked (itself when it has none).

        A store outage waits here, so no line of a task goes out unmasked."""
        task_id = line.task_id
        if task_id in self._masks:
            mask = self._masks[task_id]
        else:
            mask = await until_done(
                lambda: self._read(task_id), what=f"reading the secrets of {task_id}"
            )
            if len(self._masks) >= self.kept:
                del self._masks[next(iter(self._masks))]
            self._masks[task_id] = mask
        if mask is None:
            return line
        text = mask(line.line)
        return line if text == line.line else replace(line, line=text)

    async def _read(self, task_id: str) -> Mask | None:
        # The submission holds the tenant and the variables: a rerun changes neither.
        first = await self.store.read_stream(task_stream(task_id), 1, limit=1)
        if not first:
            return None
        state = fold(first, task_id=task_id)
        refs = sorted({v.secret_ref for v in state.spec.env if v.creator_only and v.secret_ref})
        if not refs:
            return None
        rows = await self.store.pool.fetch(
            "SELECT value FROM secrets WHERE tenant = $1 AND ref = ANY($2)", state.tenant, refs
        )
        return masker(r["value"] for r in rows)
