"""The notification service: `async def run(ctx)` until cancelled.

It starts the application (`NotificationApp.start`: tables, HTTP client),
subscribes one idempotent consumer to the task event topic (the rules write
the alert outbox in the consumer's inbox transaction), and every `poll_s`
runs the "queued too long" timer and a delivery pass. The consumer is given
`EVENT_TYPES` (the events the rules react to) as its filter: every other task
event is skipped before any database work. Settings:
`notification_<field>` of `NotificationConfig` (e.g. `notification_gateway_url`,
`notification_queued_after_s`); without `notification_gateway_url`, task
links point at `http_host`:`http_port` (the gateway of the same stack). The
webhook origins alerts may go to come from `notification.yaml` of the config
folder (`webhook_origins`; absent: Feishu's and Lark's bot endpoints).

Beside that work it serves its HTTP face (`runyard.api.service`: health,
readiness, metrics, the alert subscription routes of
`runyard.notification.http` and the rebuild routes of `queue_waits`
(`runyard.notification.rebuild`), which the gateway routes authenticated
requests to).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import asyncpg
from fastapi import FastAPI
from faststream.kafka import KafkaBroker
from runyard.api.security import TokenAuthenticator
from runyard.api.service import serve_service, service_app
from runyard.contracts.rpc import credential
from runyard.contracts.webhooks import WebhookPolicy
from runyard.eventstore import PostgresEventStore, retrying
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.notification import firsterror
from runyard.notification.app import EVENT_TYPES, NotificationApp, NotificationConfig
from runyard.notification.http import notification_router
from runyard.notification.rebuild import rebuild_router
from runyard.stack.context import ServiceContext
from runyard.stack.leader import Presence
from runyard.telemetry import register_gauge

CONSUMER = "notification"
NAME = "notification"
log = logging.getLogger("runyard.notification")


async def run(ctx: ServiceContext) -> None:
    """Run the notification service until cancelled."""
    settings = dict(ctx.settings)
    if "http_port" in settings:  # links point at this stack's gateway
        gateway = f"http://{settings.get('http_host', '127.0.0.1')}:{settings['http_port']}"
        settings.setdefault("notification_gateway_url", gateway)
    settings.setdefault(
        "notification_webhooks", WebhookPolicy.from_config(ctx.config("notification.yaml"))
    )
    config = NotificationConfig.from_settings(settings)
    store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=6)
    broker = make_broker(ctx.kafka)
    logs = firsterror.LogService(
        ctx.endpoints,
        credential.service_token(ctx.settings, ctx.data_dir),
        timeout_s=config.first_error_timeout_s,
    )
    app = NotificationApp(store, config, logs=logs)
    unregister = register_gauges(app)
    try:
        # The claims of a pass are marked with this instance's presence, so another
        # instance (or the next one, after a crash) takes them back at once.
        async with Presence(ctx.dsn, NAME) as presence:
            app.claimer = presence.key
            await serve(ctx, app, broker)
    finally:
        for gone in unregister:
            gone()
        with contextlib.suppress(Exception):
            await broker.stop()
        await app.close()
        await store.close()


def register_gauges(app: NotificationApp) -> list[Callable[[], None]]:
    """The delivery's gauges on /metrics (read from the last pass, no query at a scrape);
    the functions that remove them."""
    return [
        register_gauge(
            "runyard_alert_bots_failing",
            "Feishu bots whose last attempt failed (down, 5xx, too fast) with alerts waiting.",
            lambda: app.failing[0],
        ),
        register_gauge(
            "runyard_alerts_waiting",
            "Alerts waiting for a failing bot to answer again (retried until retry_for_s).",
            lambda: app.failing[1],
        ),
    ]


async def serve(ctx: ServiceContext, app: NotificationApp, broker: KafkaBroker) -> None:
    """Start `app` and its consumer, then serve its HTTP face and deliver until cancelled."""
    await app.start()
    consumer = make_consumer(ctx, app.store.pool, app)
    consumer.subscribe(broker, ctx.kafka.topics.task_events)
    await broker.start()
    http = http_app(app, ctx.config_dir)
    serving = serve_service(NAME, http, settings=ctx.settings, endpoints=ctx.endpoints)
    async with asyncio.TaskGroup() as tasks:  # a crash of either stops both
        tasks.create_task(serving, name="notification-http")
        tasks.create_task(deliver_forever(app, app.config.poll_s), name="notification-delivery")


async def deliver_forever(app: NotificationApp, poll_s: float) -> None:
    """The queue timer and a delivery pass every `poll_s` seconds."""

    async def _step_on() -> None:  # a bot still sending delays no other bot's alerts
        await app.step(wait=False)

    while True:
        try:  # an outage is waited out (backoff), then the pass runs
            await retrying(_step_on, component="notification delivery")
        except Exception:  # a pass that failed otherwise is tried again next time
            log.exception("notification pass failed")
        await asyncio.sleep(poll_s)


def http_app(app: NotificationApp, config_dir: Path) -> FastAPI:
    """The service's HTTP face: health, readiness (its database answers), its routes
    (webhooks checked against `notification.yaml` of `config_dir`) and the rebuild of
    `queue_waits` (`runyard.notification.rebuild`)."""
    pool = app.store.pool

    async def ready() -> Mapping[str, float]:
        await pool.fetchval("SELECT 1")  # an outage raises: not ready
        return {}

    authenticator = TokenAuthenticator(pool)
    routers = [
        notification_router(pool, authenticator, config_dir),
        rebuild_router(app, authenticator),
    ]
    return service_app(NAME, routers=routers, ready=ready)


def make_consumer(
    ctx: ServiceContext, pool: asyncpg.Pool, app: NotificationApp
) -> IdempotentConsumer:
    """The task-event consumer: `app.handle` for the events the rules react to only."""
    return IdempotentConsumer(
        CONSUMER,
        pool=pool,
        mapper=ctx.mapper,
        handler=app.handle,
        kafka=ctx.kafka,
        event_types=EVENT_TYPES,
    )
