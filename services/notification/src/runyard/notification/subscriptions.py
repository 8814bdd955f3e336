"""Tenant (team) alert subscriptions: create, list, delete (the API's use cases).

A subscription's signing secret goes into the secret store (`secrets`) under
a fresh reference in the same transaction as the subscription; it is never
returned, logged or put in an event. The webhook URL holds the bot's token,
so answers show it masked. The webhook must be one the `WebhookPolicy`
allows (Feishu's bot endpoints), and a tenant has at most
`MAX_TENANT_SUBSCRIPTIONS`. Refusals are `RunyardError`s (runyard.errors),
answered by the edges as they say: `InvalidSubscription` (field, reason,
hint) and `TooManySubscriptions`, 400 `alerts.invalid_subscription`;
`SubscriptionNotFound`, 404 `alerts.subscription_not_found`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from runyard.contracts.webhooks import WebhookPolicy, WebhookRefused
from runyard.errors import RunyardError
from runyard.notification import store
from runyard.notification.feishu import mask_url
from runyard.notification.rules import DEFAULT_ALERTS, InvalidAlerts, Subscription, check_alerts

#: Subscriptions one tenant may have (each is one more request per alert).
MAX_TENANT_SUBSCRIPTIONS = 20


class SubscriptionError(RunyardError):
    """Base of the refusals of this module."""

    http_status = 400


class InvalidSubscription(SubscriptionError):
    """A field of a new subscription is not acceptable."""

    code = "alerts.invalid_subscription"

    def __init__(self, field: str, reason: str, hint: str = "") -> None:
        super().__init__(f"{field}: {reason}", hint=hint, field=field)
        self.reason = reason


class TooManySubscriptions(InvalidSubscription):
    """The tenant has `MAX_TENANT_SUBSCRIPTIONS` already."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            "webhook_url",
            f"the tenant has {limit} alert subscriptions, the most it may have",
            "delete one first (DELETE /v1/alert-subscriptions/{id}), or send several"
            " alert kinds to one bot",
        )


class SubscriptionNotFound(SubscriptionError):
    """No subscription with that id in the caller's tenant."""

    code = "alerts.subscription_not_found"
    http_status = 404

    def __init__(self, sub_id: str) -> None:
        super().__init__(
            f"alert subscription {sub_id!r} does not exist",
            hint="list them: runyard alerts ls (GET /v1/alert-subscriptions)",
        )
        self.sub_id = sub_id


@dataclass(frozen=True, slots=True)
class NewSubscription:
    """What a caller asks for (already parsed by the edge)."""

    webhook_url: str
    alerts: tuple[str, ...] = DEFAULT_ALERTS
    secret: str | None = None
    queued_after_s: float | None = None
    text_only: bool = False


async def create(
    db: asyncpg.Pool,
    tenant: str,
    actor: str,
    new: NewSubscription,
    *,
    webhooks: WebhookPolicy | None = None,
) -> dict[str, Any]:
    """Store a tenant subscription (its secret in the secret store); answer its view."""
    try:
        (webhooks or WebhookPolicy()).check(new.webhook_url)
    except WebhookRefused as exc:
        raise InvalidSubscription("webhook_url", exc.reason, exc.hint) from exc
    try:
        alerts = check_alerts(new.alerts)
    except InvalidAlerts as exc:
        raise InvalidSubscription("alerts", str(exc), 'e.g. ["failed", "queued:1800"]') from exc
    if new.queued_after_s is not None and new.queued_after_s <= 0:
        raise InvalidSubscription("queued_after_s", "must be more than 0 seconds")
    sub_id = f"sub-{uuid.uuid4().hex[:16]}"
    ref = f"alert-secret-{uuid.uuid4().hex}" if new.secret else None
    sub = Subscription(
        sub_id, tenant, new.webhook_url, alerts, ref, new.queued_after_s, new.text_only
    )
    async with db.acquire() as conn, conn.transaction():
        await store.lock_tenant_subscriptions(conn, tenant)
        if await store.count_subscriptions(conn, tenant) >= MAX_TENANT_SUBSCRIPTIONS:
            raise TooManySubscriptions(MAX_TENANT_SUBSCRIPTIONS)
        if ref is not None and new.secret:
            await store.put_secret(conn, tenant, ref, new.secret)
        await store.insert_subscription(conn, sub, actor)
    return view(sub)


async def list_all(db: asyncpg.Pool, tenant: str) -> list[dict[str, Any]]:
    """The tenant's subscriptions, oldest first."""
    return [view(s) for s in await store.tenant_subscriptions(db, tenant)]


async def delete(db: asyncpg.Pool, tenant: str, sub_id: str) -> None:
    """Delete a subscription of the tenant and its secret."""
    async with db.acquire() as conn, conn.transaction():
        ref = await store.delete_subscription(conn, tenant, sub_id)
        if ref is None:
            raise SubscriptionNotFound(sub_id)
        if ref:
            await store.delete_secret(conn, tenant, ref)


def view(sub: Subscription) -> dict[str, Any]:
    """A subscription as the API answers it: no secret, the webhook token masked."""
    return {
        "id": sub.id,
        "tenant": sub.tenant,
        "webhook_url": mask_url(sub.webhook_url),
        "alerts": list(sub.alerts),
        "signed": sub.secret_ref is not None,
        "secret_ref": sub.secret_ref,
        "queued_after_s": sub.queued_after_s,
        "text_only": sub.text_only,
    }
