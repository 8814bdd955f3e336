"""The payload fields of an event worth a glance, as `key=value` pairs: the
`detail` of `runyard events`, `runyard watch` and `runyard audit`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Payload fields shown, in this order: what and where first, then why and who.
#: (`attempt` comes first, from the second on: after a restart, which attempt it is;
#: in a history with a restart, the first one's too: its workers' exits may come after.)
DETAIL_KEYS = (
    "stage",
    "worker",
    "exit_code",
    "item",
    "result",
    "reason",
    "delay_s",
    "step",
    "path",
    "stopped_by",
    "role",
    "requeue_count",
    "node",
    "gpus",
    "faulty_nodes",
    "removed",
    "added",
    "new_task_id",
    "task_id",
    "tenant",
    "user",
)


def detail(data: dict[str, Any], *, restarted: bool = False) -> str:
    """The payload fields that say what, where and why, as `key=value` pairs.
    `restarted`: the history holds a later attempt, so the first one is named too."""
    parts = []
    attempt = data.get("attempt")
    if isinstance(attempt, int) and (attempt > 1 or restarted):
        parts.append(f"attempt={attempt}")
    for key in DETAIL_KEYS:
        value = data.get(key)
        if value in (None, "", [], ()):
            continue
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        parts.append(f"{key}={shown}")
    workers = data.get("workers")
    nodes = {str(w["node"]) for w in workers or () if isinstance(w, dict) and "node" in w}
    if nodes:
        parts.append("nodes=" + ",".join(sorted(nodes)))
    return " ".join(parts)


def has_restarts(events: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any of `events` (their payloads under `data`) is of a later attempt."""
    return any(_attempt(e.get("data")) > 1 for e in events)


def _attempt(data: Any) -> int:
    attempt = data.get("attempt") if isinstance(data, dict) else None
    return attempt if isinstance(attempt, int) else 0
