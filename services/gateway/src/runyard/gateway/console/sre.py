"""The SRE pages (the sre and platform_admin roles only: they read every tenant):

- `/sre/events`: the event log's newest events, live (the rows are redrawn
  every 2 s: one indexed query for the newest page), filtered by event type
  and by task; older pages by position (`limit` a page, 50 by default).
  Types, streams, actors and ids only: payloads stay on the tasks' own pages,
  masked there;
- `/sre/health`: every service the gateway knows an address of (the same
  `endpoints` it routes to), asked for `/readyz` and `/metrics` now: ready or
  what it waits for, and the consumers' lag (`runyard_consumer_lag`); a service
  the gateway cannot reach is shown as such, with why;
- `/tasks/{id}/trace` (every reader of the task, not only these roles): the
  causation tree of the task's events (`runyard trace TASK`, the same
  `TraceApi` as `GET /v1/tasks/{id}/trace`), each event under its cause.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import Request as HttpRequest
from fastapi.responses import Response
from runyard.errors import RunyardError
from runyard.gateway.audit import check_types
from runyard.gateway.console import reads
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render, whole_number
from runyard.gateway.proxy import why
from runyard.gateway.trace import TraceApi

#: Events a page of the tail may show (`?limit=`; 50 by default).
MAX_TAIL = 200
#: Seconds a service has to answer /readyz or /metrics before it is shown as not answering.
HEALTH_TIMEOUT_S = 2.0
_LAG = re.compile(r"^runyard_consumer_lag\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _sre_only(who: SignedIn, what: str) -> None:
    who.principal.require_every_tenant_reader(
        "console.sre_only", what, "ask someone with the sre or platform_admin role"
    )


async def events(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The event tail page (its rows redraw themselves while it shows the newest); an
    event type no event has is said so, with the nearest known one (as the audit does),
    not answered with an empty page."""
    _sre_only(who, "the event tail")
    event_type = request.query_params.get("type", "").strip()
    try:
        if event_type:
            check_types([event_type])
    except RunyardError as exc:
        filters = {"type": event_type, "task": request.query_params.get("task", "").strip()}
        shown = {"rows": [], "filters": filters, "live": False, "rows_url": "", "older_url": None}
        return render("sre_events.html", who, status=exc.http_status, error=exc, **shown)
    return render("sre_events.html", who, **await _tail(console, request))


async def event_rows(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    _sre_only(who, "the event tail")
    return render("sre_event_rows.html", who, **await _tail(console, request))


async def _tail(console: Console, request: HttpRequest) -> dict[str, Any]:
    q = request.query_params
    event_type = q.get("type", "").strip() or None
    task = q.get("task", "").strip() or None
    before_text, limit_text = q.get("before", ""), q.get("limit", "")
    before = whole_number(before_text)
    asked = whole_number(limit_text)
    limit = max(min(asked, MAX_TAIL), 1) if asked is not None else reads.TAIL_PAGE
    rows = await reads.event_tail(
        console.gw.db,
        event_type=event_type,
        stream_id=f"task-{task}" if task else None,
        before=before,
        limit=limit,
    )
    filters = {k: v for k, v in (("type", event_type), ("task", task)) if v}
    if limit != reads.TAIL_PAGE:
        filters["limit"] = str(limit)
    query = urlencode(filters)
    older = None
    if len(rows) == limit:
        older = f"{PREFIX}/sre/events?{urlencode({**filters, 'before': rows[-1]['position']})}"
    return {
        "rows": rows,
        "filters": {"type": event_type or "", "task": task or ""},
        "live": before is None,
        "rows_url": f"{PREFIX}/sre/events/rows?{query}",
        "older_url": older,
    }


async def health(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Each known service's readiness and its consumers' lag, asked now."""
    _sre_only(who, "service health")
    endpoints = {
        name: url
        for name, url in sorted(dict(console.owners.endpoints).items())
        if str(url).startswith(("http://", "https://"))
    }
    client = console.owners.client
    answers = await asyncio.gather(*(_health_of(client, n, u) for n, u in endpoints.items()))
    lags: dict[tuple[str, str], float] = {}
    for answer in answers:
        for lag in answer.pop("lags"):
            lags[(lag["consumer"], lag["topic"])] = lag["lag"]
    shown = [{"consumer": c, "topic": t, "lag": v} for (c, t), v in sorted(lags.items())]
    return render("sre_health.html", who, services=answers, lags=shown)


async def _health_of(client: httpx.AsyncClient, name: str, url: str) -> dict[str, Any]:
    base = url.rstrip("/")
    found: dict[str, Any] = {"name": name, "url": base, "lags": []}
    try:
        ready = await client.get(f"{base}/readyz", timeout=HEALTH_TIMEOUT_S)
        found["ready"] = ready.status_code == 200
        body = ready.json() if "json" in ready.headers.get("content-type", "") else {}
        found["waiting"] = body.get("waiting") if isinstance(body, dict) else None
        metrics = await client.get(f"{base}/metrics", timeout=HEALTH_TIMEOUT_S)
        if metrics.status_code == 200:
            found["lags"] = consumer_lags(metrics.text)
    except httpx.HTTPError as exc:
        found["ready"] = None
        found["error"] = why(exc)
    return found


def consumer_lags(text: str) -> list[dict[str, Any]]:
    """The `runyard_consumer_lag{consumer, topic}` samples of a Prometheus text page."""
    lags = []
    for match in _LAG.finditer(text):
        labels = dict(_LABEL.findall(match["labels"]))
        try:
            value = float(match["value"])
        except ValueError:
            continue
        lags.append(
            {"consumer": labels.get("consumer", ""), "topic": labels.get("topic", ""), "lag": value}
        )
    return lags


async def trace(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The causation tree of a task's events (404 for a task the caller may not read)."""
    task_id = request.path_params["task_id"]
    found = await TraceApi(console.gw).task_trace(who.principal, task_id)
    return render("trace.html", who, task_id=task_id, trace=found)


PAGES = (
    ("GET", "/sre/events", events),
    ("GET", "/sre/events/rows", event_rows),
    ("GET", "/sre/health", health),
    ("GET", "/tasks/{task_id}/trace", trace),
)
