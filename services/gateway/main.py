"""The gateway service: the HTTP API (uvicorn) and the task list projector.

`run(ctx)` serves until cancelled. Settings: `http_host` (127.0.0.1),
`http_port` (8080).
"""

from __future__ import annotations

import asyncio

import uvicorn
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.stack.context import ServiceContext


async def run(ctx: ServiceContext) -> None:
    """Serve the HTTP API and keep the task list projected, until cancelled."""
    gateway = await Gateway.connect(ctx.dsn, ctx.config_dir, ctx.mapper)
    config = uvicorn.Config(
        create_app(gateway),
        host=ctx.settings.get("http_host", "127.0.0.1"),
        port=int(ctx.settings.get("http_port", 8080)),
        log_level=ctx.settings.get("log_level", "warning"),
        lifespan="off",
    )
    server = uvicorn.Server(config)
    projector = asyncio.create_task(gateway.projector.follow(), name="task-list-projector")
    serving = asyncio.create_task(server.serve(), name="gateway-http")
    try:
        await asyncio.shield(serving)
    finally:
        # Let uvicorn shut down cleanly (close its sockets) instead of cancelling it mid-serve.
        server.should_exit = True
        await asyncio.gather(serving, return_exceptions=True)
        projector.cancel()
        await asyncio.gather(projector, return_exceptions=True)
        await gateway.close()
