"""The pools pages: each pool's nodes as a grid of free and used GPUs, what each
worker spec can launch now, and the queue with every task's place and why it waits;
for platform admins, node actions (cordon, uncordon, mark faulty, mark healthy),
each confirmed on a page of its own before it is POSTed.

What is shown is the scheduler's pool view (`scheduler_pool_views`, written by
the scheduler after each change; `pools.yaml` before the scheduler wrote one):
the same document `GET /v1/pools/{id}/capacity` answers from, one row read per
page. A task is named only to those who may read its tenant; anyone else sees
that a GPU or a queue place is another tenant's, not which task holds it. Node
actions go to the scheduler's admin routes with the signed-in user's own token
(the scheduler checks the role again); the console refuses them (403) for any
other role before anything is sent.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response
from runyard.api.errors import NotFound
from runyard.contracts.resources import pool_view_of
from runyard.gateway.console import display, reads
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render
from runyard.gateway.pools import PoolInfo, capacity, describe, load_pools

#: Node actions: path word -> what the confirmation asks and the button says.
NODE_ACTIONS = {
    "cordon": "Cordon node {node}: no new workers go to it; running ones stay.",
    "uncordon": "Uncordon node {node}: it takes new workers again.",
    "fault": "Mark node {node} faulty: its workers are rescheduled, nothing new goes to it.",
    "heal": "Mark node {node} healthy: it was repaired and takes new workers again.",
}


async def pools(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Every pool: zone, type, specs and what each can launch, node health, queue."""
    found = await load_pools(console.gw.db, console.gw.config_dir)
    rows = [
        {
            **describe(info),
            "launchable": display.spec_launchable(info.raw, capacity(info)),
            "health": _mapping(info.raw.get("health")) or None,
            "waiting": _mapping(info.raw.get("queue")).get("waiting"),
            "free_gpus": _mapping(info.raw.get("capacity")).get("free_gpus"),
        }
        for info in found.values()
    ]
    return render("pools.html", who, pools=rows)


async def pool(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """One pool: its node grid, its specs' launchable counts, its queue."""
    pool_id = request.path_params["pool_id"]
    info = await _pool(console, pool_id)
    if info is None:
        raise NotFound(
            "pool.not_found", f"pool {pool_id!r} does not exist", "choose a listed pool", "pool_id"
        )
    raw = info.raw
    listing = _mapping(raw.get("nodes"))
    nodes = listing.get("items") or []
    queue = _mapping(raw.get("queue"))
    waiting = queue.get("items") or []
    held = {o for n in nodes for o in n.get("owners") or [] if o}
    tenants = await reads.task_tenants(console.gw.db, [*held, *(t["task_id"] for t in waiting)])

    def readable(task_id: str | None) -> bool:
        tenant = tenants.get(task_id or "")
        return tenant is not None and who.principal.may_read_tenant(tenant)

    grid = [display.node_cell(n, readable) for n in nodes]
    places = [{**t, "task_id": t["task_id"] if readable(t["task_id"]) else None} for t in waiting]
    return render(
        "pool.html",
        who,
        pool=describe(info),
        launchable=display.spec_launchable(raw, capacity(info)),
        raw=raw,
        grid=grid,
        nodes_total=listing.get("total", len(nodes)),
        queue=queue,
        places=places,
        admin=who.principal.is_platform_admin,
    )


async def confirm_node_action(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The confirmation of a node action (platform admins only)."""
    pool_id, node, action = _node_action(request, who)
    question = NODE_ACTIONS[action].format(node=node)
    return render(
        "node_action.html", who, pool_id=pool_id, node=node, action=action, question=question
    )


async def node_action(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Do a confirmed node action through the scheduler's admin route, as the caller."""
    pool_id, node, action = _node_action(request, who)
    form = await console.form(request, who)
    body = {"reason": form.get("reason", "").strip()} if action == "fault" else None
    path = f"/v1/admin/pools/{quote(pool_id, safe='')}/nodes/{quote(node, safe='')}/{action}"
    await console.owners.call(
        "scheduler", "POST", path, token=who.session.token, body=body, request_id=None
    )
    return RedirectResponse(f"{PREFIX}/pools/{quote(pool_id, safe='')}", status_code=303)


def _node_action(request: HttpRequest, who: SignedIn) -> tuple[str, str, str]:
    """The pool, node and action of the path; a 403 for any role but platform_admin,
    a 404 for an action there is not."""
    who.principal.require_platform_admin()
    action = request.path_params["action"]
    if action not in NODE_ACTIONS:
        raise NotFound(
            "console.no_such_action",
            f"no node action {action!r}",
            f"one of {', '.join(NODE_ACTIONS)}",
            "action",
        )
    return request.path_params["pool_id"], request.path_params["node"], action


async def _pool(console: Console, pool_id: str) -> PoolInfo | None:
    """The pool from its one view row; before the scheduler wrote any, from the config."""
    raw = await reads.pool_view(console.gw.db, pool_id)
    view = pool_view_of({"id": pool_id, **raw}) if raw is not None else None
    if raw is not None and view is not None:
        return PoolInfo(view, "scheduler", raw)
    return (await load_pools(console.gw.db, console.gw.config_dir)).get(pool_id)


def _mapping(value: Any) -> dict[str, Any]:
    """A part of the pool's view that is an object (the config's shapes differ)."""
    return value if isinstance(value, dict) else {}


PAGES = (
    ("GET", "/pools", pools),
    ("GET", "/pools/{pool_id}", pool),
    ("GET", "/pools/{pool_id}/nodes/{node}/{action}", confirm_node_action),
    ("POST", "/pools/{pool_id}/nodes/{node}/{action}", node_action),
)
