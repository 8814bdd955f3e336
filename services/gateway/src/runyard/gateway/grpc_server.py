"""The gRPC API (`proto/runyard/v1/tasks.proto`): thin handlers over the application layer.

Each handler authenticates the `authorization: Bearer <token>` metadata,
calls the same `Gateway` method as the HTTP handler and answers its result as
typed messages; `runyard.gateway.grpc_convert` is the one translation between
the messages and the HTTP shapes the application layer takes and answers.
Errors are answered by the gRPC edge every Runyard server shares
(`runyard.api.grpc_errors.abort`): the error's status code with a
`google.rpc.Status` (ErrorInfo, BadRequest, RetryInfo) and the `runyard-*`
trailing metadata.

The log, pool replay, what-if and fault-tolerance methods call the HTTP API of
the service that owns them (logs, scheduler, faulttolerance) through
`runyard.gateway.proxy.Owners`, the client the HTTP routing uses, with the
caller's token, after authenticating it here; their refusals map as the
gateway's own.
The server also serves the standard gRPC health service (`grpc.health.v1`,
SERVING once started) and server reflection.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import Field, TypeAdapter, ValidationError
from runyard.api.auth import Principal, bearer_of
from runyard.api.errors import BadRequest
from runyard.api.grpc_errors import abort
from runyard.api.inputs import (
    MAX_BODY_BYTES,
    check_param,
    check_request_id,
    parse_body,
    reject_unstorable,
)
from runyard.contracts.requests import RerunChanges, SpecOverrides, TaskGroupRequest, TaskSubmission
from runyard.contracts.task_events import TaskStatus
from runyard.eventstore.trace import MAX_TRACE_EVENTS
from runyard.gateway import grpc_convert as convert
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


def check_fields(message: Message, prefix: str = "", *, part: str = "all") -> None:
    """Refuse a request whose text the store cannot keep, in any field of any nested
    message; a field of the request is named as over HTTP (its name), a field of a
    spec by its path (`spec.name`, `items[1].spec.env[0].value`). `part`: `params`,
    the request's own fields (what HTTP takes as path and query, checked before the
    caller), `body`, the messages HTTP takes as the body (`_NESTED`: checked once the
    caller may call the method), or `all`."""
    for descriptor, value in message.ListFields():
        name = descriptor.name
        path = f"{prefix}{name}"
        if not prefix and part != "all" and (name in _NESTED) != (part == "body"):
            continue
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            reject_unstorable(dict(value), path)
        elif descriptor.is_repeated and descriptor.message_type is not None:
            for index, item in enumerate(value):
                check_fields(item, f"{path}[{index}].")
        elif descriptor.is_repeated:
            reject_unstorable(list(value), path)
        elif descriptor.message_type is not None:
            if descriptor.message_type.full_name in _OPAQUE:
                continue
            check_fields(value, f"{path}." if prefix or name in _NESTED else "")
        elif isinstance(value, str):
            reject_unstorable(value, path)
            if not prefix:  # a parameter of the request itself, as a query parameter is
                check_param(name, value)


#: Messages whose fields are named with their path (what a spec holds); the fields of
#: other nested messages (a `LogFilter`) are named as the HTTP query parameters.
_NESTED = frozenset({"spec", "template", "items", "changes", "overrides", "pools"})
#: Well-known messages with no text of their own to check.
_OPAQUE = frozenset({"google.protobuf.Timestamp", "google.protobuf.Duration"})


#: The message of the call being answered (each call runs in its own task).
_MESSAGE: ContextVar[Message | None] = ContextVar("grpc_message", default=None)


def _check_body() -> None:
    """The body part of the call's message (`check_fields`), once its caller may call it."""
    message = _MESSAGE.get()
    if message is not None:
        check_fields(message, part="body")


def _limit(limit: int) -> int:
    return limit or DEFAULT_PAGE


#: How HTTP reads the query parameters a request's own fields stand for (FastAPI's
#: checks of the routes' parameters), so that gRPC refuses what HTTP refuses.
_STATUS = TypeAdapter(TaskStatus)
_TRACE_LIMIT = TypeAdapter(Annotated[int, Field(ge=1, le=MAX_TRACE_EVENTS)])


def _param(name: str, value: Any, adapter: TypeAdapter[Any]) -> Any:
    """`value` of the request field that is HTTP's query parameter `name`, checked as
    HTTP checks it: the same 400 `request.invalid` naming it."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise BadRequest(
            "request.invalid",
            f"{name}: {exc.errors()[0]['msg']}",
            "fix the request (see /openapi.json)",
            name,
        ) from exc


class TasksService(pb_grpc.TasksServicer):
    """The `runyard.v1.Tasks` service over one `Gateway`; log methods through `owners`."""

    def __init__(self, gateway: Gateway, owners: Owners) -> None:
        self.gw = gateway
        self.owners = owners
        self.replay = ReplayApi(gateway)
        self.trace = TraceApi(gateway)

    # --- plumbing -------------------------------------------------------------

    async def _caller(self, context: grpc.aio.ServicerContext, *, body: bool = True) -> Principal:
        """The caller of the `authorization` metadata, parsed as strictly as over HTTP
        and looked up on every call (a revoked or expired token fails at once); then
        (`body`) the text of the message's body part, as HTTP checks it after the caller."""
        caller = await self.gw.authenticate(_token(context))
        if body:
            _check_body()
        return caller

    async def _request(self, context: grpc.aio.ServicerContext) -> Request:
        """The caller of a method that changes something, refused (PERMISSION_DENIED) for
        a read-only role before its message is read, as HTTP refuses any method but GET
        of such a caller; with its request id and trace context."""
        caller = await self._caller(context, body=False)
        caller.require_write()
        metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
        given = metadata.get("x-request-id")
        check_request_id(str(given) if given else None)
        _check_body()
        request_id = str(given or uuid.uuid4())
        # A caller's W3C context continues into the events this call writes.
        trace = {k: str(metadata[k]) for k in ("traceparent", "tracestate") if k in metadata}
        return Request(caller, request_id, trace)

    async def _run(
        self,
        context: grpc.aio.ServicerContext,
        request: Message,
        call: Callable[[], Awaitable[T]],
    ) -> T:
        try:
            check_fields(request, part="params")
            _MESSAGE.set(request)  # its body part: checked once the caller is known
            return await call()
        except Exception as exc:
            await abort(context, exc, "gateway")

    # --- tasks ----------------------------------------------------------------

    async def CreateTask(
        self, request: pb.CreateTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            body = parse_body(TaskSubmission, convert.spec_body(request.spec))
            return convert.task_message(await self.gw.create_task(req, body))

        return await self._run(context, request, call)

    async def GetTask(
        self, request: pb.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            caller = await self._caller(context)
            return convert.task_message(
                await self.gw.get_task(caller, _id("task_id", request.task_id))
            )

        return await self._run(context, request, call)

    async def ListTasks(
        self, request: pb.ListTasksRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTasksResponse:
        async def call() -> pb.ListTasksResponse:
            caller = await self._caller(context)
            names = ("status", "name", "tag", "pool", "creator")
            filters = {n: getattr(request, n) or None for n in names}
            if filters["status"] is not None:
                _param("status", filters["status"], _STATUS)
            page = await self.gw.list_tasks(
                caller,
                filters,
                _limit(request.limit),
                request.cursor or None,
                request.tenant or None,
            )
            return pb.ListTasksResponse(
                tasks=[convert.summary_message(r) for r in page["items"]],
                next_cursor=page["next_cursor"] or "",
            )

        return await self._run(context, request, call)

    async def StopTask(
        self, request: pb.StopTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            return convert.task_message(
                await self.gw.stop_task(req, _id("task_id", request.task_id))
            )

        return await self._run(context, request, call)

    async def RerunTask(
        self, request: pb.RerunTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            changes = parse_body(
                RerunChanges, convert.changes_body(request.changes, "changes.update_mask")
            )
            return convert.task_message(
                await self.gw.rerun_task(req, _id("task_id", request.task_id), changes)
            )

        return await self._run(context, request, call)

    async def CloneTask(
        self, request: pb.CloneTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.Task:
        async def call() -> pb.Task:
            req = await self._request(context)
            overrides = parse_body(
                SpecOverrides, convert.changes_body(request.overrides, "overrides.update_mask")
            )
            task = await self.gw.clone_task(req, _id("task_id", request.task_id), overrides)
            return convert.task_message(task)

        return await self._run(context, request, call)

    async def ListTaskEvents(
        self, request: pb.ListTaskEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTaskEventsResponse:
        async def call() -> pb.ListTaskEventsResponse:
            caller = await self._caller(context)
            events = await self.gw.task_events(caller, _id("task_id", request.task_id))
            return pb.ListTaskEventsResponse(events=[convert.event_message(e) for e in events])

        return await self._run(context, request, call)

    async def WatchTask(
        self, request: pb.WatchTaskRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        try:
            check_fields(request)
            caller = await self._caller(context)
            close = self.gw.streams.take(caller.tenant)  # past the tenant's open streams
            try:
                async for event in self.gw.watch(caller, _id("task_id", request.task_id)):
                    yield convert.event_message(event)
            finally:
                close()  # ended, refused, or the client went away (cancelled)
        except Exception as exc:
            await abort(context, exc, "gateway")

    # --- pools ----------------------------------------------------------------

    async def GetPoolCapacity(
        self, request: pb.GetPoolCapacityRequest, context: grpc.aio.ServicerContext
    ) -> pb.PoolCapacity:
        async def call() -> pb.PoolCapacity:
            caller = await self._caller(context)
            answer = await self.gw.pool_capacity(caller, _id("pool_id", request.pool_id))
            return convert.capacity_message(answer)

        return await self._run(context, request, call)

    # --- groups ---------------------------------------------------------------

    async def CreateGroup(
        self, request: pb.CreateGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Group:
        async def call() -> pb.Group:
            req = await self._request(context)
            body: dict[str, Any] = {
                "template": convert.spec_body(request.template),
                "items": [
                    convert.changes_body(item, f"items[{i}].update_mask")
                    for i, item in enumerate(request.items)
                ],
            }
            if request.group_id:
                body["group_id"] = request.group_id
            group = parse_body(TaskGroupRequest, body)
            return convert.group_message(await self.gw.create_group(req, group))

        return await self._run(context, request, call)

    async def GetGroup(
        self, request: pb.GetGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Group:
        async def call() -> pb.Group:
            caller = await self._caller(context)
            group = await self.gw.get_group(
                caller, _id("group_id", request.group_id), request.tenant or None
            )
            return convert.group_message(group)

        return await self._run(context, request, call)

    async def StopGroup(
        self, request: pb.StopGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Group:
        async def call() -> pb.Group:
            req = await self._request(context)
            return convert.group_message(
                await self.gw.stop_group(req, _id("group_id", request.group_id))
            )

        return await self._run(context, request, call)

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListGroupsResponse:
        async def call() -> pb.ListGroupsResponse:
            caller = await self._caller(context)
            answer = await self.gw.list_groups(
                caller, _limit(request.limit), request.tenant or None, request.cursor or None
            )
            groups = [convert.group_summary_message(g) for g in answer["items"]]
            return pb.ListGroupsResponse(groups=groups, next_cursor=answer["next_cursor"] or "")

        return await self._run(context, request, call)

    async def RerunGroup(
        self, request: pb.RerunGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Group:
        async def call() -> pb.Group:
            req = await self._request(context)
            changes = parse_body(
                RerunChanges, convert.changes_body(request.changes, "changes.update_mask")
            )
            return convert.group_message(
                await self.gw.rerun_group(req, _id("group_id", request.group_id), changes)
            )

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
    ) -> pb.SearchLogsResponse:
        async def call() -> pb.SearchLogsResponse:
            params = convert.log_params(request.filter)
            params |= {"order": request.order or "oldest", "limit": request.limit or LOG_PAGE}
            if request.cursor:
                params["cursor"] = request.cursor
            page = await self._logs(context, _task_path(request.task_id, "logs"), params=params)
            return convert.log_page_message(page)

        return await self._run(context, request, call)

    async def FollowLogs(
        self, request: pb.FollowLogsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FollowLogsResponse]:
        try:
            check_fields(request)
            caller = await self._caller(context)
            params = convert.log_params(request.filter) | {"limit": request.limit or LOG_PAGE}
            if request.cursor:
                params["cursor"] = request.cursor
            path = _task_path(request.task_id, "logs/follow")
            close = self.gw.streams.take(caller.tenant)  # past the tenant's open streams
            try:
                pages = await self.owners.lines("logs", path, token=_token(context), params=params)
                # closed here, not when collected: a client that goes away mid-stream
                # gives the connection to the log service back at once
                async with contextlib.aclosing(pages) as stream:
                    async for page in stream:
                        yield convert.follow_page_message(page)
            finally:
                close()
        except Exception as exc:
            await abort(context, exc, "gateway")

    async def GetFirstError(
        self, request: pb.GetFirstErrorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FirstError:
        async def call() -> pb.FirstError:
            params = {"run": request.run} if request.HasField("run") else {}
            path = _task_path(request.task_id, "first-error")
            answer = await self._logs(context, path, params=params)
            return convert.first_error_message(answer)

        return await self._run(context, request, call)

    async def StartLogExport(
        self, request: pb.StartLogExportRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogExport:
        async def call() -> pb.LogExport:
            path = _task_path(request.task_id, "logs/exports")
            body = {"format": request.format or "text"}
            params = convert.log_params(request.filter)
            answer = await self._logs(context, path, write=True, params=params, body=body)
            return convert.export_message(answer)

        return await self._run(context, request, call)

    async def GetLogExport(
        self, request: pb.GetLogExportRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogExport:
        async def call() -> pb.LogExport:
            path = f"/v1/exports/{_segment('export_id', request.export_id)}"
            return convert.export_message(await self._logs(context, path))

        return await self._run(context, request, call)

    async def ListLogExports(
        self, request: pb.ListLogExportsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListLogExportsResponse:
        async def call() -> pb.ListLogExportsResponse:
            exports = await self._logs(context, "/v1/exports")
            return pb.ListLogExportsResponse(exports=[convert.export_message(e) for e in exports])

        return await self._run(context, request, call)

    # --- replay (docs/api.md, "Replay") ------------------------------------------

    async def GetTaskAt(
        self, request: pb.GetTaskAtRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTaskAtResponse:
        async def call() -> pb.GetTaskAtResponse:
            caller = await self._caller(context)
            answer = await self.replay.task_at(caller, _id("task_id", request.task_id), request.at)
            return convert.task_at_message(answer)

        return await self._run(context, request, call)

    async def DiffTask(
        self, request: pb.DiffTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.DiffTaskResponse:
        async def call() -> pb.DiffTaskResponse:
            caller = await self._caller(context)
            answer = await self.replay.task_diff(
                caller, _id("task_id", request.task_id), request.from_point, request.to_point
            )
            return convert.diff_message(answer)

        return await self._run(context, request, call)

    async def GetPoolsAt(
        self, request: pb.GetPoolsAtRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPoolsAtResponse:
        async def call() -> pb.GetPoolsAtResponse:
            await self._caller(context)  # 401 before the scheduler is asked
            params = {"at": request.at, **({"pool": request.pool_id} if request.pool_id else {})}
            answer = await self.owners.call(
                "scheduler", "GET", "/v1/pools/replay", token=_token(context), params=params
            )
            return convert.pools_at_message(answer)

        return await self._run(context, request, call)

    async def WhatIf(
        self, request: pb.WhatIfRequest, context: grpc.aio.ServicerContext
    ) -> pb.WhatIfResponse:
        async def call() -> pb.WhatIfResponse:
            await self._caller(context)  # 401 before the scheduler is asked
            answer = await self.owners.call(
                "scheduler",
                "POST",
                "/v1/pools/whatif",
                token=_token(context),
                body=convert.whatif_body(request),
            )
            return convert.whatif_message(answer)

        return await self._run(context, request, call)

    async def Trace(
        self, request: pb.TraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceResponse:
        async def call() -> pb.TraceResponse:
            caller = await self._caller(context)
            limit = _param("limit", request.limit or MAX_TRACE_EVENTS, _TRACE_LIMIT)
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
            return convert.trace_message(answer)

        return await self._run(context, request, call)

    # --- fault tolerance (the fault-tolerance service's API, with the caller's token) ---

    async def _faulttolerance(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        path: str,
        *,
        request_id: str | None = None,
    ) -> Any:
        await self._caller(context)  # 401 before the fault-tolerance service is asked
        return await self.owners.call(
            "faulttolerance", method, path, token=_token(context), request_id=request_id
        )

    async def GetFaultToleranceLog(
        self, request: pb.GetFaultToleranceLogRequest, context: grpc.aio.ServicerContext
    ) -> pb.FaultToleranceLog:
        async def call() -> pb.FaultToleranceLog:
            path = _task_path(request.task_id, "ft-log")
            answer = await self._faulttolerance(context, "GET", path)
            message = pb.FaultToleranceLog()
            convert.to_message(message, answer)
            return message

        return await self._run(context, request, call)

    async def ListStackReports(
        self, request: pb.ListStackReportsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListStackReportsResponse:
        async def call() -> pb.ListStackReportsResponse:
            path = _task_path(request.task_id, "stacks")
            answer = await self._faulttolerance(context, "GET", path)
            message = pb.ListStackReportsResponse()
            convert.to_message(message, answer)
            return message

        return await self._run(context, request, call)

    async def CaptureStacks(
        self, request: pb.CaptureStacksRequest, context: grpc.aio.ServicerContext
    ) -> pb.StackReport:
        async def call() -> pb.StackReport:
            req = await self._request(context)  # its request id is the capture's cause
            path = _task_path(request.task_id, "stacks")
            answer = await self._faulttolerance(context, "POST", path, request_id=req.request_id)
            return convert.stack_report_message(answer)

        return await self._run(context, request, call)

    async def GetStackReport(
        self, request: pb.GetStackReportRequest, context: grpc.aio.ServicerContext
    ) -> pb.StackReport:
        async def call() -> pb.StackReport:
            tail = f"stacks/{_segment('report_id', request.report_id)}"
            answer = await self._faulttolerance(context, "GET", _task_path(request.task_id, tail))
            return convert.stack_report_message(answer)

        return await self._run(context, request, call)


def _token(context: grpc.aio.ServicerContext) -> str | None:
    """The bearer token of the `authorization` metadata (None: none or malformed)."""
    metadata = context.invocation_metadata() or ()
    return bearer_of([str(v) for k, v in metadata if k.lower() == "authorization"])


def _task_path(task_id: str, tail: str) -> str:
    """`/v1/tasks/{id}/<tail>` with the id as one path segment, whatever it holds."""
    return f"/v1/tasks/{_segment('task_id', task_id)}/{tail}"


def _id(field: str, value: str) -> str:
    """The id a method acts on; an empty one (proto3's unset) is refused naming it, as
    HTTP has no route without it (not answered as a task, group or pool of id '')."""
    if not value:
        raise BadRequest(
            "request.invalid", f"{field} is required", f"give the {field} to act on", field
        )
    return value


def _segment(field: str, value: str) -> str:
    """An id of the request as one path segment of the owner's route, whatever it holds;
    an empty one (proto3's unset) is refused: it would name another route (a list, or
    none: `Not Found`, or an answer that is no such resource)."""
    if not value:
        raise BadRequest(
            "request.invalid", f"{field} is required", f"give the {field} to read", field
        )
    return quote(value, safe="")


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
