"""The payload fields of an event worth a glance, as `key=value` pairs: the
`detail` of `runyard events`, `runyard watch` and `runyard audit`."""

from __future__ import annotations

from typing import Any

#: Payload fields shown, in this order: what and where first, then why and who.
#: (`attempt` comes first, from the second on: after a restart, which attempt it is.)
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


def detail(data: dict[str, Any]) -> str:
    """The payload fields that say what, where and why, as `key=value` pairs."""
    parts = []
    attempt = data.get("attempt")
    if isinstance(attempt, int) and attempt > 1:
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
