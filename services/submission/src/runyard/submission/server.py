"""The submission service's internal gRPC API (proto/runyard/internal/v1/submission.proto).

Thin handlers: each reads the caller the gateway authenticated from the call's
context, runs one use case of `Submissions` and answers its ids and warnings.
A refusal is answered by the gRPC edge every Runyard server shares
(`runyard.api.grpc_errors.abort`): its status code, and trailing metadata with
its HTTP status, code, field, message, hint and, for a task group, the item,
which the gateway reads back (`error_of_rpc`) and answers as it always did. A
call without the platform's service credential is refused before any handler
runs (only the standard gRPC health check answers anyone).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from runyard.api.auth import ROLES, Principal
from runyard.api.errors import BadRequest
from runyard.api.grpc_errors import abort
from runyard.contracts.rpc import credential
from runyard.contracts.rpc import submission_pb2 as pb
from runyard.contracts.rpc import submission_pb2_grpc as pb_grpc
from runyard.submission.service import Call, Submissions, Submitted

#: Largest request the server reads: a task group of long specs (MAX_GROUP_BYTES).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
#: The service's full name (gRPC health answers for it and for "").
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Submission"].full_name
#: Methods any caller may call: the standard health check.
OPEN_PREFIX = "/grpc.health.v1.Health/"

Reply = TypeVar("Reply")


def call_of(context: pb.CallContext) -> Call:
    """The use cases' `Call` from the message the gateway filled in."""
    caller = context.caller
    if caller.role not in ROLES or not caller.tenant or not caller.user:
        raise BadRequest(
            "request.invalid",
            "the call names no caller (tenant, user and a known role)",
            "the gateway fills in the caller it authenticated",
            "context.caller",
        )
    role = caller.role  # one of ROLES, checked above
    principal = Principal(caller.tenant, caller.user, role, caller.token_id)
    return Call(principal, context.request_id, dict(context.trace_context), context.call_id)


def _task_reply(submitted: Submitted) -> pb.TaskReply:
    warnings = [
        pb.Warning(code=w.code, field=w.field, message=w.message) for w in submitted.warnings
    ]
    return pb.TaskReply(task_id=submitted.task_ids[0], warnings=warnings)


def _group_reply(submitted: Submitted) -> pb.GroupReply:
    return pb.GroupReply(group_id=submitted.group_id, task_ids=list(submitted.task_ids))


def _json(text: str, name: str) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError as exc:
        raise BadRequest(
            "request.invalid", f"{name} is not JSON: {exc}", "send a JSON object", name
        ) from exc


class SubmissionServicer(pb_grpc.SubmissionServicer):
    """Each RPC: the caller from the context, one use case, its answer or refusal."""

    def __init__(self, service: Submissions) -> None:
        self.service = service

    async def _answer(
        self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[Reply]]
    ) -> Reply:
        try:
            return await work()
        except Exception as exc:
            await abort(context, exc, "submission")

    async def SubmitTask(
        self, request: pb.SubmitTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.TaskReply:
        async def work() -> pb.TaskReply:
            call = call_of(request.context)
            spec = _json(request.spec_json, "spec_json")
            done = await self.service.once(call, lambda: self.service.submit(call, spec))
            return _task_reply(done)

        return await self._answer(context, work)

    async def RerunTask(
        self, request: pb.RerunTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.TaskReply:
        async def work() -> pb.TaskReply:
            call = call_of(request.context)
            changes = _json(request.changes_json, "changes_json")
            done = await self.service.once(
                call, lambda: self.service.rerun(call, request.task_id, changes)
            )
            return _task_reply(done)

        return await self._answer(context, work)

    async def CloneTask(
        self, request: pb.CloneTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.TaskReply:
        async def work() -> pb.TaskReply:
            call = call_of(request.context)
            overrides = _json(request.overrides_json, "overrides_json")
            done = await self.service.once(
                call, lambda: self.service.clone(call, request.task_id, overrides)
            )
            return _task_reply(done)

        return await self._answer(context, work)

    async def SubmitGroup(
        self, request: pb.SubmitGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.GroupReply:
        async def work() -> pb.GroupReply:
            call = call_of(request.context)
            body = _json(request.group_json, "group_json")
            done = await self.service.once(call, lambda: self.service.submit_group(call, body))
            return _group_reply(done)

        return await self._answer(context, work)

    async def RerunGroup(
        self, request: pb.RerunGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.GroupReply:
        async def work() -> pb.GroupReply:
            call = call_of(request.context)
            changes = _json(request.changes_json, "changes_json")
            task_ids = list(request.task_ids)
            done = await self.service.once(
                call,
                lambda: self.service.rerun_group(call, request.group_id, task_ids, changes),
            )
            return _group_reply(done)

        return await self._answer(context, work)

    async def SetCatalogueEntry(
        self, request: pb.SetCatalogueEntryRequest, context: grpc.aio.ServicerContext
    ) -> pb.CatalogueEntryReply:
        async def work() -> pb.CatalogueEntryReply:
            call = call_of(request.context)
            entry = _json(request.entry_json, "entry_json")
            data = await self.service.set_entry(call, request.kind, entry)
            return pb.CatalogueEntryReply(entry_json=json.dumps(data))

        return await self._answer(context, work)

    async def GetCatalogue(
        self, request: pb.GetCatalogueRequest, context: grpc.aio.ServicerContext
    ) -> pb.CatalogueReply:
        async def work() -> pb.CatalogueReply:
            call_of(request.context)
            catalogue = await self.service.catalogue()
            return pb.CatalogueReply(catalogue_json=catalogue.model_dump_json())

        return await self._answer(context, work)


class ServiceCredential(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc: untyped
    """Refuse, before any handler, a call without the platform's service credential."""

    def __init__(self, token: str) -> None:
        self.token = token

        async def refuse(_: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "the submission service answers the platform's services only",
            )

        self._refused = grpc.unary_unary_rpc_method_handler(refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if handler_call_details.method.startswith(OPEN_PREFIX):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get(credential.METADATA_KEY)
        if credential.matches(given if isinstance(given, str) else None, self.token):
            return await continuation(handler_call_details)
        return self._refused


async def start_server(
    service: Submissions, address: str, token: str
) -> tuple[grpc.aio.Server, str]:
    """Serve the API on `address` (host:port, port 0: any free one); the server and the
    address it listens on."""
    server = grpc.aio.server(
        interceptors=[ServiceCredential(token)],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    pb_grpc.add_SubmissionServicer_to_server(SubmissionServicer(service), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host = address.rpartition(":")[0]
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"the submission service cannot listen on {address}")
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, serving)
    return server, f"{host}:{bound}"
