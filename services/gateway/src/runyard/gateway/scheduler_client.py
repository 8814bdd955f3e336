"""The gateway's client of the scheduler's API: where waiting tasks stand (R-07).

The queue read model belongs to the scheduler; the gateway asks its
`GET /v1/internal/queue?task_id=...` route with the caller's own token (the
scheduler answers only tasks of tenants that caller may read). Queue places
are extra detail on a task: while the scheduler cannot be reached the gateway
still answers, without them (`queue_entries` answers {} and logs why).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx

log = logging.getLogger("runyard.gateway")

QUEUE_PATH = "/v1/internal/queue"
#: Task ids per request (the scheduler's bound is 500).
CHUNK = 200
#: The scheduler answers from one indexed query: a slow answer means trouble.
TIMEOUT_S = 5.0


async def queue_entries(
    http: httpx.AsyncClient,
    base_url: str,
    task_ids: Sequence[str],
    *,
    authorization: str,
    request_id: str | None = None,
) -> dict[str, dict[str, Any]]:
    """task id -> queue entry (reason, position, gpus_needed, launchable, blocked, pool,
    run, queued_at, as_of) for those of `task_ids` that wait in a queue.

    `authorization` is the caller's `Authorization` header, forwarded as is. Tasks
    that do not wait are absent; everything is absent when the scheduler is down
    or refuses (the answer is logged)."""
    ids = list(dict.fromkeys(task_ids))
    headers = {"Authorization": authorization}
    if request_id:
        headers["X-Request-Id"] = request_id
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        try:
            answer = await http.get(
                base_url.rstrip("/") + QUEUE_PATH,
                params=[("task_id", task) for task in chunk],
                headers=headers,
                timeout=TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            log.warning("scheduler unreachable at %s (%r): queue places left out", base_url, exc)
            return found
        if answer.status_code != 200:
            log.warning(
                "scheduler answered %s to %s: queue places left out (%s)",
                answer.status_code,
                QUEUE_PATH,
                answer.text[:300],
            )
            return found
        found.update(answer.json()["entries"])
    return found
