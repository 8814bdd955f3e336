"""The outbox relay as a service: publishes the event log while it holds the lease.

Several relays may run; one holds the "relay" lease and publishes, the others
stand by and take over within seconds when it dies (runyard.stack.leader).
Each term publishes with a relay of its own, from the saved checkpoint. The
HTTP face answers /readyz 200 once the active relay has read the log (its
`ready` event); a standby answers 503 (waiting for the lease), so a load
balancer or `runyard ps` tells the active one apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from runyard.api.service import serve_service, service_app
from runyard.eventstore import PostgresEventStore
from runyard.relay.relay import OutboxRelay
from runyard.stack.context import ServiceContext
from runyard.stack.leader import Leadership, Lease


class RelayService:
    """The relay of the current term, and what readiness reads of it."""

    def __init__(self, ctx: ServiceContext, store: PostgresEventStore) -> None:
        self.ctx = ctx
        self.store = store
        self.leadership = Leadership.for_service(ctx, "relay")
        self.relay: OutboxRelay | None = None

    async def publish(self, _lease: Lease) -> None:
        """One term: a fresh relay from the checkpoint, until the lease is lost."""
        self.relay = OutboxRelay(self.store, self.ctx.kafka)
        try:
            await self.relay.run()
        finally:
            self.relay = None

    async def waiting(self) -> Mapping[str, float]:
        """What the relay waits for: the lease (standby), or its first read of the log."""
        if self.leadership.role == "standby":
            return {"relay.lease": 0.0}
        if self.relay is None or not self.relay.ready.is_set():
            return {"relay": 0.0}
        return {}


async def run(ctx: ServiceContext) -> None:
    """Publish the event log (while active) and serve the HTTP face, until cancelled."""
    store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper)
    service = RelayService(ctx, store)
    app = service_app("relay", ready=service.waiting)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(service.leadership.run(service.publish))
            group.create_task(
                serve_service("relay", app, settings=ctx.settings, endpoints=ctx.endpoints)
            )
    finally:
        await store.close()
