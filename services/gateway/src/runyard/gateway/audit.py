"""`GET /v1/audit/events`: audit queries over the whole event log, for SREs.

A thin edge over `runyard.eventstore.audit`: it checks the caller's role
(sre or platform_admin; everyone else a 403 `auth.audit_only`), parses and
bounds the query parameters (docs/limits.md), and answers one page,
oldest event first, with the cursor of the next. Payloads are masked as for
anyone but a task's creator (docs/api.md, "Audit").
"""

import difflib
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest
from runyard.api.inputs import check_param
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import caller_dependency
from runyard.contracts import default_mapper
from runyard.contracts import http as wire
from runyard.eventstore.audit import (
    MAX_AUDIT_LIMIT,
    MAX_AUDIT_TYPES,
    AuditFilter,
    InvalidCursor,
    audit_page,
)
from runyard.gateway.app import Gateway

AUDIT_ROLES = frozenset({"sre", "platform_admin"})
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)


def require_auditor(caller: Principal) -> None:
    """Refuse every role but sre and platform_admin."""
    caller.require_every_tenant_reader(
        "auth.audit_only",
        "an audit query over the whole log",
        "read your tasks' events with GET /v1/tasks/{id}/events (runyard events ID),"
        " or ask a platform admin for an sre token",
    )


def parse_time(name: str, value: str | None) -> datetime | None:
    """An ISO 8601 time with a zone, between 1970 and 3000; 400 `audit.time_range` else."""
    if value is None:
        return None
    check_param(name, value)
    try:
        at = datetime.fromisoformat(value)
    except ValueError as exc:
        raise BadRequest(
            "audit.time_range",
            f"{name}: {value!r} is not an ISO 8601 time",
            "send e.g. 2026-12-01T10:00:00Z",
            name,
        ) from exc
    if at.tzinfo is None or not EARLIEST <= at <= LATEST:
        raise BadRequest(
            "audit.time_range",
            f"{name} must have a zone and lie between 1970-01-01 and 3000-01-01",
            f"add Z or +00:00, or leave {name} out for an open range",
            name,
        )
    return at


def category_types(category: str) -> list[str]:
    """The event types of a stream category; 400 `audit.unknown_category` for none."""
    check_param("category", category)
    types = sorted(n for n, m in default_mapper().models.items() if m.category == category)
    if not types:
        known = sorted({m.category for m in default_mapper().models.values()})
        raise BadRequest(
            "audit.unknown_category",
            f"no event category {category!r}",
            f"one of {', '.join(known)}",
            "category",
        )
    return types


def check_types(types: list[str]) -> None:
    """400 `audit.unknown_type` for a type no event has (every type in the log is one
    the event catalogue knows: an unknown one cannot be read back either), naming
    the nearest known type; a typo would otherwise answer an empty page."""
    models = default_mapper().models
    for name in types:
        if name in models:
            continue
        by_lower = {known.lower(): known for known in models}
        near = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
        hint = (
            f"did you mean {by_lower[near[0]]}?"
            if near
            else "see the event catalogue (docs/events.md) for the event types"
        )
        raise BadRequest("audit.unknown_type", f"no event type {name!r}", hint, "type")


def audit_filter(params: dict[str, Any]) -> AuditFilter:
    """Checked filters from the query parameters. A category is its event types
    (the types index serves it); with `type` too, the types of both."""
    types: list[str] = []
    for text in params.pop("type") or []:
        types += [t.strip() for t in text.split(",") if t.strip()]  # "A, B" as typed
    check_types(types)
    if (category := params.pop("category")) is not None:
        of_category = category_types(category)
        types = [t for t in types if t in of_category] if types else of_category
        if not types:
            types = ["-"]  # no type of the category was asked for: nothing matches
    if len(types) > MAX_AUDIT_TYPES and category is None:
        raise BadRequest(
            "request.invalid",
            f"type: {len(types)} event types, at most {MAX_AUDIT_TYPES}",
            "ask for fewer types",
            "type",
        )
    for name, value in params.items():
        if isinstance(value, str):
            check_param(name, value)
    since = parse_time("since", params.pop("since"))
    until = parse_time("until", params.pop("until"))
    if since and until and since > until:
        raise BadRequest("audit.time_range", "since is after until", "swap them", "since")
    return AuditFilter(
        types=tuple(types),
        since=since,
        until=until,
        **{k: v for k, v in params.items() if v is not None},
    )


def audit_router(gateway: Gateway) -> APIRouter:
    """The audit route over the gateway's event store."""
    router = APIRouter(tags=["audit"], route_class=AnswerRoute)

    @router.get("/v1/audit/events", response_model=wire.AuditPage, responses=refusals(403))
    async def audit_events(
        caller: Annotated[Principal, caller_dependency(gateway)],
        type: Annotated[
            list[str] | None, Query(description="event types (repeat, or comma-separated)")
        ] = None,
        since: Annotated[str | None, Query(description="ISO 8601, inclusive")] = None,
        until: Annotated[str | None, Query(description="ISO 8601, exclusive")] = None,
        category: Annotated[
            str | None, Query(description="task, pool, access or catalogue")
        ] = None,
        actor: Annotated[
            str | None, Query(description="e.g. user:acme/bob; a final * is a prefix")
        ] = None,
        tenant: str | None = None,
        pool: str | None = None,
        node: str | None = None,
        task: str | None = None,
        limit: Annotated[
            int, Query(description=f"1 to {MAX_AUDIT_LIMIT}", ge=1, le=MAX_AUDIT_LIMIT)
        ] = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Events of the whole log matching every given filter, oldest first (sre,
        platform_admin). Pass `next_cursor` back for the next page."""
        require_auditor(caller)
        filters = audit_filter(
            {
                "type": type,
                "since": since,
                "until": until,
                "category": category,
                "actor": actor,
                "tenant": tenant,
                "pool": pool,
                "node": node,
                "task": task,
            }
        )
        if cursor is not None:
            check_param("cursor", cursor)
        try:
            page = await audit_page(gateway.db, filters, limit=limit, cursor=cursor)
        except InvalidCursor as exc:
            raise BadRequest(
                "cursor.invalid", str(exc), "pass next_cursor back with the same filters", "cursor"
            ) from exc
        return {
            "items": [row.as_json() for row in page.items],
            "next_cursor": page.next_cursor,
            "upto": page.upto,
        }

    return router


__all__ = ["AUDIT_ROLES", "audit_filter", "audit_router", "require_auditor"]
