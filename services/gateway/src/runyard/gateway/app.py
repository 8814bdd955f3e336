"""The gateway's application layer: every operation of the HTTP API (and the CLI).

Each public method authenticates nothing and maps nothing: it takes the
caller's `Principal`, does one use case, and raises typed errors
(`runyard.api.errors`, domain errors) that the edges map to status codes.
Nothing is written when a rule refuses a request.

What users submit (tasks, reruns, clones, groups) and the catalogue are the
submission service's: the gateway passes the authenticated caller and the
body to it (`SubmissionClient`, internal gRPC) and answers what it wrote, or
its refusal as the same coded error. A stop is decided here, with the pure
task domain on the task's stream and appended with the version read
(`runyard.eventstore.decide_and_append`: a conflict is decided again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from runyard.api import auth
from runyard.api.auth import (
    CROSS_TENANT_READERS,
    Principal,
    authenticate,
    record_token_issued,
    token_stream,
)
from runyard.api.errors import BadRequest, NotFound, PermissionDenied, task_not_found
from runyard.api.tasks import require_visible
from runyard.contracts import Event, EventMapper, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts import requests as bodies
from runyard.contracts.admin_events import TokenRevoked
from runyard.contracts.envelope import new_event_id, utcnow
from runyard.contracts.rpc import credential
from runyard.contracts.spec import TaskSpec
from runyard.domain import (
    Command,
    RequestStop,
    TaskState,
    evolve,
    fold,
    is_terminal,
)
from runyard.eventstore import (
    ANY,
    PostgresEventStore,
    TaskCommands,
    apply_migrations,
    decide_and_append,
    load_migrations,
)
from runyard.gateway import projection
from runyard.gateway.limits import GatewayLimits
from runyard.gateway.pools import PoolInfo, capacity, describe, load_pools
from runyard.gateway.projection import TaskListProjector
from runyard.gateway.scheduler_client import queue_entries
from runyard.gateway.submission_client import SubmissionClient
from runyard.gateway.views import event_view, task_view

MAX_PAGE = 200
#: How a pool's capacity shows a task the caller may not read (as a pool replay does).
HIDDEN_TASK = "(another tenant)"
#: The bearer of the request being answered, as the caller sent it ("Bearer <token>"):
#: set where the gateway authenticates it, read where another service's API is asked on
#: the caller's behalf (that service authorises the caller's own token again).
_AUTHORIZATION: ContextVar[str | None] = ContextVar("authorization", default=None)
#: Decisions on a task made again when its stream moved on meanwhile (then 409).
CONFLICT_RETRIES = 5
#: Polls of a watch between two checks of its caller's token (5 s at 0.5 s a poll).
WATCH_AUTH_EVERY = 10
#: Seconds a new group's answer waits for its tasks in the task list (the submission
#: service gives a call 60 s, so a write begun before them has ended by then).
GROUP_LISTED_WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class Request:
    """Who asks, the request id that becomes the events' correlation id, and
    the W3C trace context the events carry on (R-62)."""

    principal: Principal
    request_id: str
    trace_context: dict[str, str] = field(default_factory=dict)

    def metadata(self) -> Metadata:
        return Metadata(
            actor=self.principal.actor,
            causation_id=self.request_id,
            correlation_id=self.request_id,
            trace_context=dict(self.trace_context),
        )


def gateway_migrations() -> list[Any]:
    """The gateway's own tables (tokens, secrets, task list)."""
    folder = Path(str(resources.files("runyard.gateway") / "migrations"))
    return load_migrations("gateway", folder)


class Gateway:
    """Task operations over the event store, the task list and the submission service."""

    def __init__(
        self,
        store: PostgresEventStore,
        config_dir: Path,
        submission: SubmissionClient,
        *,
        endpoints: Mapping[str, str] | None = None,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], datetime] = utcnow,
        new_id: Callable[[], str] = lambda: str(new_event_id()),
        limits: GatewayLimits | None = None,
    ) -> None:
        self.store = store
        self.config_dir = config_dir
        self.submission = submission
        #: Where the other services answer (name -> base URL), read at each call.
        self.endpoints = endpoints if endpoints is not None else {}
        #: The client of the other services' HTTP APIs (the scheduler's queue places).
        self.http = http or httpx.AsyncClient()
        self.projector = TaskListProjector(store)
        self.clock = clock
        self.new_id = new_id
        #: Each tenant's share of the gateway (gateway.yaml; `runyard.gateway.limits`).
        self.limits = limits or GatewayLimits()
        #: The long-lived streams each tenant has open (watches, live tails, the
        #: console's live list): the edges take one before a stream starts.
        self.streams = self.limits.open_streams()
        #: The requests each tenant has in flight to the submission service.
        self.submissions = self.limits.submission_slots()

    @classmethod
    async def connect(
        cls,
        dsn: str,
        config_dir: Path,
        mapper: EventMapper | None = None,
        *,
        submission: SubmissionClient | None = None,
        endpoints: Mapping[str, str] | None = None,
        http: httpx.AsyncClient | None = None,
        limits: GatewayLimits | None = None,
    ) -> Gateway:
        """Open the store and apply the gateway's migrations.

        `endpoints`: where the other services answer (default: RUNYARD_ENDPOINTS);
        `submission`: the submission service's client (default: at
        `endpoints["submission-grpc"]`, with the credential of
        `runyard.contracts.rpc.credential`); `http`: the client of the other
        services' HTTP APIs (default: a new one, closed with the gateway); `limits`:
        each tenant's share (default: `GatewayLimits()`)."""
        store = await PostgresEventStore.connect(dsn, mapper or default_mapper())
        async with store.pool.acquire() as conn:
            await apply_migrations(conn, gateway_migrations())
        if endpoints is None:
            endpoints = {str(k): str(v) for k, v in _json_env("RUNYARD_ENDPOINTS").items()}
        submission = submission or submission_client(endpoints)
        return cls(store, config_dir, submission, endpoints=endpoints, http=http, limits=limits)

    async def close(self) -> None:
        await self.submission.close()
        await self.http.aclose()
        await self.store.close()

    @property
    def db(self) -> asyncpg.Pool:
        return self.store.pool

    # --- auth -----------------------------------------------------------------

    async def authenticate(self, token: str | None) -> Principal:
        """The caller of a bearer token (401 otherwise); the token is kept for the rest of
        the request, for the services the gateway asks on the caller's behalf."""
        principal = await authenticate(self.db, token)
        _AUTHORIZATION.set(f"Bearer {token}")
        return principal

    async def create_token(self, req: Request, request: bodies.TokenRequest) -> dict[str, Any]:
        """Tenant or platform admin: a token for {tenant, user, role}, with an optional
        `ttl` or `expires_at` and `description`; the token is in the answer, only there.
        A tenant admin mints only for its own tenant, never platform_admin or sre, and
        never for a user someone else made (`auth.require_own_user`)."""
        caller = req.principal
        caller.require_token_admin()
        tenant, user, role = request.tenant, request.user, request.role
        caller.require_grant(tenant, role)
        description = auth.check_description(request.description)
        now = self.clock()
        expires = auth.token_expiry(now, request.ttl, request.expires_at)
        async with self.store.transaction() as conn:
            await auth.require_own_user(conn, caller, tenant, user)
            await auth.require_token_room(conn, tenant, now)
            token, info = await auth.insert_token(
                conn, tenant, user, role, expires, description=description, created_by=caller.actor
            )
            await record_token_issued(self.store, conn, info, req.metadata(), now)
        return {**info.to_dict(now), "token": token}

    async def list_tokens(
        self, caller: Principal, tenant: str | None = None, include_revoked: bool = False
    ) -> dict[str, Any]:
        """Tokens without their secrets, newest first (at most MAX_LISTED_TOKENS;
        `truncated` when more matched): a tenant admin sees its tenant's, a platform
        admin every tenant's (or one, with `tenant`)."""
        caller.require_token_admin()
        tenant = tenant or None  # `?tenant=`: none given
        if not caller.is_platform_admin:
            if tenant not in (None, caller.tenant):
                caller.require_grant(tenant or "", "member")
            tenant = caller.tenant
        rows, truncated = await auth.list_tokens(self.db, tenant, include_revoked)
        now = self.clock()
        return {"items": [info.to_dict(now) for info in rows], "truncated": truncated}

    async def revoke_token(self, req: Request, token_id: str) -> dict[str, Any]:
        """Revoke a token at once (its next request, HTTP or gRPC, is refused); a token
        revoked already is answered as it is. A tenant admin revokes only what it may mint."""
        caller = req.principal
        caller.require_token_admin()
        info = await auth.get_token(self.db, token_id)
        if info is None or not (caller.is_platform_admin or info.tenant == caller.tenant):
            raise NotFound(
                "token.not_found",
                f"token {token_id!r} does not exist",
                "list tokens: GET /v1/admin/tokens",
                "token_id",
            )
        caller.require_grant(info.tenant, info.role)
        async with self.store.transaction() as conn:
            revoked = await auth.mark_revoked(conn, token_id, caller.actor)
            if revoked is not None:
                event = TokenRevoked(
                    token_id=token_id, tenant=info.tenant, user=info.user, role=info.role
                )
                new = NewEvent(event=event, metadata=req.metadata(), occurred_at=self.clock())
                await self.store.append_in(conn, token_stream(token_id), [new], ANY)
                info = revoked
        return info.to_dict(self.clock())

    # --- tasks ----------------------------------------------------------------

    async def create_task(self, req: Request, spec: bodies.TaskSubmission) -> dict[str, Any]:
        """Submit a spec: the submission service checks it against the rules and
        appends it; the answer is the new task, with its warnings."""
        req.principal.require_write()
        async with self._submitting(req):
            accepted = await self.submission.submit_task(req, spec.as_json())
            return await self.get_task(req.principal, accepted.task_id)

    async def get_task(self, caller: Principal, task_id: str) -> dict[str, Any]:
        """A task's detail, as the caller may see it."""
        state, events = await self._load(caller, task_id)
        is_creator = _is_creator(caller, state)
        secrets = await self._secrets(caller.tenant, state.spec) if is_creator else {}
        view = task_view(state, events, is_creator, secrets)
        await self._with_queue([view])
        return view

    async def _with_queue(self, tasks: Sequence[dict[str, Any]]) -> None:
        """Where each queued task stands now and why, from the scheduler's API (its queue
        read model, R-07), asked with the caller's own token; a task it has no entry for,
        or all of them while the scheduler cannot be reached, keeps what its last
        TaskQueued said."""
        for task in tasks:
            task.setdefault("queue", None)
        queued = [t for t in tasks if t["status"] == "queued"]
        scheduler, authorization = self.endpoints.get("scheduler"), _AUTHORIZATION.get()
        if not queued or scheduler is None or authorization is None:
            return
        ids = [t["task_id"] for t in queued]
        entries = await queue_entries(self.http, scheduler, ids, authorization=authorization)
        for task in queued:
            entry = entries.get(task["task_id"])
            if entry is not None and entry["run"] == task["run"]:
                task["queue"] = {k: v for k, v in entry.items() if k not in ("pool", "run")}

    async def list_tasks(
        self,
        caller: Principal,
        filters: Mapping[str, str | None],
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """A page of the caller's tenant's tasks from the task list (another tenant's
        with `tenant`, for the roles that read across tenants)."""
        tenant = _read_tenant(caller, tenant)
        if not 1 <= limit <= MAX_PAGE:
            raise BadRequest(
                "request.invalid",
                f"limit must be 1 to {MAX_PAGE}",
                f"give a limit from 1 to {MAX_PAGE}",
                "limit",
            )
        await self.projector.catch_up()
        try:
            rows, next_cursor = await projection.list_rows(
                self.db, tenant, dict(filters), limit, cursor
            )
        except ValueError as exc:
            raise BadRequest(
                "cursor.invalid", str(exc), "pass back a next_cursor as given", "cursor"
            ) from exc
        await self._with_queue(rows)
        return {"items": rows, "next_cursor": next_cursor}

    async def stop_task(self, req: Request, task_id: str) -> dict[str, Any]:
        """Ask to stop a task (a task holding no workers stops at once)."""
        _, recorded = await self._load(req.principal, task_id, write=True)
        await self._decide_and_append(req, recorded, _stop(req.principal, task_id))
        return await self.get_task(req.principal, task_id)

    async def rerun_task(
        self, req: Request, task_id: str, changes: bodies.RerunChanges
    ) -> dict[str, Any]:
        """Run a finished task again, with only the changes a rerun allows (R-16)."""
        req.principal.require_write()
        async with self._submitting(req):
            await self.submission.rerun_task(req, task_id, changes.as_json())
            return await self.get_task(req.principal, task_id)

    async def clone_task(
        self, req: Request, task_id: str, overrides: bodies.SpecOverrides
    ) -> dict[str, Any]:
        """A new task from this task's spec, any field overridden (R-16)."""
        req.principal.require_write()
        async with self._submitting(req):
            accepted = await self.submission.clone_task(req, task_id, overrides.as_json())
            return await self.get_task(req.principal, accepted.task_id)

    async def task_events(self, caller: Principal, task_id: str) -> list[dict[str, Any]]:
        """The task's audit timeline: every event with actor and correlation id."""
        state, events = await self._load(caller, task_id)
        return [event_view(e, _is_creator(caller, state)) for e in events]

    async def watch(
        self, caller: Principal, task_id: str, poll_interval: float = 0.5
    ) -> AsyncIterator[dict[str, Any]]:
        """The task's events, then each new one, until the task has ended; ended with
        `Unauthenticated` once the caller's token is revoked or has expired (checked every
        `WATCH_AUTH_EVERY` polls), as the next request would be."""
        state, events = await self._load(caller, task_id)
        is_creator = _is_creator(caller, state)
        polls = 0
        while True:
            for recorded in events:
                yield event_view(recorded, is_creator)
            if is_terminal(state.status):
                return
            await asyncio.sleep(poll_interval)
            polls += 1
            if polls % WATCH_AUTH_EVERY == 0:
                await auth.authenticate_again(self.db, caller)
            events = await self.store.read_stream(_stream(task_id), state.version + 1)
            state = _evolve_all(state, events)

    # --- pools ----------------------------------------------------------------

    async def pools(self, caller: Principal) -> list[dict[str, Any]]:
        """Every pool the rules know, with its zone, network and worker specs."""
        return [describe(info) for info in (await self._pools()).values()]

    async def pool_capacity(self, caller: Principal, pool_id: str) -> dict[str, Any]:
        """Launchable count per spec, custom-count maximum, occupancy, queue load."""
        info = (await self._pools()).get(pool_id)
        if info is None:
            raise NotFound(
                "pool.not_found",
                f"pool {pool_id!r} does not exist",
                "choose a pool listed by `runyard pools`",
                "pool_id",
            )
        return await self._hide_other_tenants(caller, capacity(info))

    async def _hide_other_tenants(self, caller: Principal, view: dict[str, Any]) -> dict[str, Any]:
        """`view` (a pool's capacity) with the ids of the tasks the caller may not read
        (another tenant's, or a task not known yet) shown as `HIDDEN_TASK`: what runs
        and waits is counted as it is, whose it is stays with its tenant (as a pool
        replay shows it)."""
        occupancy, queue = view.get("occupancy"), view.get("queue")
        items = [
            item
            for part in (occupancy, queue)
            if isinstance(part, dict)
            for item in part.get("items") or []
            if isinstance(item, dict)
        ]
        ids = {str(i["task_id"]) for i in items if i.get("task_id")}
        if isinstance(queue, dict) and queue.get("head"):
            ids.add(str(queue["head"]))
        if not ids:
            return view
        rows = await self.db.fetch(
            "SELECT stream_id, data ->> 'tenant' AS tenant FROM events"
            " WHERE stream_id = ANY($1::text[]) AND stream_version = 1",
            [_stream(task_id) for task_id in sorted(ids)],
        )
        tenants = {r["stream_id"].removeprefix("task-"): r["tenant"] for r in rows}
        visible = {t for t in ids if t in tenants and caller.may_read_tenant(tenants[t])}

        def shown(task_id: Any) -> Any:
            return task_id if task_id is None or str(task_id) in visible else HIDDEN_TASK

        for item in items:
            if "task_id" in item:
                item["task_id"] = shown(item["task_id"])
        if isinstance(queue, dict) and "head" in queue:
            queue["head"] = shown(queue["head"])
        return view

    # --- groups ---------------------------------------------------------------

    async def create_group(self, req: Request, group: bodies.TaskGroupRequest) -> dict[str, Any]:
        """R-17: one task per item, each the template with the item's overrides; all or none."""
        req.principal.require_write()
        async with self._submitting(req):
            # The submission service keeps a group (its group_id sent again) within
            # MAX_GROUP_SIZE, in the transaction that appends its new tasks.
            accepted = await self.submission.submit_group(req, group.as_json())
            await self._listed(accepted.task_ids)
            return await self.get_group(req.principal, accepted.group_id)

    async def _listed(self, task_ids: Sequence[str]) -> None:
        """Wait until the task list holds `task_ids` as their streams are now (new
        tasks, or tasks just stopped or rerun), at most GROUP_LISTED_WAIT_S. The list
        reads the log in order, so it stops before a write still in flight (any
        tenant's: a large group takes seconds) and holds what was appended after it
        only once it has ended: a group's answer, read from the list, would have been a
        404 for a group just made, or the statuses from before a stop or a rerun."""
        streams = [_stream(task_id) for task_id in set(task_ids)]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GROUP_LISTED_WAIT_S):
                wanted = await self.db.fetch(
                    "SELECT stream_id, version FROM streams WHERE stream_id = ANY($1::text[])",
                    streams,
                )
                ids = [r["stream_id"].removeprefix("task-") for r in wanted]
                versions = [r["version"] for r in wanted]
                while True:
                    await self.projector.catch_up()
                    listed = await self.db.fetchval(
                        f"SELECT count(*) FROM {self.projector.table} t"
                        " JOIN unnest($1::text[], $2::bigint[]) AS w(task_id, version)"
                        " ON t.task_id = w.task_id AND t.version >= w.version",
                        ids,
                        versions,
                    )
                    if listed >= len(ids):
                        return
                    await asyncio.sleep(0.05)

    async def get_group(
        self, caller: Principal, group_id: str, tenant: str | None = None
    ) -> dict[str, Any]:
        """The group's tasks (from the task list) and a count per status."""
        tenant = _read_tenant(caller, tenant)
        await self.projector.catch_up()
        rows, _ = await projection.list_rows(
            self.db, tenant, {"group_id": group_id}, MAX_PAGE * 5, None
        )
        if not rows:
            hint = "check the group id; `runyard group ls` lists the tenant's groups"
            if caller.role in CROSS_TENANT_READERS:
                hint += "; another tenant's group: give its tenant (--tenant, ?tenant=)"
            raise NotFound(
                "group.not_found",
                f"task group {group_id!r} does not exist in tenant {tenant!r}",
                hint,
                "group_id",
            )
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        return {"group_id": group_id, "tasks": rows, "status_counts": counts}

    async def stop_group(self, req: Request, group_id: str) -> dict[str, Any]:
        """Stop every task of the group that has not ended yet."""
        group = await self._group_to_change(req.principal, group_id)
        for row in group["tasks"]:
            state, recorded = await self._load(req.principal, row["task_id"], write=True)
            if not is_terminal(state.status):
                stop = _stop(req.principal, state.task_id, group_id)
                await self._decide_and_append(req, recorded, stop)
        await self._listed([row["task_id"] for row in group["tasks"]])
        return await self.get_group(req.principal, group_id)

    async def _group_to_change(self, caller: Principal, group_id: str) -> dict[str, Any]:
        """The caller's tenant's group, to stop or rerun: answered as a task would be.

        A read-only role: 403, whether the group is or not. A group of another tenant
        only: 404 (as no group) to a member, who may not read it; 403 to a platform
        admin, who may read it but not change it (as `_load` answers for a task)."""
        caller.require_write()
        try:
            return await self.get_group(caller, group_id)
        except NotFound:
            if caller.role in CROSS_TENANT_READERS:
                tenants = await projection.group_tenants(self.db, group_id, caller.tenant)
                if tenants:
                    raise PermissionDenied(
                        "auth.other_tenant",
                        f"task group {group_id!r} belongs to tenant"
                        f" {', '.join(repr(t) for t in tenants)}: you may read it only",
                        "use a token of that tenant to change it",
                        "group_id",
                    ) from None
            raise

    async def list_groups(
        self,
        caller: Principal,
        limit: int = 50,
        tenant: str | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """A page of the caller's tenant's task groups, newest first, with a count per
        status, and the cursor of the next page (None on the last)."""
        tenant = _read_tenant(caller, tenant)
        if not 1 <= limit <= MAX_PAGE:
            raise BadRequest(
                "request.invalid",
                f"limit must be 1 to {MAX_PAGE}",
                f"give a limit from 1 to {MAX_PAGE}",
                "limit",
            )
        await self.projector.catch_up()
        try:
            rows, next_cursor = await projection.group_rows(self.db, tenant, limit, cursor)
        except ValueError as exc:
            raise BadRequest(
                "cursor.invalid", str(exc), "pass back a next_cursor as given", "cursor"
            ) from exc
        return {"items": rows, "next_cursor": next_cursor}

    async def rerun_group(
        self, req: Request, group_id: str, changes: bodies.RerunChanges
    ) -> dict[str, Any]:
        """Rerun every finished task of the group, each with the same allowed changes.

        The submission service checks every rerun first, then writes all in one
        transaction, so either every finished task runs again or none does.
        """
        async with self._submitting(req):
            group = await self._group_to_change(req.principal, group_id)
            task_ids = [row["task_id"] for row in group["tasks"]]
            await self.submission.rerun_group(req, group_id, task_ids, changes.as_json())
            await self._listed(task_ids)
            return await self.get_group(req.principal, group_id)

    # --- catalogue (admin) ----------------------------------------------------

    async def add_image(self, req: Request, entry: bodies.ImageEntry) -> dict[str, Any]:
        """Platform admin: add or replace an image of the catalogue."""
        return await self._change_catalogue(req, "image", entry)

    async def add_volume(self, req: Request, entry: bodies.VolumeEntry) -> dict[str, Any]:
        """Platform admin: add a volume {file_system, volume, zone} to the catalogue."""
        return await self._change_catalogue(req, "volume", entry)

    async def add_public_data(self, req: Request, entry: bodies.PublicDataEntry) -> dict[str, Any]:
        """Platform admin: offer public data in a zone {zone, path?}."""
        return await self._change_catalogue(req, "public_data", entry)

    async def _change_catalogue(
        self, req: Request, kind: str, entry: bodies.RequestBody
    ) -> dict[str, Any]:
        req.principal.require_platform_admin()
        return await self.submission.set_catalogue_entry(req, kind, entry.as_json())

    async def catalogue_view(self, caller: Principal) -> dict[str, Any]:
        """The images, volumes and public data the rules use (the submission service's)."""
        return await self.submission.catalogue(caller)

    # --- internals ------------------------------------------------------------

    def _submitting(self, req: Request) -> AbstractAsyncContextManager[None]:
        """One of the caller's tenant's submissions in flight (`submissions_per_tenant`):
        past them it waits its turn, then is refused with 429 `submission.busy`."""
        return self.submissions.taken(req.principal.tenant)

    async def _load(
        self, caller: Principal, task_id: str, *, write: bool = False
    ) -> tuple[TaskState, list[RecordedEvent[Event]]]:
        """The task if the caller may read it (404 otherwise, as for no task); with
        `write`, 403 unless the caller may also change it (own tenant, not sre)."""
        if write:
            caller.require_write()
        events = await self.store.read_stream(_stream(task_id))
        if not events:
            raise task_not_found(task_id)
        return require_visible(caller, fold(events, task_id=task_id), write=write), events

    async def _decide_and_append(
        self, req: Request, recorded: Sequence[RecordedEvent[Event]], command: Command
    ) -> None:
        """Decide on the task's stream as `_load` read it and append; when the task moved
        on meanwhile (the scheduler's or the deployer's event landed first), decide again
        on what is new (409 `conflict` after CONFLICT_RETRIES tries)."""
        req.principal.require_write()  # every task event goes through here
        decision = TaskCommands(
            command.task_id, [command], req.metadata(), self.clock, ids=self.new_id
        )
        await decide_and_append(
            self.store,
            _stream(command.task_id),
            decision,
            recorded=recorded,
            attempts=CONFLICT_RETRIES,
        )

    async def _secrets(self, tenant: str, spec: TaskSpec) -> dict[str, str]:
        refs = [v.secret_ref for v in spec.env if v.creator_only and v.secret_ref]
        if not refs:
            return {}
        rows = await self.db.fetch(
            "SELECT ref, value FROM secrets WHERE tenant = $1 AND ref = ANY($2)", tenant, refs
        )
        return {r["ref"]: r["value"] for r in rows}

    async def _pools(self) -> dict[str, PoolInfo]:
        return await load_pools(self.db, self.config_dir)


def _stream(task_id: str) -> str:
    return f"task-{task_id}"


def _read_tenant(caller: Principal, tenant: str | None) -> str:
    """The tenant a list reads: the caller's own unless its role reads across tenants
    (`tenant` empty, as `?tenant=` or gRPC's unset field, is the caller's own)."""
    if not tenant or tenant == caller.tenant:
        return caller.tenant
    if not caller.may_read_tenant(tenant):
        raise PermissionDenied(
            "auth.other_tenant",
            f"your role reads only tenant {caller.tenant!r}",
            "leave `tenant` out, or use an sre or platform_admin token",
            "tenant",
        )
    return tenant


def _is_creator(caller: Principal, state: TaskState) -> bool:
    """The task's creator: same tenant and same user (a user name alone is not unique)."""
    return caller.tenant == state.tenant and caller.user == state.creator


def _evolve_all(state: TaskState, events: Sequence[RecordedEvent[Event]]) -> TaskState:
    for recorded in events:
        state = evolve(state, recorded)
    return state


def _stop(caller: Principal, task_id: str, group_id: str | None = None) -> RequestStop:
    """A stop that names who asked and in what role (never "its owner" by default)."""
    return RequestStop(task_id, by=caller.user, role=caller.role, group_id=group_id)


def submission_client(endpoints: Mapping[str, str]) -> SubmissionClient:
    """The submission service's client at `endpoints["submission-grpc"]`, with the
    platform's credential (`runyard.contracts.rpc.credential`: RUNYARD_INTERNAL_TOKEN, or
    the file of RUNYARD_HOME), read at the first call."""
    home = Path(os.environ.get("RUNYARD_HOME", ".runyard"))
    return SubmissionClient(endpoints, lambda: credential.service_token({}, home))


def _json_env(variable: str) -> dict[str, Any]:
    loaded = json.loads(os.environ.get(variable) or "{}")
    if not isinstance(loaded, dict):
        raise ValueError(f"{variable}: expected a JSON object")
    return loaded


__all__ = ["Gateway", "Request", "submission_client"]
