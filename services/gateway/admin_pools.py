"""Admin API for pool nodes and spot capacity (platform_admin role): `/v1/admin/pools/...`.

    POST   /v1/admin/pools/{pool}/nodes                 {node, gpus?}   add a node (201)
    DELETE /v1/admin/pools/{pool}/nodes/{node}                          remove an idle node
    POST   /v1/admin/pools/{pool}/nodes/{node}/cordon                   no new workers there
    POST   /v1/admin/pools/{pool}/nodes/{node}/uncordon
    POST   /v1/admin/pools/{pool}/nodes/{node}/fault    {reason}        mark faulty (tests' faults)
    POST   /v1/admin/pools/{pool}/nodes/{node}/heal                     mark healthy
    POST   /v1/admin/pools/{pool}/spot-capacity         {remove: n} | {add: [names]}, reason?

Each handler makes the decision itself with `runyard.scheduler.admin` over
the event store: fold the pool stream, decide, append with the stream's
expected version (plus the preempted tasks' events of a spot shrink, in the
same append). The gateway never calls the scheduler process; the scheduler
reacts to the pool events it consumes (it re-plans its queue). Answers the
`AdminResult` (pool version, events appended, tasks preempted).

Refusals use the gateway's JSON error `{code, field, message, hint}`: 403
without the platform_admin role, 404 unknown pool or node, 409 a node that exists or is
busy and a pool that kept changing, 400 a malformed request (including a spot
change of a subscription pool or of more nodes than the pool has).
"""

from collections.abc import Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from runyard.api.errors import BadRequest, Conflict, GatewayError, NotFound
from runyard.contracts.pool_events import GPUS_PER_NODE
from runyard.gateway.app import Gateway, Request
from runyard.scheduler import admin
from runyard.scheduler.admin import AdminResult, InvalidAdminRequest
from runyard.scheduler.domain import InvalidCapacityChange, NotASpotPool, SchedulerError
from runyard.scheduler.errors import (
    ConflictPersisted,
    NodeBusy,
    NodeExists,
    SchedulerServiceError,
    UnknownNode,
    UnknownPool,
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddNode(_Body):
    """A node to add: its name and GPUs (8 unless said)."""

    node: str = Field(min_length=1, max_length=128, pattern=r"^[^/]+$")
    gpus: int = Field(default=GPUS_PER_NODE, ge=1, le=GPUS_PER_NODE)


class Fault(_Body):
    """Why the node is faulty (shown on the node and in the event)."""

    reason: str = Field(min_length=1, max_length=1000)


#: The document says what the handler checks: exactly one of `remove` and `add`.
_ONE_OF_REMOVE_ADD = {
    "oneOf": [
        {
            "required": ["remove"],
            "properties": {"remove": {"type": "integer"}, "add": {"type": "null"}},
        },
        {
            "required": ["add"],
            "properties": {"add": {"type": "array"}, "remove": {"type": "null"}},
        },
    ]
}


class SpotChange(_Body):
    """Either `remove` n nodes (preempting spot tasks as needed) or `add` named nodes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_ONE_OF_REMOVE_ADD)

    remove: int | None = Field(default=None, ge=1, le=10_000)
    add: list[Annotated[str, Field(max_length=128)]] | None = Field(
        default=None, min_length=1, max_length=1000
    )
    gpus_per_node: int = Field(default=GPUS_PER_NODE, ge=1, le=GPUS_PER_NODE)
    reason: str = Field(default="spot capacity changed by an admin", min_length=1, max_length=1000)


def admin_pools_router(gateway: Gateway) -> APIRouter:
    """The router of the pool admin API over `gateway`'s store and authentication."""
    from runyard.gateway.http import _request_dependency  # http.py includes this router

    async def admin_request(
        req: Annotated[Request, _request_dependency(gateway)],
    ) -> Request:
        req.principal.require_platform_admin()
        return req

    Admin = Annotated[Request, Depends(admin_request)]
    store = gateway.store
    router = APIRouter(prefix="/v1/admin/pools/{pool_id}", tags=["admin"])

    def who(req: Request) -> dict[str, Any]:
        return {"actor": req.principal.actor, "request_id": req.request_id}

    @router.post("/nodes", status_code=201)
    async def add_node(req: Admin, pool_id: str, body: AddNode) -> dict[str, Any]:
        """Admin: add a healthy node with every GPU free; the scheduler re-plans."""
        return await _answer(admin.add_node(store, pool_id, body.node, body.gpus, **who(req)))

    @router.delete("/nodes/{node}")
    async def remove_node(req: Admin, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: remove an idle node (409 while workers run on it)."""
        return await _answer(admin.remove_node(store, pool_id, node, **who(req)))

    @router.post("/nodes/{node}/cordon")
    async def cordon_node(req: Admin, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: no new workers go to the node; running ones stay."""
        return await _answer(admin.cordon_node(store, pool_id, node, **who(req)))

    @router.post("/nodes/{node}/uncordon")
    async def uncordon_node(req: Admin, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: the node takes new workers again."""
        return await _answer(admin.uncordon_node(store, pool_id, node, **who(req)))

    @router.post("/nodes/{node}/fault")
    async def mark_faulty(req: Admin, pool_id: str, node: str, body: Fault) -> dict[str, Any]:
        """Admin: the node has a hardware fault (also how tests inject faults)."""
        return await _answer(admin.mark_node_faulty(store, pool_id, node, body.reason, **who(req)))

    @router.post("/nodes/{node}/heal")
    async def mark_healthy(req: Admin, pool_id: str, node: str) -> dict[str, Any]:
        """Admin: the node was repaired and takes new workers again."""
        return await _answer(admin.mark_node_healthy(store, pool_id, node, **who(req)))

    @router.post("/spot-capacity")
    async def spot_capacity(req: Admin, pool_id: str, body: SpotChange) -> dict[str, Any]:
        """Admin: shrink a spot pool by `remove` nodes (preempting and requeueing spot
        tasks, lowest priority and newest first) or grow it by the `add` nodes."""
        if (body.remove is None) == (body.add is None):
            raise BadRequest(
                "request.invalid",
                "give exactly one of `remove` (a number of nodes) and `add` (node names)",
                'e.g. {"remove": 2} or {"add": ["s-9"]}',
                "remove",
            )
        change = admin.change_spot_capacity(
            store,
            pool_id,
            remove=body.remove or 0,
            add=tuple(body.add or ()),
            gpus_per_node=body.gpus_per_node,
            reason=body.reason,
            **who(req),
        )
        return await _answer(change)

    return router


async def _answer(operation: Awaitable[AdminResult]) -> dict[str, Any]:
    try:
        result = await operation
    except (SchedulerServiceError, SchedulerError) as exc:
        raise refusal(exc) from exc
    return result.to_dict()


def refusal(error: SchedulerServiceError | SchedulerError) -> GatewayError:
    """The gateway's answer for a scheduler refusal (code and hint kept as they are)."""
    code, message, hint = error.code, error.message, error.hint
    if isinstance(error, UnknownPool):
        return NotFound(code, message, hint, "pool_id")
    if isinstance(error, UnknownNode):
        return NotFound(code, message, hint, "node")
    if isinstance(error, NodeBusy):
        busy = Conflict(code, message, hint, "node")
        busy.extra = {"tasks": list(error.tasks)}
        return busy
    if isinstance(error, NodeExists):
        return Conflict(code, message, hint, "node")
    if isinstance(error, ConflictPersisted):
        return Conflict(code, message, hint)
    if isinstance(error, InvalidAdminRequest):
        return BadRequest(code, message, hint, error.field)
    if isinstance(error, NotASpotPool):
        return BadRequest(code, message, hint, "pool_id")
    if isinstance(error, InvalidCapacityChange):
        return BadRequest(code, message, hint, "remove")
    if isinstance(error, SchedulerServiceError):
        return BadRequest(code, message, hint)
    return Conflict(code, message, hint)
