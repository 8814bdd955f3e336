"""A task as a caller may see it, from the event log: what the services that own
a task's data (logs, alerts, fault tolerance) check before they answer."""

from __future__ import annotations

from collections import OrderedDict

from runyard.api.auth import Principal
from runyard.api.errors import PermissionDenied, task_not_found
from runyard.domain import TaskState, evolve
from runyard.eventstore import EventStore

#: How many folded tasks a `TaskStates` keeps (those asked for last), and how many
#: bytes their specs may take together as JSON: a spec is most of a task's state,
#: and a large one (up to an event's 512 KiB) counts for what it is.
KEPT_TASKS = 1024
KEPT_SPEC_BYTES = 16 * 1024 * 1024


def task_stream(task_id: str) -> str:
    return f"task-{task_id}"


class TaskStates:
    """Tasks folded from their streams, kept for the next ask.

    A task asked for again is brought up to date from the events appended to its
    stream since: a stream only grows and a fold is pure, so that is the state a
    fold of the whole stream gives, for one short read instead of the whole stream
    (a log search or a follow asks for the same task again and again, and a long
    task has thousands of events). It keeps the `kept` tasks asked for last, fewer
    when their specs take more than `kept_bytes` together."""

    def __init__(
        self, store: EventStore, kept: int = KEPT_TASKS, kept_bytes: int = KEPT_SPEC_BYTES
    ) -> None:
        self.store = store
        self.kept = kept
        self.kept_bytes = kept_bytes
        self._states: OrderedDict[str, TaskState] = OrderedDict()
        self._sizes: dict[str, int] = {}  # task id -> its spec's JSON bytes
        self._bytes = 0

    async def get(self, task_id: str) -> TaskState:
        """The task now; a 404 when it has no events."""
        state = self._states.get(task_id)
        after = state.version if state is not None else 0
        for event in await self.store.read_stream(task_stream(task_id), from_version=after + 1):
            state = evolve(state, event)
        if state is None:
            raise task_not_found(task_id)
        self._keep(task_id, state)
        return state

    def _keep(self, task_id: str, state: TaskState) -> None:
        kept = self._states.get(task_id)
        if kept is not None and kept.version > state.version:
            state = kept  # a slower ask keeps no older state
        if kept is None or kept.spec is not state.spec:  # new, or rerun with changes
            size = len(state.spec.model_dump_json())
            self._bytes += size - self._sizes.get(task_id, 0)
            self._sizes[task_id] = size
        self._states[task_id] = state
        self._states.move_to_end(task_id)
        while self._states and (len(self._states) > self.kept or self._bytes > self.kept_bytes):
            oldest, _ = self._states.popitem(last=False)
            self._bytes -= self._sizes.pop(oldest)

    async def visible(self, caller: Principal, task_id: str, *, write: bool = False) -> TaskState:
        """The task if the caller may see it (`require_visible`)."""
        if write:
            caller.require_write()
        return require_visible(caller, await self.get(task_id), write=write)


def require_visible(caller: Principal, state: TaskState, *, write: bool = False) -> TaskState:
    """`state` if the caller may read its task (a task of another tenant is a 404, as
    no task); with `write`, a 403 unless it may also change it (own tenant, not sre)."""
    if not caller.may_read_tenant(state.tenant):
        raise task_not_found(state.task_id)
    if write and not caller.may_write_tenant(state.tenant):
        raise PermissionDenied(
            "auth.other_tenant",
            f"task {state.task_id!r} belongs to tenant {state.tenant!r}: you may read it only",
            "use a token of that tenant to change it",
            "task_id",
        )
    return state
