"""Task groups (R-17) for people who never open a terminal (`runyard group ...`,
`/v1/groups`):

- `/groups`: the tenant's groups, newest first (id, tasks, a count per status, when
  made and last changed); sre and platform_admin may read another tenant's
  (`?tenant=`);
- `/new-group`: a group as YAML or JSON (`template:` a task spec, `items:` each
  task's overrides, `group_id:` optional), prefilled with an example on a pool of
  the platform; submitted through the use case of `POST /v1/groups` (every task or
  none); a refusal shows its code, field (and item) and hint above the text, which
  is kept as typed;
- `/groups/{id}`: the group's tasks as the task list shows them, and a count per
  status, polled every 2 s (`?live=1`: that part alone; a 204 while it shows
  what it would draw); **Stop the group** (its
  tasks that have not ended) and **Rerun the group** (its finished tasks, all or
  none), each confirmed and sent with the session's CSRF token, as
  `runyard group stop|rerun` send them.

What a token may see and do is what it may through the API: another tenant's group
is a 404 to a member, read-only to sre and platform_admin.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import yaml
from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response
from runyard.api.inputs import parse_body
from runyard.contracts.envelope import utcnow
from runyard.contracts.requests import RerunChanges, TaskGroupRequest
from runyard.contracts.spec import MAX_GROUP_SIZE
from runyard.domain.task import TERMINAL_STATUSES
from runyard.errors import RunyardError
from runyard.gateway.console import display, yamltext
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render

#: Groups on a page of `/groups`.
GROUPS_LISTED = 50


async def groups(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """A page of the tenant's groups, newest first (`?tenant=`: another's, for sre and
    admins; `?cursor=`: the page after the one that gave it)."""
    tenant = request.query_params.get("tenant", "").strip() or None
    cursor = request.query_params.get("cursor") or None
    listed = await console.gw.list_groups(who.principal, GROUPS_LISTED, tenant, cursor)
    params = {"tenant": tenant} if tenant else {}
    older = listed["next_cursor"]
    return render(
        "groups.html",
        who,
        groups=listed["items"],
        tenant=tenant or "",
        older_url=f"{PREFIX}/groups?{urlencode({**params, 'cursor': older})}" if older else None,
        newest_url=f"{PREFIX}/groups?{urlencode(params)}" if cursor else None,
    )


async def group(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """One group: its tasks and a count per status (404 for a group the caller may not
    read); the stop and rerun buttons for those who may change it."""
    tenant = request.query_params.get("tenant", "").strip() or None
    live = request.query_params.get("live") == "1"
    seen = request.query_params.get("seen") if live else None
    return await _group_page(
        console, who, request.path_params["group_id"], tenant, live=live, seen=seen
    )


async def stop(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Stop every task of the group that has not ended."""
    group_id = request.path_params["group_id"]
    await console.form(request, who)
    await console.gw.stop_group(who.request(), group_id)
    return RedirectResponse(_group_url(group_id), status_code=303)


async def rerun(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Rerun every finished task of the group (all or none); a refusal (nothing has
    finished yet) shows on the group's page."""
    group_id = request.path_params["group_id"]
    await console.form(request, who)
    try:
        await console.gw.rerun_group(who.request(), group_id, RerunChanges())
    except RunyardError as exc:
        if exc.http_status in (403, 404):  # not the caller's to change: as a stop answers
            raise
        return await _group_page(console, who, group_id, None, error=exc)
    return RedirectResponse(_group_url(group_id), status_code=303)


async def new_group_form(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The form for a new group, prefilled with an example on one of the pools."""
    text = await _example(console, who)
    return render("group_new.html", who, text=text, error=None, max_items=MAX_GROUP_SIZE)


async def create(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Make the group (every task or none); a refusal shown above the text, kept."""
    form = await console.form(request, who)
    text = form.get("group", "")
    try:
        body = parse_body(TaskGroupRequest, parse_group(text))
        made = await console.gw.create_group(who.request(), body)
    except RunyardError as exc:
        return render(
            "group_new.html",
            who,
            status=exc.http_status,
            text=text,
            error=exc,
            max_items=MAX_GROUP_SIZE,
        )
    return RedirectResponse(_group_url(made["group_id"]), status_code=303)


def parse_group(text: str) -> dict[str, Any]:
    """The group of the textarea: a YAML (or JSON) mapping read as a group file is
    (`runyard.contracts.yamlcore`); 400 `console.group_yaml` else, and 413
    `request.too_large` when it is more than `POST /v1/groups` takes (`yamltext`)."""
    loaded: dict[str, Any] = yamltext.load_mapping(
        text,
        code="console.group_yaml",
        what="the group",
        hint="fix the line it names (YAML or JSON: a mapping with template: and items:)",
        field="group",
        shape="`template:` (a task spec) and `items:` (the overrides of each task)",
    )
    return loaded


async def _group_page(
    console: Console,
    who: SignedIn,
    group_id: str,
    tenant: str | None,
    *,
    error: RunyardError | None = None,
    live: bool = False,
    seen: str | None = None,
) -> Response:
    """The group's page (`live`: only its part that refreshes every 2 s; a 204, which
    htmx leaves as it is, while it is still what the poll's `seen` names)."""
    found = await console.gw.get_group(who.principal, group_id, tenant)
    now = utcnow()
    tasks = found["tasks"]
    shown = _shown(tasks, now)
    if live and seen == shown:
        return Response(status_code=204, headers={"Cache-Control": "no-store"})
    for row in tasks:
        row["age"] = display.age(row["created_at"], now)
    owner = tasks[0]["tenant"] if tasks else who.principal.tenant
    return render(
        "group_live.html" if live else "group.html",
        who,
        status=error.http_status if error is not None else 200,
        live_url=_group_url(group_id, tenant, live=True, seen=shown),
        group=found,
        tenant=tenant or "",
        tasks=tasks,
        may_change=who.principal.role != "sre" and owner == who.principal.tenant,
        running=sum(n for s, n in found["status_counts"].items() if s not in TERMINAL_STATUSES),
        ended=sum(n for s, n in found["status_counts"].items() if s in TERMINAL_STATUSES),
        error=error,
    )


async def _example(console: Console, who: SignedIn) -> str:
    """A group to start from: two tasks on the first pool of the default resource
    type (else the first pool), its smallest worker spec, the catalogue's first image."""
    pools = await console.gw.pools(who.principal)
    pool = next((p for p in pools if p.get("resource_type") == "subscription"), None)
    pool = pool or (pools[0] if pools else {})
    specs = sorted((pool.get("specs") or {}).items(), key=lambda s: s[1])
    images = (await console.gw.catalogue_view(who.principal)).get("images", [])
    template: dict[str, Any] = {
        "name": "sweep",
        "pool": pool.get("pool_id", "your-pool"),
        "resource_type": pool.get("resource_type", "subscription"),
        "worker_spec": specs[0][0] if specs else "1gpu",
        "image": images[0]["name"] if images else "your-image",
        "command": "python train.py --lr 0.1",
        "tags": ["sweep"],
    }
    example = {
        "template": template,
        "items": [
            {"name": "sweep-lr-0.1"},
            {"name": "sweep-lr-0.01", "command": "python train.py --lr 0.01"},
        ],
    }
    text: str = yaml.safe_dump(example, sort_keys=False, allow_unicode=True, width=100)
    return text


def _shown(tasks: list[dict[str, Any]], now: datetime) -> str:
    """What the group's live part shows, as a short digest: its tasks' rows as the list
    holds them, and the minute (the rows' ages move on). A poll of a group of 1000 tasks
    that has not changed is answered 204, not 1000 rows drawn again every 2 s."""
    rows = json.dumps([tasks, now.strftime("%Y-%m-%dT%H:%M")], sort_keys=True, default=str)
    return hashlib.sha256(rows.encode()).hexdigest()[:24]


def _group_url(
    group_id: str, tenant: str | None = None, *, live: bool = False, seen: str | None = None
) -> str:
    params = {
        **({"tenant": tenant} if tenant else {}),
        **({"live": "1"} if live else {}),
        **({"seen": seen} if live and seen else {}),
    }
    query = f"?{urlencode(params)}" if params else ""
    return f"{PREFIX}/groups/{quote(group_id, safe='')}{query}"


PAGES = (
    ("GET", "/groups", groups),
    ("GET", "/new-group", new_group_form),
    ("POST", "/new-group", create),
    ("GET", "/groups/{group_id}", group),
    ("POST", "/groups/{group_id}/stop", stop),
    ("POST", "/groups/{group_id}/rerun", rerun),
)
