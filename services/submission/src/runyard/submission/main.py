"""The submission service: the internal gRPC API the gateway calls, and its HTTP face.

`run(ctx)` serves until cancelled. Where the gRPC API listens, first found:
settings `submission_grpc_port` (with `submission_grpc_host`, 127.0.0.1),
`ctx.endpoints["submission-grpc"]` (host:port), else 127.0.0.1 on a free
port; the address it bound is published in `ctx.endpoints["submission-grpc"]`
before it serves, so a gateway in the same process finds it. Every call must
carry the platform's service credential (`runyard.contracts.rpc.credential`).
The HTTP face (/healthz, /readyz, /metrics) is `runyard.api.service`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from runyard.api.service import serve_service, service_app
from runyard.contracts.rpc import credential
from runyard.stack.context import ServiceContext
from runyard.submission.server import start_server
from runyard.submission.service import Submissions

log = logging.getLogger("runyard.submission")

NAME = "submission"
#: The endpoint key of the internal gRPC API (host:port).
GRPC_ENDPOINT = "submission-grpc"


def grpc_address(settings: Mapping[str, object], endpoints: Mapping[str, str]) -> str:
    """Where the gRPC API listens (see the module docstring)."""
    if "submission_grpc_port" in settings:
        host = settings.get("submission_grpc_host", "127.0.0.1")
        return f"{host}:{int(str(settings['submission_grpc_port']))}"
    return endpoints.get(GRPC_ENDPOINT) or "127.0.0.1:0"


async def _forget_calls(service: Submissions, every_s: float = 3600.0) -> None:
    """Drop old call answers now and then (an outage only delays it)."""
    while True:
        try:
            await service.forget_calls()
        except Exception as exc:
            log.warning("old submission calls not dropped this time: %r", exc)
        await asyncio.sleep(every_s)


async def run(ctx: ServiceContext) -> None:
    """Serve the internal gRPC API and the HTTP face until cancelled."""
    service = await Submissions.connect(ctx.dsn, ctx.config_dir, ctx.mapper)
    token = credential.service_token(ctx.settings, ctx.data_dir)
    server, address = await start_server(service, grpc_address(ctx.settings, ctx.endpoints), token)
    ctx.endpoints[GRPC_ENDPOINT] = address

    async def ready() -> dict[str, float]:
        await service.db.fetchval("SELECT 1")
        return {}

    app = service_app(NAME, ready=ready)
    forgetting = asyncio.create_task(_forget_calls(service), name="submission-forget-calls")
    try:
        await serve_service(NAME, app, settings=ctx.settings, endpoints=ctx.endpoints)
    finally:
        forgetting.cancel()
        await asyncio.gather(forgetting, return_exceptions=True)
        if ctx.endpoints.get(GRPC_ENDPOINT) == address:
            ctx.endpoints.pop(GRPC_ENDPOINT, None)
        with contextlib.suppress(Exception):
            await asyncio.shield(server.stop(grace=1))
        await service.close()
