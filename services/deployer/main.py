"""The deployer service: `async def run(ctx)` until cancelled.

It builds the local runtime from `runtime.yaml` of the config folder (its
`local:` section: image catalogue, scratch and volume roots, stop grace),
starts `DeployerApp`, and subscribes one idempotent consumer to the task
event topic. Worker output goes to the `runyard.logs` topic, one JSON record
per line (time, task, run, attempt, worker, stream, line); workers write to
files, so a slow or absent broker never stalls a worker: the runtime retries
a line until the broker takes it and only then moves its saved offset on. On
cancel every worker it started is stopped; what cannot be recorded then stays
on disk for the next deployer.

The producer is connected first; then, before the consumer starts,
`DeployerApp.reconcile` takes over what an earlier
deployer process left (workers still running, exits nobody recorded,
deployments cut mid-stage, placements nobody deployed); see docs/deployer.md.
`runtime.yaml`'s `deployer:` section may cap restart delays
(`max_restart_delay_s`, for development stacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from runyard.deployer.app import REACTS_TO, DeployerApp
from runyard.deployer.retry import until_done
from runyard.deployer.runtime import LocalRuntime, LocalRuntimeConfig, OutputLine
from runyard.eventstore import PostgresEventStore
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.stack.context import ServiceContext

CONSUMER = "deployer"
log = logging.getLogger("runyard.deployer")


def build_runtime(ctx: ServiceContext) -> LocalRuntime:
    raw = ctx.config("runtime.yaml").get("local") or {}
    config = LocalRuntimeConfig.from_mapping(raw, data_dir=ctx.data_dir, base_dir=ctx.config_dir)
    return LocalRuntime(config)


async def run(ctx: ServiceContext) -> None:
    """Run the deployer until cancelled."""
    store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=8)
    broker = make_broker(ctx.kafka)
    logs_topic = ctx.kafka.topics.logs

    async def publish(line: OutputLine) -> None:
        await broker.publish(
            json.dumps(line.record()).encode(), topic=logs_topic, key=line.task_id.encode()
        )

    options = ctx.config("runtime.yaml").get("deployer") or {}
    cap = options.get("max_restart_delay_s")
    app = DeployerApp(
        store,
        build_runtime(ctx),
        on_output=publish,
        max_restart_delay_s=float(cap) if cap is not None else None,
    )
    ctx.settings["deployer_app"] = app
    try:
        consumer = IdempotentConsumer(
            CONSUMER,
            pool=store.pool,
            mapper=ctx.mapper,
            handler=app.handle,
            kafka=ctx.kafka,
            event_types=REACTS_TO,
        )
        consumer.subscribe(broker, ctx.kafka.topics.task_events)
        # The producer first: adopted workers' output (the rest of it, from the saved
        # offsets) is published from the moment reconcile adopts them. Consuming starts
        # after reconcile, so placements are never deployed twice.
        await until_done(
            broker.connect,
            what="connecting to the broker",
            component="deployer (broker)",
            any_error=True,
        )
        taken = await app.reconcile()
        if taken:
            log.info("took over %d task(s) from an earlier deployer: %s", len(taken), taken)
        await broker.start()
        await asyncio.Event().wait()  # until cancelled
    finally:
        with contextlib.suppress(Exception):
            await app.close()
        with contextlib.suppress(Exception):
            await broker.stop()
        await store.close()
