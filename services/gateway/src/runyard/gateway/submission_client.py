"""The gateway's client of the submission service's internal gRPC API.

The submission service owns the rules, the catalogue and the append of what
users submit; the gateway authenticates the caller and passes it along with
each call. Its answers come back as the ids the gateway then reads (the task,
the group); its refusals come back as the same API errors the gateway always
answered (`runyard.api.grpc_errors.error_of_rpc`: `BadRequest`, `NotFound`, ...
with the same status, code, field, hint and item), and an unreachable service
as a 503 naming it.

The service's address is read from `endpoints["submission-grpc"]` at each
call (a service started later, or restarted elsewhere, is found), and every
call carries the platform's service credential. A call is tried again, with
the same call id, when the service could not be reached or did not answer in
time; the service answers a call it has done already as it did then, so a
retry never submits twice.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from runyard.api.auth import Principal
from runyard.api.errors import Unavailable
from runyard.api.grpc_errors import error_of_rpc
from runyard.contracts.rpc import credential
from runyard.contracts.rpc import submission_pb2 as pb
from runyard.contracts.rpc import submission_pb2_grpc as pb_grpc

#: The endpoint key of the submission service's gRPC API (host:port).
ENDPOINT = "submission-grpc"
#: Tries of one call when the service cannot be reached, and the wait between them.
TRIES = 3
RETRY_WAIT_S = 0.2
#: How long one try may take: a task group of 1000 long specs is the slowest call.
CALL_TIMEOUT_S = 60.0
#: Largest message sent or read (a task group of long specs).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
#: Codes of a service that is away (down, restarting, stopping) or did not answer in time.
_RETRIED = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)


class Caller(Protocol):
    """What the gateway knows of a request: who asks, its id and trace context."""

    @property
    def principal(self) -> Principal: ...

    @property
    def request_id(self) -> str: ...

    @property
    def trace_context(self) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class Accepted:
    """What the service wrote: the task(s), the group, the warnings."""

    task_ids: tuple[str, ...]
    group_id: str = ""
    warnings: tuple[dict[str, str], ...] = ()

    @property
    def task_id(self) -> str:
        return self.task_ids[0]


def unavailable(reason: str) -> Unavailable:
    """The 503 of a submission service the gateway cannot reach now."""
    return Unavailable(
        "service.unavailable",
        f"the submission service cannot be reached now ({reason})",
        f"send the request again in {Unavailable.retry_after_s} s; the submission service"
        " takes submissions again as soon as it is back",
    )


class SubmissionClient:
    """Calls of the submission service (see the module docstring)."""

    def __init__(
        self,
        endpoints: Mapping[str, str],
        token: str | Callable[[], str],
        *,
        on_close: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self.endpoints = endpoints
        self._token = token
        self._on_close = list(on_close)
        self._channel: grpc.aio.Channel | None = None
        self._address = ""

    async def close(self) -> None:
        """Close the channel, then run what was to be done at close (in order)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        for done in self._on_close:
            await done()

    # --- calls ------------------------------------------------------------------

    async def submit_task(self, req: Caller, spec: Mapping[str, Any]) -> Accepted:
        request = pb.SubmitTaskRequest(context=_context(req), spec_json=_dump(spec))
        return _accepted(await self._call("SubmitTask", request))

    async def rerun_task(self, req: Caller, task_id: str, changes: Mapping[str, Any]) -> Accepted:
        request = pb.RerunTaskRequest(
            context=_context(req), task_id=task_id, changes_json=_dump(changes)
        )
        return _accepted(await self._call("RerunTask", request))

    async def clone_task(self, req: Caller, task_id: str, overrides: Mapping[str, Any]) -> Accepted:
        request = pb.CloneTaskRequest(
            context=_context(req), task_id=task_id, overrides_json=_dump(overrides)
        )
        return _accepted(await self._call("CloneTask", request))

    async def submit_group(self, req: Caller, body: Mapping[str, Any]) -> Accepted:
        request = pb.SubmitGroupRequest(context=_context(req), group_json=_dump(body))
        reply = await self._call("SubmitGroup", request)
        return Accepted(tuple(reply.task_ids), reply.group_id)

    async def rerun_group(
        self, req: Caller, group_id: str, task_ids: Sequence[str], changes: Mapping[str, Any]
    ) -> Accepted:
        request = pb.RerunGroupRequest(
            context=_context(req),
            group_id=group_id,
            task_ids=list(task_ids),
            changes_json=_dump(changes),
        )
        reply = await self._call("RerunGroup", request)
        return Accepted(tuple(reply.task_ids), reply.group_id)

    async def set_catalogue_entry(
        self, req: Caller, kind: str, entry: Mapping[str, Any]
    ) -> dict[str, Any]:
        request = pb.SetCatalogueEntryRequest(
            context=_context(req), kind=kind, entry_json=_dump(entry)
        )
        reply = await self._call("SetCatalogueEntry", request)
        return dict(json.loads(reply.entry_json))

    async def catalogue(self, caller: Principal) -> dict[str, Any]:
        request = pb.GetCatalogueRequest(context=pb.CallContext(caller=_caller(caller)))
        reply = await self._call("GetCatalogue", request)
        return dict(json.loads(reply.catalogue_json))

    # --- transport --------------------------------------------------------------

    async def _stub(self) -> pb_grpc.SubmissionStub:
        address = self.endpoints.get(ENDPOINT)
        if not address:
            raise unavailable("it has published no address yet")
        if self._channel is None or address != self._address:
            if self._channel is not None:
                await self._channel.close()  # the service moved
            self._channel = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._address = address
        return pb_grpc.SubmissionStub(self._channel)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        token = self._token() if callable(self._token) else self._token
        return ((credential.METADATA_KEY, token),)

    async def _call(self, method: str, request: Any) -> Any:
        """One call, tried again (same call id) while the service cannot be reached."""
        for attempt in range(1, TRIES + 1):
            rpc = getattr(await self._stub(), method)
            try:
                return await rpc(request, metadata=self._metadata(), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                refusal = error_of_rpc(exc)
                if refusal is not None:
                    raise refusal from exc
                if exc.code() not in _RETRIED:
                    # Not an outage (a wrong credential, a fault of the service): a 500.
                    raise RuntimeError(f"submission {method}: {exc.code().name}") from exc
                if attempt == TRIES:
                    raise unavailable(exc.code().name.lower()) from exc
                await asyncio.sleep(RETRY_WAIT_S * attempt)
        raise AssertionError("unreachable")  # pragma: no cover


def _caller(principal: Principal) -> pb.Caller:
    return pb.Caller(
        tenant=principal.tenant,
        user=principal.user,
        role=principal.role,
        token_id=principal.token_id,
    )


def _context(req: Caller) -> pb.CallContext:
    """The call's context: a new call id, kept by the tries of this call only."""
    return pb.CallContext(
        caller=_caller(req.principal),
        request_id=req.request_id,
        trace_context=dict(req.trace_context),
        call_id=str(uuid.uuid4()),
    )


def _accepted(reply: pb.TaskReply) -> Accepted:
    warnings = tuple(
        {"code": w.code, "field": w.field, "message": w.message} for w in reply.warnings
    )
    return Accepted((reply.task_id,), warnings=warnings)


def _dump(body: Any) -> str:
    """JSON text of a body as the client sent it (lone surrogates escaped, so they reach
    the rules, which name the field)."""
    return json.dumps(body)
