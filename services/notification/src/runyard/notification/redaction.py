"""Secret values kept out of what an alert says (R-12).

An alert goes to a chat the task's creator may not be alone in (a team's
bot, a tenant subscription), and a card quotes text the workers wrote: the
first error line is what a worker printed, and a worker may print its own
creator-only variable (`connect failed: postgres://app:<password>@db`).
Before such text goes into a card (and into the outbox row it is built
from), every secret value of the task is replaced by `[redacted]`: the
values of its creator-only variables (from the secret store, or given inline)
and the signing secrets of its alert subscriptions. The bundle redacts the
same values (docs/support-bundle.md, "Secrets").

Values shorter than `MIN_SECRET_CHARS` are not searched for: they would match
ordinary words and numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Final

from runyard.contracts.spec import MASK, TaskSpec
from runyard.notification.feishu import AlertFacts, FirstErrorFact
from runyard.notification.store import Db

REDACTED: Final = "[redacted]"
MIN_SECRET_CHARS: Final = 8


class Redactor:
    """Replaces a task's secret values in text by `[redacted]` (the longest first)."""

    def __init__(self, values: Iterable[str]) -> None:
        found = {v for v in values if v and v != MASK and len(v) >= MIN_SECRET_CHARS}
        ordered = sorted(found, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None

    def text(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text

    def first_error(self, fact: FirstErrorFact) -> FirstErrorFact:
        exception = None if fact.exception is None else self.text(fact.exception)
        return replace(fact, line=self.text(fact.line), exception=exception)

    def facts(self, facts: AlertFacts) -> AlertFacts:
        """The facts with every text a worker or a person may have written redacted."""
        first = None if facts.first_error is None else self.first_error(facts.first_error)
        return replace(
            facts,
            task_name=self.text(facts.task_name),
            reason=self.text(facts.reason),
            first_error=first,
        )


NOTHING: Final = Redactor(())


def secret_refs(spec: TaskSpec) -> set[str]:
    """The secret store references of the spec: creator-only variables, alert signing."""
    refs = {v.secret_ref for v in spec.env if v.creator_only and v.secret_ref}
    return refs | {a.secret_ref for a in spec.alerts if a.secret_ref}


async def task_redactor(db: Db, tenant: str, spec: TaskSpec) -> Redactor:
    """The redactor of a task's secrets (no query when its spec has none)."""
    values = [v.value for v in spec.env if v.creator_only and v.value]
    refs = secret_refs(spec)
    if refs:
        rows = await db.fetch(
            "SELECT value FROM secrets WHERE tenant = $1 AND ref = ANY($2)", tenant, sorted(refs)
        )
        values += [r["value"] for r in rows]
    return Redactor(values) if values else NOTHING
