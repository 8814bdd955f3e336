"""A task as a caller may see it, from the event log: what the services that own
a task's data (logs, alerts, fault tolerance) check before they answer."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from runyard.api.auth import Principal
from runyard.api.errors import PermissionDenied, task_not_found
from runyard.contracts import Event, RecordedEvent
from runyard.contracts.spec import TaskSpec
from runyard.domain import TaskNotFound, TaskState, evolve
from runyard.eventstore import EventStore

#: How many folded tasks a `TaskStates` keeps (those asked for last), and how many
#: bytes their specs may take together as JSON: a spec is most of a task's state,
#: and a large one (up to an event's 512 KiB) counts for what it is.
KEPT_TASKS = 1024
KEPT_SPEC_BYTES = 16 * 1024 * 1024

V = TypeVar("V")


def task_stream(task_id: str) -> str:
    return f"task-{task_id}"


class KeptTasks(Generic[V]):
    """Values about tasks (a folded state, or one with more beside it), the `kept`
    kept last, fewer when their tasks' specs take more than `kept_bytes` together as
    JSON (`spec_of` finds a value's spec; a spec is counted again only when it is
    another object, a rerun with changes)."""

    def __init__(
        self,
        spec_of: Callable[[V], TaskSpec],
        kept: int = KEPT_TASKS,
        kept_bytes: int = KEPT_SPEC_BYTES,
    ) -> None:
        self.spec_of = spec_of
        self.kept = kept
        self.kept_bytes = kept_bytes
        self._values: OrderedDict[str, V] = OrderedDict()
        self._sizes: dict[str, int] = {}  # task id -> its spec's JSON bytes
        self._bytes = 0

    def __iter__(self) -> Iterator[str]:
        """The task ids kept, the one kept longest ago first."""
        return iter(self._values)

    def get(self, task_id: str) -> V | None:
        return self._values.get(task_id)

    def size(self, task_id: str) -> int:
        """The JSON bytes of a kept task's spec (0 when not kept)."""
        return self._sizes.get(task_id, 0)

    def forget(self, task_id: str) -> None:
        """Keep nothing of the task (it is read again from the log when next asked)."""
        if self._values.pop(task_id, None) is not None:
            self._bytes -= self._sizes.pop(task_id, 0)

    def keep(self, task_id: str, value: V) -> None:
        """Keep `value` as the newest; the oldest go while there are too many."""
        kept = self._values.get(task_id)
        spec = self.spec_of(value)
        if kept is None or self.spec_of(kept) is not spec:  # new, or rerun with changes
            size = len(spec.model_dump_json())
            self._bytes += size - self._sizes.get(task_id, 0)
            self._sizes[task_id] = size
        self._values[task_id] = value
        self._values.move_to_end(task_id)
        while self._values and (len(self._values) > self.kept or self._bytes > self.kept_bytes):
            oldest, _ = self._values.popitem(last=False)
            self._bytes -= self._sizes.pop(oldest)


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
        self.states: KeptTasks[TaskState] = KeptTasks(_spec, kept, kept_bytes)

    async def get(self, task_id: str) -> TaskState:
        """The task now; a 404 when it has no events."""
        state = self.states.get(task_id)
        after = state.version if state is not None else 0
        for event in await self.store.read_stream(task_stream(task_id), from_version=after + 1):
            state = evolve(state, event)
        if state is None:
            raise task_not_found(task_id)
        return self._keep(task_id, state)

    async def at(self, event: RecordedEvent[Event]) -> TaskState:
        """The task of `event` (a task event) as of `event`: later events are not
        looked at, so a replay agrees. From the kept state, `event` itself folded on
        when it follows, else what lies between them read; a task kept past `event`
        (one handled again) is folded anew up to it."""
        task_id = event.stream_id.removeprefix("task-")
        version = event.stream_version
        state = self.states.get(task_id)
        if state is not None and state.version == version:
            return state
        if state is not None and state.version > version:
            state = None
        after = state.version if state is not None else 0
        if after == version - 1:
            state = evolve(state, event)
        else:
            stream = task_stream(task_id)
            for recorded in await self.store.read_stream(stream, after + 1, version - after):
                state = evolve(state, recorded)
        if state is None:
            raise TaskNotFound(task_id)
        return self._keep(task_id, state)

    def _keep(self, task_id: str, state: TaskState) -> TaskState:
        """Keep `state` unless a newer one is kept (a slower ask keeps no older state)."""
        kept = self.states.get(task_id)
        if kept is None or kept.version <= state.version:
            self.states.keep(task_id, state)
        return state

    async def visible(self, caller: Principal, task_id: str, *, write: bool = False) -> TaskState:
        """The task if the caller may see it (`require_visible`)."""
        if write:
            caller.require_write()
        return require_visible(caller, await self.get(task_id), write=write)


def _spec(state: TaskState) -> TaskSpec:
    return state.spec


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
