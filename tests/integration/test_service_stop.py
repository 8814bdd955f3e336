"""A service's HTTP face stops when asked, even with an answer that never ends.

uvicorn, asked to exit, waits for the answers it is still sending. One that never
ends (a live stream whose client keeps reading) would keep the service, and
everything stopping after it, from ever stopping: `GRACEFUL_STOP_S` bounds that
wait, then cuts the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from runyard.api.service import GRACEFUL_STOP_S, serve_service

pytestmark = pytest.mark.integration


def endless_app() -> FastAPI:
    app = FastAPI()

    @app.get("/forever")
    async def forever() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            while True:
                yield b"still here\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(lines(), media_type="text/plain")

    return app


async def test_a_service_with_an_endless_answer_open_still_stops() -> None:
    endpoints: dict[str, str] = {}
    serving = asyncio.create_task(
        serve_service("endless", endless_app(), settings={}, endpoints=endpoints)
    )
    while "endless" not in endpoints:
        assert not serving.done(), serving
        await asyncio.sleep(0.01)
    async with (
        httpx.AsyncClient(base_url=endpoints["endless"], timeout=30) as http,
        http.stream("GET", "/forever") as answer,
    ):
        lines = answer.aiter_lines()
        assert await anext(lines) == "still here"
        serving.cancel()
        # Cut after GRACEFUL_STOP_S; without a bound this waits forever.
        await asyncio.wait_for(
            asyncio.gather(serving, return_exceptions=True), GRACEFUL_STOP_S + 30
        )
        with pytest.raises(httpx.HTTPError):  # the answer was cut, not ended
            async for _ in lines:
                pass
    assert "endless" not in endpoints
