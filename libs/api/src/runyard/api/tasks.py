"""A task as a caller may see it, from the event log: what the services that own
a task's data (logs, alerts, fault tolerance) check before they answer."""

from __future__ import annotations

from runyard.api.auth import Principal
from runyard.api.errors import PermissionDenied, task_not_found
from runyard.domain import TaskState, fold
from runyard.eventstore import EventStore


def task_stream(task_id: str) -> str:
    return f"task-{task_id}"


async def visible_task(
    store: EventStore, caller: Principal, task_id: str, *, write: bool = False
) -> TaskState:
    """The task folded from its stream if the caller may read it (a task of another
    tenant is a 404, as no task); with `write`, a 403 unless it may also change it."""
    if write:
        caller.require_write()
    events = await store.read_stream(task_stream(task_id))
    if not events:
        raise task_not_found(task_id)
    state = fold(events, task_id=task_id)
    if not caller.may_read_tenant(state.tenant):
        raise task_not_found(task_id)
    if write and not caller.may_write_tenant(state.tenant):
        raise PermissionDenied(
            "auth.other_tenant",
            f"task {task_id!r} belongs to tenant {state.tenant!r}: you may read it only",
            "use a token of that tenant to change it",
            "task_id",
        )
    return state
