"""The services of one process stop together, and one that will not stop is named.

`run_platform` runs every service as a task of one event loop (`_run_all`). Asked
to stop, it cancels them all; a service that swallows its cancellation must not
keep the process from stopping without a word: after the bound the stop fails,
naming the service, and the log shows where every task waited.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from runyard.stack.up import _run_all


async def forever() -> None:
    await asyncio.Event().wait()


async def deaf(started: asyncio.Event) -> None:
    """A service that catches its cancellation and goes on waiting."""
    started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)


async def test_a_stop_that_cancels_every_service_ends_quietly() -> None:
    run = asyncio.create_task(_run_all({"a": forever(), "b": forever()}, stop_within_s=5))
    await asyncio.sleep(0.05)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_a_service_deaf_to_its_cancellation_is_named_with_where_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()
    run = asyncio.create_task(
        _run_all({"fine": forever(), "stuck": deaf(started)}, stop_within_s=2)
    )
    await started.wait()  # cancelled before its first step, it would not be deaf
    run.cancel()
    with (
        caplog.at_level(logging.ERROR, logger="runyard.up"),
        pytest.raises(RuntimeError, match=r"not stopped 2 s after asked: stuck$"),
    ):
        await run
    assert "in deaf" in caplog.text  # its stack
    (left,) = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "deaf"]  # type: ignore[union-attr]
    left.cancel()  # a second cancellation reaches it (in its except)
    with pytest.raises(asyncio.CancelledError):
        await left


async def test_the_stuck_service_is_named_even_beside_a_task_whose_stack_cannot_print(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """grpc's server runs compiled coroutines whose frames have no line number: printing
    their stack raises. The gateway and submission run one in the same loop."""
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        started = asyncio.Event()
        run = asyncio.create_task(_run_all({"stuck": deaf(started)}, stop_within_s=2))
        await started.wait()
        run.cancel()
        with (
            caplog.at_level(logging.ERROR, logger="runyard.up"),
            pytest.raises(RuntimeError, match=r"not stopped 2 s after asked: stuck$"),
        ):
            await run
        assert "in deaf" in caplog.text
        assert "_server_main_loop" in caplog.text and "no stack" in caplog.text
        (left,) = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "deaf"]  # type: ignore[union-attr]
        left.cancel()
        with pytest.raises(asyncio.CancelledError):
            await left
    finally:
        await server.stop(None)


async def test_a_service_that_fails_stops_the_others_and_its_error_is_raised() -> None:
    async def broken() -> None:
        raise ValueError("no config")

    with pytest.raises(ValueError, match="no config"):
        await _run_all({"ok": forever(), "broken": broken()}, stop_within_s=5)
