"""Each operation of the API as a `Call`: method, path, query, body, and how its answer
is read. The sync and the async client send the same calls; only the waiting differs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, TypeAdapter
from runyard.client._errors import InvalidId
from runyard.client._retry import IDEMPOTENT_METHODS
from runyard.contracts import http as wire

T = TypeVar("T")
#: A request body: JSON-able data, or a model, such as the API's own request models
#: (`runyard.contracts.requests`: TaskSubmission, SpecOverrides, RerunChanges,
#: TaskGroupRequest, TokenRequest), sent with only the fields that were set.
Body = Mapping[str, Any] | BaseModel


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request of the API and how its JSON answer becomes a `T`."""

    method: str
    path: str
    read: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    body: Any = None
    #: Sending it twice does what sending it once does (see `runyard.client._retry`).
    idempotent: bool = field(default=False)

    @property
    def json(self) -> Any:
        if isinstance(self.body, BaseModel):
            return self.body.model_dump(mode="json", exclude_unset=True)
        return None if self.body is None else dict(self.body)


def reader(model: type[T]) -> Callable[[Any], T]:
    adapter = TypeAdapter(model)
    return adapter.validate_python


def raw(answer: Any) -> Any:
    return answer


def call(
    method: str, path: str, read: Callable[[Any], T], *, idempotent: bool | None = None, **kw: Any
) -> Call[T]:
    method = method.upper()
    if idempotent is None:
        idempotent = method in IDEMPOTENT_METHODS
    return Call(method, path, read, idempotent=idempotent, **kw)


def segment(value: str) -> str:
    """`value` (an id) as one segment of a URL path: percent-encoded whole (a `%`, `?` or
    `#` is sent as itself), and `.` or `..` as `%2E`, `%2E%2E` (not the path's dot
    segments, which would name another route). An id holding a `/` raises `InvalidId`:
    the gateway decodes `%2F` before it routes, so no encoding keeps it one segment."""
    if "/" in value:
        raise InvalidId(value)
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


_TASK = reader(wire.Task)
_GROUP = reader(wire.Group)

# --- tasks ----------------------------------------------------------------------------


def create_task(spec: Body) -> Call[wire.Task]:
    return call("POST", "/v1/tasks", _TASK, body=spec)


def get_task(task_id: str) -> Call[wire.Task]:
    return call("GET", f"/v1/tasks/{segment(task_id)}", _TASK)


def list_tasks(
    *,
    status: str | None = None,
    name: str | None = None,
    tag: str | None = None,
    pool: str | None = None,
    creator: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
    tenant: str | None = None,
) -> Call[wire.TaskPage]:
    params = _given(
        status=status,
        name=name,
        tag=tag,
        pool=pool,
        creator=creator,
        limit=limit,
        cursor=cursor,
        tenant=tenant,
    )
    return call("GET", "/v1/tasks", reader(wire.TaskPage), params=params)


def stop_task(task_id: str) -> Call[wire.Task]:
    # A stop asked twice stops the task once (the second ask of a task that has ended
    # by then is a 409, which the caller may take as done).
    return call("POST", f"/v1/tasks/{segment(task_id)}/stop", _TASK, idempotent=True)


def rerun_task(task_id: str, changes: Body | None = None) -> Call[wire.Task]:
    return call("POST", f"/v1/tasks/{segment(task_id)}/rerun", _TASK, body=changes or {})


def clone_task(task_id: str, overrides: Body | None = None) -> Call[wire.Task]:
    return call("POST", f"/v1/tasks/{segment(task_id)}/clone", _TASK, body=overrides or {})


def task_events(task_id: str) -> Call[list[wire.TaskEvent]]:
    return call("GET", f"/v1/tasks/{segment(task_id)}/events", reader(list[wire.TaskEvent]))


# --- groups ---------------------------------------------------------------------------


def create_group(group: Body) -> Call[wire.Group]:
    return call("POST", "/v1/groups", _GROUP, body=group)


def get_group(group_id: str, *, tenant: str | None = None) -> Call[wire.Group]:
    """The caller's tenant's group (`tenant`: another's, for sre and platform_admin)."""
    return call("GET", f"/v1/groups/{segment(group_id)}", _GROUP, params=_given(tenant=tenant))


def list_groups(
    *, limit: int | None = None, tenant: str | None = None, cursor: str | None = None
) -> Call[wire.GroupPage]:
    """A page of the caller's tenant's groups (`tenant`: another's, for sre and
    platform_admin), after `cursor` (a page's `next_cursor`)."""
    params = _given(limit=limit, tenant=tenant, cursor=cursor)
    return call("GET", "/v1/groups", reader(wire.GroupPage), params=params)


def stop_group(group_id: str) -> Call[wire.Group]:
    return call("POST", f"/v1/groups/{segment(group_id)}/stop", _GROUP, idempotent=True)


def rerun_group(group_id: str, changes: Body | None = None) -> Call[wire.Group]:
    return call("POST", f"/v1/groups/{segment(group_id)}/rerun", _GROUP, body=changes or {})


# --- pools and catalogue --------------------------------------------------------------


def pools() -> Call[list[wire.Pool]]:
    return call("GET", "/v1/pools", reader(list[wire.Pool]))


def pool_capacity(pool_id: str) -> Call[wire.PoolCapacity]:
    return call("GET", f"/v1/pools/{segment(pool_id)}/capacity", reader(wire.PoolCapacity))


def catalogue() -> Call[wire.Catalogue]:
    return call("GET", "/v1/catalogue", reader(wire.Catalogue))


# --- logs, fault tolerance, causation -------------------------------------------------


def task_logs(task_id: str, **query: Any) -> Call[wire.LogPage]:
    """`query`: worker (a list), run, since, until, words, phrase, regex, ignore_case,
    order, limit, cursor."""
    path = f"/v1/tasks/{segment(task_id)}/logs"
    return call("GET", path, reader(wire.LogPage), params=_given(**query))


def first_error(task_id: str, run: int | None = None) -> Call[wire.FirstError]:
    path = f"/v1/tasks/{segment(task_id)}/first-error"
    return call("GET", path, reader(wire.FirstError), params=_given(run=run))


def ft_log(task_id: str) -> Call[wire.FaultToleranceLog]:
    return call("GET", f"/v1/tasks/{segment(task_id)}/ft-log", reader(wire.FaultToleranceLog))


def task_trace(task_id: str, limit: int | None = None) -> Call[wire.Trace]:
    path = f"/v1/tasks/{segment(task_id)}/trace"
    return call("GET", path, reader(wire.Trace), params=_given(limit=limit))


def audit_events(**query: Any) -> Call[wire.AuditPage]:
    """`query`: type, since, until, category, actor, tenant, pool, node, task, limit,
    cursor (sre, platform_admin)."""
    return call("GET", "/v1/audit/events", reader(wire.AuditPage), params=_given(**query))


# --- tokens and alerts ----------------------------------------------------------------


def create_token(request: Body) -> Call[wire.IssuedToken]:
    return call("POST", "/v1/admin/tokens", reader(wire.IssuedToken), body=request)


def list_tokens(
    *, tenant: str | None = None, include_revoked: bool | None = None
) -> Call[wire.TokenPage]:
    params = _given(tenant=tenant, include_revoked=include_revoked)
    return call("GET", "/v1/admin/tokens", reader(wire.TokenPage), params=params)


def revoke_token(token_id: str) -> Call[wire.TokenInfo]:
    return call("DELETE", f"/v1/admin/tokens/{segment(token_id)}", reader(wire.TokenInfo))


def alert_subscriptions() -> Call[wire.AlertSubscriptions]:
    return call("GET", "/v1/alert-subscriptions", reader(wire.AlertSubscriptions))


def subscribe_alerts(subscription: Body) -> Call[wire.AlertSubscription]:
    path = "/v1/alert-subscriptions"
    return call("POST", path, reader(wire.AlertSubscription), body=subscription)


def unsubscribe_alerts(subscription_id: str) -> Call[wire.Deleted]:
    path = f"/v1/alert-subscriptions/{segment(subscription_id)}"
    return call("DELETE", path, reader(wire.Deleted))
