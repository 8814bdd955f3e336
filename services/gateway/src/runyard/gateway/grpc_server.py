"""The gRPC API (`proto/runyard/v1/tasks.proto`): thin handlers over the application layer.

Each handler authenticates the `authorization: Bearer <token>` metadata,
calls the same `Gateway` method as the HTTP handler and answers its result;
specs, changes and full answers travel as JSON text in the HTTP shapes.
Errors are answered by the gRPC edge every Runyard server shares
(`runyard.api.grpc_errors.abort`): the error's status code, with `runyard-code`,
`runyard-field`, `runyard-hint`, `runyard-status` and `runyard-error-bin` (the
HTTP error body, UTF-8 JSON) in the trailing metadata.

The log methods call the log service's HTTP API (`runyard.gateway.proxy.Owners`,
the client the HTTP routing uses) with the caller's token, after
authenticating it here; the log service's refusals map as the gateway's own.
The server also serves the standard gRPC health service (`grpc.health.v1`,
SERVING once started) and server reflection.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from runyard.api.auth import Principal, bearer_token
from runyard.api.errors import BadRequest
from runyard.api.grpc_errors import abort
from runyard.api.inputs import (
    MAX_BODY_BYTES,
    check_param,
    check_request_id,
    reject_unstorable,
)
from runyard.eventstore.trace import MAX_TRACE_EVENTS
from runyard.gateway.app import Gateway, Request
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.proxy import Owners
from runyard.gateway.replay import ReplayApi
from runyard.gateway.trace import TraceApi

log = logging.getLogger(__name__)

#: Largest request message the server reads (as HTTP bodies; bigger ones are
#: refused by gRPC itself with RESOURCE_EXHAUSTED before any handler runs).
MAX_MESSAGE_BYTES = MAX_BODY_BYTES
DEFAULT_PAGE = 50
#: Lines per page of SearchLogs and FollowLogs when `limit` is 0 (as HTTP /logs).
LOG_PAGE = 200
#: The service names of this server (health and reflection answer for each).
TASKS_SERVICE = pb.DESCRIPTOR.services_by_name["Tasks"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

T = TypeVar("T")


def _json_object(text: str, field: str) -> dict[str, Any]:
    """A JSON object from a `*_json` field; empty text is `{}`."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except RecursionError as exc:  # nested far deeper than any spec: refuse, never crash
        raise BadRequest(
            "request.invalid",
            f"{field}: JSON nested too deep",
            "send the spec as a plain JSON object (docs/limits.md)",
            field,
        ) from exc
    except ValueError as exc:
        raise BadRequest(
            "request.invalid", f"{field}: not valid JSON ({exc})", "send a JSON object", field
        ) from exc
    if not isinstance(value, dict):
        raise BadRequest("request.invalid", f"{field} must be a JSON object", "send {...}", field)
    reject_unstorable(value, field)
    return value


def check_fields(message: Any) -> None:
    """Refuse a request whose string fields hold text the store cannot keep
    (nested messages too: the field is named as HTTP names it)."""
    for descriptor, value in message.ListFields():
        if isinstance(value, str):
            reject_unstorable(value, descriptor.name)
            if not descriptor.name.endswith("_json"):  # JSON is bounded by the message size
                check_param(descriptor.name, value)
        elif descriptor.message_type is not None and not descriptor.is_repeated:
            check_fields(value)
        elif descriptor.is_repeated:
            reject_unstorable(list(value), descriptor.name)


def _limit(limit: int) -> int:
    return limit or DEFAULT_PAGE


def log_params(message: pb.LogFilter) -> dict[str, Any]:
    """The HTTP query parameters of a gRPC `LogFilter` (unset optionals: absent)."""
    params: dict[str, Any] = {"worker": list(message.workers)} if message.workers else {}
    for name in ("run", "words", "phrase", "regex"):
        if message.HasField(name):
            params[name] = getattr(message, name)
    for name in ("since", "until"):
        at = _time(getattr(message, name), name)
        if at is not None:
            params[name] = at.isoformat()
    if message.ignore_case:
        params["ignore_case"] = "true"
    return params


def _time(text: str, field: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadRequest(
            "request.invalid",
            f"{field}: not an ISO 8601 time ({exc})",
            "e.g. 2026-01-02T03:04:05Z",
            field,
        ) from exc


def log_line_message(line: Mapping[str, Any]) -> pb.LogLine:
    return pb.LogLine(
        at=line["at"],
        run=line["run"],
        attempt=line["attempt"],
        worker=line["worker"],
        stream=line["stream"],
        line=line["line"],
    )


def log_page_message(page: Mapping[str, Any]) -> pb.LogPage:
    return pb.LogPage(
        lines=[log_line_message(line) for line in page["lines"]],
        next_cursor=page["next_cursor"] or "",
        tail_cursor=page["tail_cursor"] or "",
        json=json.dumps(page),
    )


def export_message(export: Mapping[str, Any]) -> pb.LogExport:
    return pb.LogExport(
        export_id=export["export_id"],
        task_id=export["task_id"],
        state=export["state"],
        lines_done=export["lines_done"] or 0,
        lines_total=export["lines_total"] or 0,
        json=json.dumps(export),
    )


def task_message(task: Mapping[str, Any]) -> pb.Task:
    return pb.Task(
        task_id=task["task_id"],
        name=task["name"],
        status=task["status"],
        creator=task["creator"],
        run=task["run"],
        json=json.dumps(task),
    )


def summary_message(row: Mapping[str, Any]) -> pb.TaskSummary:
    return pb.TaskSummary(
        task_id=row["task_id"],
        name=row["name"],
        status=row["status"],
        pool=row["pool"],
        creator=row["creator"],
        run=row["run"],
        json=json.dumps(row),
    )


def event_message(event: Mapping[str, Any]) -> pb.Event:
    return pb.Event(
        position=event["position"] or 0,
        version=event["version"] or 0,
        type=event["type"],
        occurred_at=event["occurred_at"] or "",
        actor=event["actor"] or "",
        correlation_id=event["correlation_id"] or "",
        json=json.dumps(event),
    )


def group_message(group: Mapping[str, Any]) -> pb.Group:
    return pb.Group(
        group_id=group["group_id"],
        tasks=[summary_message(t) for t in group["tasks"]],
        status_counts=group["status_counts"],
        json=json.dumps(group),
    )


class TasksService(pb_grpc.TasksServicer):
    """The `runyard.v1.Tasks` service over one `Gateway`; log methods through `owners`."""

    def __init__(self, gateway: Gateway, owners: Owners) -> None:
        self.gw = gateway
        self.owners = owners
        self.replay = ReplayApi(gateway)
        self.trace = TraceApi(gateway)

    # --- plumbing -------------------------------------------------------------

    async def _caller(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of the `authorization` metadata, parsed as strictly as over HTTP
        and looked up on every call (a revoked or expired token fails at once)."""
        return await self.gw.authenticate(_token(context))

    async def _request(self, context: grpc.aio.ServicerContext) -> Request:
        metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
        given = metadata.get("x-request-id")
        check_request_id(str(given) if given else None)
        request_id = str(given or uuid.uuid4())
        # A caller's W3C context continues into the events this call writes.
        trace = {k: str(metadata[k]) for k in ("traceparent", "tracestate") if k in metadata}
        return Request(await self._caller(context), request_id, trace)

    async def _run(
        self, context: grpc.aio.ServicerContext, request: Any, call: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            check_fields(request)
            return await call()
        except Exception as exc:
            await abort(context, exc, "gateway")

    # --- tasks ----------------------------------------------------------------

    async def CreateTask(
        self, request: pb.CreateTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            body = _json_object(request.spec_json, "spec_json")
            return task_message(await self.gw.create_task(req, body))

        return await self._run(context, request, call)

    async def GetTask(self, request: pb.TaskRef, context: grpc.aio.ServicerContext) -> pb.Task:
        async def call() -> pb.Task:
            caller = await self._caller(context)
            return task_message(await self.gw.get_task(caller, request.task_id))

        return await self._run(context, request, call)

    async def ListTasks(
        self, request: pb.ListTasksRequest, context: grpc.aio.ServicerContext
    ) -> pb.TaskPage:
        async def call() -> pb.TaskPage:
            caller = await self._caller(context)
            names = ("status", "name", "tag", "pool", "creator")
            filters = {n: getattr(request, n) or None for n in names}
            page = await self.gw.list_tasks(
                caller, filters, _limit(request.limit), request.cursor or None
            )
            return pb.TaskPage(
                items=[summary_message(r) for r in page["items"]],
                next_cursor=page["next_cursor"] or "",
            )

        return await self._run(context, request, call)

    async def StopTask(self, request: pb.TaskRef, context: grpc.aio.ServicerContext) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            return task_message(await self.gw.stop_task(req, request.task_id))

        return await self._run(context, request, call)

    async def RerunTask(
        self, request: pb.RerunTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            changes = _json_object(request.changes_json, "changes_json")
            return task_message(await self.gw.rerun_task(req, request.task_id, changes))

        return await self._run(context, request, call)

    async def CloneTask(
        self, request: pb.CloneTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            overrides = _json_object(request.overrides_json, "overrides_json")
            return task_message(await self.gw.clone_task(req, request.task_id, overrides))

        return await self._run(context, request, call)

    async def ListTaskEvents(
        self, request: pb.TaskRef, context: grpc.aio.ServicerContext
    ) -> pb.EventList:
        async def call() -> pb.EventList:
            caller = await self._caller(context)
            events = await self.gw.task_events(caller, request.task_id)
            return pb.EventList(events=[event_message(e) for e in events])

        return await self._run(context, request, call)

    async def WatchTask(
        self, request: pb.TaskRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        try:
            check_fields(request)
            caller = await self._caller(context)
            async for event in self.gw.watch(caller, request.task_id):
                yield event_message(event)
        except Exception as exc:
            await abort(context, exc, "gateway")

    # --- pools ----------------------------------------------------------------

    async def GetPoolCapacity(
        self, request: pb.PoolRef, context: grpc.aio.ServicerContext
    ) -> pb.JsonReply:
        async def call() -> pb.JsonReply:
            caller = await self._caller(context)
            answer = await self.gw.pool_capacity(caller, request.pool_id)
            return pb.JsonReply(json=json.dumps(answer))

        return await self._run(context, request, call)

    # --- groups ---------------------------------------------------------------

    async def CreateGroup(
        self, request: pb.CreateGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Group:
        async def call() -> pb.Group:
            req = await self._request(context)
            body: dict[str, Any] = {
                "template": _json_object(request.template_json, "template_json"),
                "items": [
                    _json_object(item, f"items_json[{i}]")
                    for i, item in enumerate(request.items_json)
                ],
            }
            if request.group_id:
                body["group_id"] = request.group_id
            return group_message(await self.gw.create_group(req, body))

        return await self._run(context, request, call)

    async def GetGroup(self, request: pb.GroupRef, context: grpc.aio.ServicerContext) -> pb.Group:
        async def call() -> pb.Group:
            caller = await self._caller(context)
            return group_message(await self.gw.get_group(caller, request.group_id))

        return await self._run(context, request, call)

    async def StopGroup(self, request: pb.GroupRef, context: grpc.aio.ServicerContext) -> pb.Group:
        async def call() -> pb.Group:
            req = await self._request(context)
            return group_message(await self.gw.stop_group(req, request.group_id))

        return await self._run(context, request, call)

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GroupList:
        async def call() -> pb.GroupList:
            caller = await self._caller(context)
            answer = await self.gw.list_groups(caller, _limit(request.limit))
            return pb.GroupList(
                groups=[
                    pb.GroupSummary(
                        group_id=g["group_id"],
                        tasks=g["tasks"],
                        status_counts=g["status_counts"],
                        json=json.dumps(g),
                    )
                    for g in answer["items"]
                ]
            )

        return await self._run(context, request, call)

    async def RerunGroup(
        self, request: pb.RerunGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Group:
        async def call() -> pb.Group:
            req = await self._request(context)
            changes = _json_object(request.changes_json, "changes_json")
            return group_message(await self.gw.rerun_group(req, request.group_id, changes))

        return await self._run(context, request, call)

    # --- logs (the log service's API, with the caller's token) -------------------

    async def _logs(
        self, context: grpc.aio.ServicerContext, path: str, *, write: bool = False, **kw: Any
    ) -> Any:
        """The log service's answer to `path` for the caller (authenticated here first)."""
        caller = await self._caller(context)
        if write:
            caller.require_write()  # as over HTTP: a read-only role starts nothing
        method = "POST" if write else "GET"
        return await self.owners.call("logs", method, path, token=_token(context), **kw)

    async def SearchLogs(
        self, request: pb.SearchLogsRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogPage:
        async def call() -> pb.LogPage:
            params = log_params(request.filter)
            params |= {"order": request.order or "oldest", "limit": request.limit or LOG_PAGE}
            if request.cursor:
                params["cursor"] = request.cursor
            page = await self._logs(context, _task_path(request.task_id, "logs"), params=params)
            return log_page_message(page)

        return await self._run(context, request, call)

    async def FollowLogs(
        self, request: pb.FollowLogsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LogPage]:
        try:
            check_fields(request)
            await self._caller(context)
            params = log_params(request.filter) | {"limit": request.limit or LOG_PAGE}
            if request.cursor:
                params["cursor"] = request.cursor
            path = _task_path(request.task_id, "logs/follow")
            pages = await self.owners.lines("logs", path, token=_token(context), params=params)
            # closed here, not when collected: a client that goes away mid-stream gives
            # the connection to the log service back at once
            async with contextlib.aclosing(pages) as stream:
                async for page in stream:
                    yield log_page_message(page)
        except Exception as exc:
            await abort(context, exc, "gateway")

    async def GetFirstError(
        self, request: pb.FirstErrorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FirstError:
        async def call() -> pb.FirstError:
            params = {"run": request.run} if request.HasField("run") else {}
            path = _task_path(request.task_id, "first-error")
            answer = await self._logs(context, path, params=params)
            found = pb.FirstError(found=answer["found"], json=json.dumps(answer))
            if answer["found"]:
                found.line.CopyFrom(log_line_message(answer["line"]))
                found.layer, found.rule = answer["layer"], answer["rule"]
            return found

        return await self._run(context, request, call)

    async def StartLogExport(
        self, request: pb.StartLogExportRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogExport:
        async def call() -> pb.LogExport:
            path = _task_path(request.task_id, "logs/exports")
            body = {"format": request.format or "text"}
            params = log_params(request.filter)
            answer = await self._logs(context, path, write=True, params=params, body=body)
            return export_message(answer)

        return await self._run(context, request, call)

    async def GetLogExport(
        self, request: pb.ExportRef, context: grpc.aio.ServicerContext
    ) -> pb.LogExport:
        async def call() -> pb.LogExport:
            path = f"/v1/exports/{quote(request.export_id, safe='')}"
            return export_message(await self._logs(context, path))

        return await self._run(context, request, call)

    async def ListLogExports(
        self, request: pb.ListLogExportsRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogExportList:
        async def call() -> pb.LogExportList:
            exports = await self._logs(context, "/v1/exports")
            return pb.LogExportList(exports=[export_message(e) for e in exports])

        return await self._run(context, request, call)

    # --- replay (docs/api.md, "Replay") ------------------------------------------

    async def GetTaskAt(
        self, request: pb.TaskAtRequest, context: grpc.aio.ServicerContext
    ) -> pb.JsonReply:
        async def call() -> pb.JsonReply:
            caller = await self._caller(context)
            answer = await self.replay.task_at(caller, request.task_id, request.at)
            return pb.JsonReply(json=json.dumps(answer))

        return await self._run(context, request, call)

    async def DiffTask(
        self, request: pb.DiffTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.JsonReply:
        async def call() -> pb.JsonReply:
            caller = await self._caller(context)
            answer = await self.replay.task_diff(
                caller, request.task_id, request.from_point, request.to_point
            )
            return pb.JsonReply(json=json.dumps(answer))

        return await self._run(context, request, call)

    async def GetPoolsAt(
        self, request: pb.PoolsAtRequest, context: grpc.aio.ServicerContext
    ) -> pb.JsonReply:
        async def call() -> pb.JsonReply:
            await self._caller(context)  # 401 before the scheduler is asked
            params = {"at": request.at, **({"pool": request.pool_id} if request.pool_id else {})}
            answer = await self.owners.call(
                "scheduler", "GET", "/v1/pools/replay", token=_token(context), params=params
            )
            return pb.JsonReply(json=json.dumps(answer))

        return await self._run(context, request, call)

    async def WhatIf(
        self, request: pb.WhatIfRequest, context: grpc.aio.ServicerContext
    ) -> pb.JsonReply:
        async def call() -> pb.JsonReply:
            await self._caller(context)  # 401 before the scheduler is asked
            body: dict[str, Any] = {"from": request.from_point, "to": request.to_point}
            if request.pools_json.strip():  # a pools document: its `pools` list is sent
                document = _json_object(request.pools_json, "pools_json")
                body["pools"] = document.get("pools", document)
            if request.policy:
                body["policy"] = request.policy
            if request.pool_id:
                body["pool"] = request.pool_id
            answer = await self.owners.call(
                "scheduler", "POST", "/v1/pools/whatif", token=_token(context), body=body
            )
            return pb.JsonReply(json=json.dumps(answer))

        return await self._run(context, request, call)

    async def Trace(
        self, request: pb.TraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.JsonReply:
        async def call() -> pb.JsonReply:
            caller = await self._caller(context)
            limit = request.limit or MAX_TRACE_EVENTS
            if bool(request.task_id) == bool(request.event_id):
                raise BadRequest(
                    "request.invalid",
                    "give exactly one of task_id and event_id",
                    "trace a task (task_id) or one event (event_id)",
                    "task_id",
                )
            if request.task_id:
                answer = await self.trace.task_trace(caller, request.task_id, limit)
            else:
                answer = await self.trace.event_trace(caller, request.event_id, limit)
            return pb.JsonReply(json=json.dumps(answer))

        return await self._run(context, request, call)


def _token(context: grpc.aio.ServicerContext) -> str | None:
    """The bearer token of the `authorization` metadata (None: none or malformed)."""
    metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
    header = metadata.get("authorization")
    return bearer_token(str(header) if header else None)


def _task_path(task_id: str, tail: str) -> str:
    """`/v1/tasks/{id}/<tail>` with the id as one path segment, whatever it holds."""
    return f"/v1/tasks/{quote(task_id, safe='')}/{tail}"


async def start_server(
    gateway: Gateway,
    host: str,
    port: int,
    *,
    owners: Owners | Mapping[str, str] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A started grpc.aio server for `gateway` on host:port (the log methods call the
    log service through `owners`: an `Owners`, or the endpoints mapping to make one
    of); returns it and the bound port. Health answers SERVING once it has started."""
    if not isinstance(owners, Owners):
        owners = Owners(owners if owners is not None else {})
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_metadata_size", 16 * 1024),
        ]
    )
    pb_grpc.add_TasksServicer_to_server(TasksService(gateway, owners), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    names = (TASKS_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    for name in ("", TASKS_SERVICE):  # "": the server as a whole
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC API on %s:%s", host, bound)
    return server, bound


__all__ = ["TasksService", "start_server"]
