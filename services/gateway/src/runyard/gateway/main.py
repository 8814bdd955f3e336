"""The gateway service: the HTTP API (uvicorn), the gRPC API and the task list projector.

`run(ctx)` serves until cancelled. Settings: `http_host` (127.0.0.1),
`http_port` (8080), `grpc_host` (127.0.0.1), `grpc_port` (50051). Each tenant's
share of the gateway is gateway.yaml's in the config folder, its keys overridden
by the settings' `gateway` mapping (`runyard.gateway.limits`). Submissions
go to the submission service at `ctx.endpoints["submission-grpc"]` (read at
each call) with the platform's service credential
(`runyard.contracts.rpc.credential`); queue places come from the scheduler's
API at `ctx.endpoints["scheduler"]`.
"""

from __future__ import annotations

import asyncio

import uvicorn
from runyard.api.service import GRACEFUL_STOP_S, KEEP_ALIVE_S
from runyard.contracts.rpc import credential
from runyard.gateway.app import Gateway
from runyard.gateway.grpc_server import start_server
from runyard.gateway.http import create_app
from runyard.gateway.limits import GatewayLimits
from runyard.gateway.proxy import Owners
from runyard.gateway.submission_client import SubmissionClient
from runyard.stack.context import ServiceContext


async def run(ctx: ServiceContext) -> None:
    """Serve the HTTP API and keep the task list projected, until cancelled."""
    token = credential.service_token(ctx.settings, ctx.data_dir)
    submission = SubmissionClient(ctx.endpoints, token)
    limits = GatewayLimits.from_config(
        {**ctx.config("gateway.yaml"), **ctx.settings.get("gateway", {})}
    )
    gateway = await Gateway.connect(
        ctx.dsn,
        ctx.config_dir,
        ctx.mapper,
        submission=submission,
        endpoints=ctx.endpoints,
        limits=limits,
    )
    owners = Owners(ctx.endpoints)  # the services whose routes the gateway routes to them
    app = create_app(gateway, owners)
    config = uvicorn.Config(
        app,
        host=ctx.settings.get("http_host", "127.0.0.1"),
        port=int(ctx.settings.get("http_port", 8080)),
        log_level=ctx.settings.get("log_level", "warning"),
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )
    server = uvicorn.Server(config)
    grpc_server, _ = await start_server(
        gateway,
        str(ctx.settings.get("grpc_host", "127.0.0.1")),
        int(ctx.settings.get("grpc_port", 50051)),
        owners=owners,
    )
    projector = asyncio.create_task(gateway.projector.follow(), name="task-list-projector")
    serving = asyncio.create_task(server.serve(), name="gateway-http")
    try:
        await asyncio.shield(serving)
    finally:
        # Let uvicorn shut down cleanly (close its sockets) instead of cancelling it mid-serve;
        # it waits for open answers, so the console's live streams end first.
        app.state.console.close()
        server.should_exit = True
        await asyncio.gather(serving, return_exceptions=True)
        await grpc_server.stop(grace=1)
        projector.cancel()
        await asyncio.gather(projector, return_exceptions=True)
        await owners.aclose()
        await gateway.close()
