"""The SRE pages over the log's past (the sre and platform_admin roles only):

- `/sre/audit`: the audit query (`GET /v1/audit/events`, `runyard audit`): the
  events of every stream matching an actor, a task, event types and a time
  range, oldest first, 50 a page (the API's cursor, fixed to the log's head
  when the first page was read; `?limit=` up to 200), payloads masked as for anyone but a task's
  creator;
- `/sre/time-travel`: a task as it was at a point of the log, a position or an
  ISO 8601 time (`GET /v1/tasks/{id}/replay?at=`, `runyard show ID --at P`):
  its state folded up to there, and the events of its stream up to there;
- `/sre/whatif`: what-if scheduling (`POST /v1/pools/whatif`, `runyard
  whatif`): a window of the log played again on a pool with other nodes or
  another queue policy; the real and the simulated queue times and
  utilisation side by side. The scheduler answers it (reading the log only),
  asked with the signed-in user's own token.

The same use cases as the API (`audit_filter`/`audit_page`, `ReplayApi`, the
scheduler's route), so the rules and the masking are theirs.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import yaml
from fastapi import Request as HttpRequest
from fastapi.responses import Response
from runyard.api.errors import BadRequest
from runyard.contracts.envelope import utcnow
from runyard.contracts.http import WHATIF_FIGURES
from runyard.errors import RunyardError
from runyard.eventstore.audit import InvalidCursor, audit_page
from runyard.gateway.audit import audit_filter
from runyard.gateway.console import yamltext
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render, whole_number
from runyard.gateway.replay import ReplayApi
from runyard.gateway.views import event_view

AUDIT_PAGE = 50
#: The most events an audit page shows (`?limit=`).
MAX_AUDIT_PAGE = 200
#: Events of the task's stream shown on the time-travel page (the last ones up to the point).
TRAVEL_EVENTS = 200
POLICIES = ("backfill", "fifo")
AUDIT_FIELDS = ("actor", "task", "type", "tenant", "since", "until")
#: A window end as the CLI takes it: `30m`, `1h`, `2d` (ago), or an ISO 8601 time.
_AGO = re.compile(r"^(\d{1,6})\s*([smhd])(?:\s+ago)?$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
FIGURES = WHATIF_FIGURES


def _sre_only(who: SignedIn, what: str) -> None:
    who.principal.require_every_tenant_reader(
        "console.sre_only", what, "ask someone with the sre or platform_admin role"
    )


async def audit(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """A page of the audit query's events (none asked: the form and the first page)."""
    _sre_only(who, "the audit")
    q = request.query_params
    values = {k: q.get(k, "").strip() for k in AUDIT_FIELDS}
    cursor = q.get("cursor") or None
    limit_text = q.get("limit", "")
    asked = whole_number(limit_text)
    limit = max(1, min(asked, MAX_AUDIT_PAGE)) if asked is not None else AUDIT_PAGE
    shown: dict[str, Any] = {
        "values": values,
        "error": None,
        "rows": [],
        "next_url": None,
        "limit": limit,
    }
    try:
        filters = audit_filter(
            {
                "type": [values["type"]] if values["type"] else None,
                "category": None,
                **{k: values[k] or None for k in AUDIT_FIELDS if k != "type"},
                "pool": None,
                "node": None,
            }
        )
        page = await audit_page(console.gw.db, filters, limit=limit, cursor=cursor)
    except InvalidCursor as exc:
        shown["error"] = BadRequest(
            "cursor.invalid", str(exc), "start again from the first page", "cursor"
        )
        return render("sre_audit.html", who, status=400, **shown)
    except RunyardError as exc:
        shown["error"] = exc
        return render("sre_audit.html", who, status=exc.http_status, **shown)
    rows = [row.as_json() for row in page.items]
    for row in rows:
        stream = row["stream_id"]
        row["task_id"] = stream.removeprefix("task-") if stream.startswith("task-") else None
    params = {k: v for k, v in values.items() if v}
    if limit != AUDIT_PAGE:
        params["limit"] = str(limit)
    if page.next_cursor:
        shown["next_url"] = (
            f"{PREFIX}/sre/audit?{urlencode({**params, 'cursor': page.next_cursor})}"
        )
    shown.update(rows=rows, upto=page.upto, paged=cursor is not None, first_url=_url(params))
    return render("sre_audit.html", who, **shown)


def _url(params: dict[str, str]) -> str:
    return f"{PREFIX}/sre/audit?{urlencode(params)}" if params else f"{PREFIX}/sre/audit"


async def time_travel(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """A task as it was at `at` (a position or a time), and its events up to there."""
    _sre_only(who, "time travel")
    task_id = request.query_params.get("task", "").strip()
    at = request.query_params.get("at", "").strip()
    shown: dict[str, Any] = {"task_id": task_id, "at": at, "found": None, "events": []}
    if not task_id or not at:
        return render("sre_time_travel.html", who, **shown)
    try:
        found = await ReplayApi(console.gw).task_at(who.principal, task_id, at)
    except RunyardError as exc:
        if exc.http_status == 404:
            raise  # another tenant's task reads as no task, as on every page
        return render("sre_time_travel.html", who, status=exc.http_status, error=exc, **shown)
    version = int(found["as_of"]["version"])
    first = max(1, version - TRAVEL_EVENTS + 1)
    recorded = await console.gw.store.read_stream(
        f"task-{task_id}", first, limit=version - first + 1
    )
    events = [event_view(e, is_creator=False) for e in recorded if e.stream_version <= version]
    return render(
        "sre_time_travel.html",
        who,
        **{**shown, "found": found, "events": list(reversed(events)), "cut": first - 1},
    )


async def whatif_form(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The what-if form: the pool, the window, the changed nodes or policy."""
    _sre_only(who, "what-if scheduling")
    pools = [p["pool_id"] for p in await console.gw.pools(who.principal)]
    form = {"pool": request.query_params.get("pool", ""), "from": "1h", "to": "0m"}
    return render("sre_whatif.html", who, pools=pools, form=form, answer=None, error=None)


async def whatif(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Play the window again as the form changes it; the compared outcomes."""
    _sre_only(who, "what-if scheduling")
    form = await console.form(request, who)
    pools = [p["pool_id"] for p in await console.gw.pools(who.principal)]
    shown: dict[str, Any] = {"pools": pools, "form": form, "figures": FIGURES}
    try:
        body = whatif_body(form)
        answer = await console.owners.call(
            "scheduler", "POST", "/v1/pools/whatif", token=who.session.token, body=body
        )
    except RunyardError as exc:
        return render(
            "sre_whatif.html", who, status=exc.http_status, answer=None, error=exc, **shown
        )
    return render("sre_whatif.html", who, answer=answer, error=None, **shown)


def whatif_body(form: dict[str, str]) -> dict[str, Any]:
    """The `POST /v1/pools/whatif` body of the form: the window, the policy, the pool,
    and its changed nodes (a count and GPUs each, or a pools document in YAML)."""
    pool = form.get("pool", "").strip()
    policy = form.get("policy", "backfill")
    body: dict[str, Any] = {
        "from": window_point(form.get("from", ""), "from"),
        "to": window_point(form.get("to", ""), "to"),
        "policy": policy if policy in POLICIES else "backfill",
    }
    if pool:
        body["pool"] = pool
    document = form.get("pools_yaml", "").strip()
    nodes, gpus = form.get("nodes", "").strip(), form.get("gpus", "").strip()
    if document:
        body["pools"] = _pools_document(document)
    elif nodes or gpus:
        node_count, node_gpus = whole_number(nodes), whole_number(gpus)
        if not pool or node_count is None or node_gpus is None:
            raise BadRequest(
                "console.whatif_nodes",
                "changed nodes need the pool, a node count and the GPUs of each node",
                "pick the pool and give both numbers, or leave both empty to replay as it was",
                "nodes",
            )
        body["pools"] = [
            {
                "id": pool,
                "nodes": {"prefix": f"{pool}-whatif-", "count": node_count, "gpus": node_gpus},
            }
        ]
    return body


def window_point(text: str, field: str) -> str:
    """An ISO 8601 time as typed, or `30m`, `1h`, `2d` (ago) as the time it was then."""
    value = text.strip()
    ago = _AGO.match(value)
    if ago:
        try:
            return (utcnow() - timedelta(**{_UNITS[ago[2]]: int(ago[1])})).isoformat()
        except OverflowError:  # before year 1 (999999d)
            raise BadRequest(
                "console.whatif_window",
                f"{field}: {value!r} ago is before any time the log can hold",
                "a what-if replays at most 7 days: e.g. 1h, 2d, or 2026-12-01T10:00Z",
                field,
            ) from None
    if not value:
        raise BadRequest(
            "console.whatif_window",
            f"{field} is empty",
            "e.g. 1h (ago) or 2026-12-01T10:00Z",
            field,
        )
    return value


def _pools_document(text: str) -> list[Any]:
    loaded = yamltext.load(
        text,
        code="console.whatif_pools",
        what="the pools document",
        hint=_POOLS_HINT,
        field="pools",
        loader=yaml.safe_load,
    )
    pools = loaded.get("pools") if isinstance(loaded, dict) else loaded
    if not isinstance(pools, list):
        raise BadRequest(
            "console.whatif_pools", "the pools document has no list of pools", _POOLS_HINT, "pools"
        )
    return pools


_POOLS_HINT = "pools: [{id: dev-a100, nodes: {prefix: n-, count: 8, gpus: 8}}]"


PAGES = (
    ("GET", "/sre/audit", audit),
    ("GET", "/sre/time-travel", time_travel),
    ("GET", "/sre/whatif", whatif_form),
    ("POST", "/sre/whatif", whatif),
)
