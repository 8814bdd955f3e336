"""The submission service's application layer: decide and append what users submit.

Each use case takes a `Call` (the caller the gateway authenticated, the
request id, the trace context and the gateway's call id), runs the
submission rules and, when they accept, appends the task events with the
creator-only values sealed into the `secrets` table in the same transaction
(R-12). A refusal raises a typed error (`SubmissionError`, or an API error of
`runyard.api.errors`) and writes nothing.

    submit        TaskSubmitted                                   (R-10)
    rerun         TaskRerunRequested, with only the allowed changes (R-16)
    clone         TaskCloned on the source, TaskSubmitted on the new task (R-16)
    submit_group  one TaskSubmitted per item, all or none        (R-17)
    rerun_group   every finished task of a group again, all or none
    set_entry     a catalogue entry (table row + CatalogueEntrySet)

A call's writes are recorded with its call id in `submission_calls`, in the
same transaction: the gateway's retry of a call whose answer it lost is
answered as the first was, and writes nothing twice.

Each call's transaction holds one of the store's connections (10) for as long as
it takes (a group of 1000 tasks, or one waiting for its group's row): at most
`WRITES_PER_TENANT` of one tenant's calls hold one at once, the others wait their
turn (at most `WRITE_WAIT_S`, then 429 `submission.busy`), so that one tenant's
flood, from every gateway together, never takes every connection and stops the
other tenants' submissions.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import asyncpg
import yaml
from pydantic import ValidationError
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest, Conflict, PermissionDenied, TooBusy, task_not_found
from runyard.api.inputs import group_id_of
from runyard.api.slots import TenantSlots
from runyard.contracts import Event, EventMapper, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.admin_events import CatalogueEntrySet
from runyard.contracts.envelope import new_event_id, utcnow
from runyard.contracts.resources import (
    ENTRY_KINDS,
    Catalogue,
    PoolView,
    entry_key,
    with_entry,
)
from runyard.contracts.spec import MASK, MAX_GROUP_SIZE, EnvVar, TaskSpec
from runyard.contracts.webhooks import policy_of
from runyard.domain import (
    Clone,
    Command,
    IdFactory,
    Rerun,
    Submit,
    TaskState,
    decide,
    fold,
    is_terminal,
)
from runyard.eventstore import (
    ANY,
    NO_STREAM,
    AppendRequest,
    PostgresEventStore,
    TaskCommands,
    apply_migrations,
    decide_and_append,
    load_migrations,
)
from runyard.submission.changes import check_group, clone_spec, expand_group, rerun_with_changes
from runyard.submission.env import parse_env
from runyard.submission.errors import ErrorCode, GroupItemError, SpecError
from runyard.submission.pools import pool_views
from runyard.submission.rules import check_spec
from runyard.submission.warnings import SubmissionWarning

#: One tenant's write transactions at once, of the store's 10 connections.
WRITES_PER_TENANT = 4
#: Seconds one more of a tenant's calls waits for its turn before it is refused (the
#: gateway gives a call 60 s).
WRITE_WAIT_S = 30.0

#: Decisions on a task made again when its stream moved on meanwhile (then 409).
CONFLICT_RETRIES = 5
#: How long a call's answer is kept for the gateway's retries of it.
CALLS_KEPT_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Call:
    """Who asks (as the gateway authenticated them), the request id that becomes the
    events' correlation id, the W3C trace context, and the gateway's call id."""

    principal: Principal
    request_id: str
    trace_context: dict[str, str] = field(default_factory=dict)
    call_id: str = ""

    def metadata(self) -> Metadata:
        return Metadata(
            actor=self.principal.actor,
            causation_id=self.request_id,
            correlation_id=self.request_id,
            trace_context=dict(self.trace_context),
        )


@dataclass(frozen=True, slots=True)
class Submitted:
    """What a call wrote: the task (or group) and the tasks it concerns."""

    task_ids: tuple[str, ...]
    group_id: str = ""
    warnings: tuple[SubmissionWarning, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "task_ids": list(self.task_ids),
                "group_id": self.group_id,
                "warnings": [w.model_dump(mode="json") for w in self.warnings],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Submitted:
        data = json.loads(text)
        warnings = tuple(SubmissionWarning.model_validate(w) for w in data["warnings"])
        return cls(tuple(data["task_ids"]), data["group_id"], warnings)


def submission_migrations() -> list[Any]:
    """The submission service's tables (its call ids; the catalogue and secret tables
    it writes are created here too when it starts first)."""
    folder = Path(str(resources.files("runyard.submission") / "migrations"))
    return load_migrations("submission", folder)


def load_catalogue(config_dir: Path) -> Catalogue:
    """The catalogue of `catalogue.yaml` in the config folder (empty when absent)."""
    path = config_dir / "catalogue.yaml"
    data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    return Catalogue.from_dict(data)


async def overlay_catalogue(
    conn: asyncpg.Pool | asyncpg.Connection, catalogue: Catalogue
) -> Catalogue:
    """`catalogue` (from the config file) with the stored admin changes, oldest first."""
    rows = await conn.fetch(
        "SELECT kind, body FROM catalogue_entries ORDER BY updated_at, kind, key"
    )
    for row in rows:
        body = row["body"]
        data = json.loads(body) if isinstance(body, str) else dict(body)
        catalogue = with_entry(catalogue, ENTRY_KINDS[row["kind"]].model_validate(data))
    return catalogue


class Submissions:
    """The submission rules over the event store, the catalogue and the pools."""

    def __init__(
        self,
        store: PostgresEventStore,
        config_dir: Path,
        *,
        clock: Callable[[], datetime] = utcnow,
        new_id: Callable[[], str] = lambda: str(new_event_id()),
    ) -> None:
        self.store = store
        self.config_dir = config_dir
        #: The config file's catalogue; the stored admin changes are laid over it at
        #: each use, so every instance of the service sees every change at once.
        self.file_catalogue = load_catalogue(config_dir)
        self.clock = clock
        self.new_id = new_id
        #: Each tenant's transactions at once (`WRITES_PER_TENANT`).
        self.writes = TenantSlots(WRITES_PER_TENANT, WRITE_WAIT_S, _writes_busy)

    @classmethod
    async def connect(
        cls, dsn: str, config_dir: Path, mapper: EventMapper | None = None
    ) -> Submissions:
        """Open the store and apply the submission service's migrations."""
        store = await PostgresEventStore.connect(dsn, mapper or default_mapper())
        async with store.pool.acquire() as conn:
            await apply_migrations(conn, submission_migrations())
        return cls(store, config_dir)

    async def close(self) -> None:
        await self.store.close()

    @property
    def db(self) -> asyncpg.Pool:
        return self.store.pool

    # --- tasks ----------------------------------------------------------------

    async def submit(self, call: Call, body: Mapping[str, Any]) -> Submitted:
        """Check a spec against the rules and submit it as a new task."""
        call.principal.require_write()
        spec = parse_spec(body)
        warnings = await self._check(spec)
        task_id = self.new_id()
        submitted = Submitted((task_id,), warnings=tuple(warnings))
        async with self._writing(call, submitted) as conn:
            await self._submit(conn, call, task_id, spec, warnings)
        return submitted

    async def rerun(self, call: Call, task_id: str, changes: Mapping[str, Any]) -> Submitted:
        """Run a finished task again, with only the changes a rerun allows (R-16); when the
        task moved on meanwhile (the scheduler's event landed first), decide again."""
        state, recorded = await self._load(call.principal, task_id)
        _require_creator_to_change(call.principal, state, _object(changes))
        spec = rerun_with_changes(state.spec, _object(changes))
        await self._check(spec)
        submitted = Submitted((task_id,))
        rerun = self._commands(call, Rerun(task_id, spec), self.new_id)
        await decide_and_append(
            self.store,
            _stream(task_id),
            rerun,
            recorded=recorded,
            attempts=CONFLICT_RETRIES,
            write=self._writer(call, submitted),
        )
        return submitted

    async def clone(self, call: Call, task_id: str, overrides: Mapping[str, Any]) -> Submitted:
        """A new task from this task's spec, any field overridden (R-16)."""
        state, recorded = await self._load(call.principal, task_id)
        by_creator = _is_creator(call.principal, state)
        spec = clone_spec(state.spec, _env_text(overrides), by_creator=by_creator)
        warnings = await self._check(spec)
        new_id = self.new_id()
        submitted = Submitted((new_id,), warnings=tuple(warnings))

        async def submit_clone(conn: asyncpg.Connection) -> None:
            await self._submit(conn, call, new_id, spec, warnings, cloned_from=task_id)

        # a conflict on the new task's stream (its id taken) is not decided again
        await decide_and_append(
            self.store,
            _stream(task_id),
            self._commands(call, Clone(task_id), lambda: new_id),
            recorded=recorded,
            attempts=CONFLICT_RETRIES,
            write=self._writer(call, submitted, also=submit_clone),
        )
        return submitted

    # --- groups ---------------------------------------------------------------

    async def submit_group(self, call: Call, body: Mapping[str, Any]) -> Submitted:
        """R-17: one task per item, each the template with the item's overrides; all or none."""
        call.principal.require_write()
        template = parse_spec(_field(body, "template", dict))
        items = [_env_text(item) for item in _field(body, "items", list)]
        if not all(isinstance(item, dict) for item in items):
            raise BadRequest(
                "request.invalid",
                "every item must be an object of overrides",
                "give items as [{...}, {...}]",
                "items",
            )
        specs = expand_group(template, items)
        pools = await pool_views(self.db, self.config_dir)
        catalogue = await self.catalogue()
        webhooks = policy_of(self.config_dir).refusal
        # In a worker thread, like `_check`: a group of long commands is the slowest check.
        warnings = await asyncio.to_thread(check_group, specs, catalogue, pools, webhooks=webhooks)
        group_id = group_id_of(body) or self.new_id()
        task_ids = tuple(self.new_id() for _ in specs)
        submitted = Submitted(task_ids, group_id)
        async with self._writing(call, submitted) as conn:
            await _make_room(conn, call.principal.tenant, group_id, len(task_ids))
            for task_id, spec, warned in zip(task_ids, specs, warnings, strict=True):
                await self._submit(conn, call, task_id, spec, warned, group_id=group_id)
        return submitted

    async def rerun_group(
        self, call: Call, group_id: str, task_ids: Sequence[str], changes: Mapping[str, Any]
    ) -> Submitted:
        """Rerun every finished task of the group, each with the same allowed changes.

        Every rerun is checked first; then all are written in one transaction,
        so either every finished task runs again or none does.
        """
        planned: list[tuple[TaskState, list[Event]]] = []
        for task_id in task_ids:
            state, _ = await self._load(call.principal, task_id)
            if state.group_id != group_id or not is_terminal(state.status):
                continue
            _require_creator_to_change(call.principal, state, _object(changes))
            spec = rerun_with_changes(state.spec, _object(changes))
            await self._check(spec)
            events = decide(state, Rerun(task_id, spec), now=self.clock(), ids=self.new_id)
            planned.append((state, list(events)))
        if not planned:
            raise Conflict(
                "group.nothing_to_rerun",
                f"no task of group {group_id!r} has finished",
                "stop the group first, or wait for its tasks to end",
            )
        submitted = Submitted(tuple(s.task_id for s, _ in planned), group_id)
        async with self._writing(call, submitted) as conn:
            for state, events in planned:
                await self._write(conn, call, state.task_id, events, state.version)
        return submitted

    # --- catalogue (admin) ----------------------------------------------------

    async def catalogue(self) -> Catalogue:
        """The config file's catalogue with the stored admin changes laid over it."""
        return await overlay_catalogue(self.db, self.file_catalogue)

    def reload_file(self) -> None:
        """Read `catalogue.yaml` again (the stored admin changes still count)."""
        self.file_catalogue = load_catalogue(self.config_dir)

    async def set_entry(self, call: Call, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Platform admin: validate, store (so it survives a restart) with its event, one
        change of the catalogue (an image, a volume or public data)."""
        call.principal.require_platform_admin()
        model = ENTRY_KINDS.get(kind)
        if model is None:
            raise BadRequest(
                "request.invalid",
                f"no catalogue entry kind {kind!r}",
                f"one of {', '.join(ENTRY_KINDS)}",
                "kind",
            )
        try:
            entry = model.model_validate(_object(body))
        except ValidationError as exc:
            raise _invalid(exc, "") from exc
        _, key = entry_key(entry)
        data = entry.model_dump(mode="json")
        event = CatalogueEntrySet.model_validate({"kind": kind, "key": key, "entry": data})
        new = NewEvent(event=event, metadata=call.metadata(), occurred_at=self.clock())
        async with self.store.transaction() as conn:
            await conn.execute(
                """INSERT INTO catalogue_entries (kind, key, body, updated_by)
                   VALUES ($1, $2, $3::jsonb, $4)
                   ON CONFLICT (kind, key) DO UPDATE
                   SET body = EXCLUDED.body, updated_by = EXCLUDED.updated_by,
                       updated_at = now()""",
                kind,
                key,
                json.dumps(data),
                call.principal.actor,
            )
            await self.store.append_in(conn, f"catalogue-{kind}", [new], ANY)
        return data

    async def forget_calls(self, older_than_s: float = CALLS_KEPT_S) -> int:
        """Drop the answers of calls older than `older_than_s` (a retry comes within
        seconds); the count dropped."""
        status = await self.db.execute(
            "DELETE FROM submission_calls WHERE created_at < now() - make_interval(secs => $1)",
            older_than_s,
        )
        return int(status.rpartition(" ")[2])

    # --- internals ------------------------------------------------------------

    async def _answered(self, call: Call) -> Submitted | None:
        """What an earlier try of this call wrote (None: it wrote nothing)."""
        if not call.call_id:
            return None
        answer = await self.db.fetchval(
            "SELECT answer FROM submission_calls WHERE call_id = $1 AND tenant = $2",
            call.call_id,
            call.principal.tenant,
        )
        return None if answer is None else Submitted.from_json(answer)

    @asynccontextmanager
    async def _writing(self, call: Call, submitted: Submitted) -> AsyncIterator[asyncpg.Connection]:
        """A transaction for a call's writes that records its answer with them, once one
        of the caller's tenant's write slots is free."""
        async with self.writes.taken(call.principal.tenant), self.store.transaction() as conn:
            yield conn
            if call.call_id:
                await conn.execute(
                    "INSERT INTO submission_calls (call_id, tenant, answer) VALUES ($1, $2, $3)",
                    call.call_id,
                    call.principal.tenant,
                    submitted.to_json(),
                )

    async def once(self, call: Call, work: Callable[[], Awaitable[Submitted]]) -> Submitted:
        """`work`, unless a try of this call wrote already: then what that try wrote.

        A try that fails because another try of the same call committed first (its
        call id row, or the task's stream, moved under it) is answered the same way.
        """
        if (done := await self._answered(call)) is not None:
            return done
        try:
            return await work()
        except Exception:
            if (done := await self._answered(call)) is not None:
                return done
            raise

    async def _load(
        self, caller: Principal, task_id: str
    ) -> tuple[TaskState, list[RecordedEvent[Event]]]:
        """The task, and its stream as read, if the caller may change it: 404 when it may
        not even read it (as for no task), 403 when it may read but not change it (another
        tenant, or sre)."""
        caller.require_write()
        events = await self.store.read_stream(_stream(task_id))
        if not events:
            raise task_not_found(task_id)
        state = fold(events, task_id=task_id)
        if not caller.may_read_tenant(state.tenant):
            raise task_not_found(task_id)
        if not caller.may_write_tenant(state.tenant):
            raise PermissionDenied(
                "auth.other_tenant",
                f"task {task_id!r} belongs to tenant {state.tenant!r}: you may read it only",
                "use a token of that tenant to change it",
                "task_id",
            )
        return state, events

    def _commands(self, call: Call, command: Command, ids: IdFactory) -> TaskCommands:
        """`command` decided on its task's stream for `call` (its events carry the call's
        metadata)."""
        return TaskCommands(command.task_id, [command], call.metadata(), self.clock, ids=ids)

    def _writer(
        self,
        call: Call,
        submitted: Submitted,
        also: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    ) -> Callable[[list[AppendRequest]], Awaitable[None]]:
        """Writes a decision in the call's transaction (with its answer), then `also`'s
        writes in the same transaction."""

        async def write(requests: list[AppendRequest]) -> None:
            call.principal.require_write()  # every task event goes through here
            async with self._writing(call, submitted) as conn:
                for request in requests:
                    await self.store.append_in(
                        conn, request.stream_id, request.events, request.expected
                    )
                if also is not None:
                    await also(conn)

        return write

    async def _submit(
        self,
        conn: asyncpg.Connection,
        call: Call,
        task_id: str,
        spec: TaskSpec,
        warnings: Sequence[SubmissionWarning],
        *,
        group_id: str | None = None,
        cloned_from: str | None = None,
    ) -> None:
        """A new task's `TaskSubmitted`, its creator-only values sealed first."""
        tenant, user = call.principal.tenant, call.principal.user
        sealed = await self._seal(conn, tenant, spec)
        submit = Submit(
            task_id,
            tenant,
            user,
            sealed,
            tuple(warnings),
            group_id=group_id,
            cloned_from=cloned_from,
        )
        events = decide(None, submit, now=self.clock(), ids=self.new_id)
        await self._write(conn, call, task_id, events, NO_STREAM)

    async def _write(
        self,
        conn: asyncpg.Connection,
        call: Call,
        task_id: str,
        events: Sequence[Event],
        expected: Any,
    ) -> None:
        call.principal.require_write()  # every task event goes through here
        now, meta = self.clock(), call.metadata()
        new = [NewEvent(event=e, metadata=meta, occurred_at=now) for e in events]
        await self.store.append_in(conn, _stream(task_id), new, expected)

    async def _seal(self, conn: asyncpg.Connection, tenant: str, spec: TaskSpec) -> TaskSpec:
        """Move creator-only values into the secret store; the spec keeps only references."""
        env = []
        for var in spec.env:
            if var.creator_only and var.value is not None and var.value != MASK:
                ref = f"secret-{uuid.uuid4().hex}"
                await conn.execute(
                    "INSERT INTO secrets (tenant, ref, value) VALUES ($1, $2, $3)",
                    tenant,
                    ref,
                    var.value,
                )
                var = EnvVar(name=var.name, creator_only=True, secret_ref=ref)
            env.append(var)
        return spec.model_copy(update={"env": tuple(env)})

    async def _check(self, spec: TaskSpec) -> list[SubmissionWarning]:
        """`check_spec` in a worker thread: the rules are pure but take time linear in the
        spec (a 64 KiB launch command), and the event loop keeps answering meanwhile."""
        pool: PoolView | None = (await pool_views(self.db, self.config_dir)).get(spec.pool)
        catalogue = await self.catalogue()
        webhooks = policy_of(self.config_dir).refusal
        return await asyncio.to_thread(check_spec, spec, catalogue, pool, webhooks=webhooks)


def _stream(task_id: str) -> str:
    return f"task-{task_id}"


async def _make_room(conn: asyncpg.Connection, tenant: str, group_id: str, adding: int) -> None:
    """Count `adding` more tasks in the tenant's group, in the transaction that appends
    them; refuse (`group.too_large`, nothing written) past `MAX_GROUP_SIZE`.

    Items sent with the `group_id` of a group that has tasks join it. The group's row
    stays locked until the transaction ends: a second call adding to the same group
    waits for it and counts its tasks, so two calls never pass the limit together."""
    total = await conn.fetchval(
        """INSERT INTO task_groups (tenant, group_id, tasks) VALUES ($1, $2, $3)
           ON CONFLICT (tenant, group_id) DO UPDATE SET tasks = task_groups.tasks + $3
           RETURNING tasks""",
        tenant,
        group_id,
        adding,
    )
    if total > MAX_GROUP_SIZE:
        has = total - adding
        raise GroupItemError(
            ErrorCode.GROUP_TOO_LARGE,
            "group_id",
            f"task group {group_id!r} has {has} tasks: {adding} more would make"
            f" {total}, over the {MAX_GROUP_SIZE} a group may hold",
            "leave group_id out (or give a new one) to make a group of these items",
        )


def _writes_busy(per_tenant: int, wait_s: float) -> TooBusy:
    return TooBusy(
        "submission.busy",
        f"your tenant has {per_tenant} submissions being written at the submission service,"
        f" the most it may at once, and none ended within {wait_s:g} s",
        f"send it again in a few seconds; keep at most {per_tenant} large submissions"
        " (task groups) in flight",
    )


def _is_creator(caller: Principal, state: TaskState) -> bool:
    """The task's creator: same tenant and same user (a user name alone is not unique)."""
    return caller.tenant == state.tenant and caller.user == state.creator


#: What a rerun may change that decides what the workers run.
_WHAT_RUNS = ("command", "image")


def _require_creator_to_change(
    caller: Principal, state: TaskState, changes: Mapping[str, Any]
) -> None:
    """Only the creator of a task with creator-only variables changes what it runs.

    Another member's run gets no creator-only value, but the change stays in the task's
    spec: the creator's next rerun would run that member's command or image with the
    creator's values. Rerunning it as it is, or changing its size, stays open to all."""
    hidden = [v.name for v in state.spec.env if v.creator_only]
    if not hidden or _is_creator(caller, state):
        return
    changed = [f for f in _WHAT_RUNS if f in changes and changes[f] != getattr(state.spec, f)]
    if changed:
        raise PermissionDenied(
            "rerun.creator_only",
            f"task {state.task_id!r} has creator-only variables ({', '.join(hidden)}): only"
            f" its creator {state.creator!r} may change its {' or '.join(changed)}, which"
            " the creator's later runs would run with those values",
            "rerun it as it is, or clone it: a clone runs with the values you give it",
            changed[0],
        )


# --- parsing request bodies ---------------------------------------------------


def parse_spec(body: Any) -> TaskSpec:
    """A TaskSpec from an API body: `env` as `A=x;B=y` text or a list, `creator_only` names.

    Shape errors become `spec.unknown_field` / `spec.invalid` with the field's path.
    """
    if not isinstance(body, Mapping):
        raise BadRequest("request.invalid", "the task spec must be an object", "send JSON {...}")
    data = dict(body)
    creator_only = data.pop("creator_only", []) or []
    if not isinstance(creator_only, list):
        raise BadRequest(
            "request.invalid",
            "creator_only must be a list of variable names",
            'e.g. ["API_KEY"]',
            "creator_only",
        )
    if isinstance(data.get("env"), str):
        data["env"] = parse_env(data["env"], creator_only=creator_only)
    elif creator_only:
        data["env"] = [_mark(v, creator_only) for v in data.get("env") or []]
    _refuse_secret_refs(data.get("env"), "env")
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, "") from exc


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest("request.invalid", "the body must be an object", "send JSON {...}")
    return dict(body)


def _mark(var: Any, creator_only: list[str]) -> Any:
    if isinstance(var, dict) and var.get("name") in creator_only:
        return {**var, "creator_only": True}
    return var


def _env_text(overrides: Any) -> Any:
    """Overrides with `env` text parsed, honouring a `creator_only` list."""
    if not isinstance(overrides, dict):
        return overrides
    data = dict(overrides)
    creator_only = data.pop("creator_only", []) or []
    if isinstance(data.get("env"), str):
        data["env"] = parse_env(data["env"], creator_only=creator_only)
    _refuse_secret_refs(data.get("env"), "env")
    return data


def _refuse_secret_refs(env: Any, field: str) -> None:
    """A creator-only value's `secret_ref` is the platform's to assign, never a client's.

    The deployer resolves a ref for runs that the task's creator started, so a
    ref sent by a client would let one member run with another member's value.
    """
    if not isinstance(env, list | tuple):
        return
    for i, var in enumerate(env):
        # Anything else (a string, a number) is left to the spec's own validation.
        ref = var.get("secret_ref") if isinstance(var, Mapping) else None
        if isinstance(var, EnvVar):
            ref = var.secret_ref
        if ref is not None:
            raise BadRequest(
                "env.secret_ref",
                f"{field}[{i}].secret_ref is assigned by the platform and cannot be sent",
                "send the creator-only variable's value (or `******` to keep the one "
                "you set before); Runyard stores it and assigns the reference",
                f"{field}[{i}].secret_ref",
            )


def _field(body: Any, name: str, kind: type) -> Any:
    value = body.get(name) if isinstance(body, Mapping) else None
    if not isinstance(value, kind):
        raise BadRequest(
            "request.invalid",
            f"{name} must be a {kind.__name__}",
            f"give {name} in the request body",
            name,
        )
    return value


def _invalid(error: ValidationError, prefix: str) -> SpecError:
    first = error.errors()[0]
    path = prefix + ".".join(str(p) for p in first["loc"])
    unknown = first["type"] == "extra_forbidden"
    code = ErrorCode.SPEC_UNKNOWN_FIELD if unknown else ErrorCode.SPEC_INVALID
    hint = "check the field name" if unknown else "fix the field"
    return SpecError(code, path or "spec", f"{path or 'spec'}: {first['msg']}", hint)
