"""Alert subscriptions of the caller's tenant over HTTP: `/v1/alert-subscriptions`.

    POST   /v1/alert-subscriptions        {webhook_url, alerts?, secret?, queued_after_s?,
                                            text_only?}                       create (201)
    GET    /v1/alert-subscriptions                                            list
    DELETE /v1/alert-subscriptions/{id}                                       delete

Answers never carry the signing secret, and show the webhook's token masked.
`secret_ref` may be named by a task spec's `alerts[].secret_ref` to sign with
the same secret. The webhook must be a Feishu bot's (`webhooks.py`: the
origins of `notification.yaml` in the gateway's config folder), and a tenant
has at most 20 subscriptions. Refusals use the gateway's JSON error `{code, field,
message, hint}`: 400 a bad field, 401 no token, 404 no such subscription.
The notification tables are created on first use, so the gateway needs no
migration of its own for them.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from runyard.api.errors import BadRequest, NotFound
from runyard.gateway.app import Gateway, Request
from runyard.notification import store, subscriptions
from runyard.notification.rules import DEFAULT_ALERTS
from runyard.notification.subscriptions import (
    InvalidSubscription,
    NewSubscription,
    SubscriptionNotFound,
)
from runyard.notification.webhooks import policy_of


class SubscriptionBody(BaseModel):
    """A tenant subscription to create."""

    model_config = ConfigDict(extra="forbid")

    webhook_url: str = Field(min_length=1)
    alerts: list[str] = Field(default_factory=lambda: list(DEFAULT_ALERTS), min_length=1)
    secret: str | None = Field(default=None, min_length=1, repr=False)
    queued_after_s: float | None = None
    text_only: bool = False


def notification_router(gateway: Gateway) -> APIRouter:
    """The router of the alert subscription API over `gateway`'s database and authentication."""
    from runyard.gateway.http import _request_dependency  # http.py includes this router

    migrated = False

    async def caller(req: Annotated[Request, _request_dependency(gateway)]) -> Request:
        nonlocal migrated
        if not migrated:
            await store.migrate(gateway.db)
            migrated = True
        return req

    Caller = Annotated[Request, Depends(caller)]
    router = APIRouter(prefix="/v1/alert-subscriptions", tags=["alerts"])

    @router.post("", status_code=201)
    async def create(req: Caller, body: SubscriptionBody) -> dict[str, Any]:
        """Subscribe a Feishu bot to the tenant's task alerts; the secret is stored, not shown."""
        new = NewSubscription(
            webhook_url=body.webhook_url,
            alerts=tuple(body.alerts),
            secret=body.secret,
            queued_after_s=body.queued_after_s,
            text_only=body.text_only,
        )
        principal = req.principal
        webhooks = policy_of(gateway.config_dir)  # a changed file is read again
        try:
            return await subscriptions.create(
                gateway.db, principal.tenant, principal.actor, new, webhooks=webhooks
            )
        except InvalidSubscription as exc:
            raise BadRequest("alerts.invalid_subscription", str(exc), exc.hint, exc.field) from exc

    @router.get("")
    async def list_subscriptions(req: Caller) -> dict[str, Any]:
        """The tenant's alert subscriptions, oldest first."""
        return {"items": await subscriptions.list_all(gateway.db, req.principal.tenant)}

    @router.delete("/{sub_id}")
    async def delete(req: Caller, sub_id: str) -> dict[str, Any]:
        """Delete a subscription of the tenant (and its stored secret)."""
        try:
            await subscriptions.delete(gateway.db, req.principal.tenant, sub_id)
        except SubscriptionNotFound as exc:
            raise NotFound(
                "alerts.subscription_not_found", str(exc), "list them: GET /v1/alert-subscriptions"
            ) from exc
        return {"id": sub_id, "deleted": True}

    return router
