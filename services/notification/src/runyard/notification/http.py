"""Alert subscriptions of the caller's tenant over HTTP: `/v1/alert-subscriptions`,
served by the notification service itself (the gateway authenticates a request
and routes it here unchanged with the caller's token).

    POST   /v1/alert-subscriptions        {webhook_url, alerts?, secret?, queued_after_s?,
                                            text_only?}                       create (201)
    GET    /v1/alert-subscriptions                                            list
    DELETE /v1/alert-subscriptions/{id}                                       delete

Answers never carry the signing secret, and show the webhook's token masked.
`secret_ref` may be named by a task spec's `alerts[].secret_ref` to sign with
the same secret. The webhook must be a Feishu bot's (`webhooks.py`: the
origins of `notification.yaml` in the config folder), and a tenant has at most
20 subscriptions. Refusals use the JSON error `{code, field, message, hint}`
(`runyard.notification.subscriptions`' errors, answered by the edge every
service's app has): 400 a bad field, 401 no token, 404 no such subscription.
Every route authenticates the bearer token again (`runyard.api.security`).

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(...)` when it reads the handlers' signatures.)
"""

from pathlib import Path
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Depends, Header
from pydantic import BaseModel, ConfigDict, Field
from runyard.api.auth import Principal
from runyard.api.inputs import check_request_id
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.contracts import http as wire
from runyard.contracts.webhooks import policy_of
from runyard.notification import subscriptions
from runyard.notification.rules import DEFAULT_ALERTS
from runyard.notification.subscriptions import NewSubscription


class SubscriptionBody(BaseModel):
    """A tenant subscription to create."""

    model_config = ConfigDict(extra="forbid")

    webhook_url: str = Field(min_length=1)
    alerts: list[str] = Field(default_factory=lambda: list(DEFAULT_ALERTS), min_length=1)
    secret: str | None = Field(default=None, min_length=1, repr=False)
    queued_after_s: float | None = None
    text_only: bool = False


def notification_router(
    db: asyncpg.Pool, authenticator: Authenticator, config_dir: Path
) -> APIRouter:
    """The alert subscription routes over the notification service's database (its
    tables migrated at the service's start); webhooks checked against the policy of
    `config_dir`."""
    principal = caller_dependency(authenticator)

    async def caller(
        who: Annotated[Principal, principal],
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> Principal:
        check_request_id(x_request_id)
        return who

    Caller = Annotated[Principal, Depends(caller)]
    router = APIRouter(prefix="/v1/alert-subscriptions", tags=["alerts"], route_class=AnswerRoute)

    @router.post(
        "", status_code=201, response_model=wire.AlertSubscription, responses=refusals(403, 413)
    )
    async def create(who: Caller, body: SubscriptionBody) -> dict[str, Any]:
        """Subscribe a Feishu bot to the tenant's task alerts; the secret is stored, not shown."""
        new = NewSubscription(
            webhook_url=body.webhook_url,
            alerts=tuple(body.alerts),
            secret=body.secret,
            queued_after_s=body.queued_after_s,
            text_only=body.text_only,
        )
        webhooks = policy_of(config_dir)  # a changed file is read again
        return await subscriptions.create(db, who.tenant, who.actor, new, webhooks=webhooks)

    @router.get("", response_model=wire.AlertSubscriptions, responses=refusals())
    async def list_subscriptions(who: Caller) -> dict[str, Any]:
        """The tenant's alert subscriptions, oldest first."""
        return {"items": await subscriptions.list_all(db, who.tenant)}

    @router.delete("/{sub_id}", response_model=wire.Deleted, responses=refusals(403, 404))
    async def delete(who: Caller, sub_id: str) -> dict[str, Any]:
        """Delete a subscription of the tenant (and its stored secret)."""
        await subscriptions.delete(db, who.tenant, sub_id)
        return {"id": sub_id, "deleted": True}

    return router
