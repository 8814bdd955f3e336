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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg
from runyard.eventstore import PostgresEventStore, retrying
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.notification.app import EVENT_TYPES, NotificationApp, NotificationConfig
from runyard.notification.webhooks import WebhookPolicy
from runyard.stack.context import ServiceContext

CONSUMER = "notification"
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
    app = NotificationApp(store, config)
    try:
        await app.start()
        ctx.settings["notification_app"] = app
        consumer = make_consumer(ctx, store.pool, app)
        consumer.subscribe(broker, ctx.kafka.topics.task_events)
        await broker.start()
        while True:
            try:  # an outage is waited out (backoff), then the pass runs
                await retrying(app.step, component="notification delivery")
            except Exception:  # a pass that failed otherwise is tried again next time
                log.exception("notification pass failed")
            await asyncio.sleep(config.poll_s)
    finally:
        with contextlib.suppress(Exception):
            await broker.stop()
        await app.close()
        await store.close()


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
