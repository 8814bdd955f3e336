"""The task list, live by server-sent events: `GET /tasks/stream` (an `EventSource`).

While the newest page of the list is shown, the browser's `EventSource`
(static/console.js) gets the rows that changed: every `TICK_S` the stream reads
the page as the list does (one keyset query on the task list) and sends

- `event: row`, a `<tr>`, for each row whose values changed (same rows, same order);
- `event: rows`, the page's rows, when rows came, went or moved;
- a comment every `HEARTBEAT_S` when nothing changed (proxies keep it open);
- `event: end` when the session ended (signed out, expired, token revoked) or
  the gateway stops (it waits for open answers: `Console.close` ends them).

A stream lasts `MAX_S` at most; the browser reconnects by itself. While the
stream is not open (no `EventSource`, a proxy that buffers, a reconnect) the
rows poll every 2 s as before, so the page stays live either way (ADR 0006).
Each stream is one of its tenant's open streams at the gateway
(`streams_per_tenant`, `runyard.gateway.limits`): past them it is refused (429)
and the page polls.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request as HttpRequest
from fastapi.responses import Response
from runyard.api.errors import Unauthenticated
from runyard.contracts.envelope import utcnow
from runyard.gateway.console import display
from runyard.gateway.console.pages import PAGE_SIZE, Console, SignedIn, list_query, template
from runyard.gateway.limits import CountedStream

TICK_S = 1.0
HEARTBEAT_S = 15.0
#: How long one stream lasts; the browser reconnects (its session checked again).
MAX_S = 300.0
#: Ticks between authentications of the session's token (a revoked token ends it).
AUTH_EVERY = 10


async def task_stream(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The changed rows of the newest page of the list, as server-sent events."""
    query = list_query(request)
    # one of the tenant's open streams (429 past them: the rows poll every 2 s instead)
    close = console.gw.streams.take(who.principal.tenant)
    return CountedStream(
        _changes(console, request, who, query),
        close,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _changes(
    console: Console, request: HttpRequest, who: SignedIn, query: dict[str, Any]
) -> AsyncIterator[str]:
    shown: dict[str, str] = {}
    order: list[str] = []
    started = last_sent = time.monotonic()
    yield "retry: 2000\n\n"
    tick = 0
    while time.monotonic() - started < MAX_S and not await request.is_disconnected():
        if not await _still_signed_in(console, who, tick):
            yield _event("end", "")
            return
        rows = await _page(console, who, query)
        keys = {r["task_id"]: _key(r) for r in rows}
        ids = [r["task_id"] for r in rows]
        if ids != order:
            yield _event("rows", _rows_html(rows))
        else:
            for row in rows:
                if shown.get(row["task_id"]) != keys[row["task_id"]]:
                    yield _event("row", template("task_row.html", t=row))
        if ids != order or any(shown.get(k) != v for k, v in keys.items()):
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent > HEARTBEAT_S:
            last_sent = time.monotonic()
            yield ": still here\n\n"
        shown, order = keys, ids
        tick += 1
        if await _closing(console):
            yield _event("end", "")
            return


async def _closing(console: Console) -> bool:
    """Wait a tick; True when the gateway is stopping meanwhile."""
    try:
        async with asyncio.timeout(TICK_S):
            await console.closing.wait()
    except TimeoutError:
        return False
    return True


async def _still_signed_in(console: Console, who: SignedIn, tick: int) -> bool:
    if await console.sessions.get(who.session.session_id) is None:
        return False
    if tick % AUTH_EVERY:
        return True
    try:
        await console.gw.authenticate(who.session.token)
    except Unauthenticated:
        return False
    return True


async def _page(console: Console, who: SignedIn, query: dict[str, Any]) -> list[dict[str, Any]]:
    page = await console.gw.list_tasks(
        who.principal, query["filters"], PAGE_SIZE, None, query["tenant"]
    )
    now = utcnow()
    rows: list[dict[str, Any]] = page["items"]
    for row in rows:
        row["age"] = display.age(row["created_at"], now)
    return rows


def _key(row: dict[str, Any]) -> str:
    """What a row shows, but its age (which changes every second by itself)."""
    return json.dumps({k: v for k, v in row.items() if k != "age"}, sort_keys=True, default=str)


def _rows_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return '<tr><td colspan="8">No tasks match.</td></tr>'
    return "".join(template("task_row.html", t=row) for row in rows)


def _event(name: str, data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in (data.splitlines() or [""]))
    return f"event: {name}\n{lines}\n"


PAGES = (("GET", "/tasks/stream", task_stream),)
