"""Which errors are outages (waited out) and which are not (raised at once)."""

from __future__ import annotations

import asyncio
import errno

import asyncpg
import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError
from runyard.eventstore import StoreUnavailable
from runyard.eventstore.transient import Backoff, Health, cancel_and_wait, is_transient, retrying


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        ConnectionResetError(),
        OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 5432, 0, 0)"),
        OSError(errno.EHOSTUNREACH, "no route"),
        FileNotFoundError(errno.ENOENT, "No such file or directory"),  # a unix socket gone
        TimeoutError(),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.InterfaceError("cannot call Connection.fetch(): connection is closed"),
        StoreUnavailable("down"),
        KafkaConnectionError("no broker"),
    ],
)
def test_outages_are_transient(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a bug"),
        FileNotFoundError(errno.ENOENT, "No such file or directory", "/etc/runyard/pools.yaml"),
        PermissionError(errno.EACCES, "denied", "/data"),
        asyncpg.UniqueViolationError("duplicate key"),
        asyncpg.InsufficientPrivilegeError("permission denied for table events"),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        MessageSizeTooLargeError(),
    ],
)
def test_other_errors_are_not_transient(error: BaseException) -> None:
    assert not is_transient(error)


def test_an_error_caused_by_an_outage_is_transient() -> None:
    try:
        try:
            raise ConnectionResetError()
        except ConnectionResetError as exc:
            raise RuntimeError("could not save") from exc
    except RuntimeError as wrapped:
        assert is_transient(wrapped)


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    backoff = Backoff(base=0.1, cap=1.0)
    delays = [backoff.next_delay() for _ in range(10)]
    assert all(0.05 <= d <= 0.1 for d in delays[:1])
    assert all(0.5 <= d <= 1.0 for d in delays[5:])  # capped
    assert len(set(delays)) > 1  # jittered
    backoff.reset()
    assert backoff.next_delay() <= 0.1


async def test_retrying_waits_out_transient_errors_and_reports_health() -> None:
    health = Health()
    calls = 0
    seen_down: list[bool] = []

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        seen_down.append("store" in health.down)
        if calls < 4:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        return "done"

    result = await retrying(flaky, component="store", backoff=Backoff(base=0.001), health=health)
    assert (result, calls) == ("done", 4)
    assert seen_down == [False, True, True, True]  # down while waiting
    assert health.ready and health.report() == {}


async def test_retrying_raises_other_errors_at_once() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        await retrying(broken, component="x", health=Health())
    assert calls == 1


async def test_retrying_ends_on_cancel() -> None:
    health = Health()

    async def down() -> None:
        raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")

    task = asyncio.create_task(retrying(down, component="db", health=health))
    await asyncio.sleep(0.05)
    assert "db" in health.report()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert health.report() == {}  # a stopped component reports nothing


def test_an_outage_is_503_with_retry_after_and_grpc_unavailable() -> None:
    import grpc
    from runyard.api.errors import Unavailable, translate
    from runyard.api.grpc_errors import status_of

    error = translate(asyncpg.CannotConnectNowError("the database system is starting up"))
    assert isinstance(error, Unavailable)
    assert (error.http_status, error.code, error.headers, error.retryable) == (
        503,
        "service.unavailable",
        {"Retry-After": "2"},
        True,
    )
    assert status_of(error) == grpc.StatusCode.UNAVAILABLE
    assert translate(ValueError("a bug")) is None  # a bug stays a 500


async def test_retrying_waits_out_an_outage_met_by_a_task_group() -> None:
    """A call that writes in parallel parts (a TaskGroup) and meets an outage: Python
    3.11's TaskGroup leaves a cancellation counted on the caller's task, which must not
    be taken for a stop (the batch would be dropped, not retried)."""
    calls = 0

    async def part(fails: bool) -> None:
        await asyncio.sleep(0)
        if fails:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        await asyncio.sleep(0.05)

    async def insert_in_parts() -> str:
        nonlocal calls
        calls += 1
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(part(fails=calls < 3))
                group.create_task(part(fails=False))
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return "stored"

    stored = await asyncio.wait_for(
        retrying(insert_in_parts, component="db", backoff=Backoff(base=0.01), health=Health()),
        5,
    )
    assert stored == "stored" and calls == 3


async def test_retrying_in_a_cleanup_after_a_stop_still_waits_out_the_outage() -> None:
    """A stopped task that records what it must not lose on its way out (a worker's exit)
    began that call after the stop: the call's outage is waited out as ever."""
    calls = 0
    recorded: list[str] = []

    async def down_twice() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        return "recorded"

    async def stopping() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            backoff = Backoff(base=0.01)
            recorded.append(await retrying(down_twice, component="db", backoff=backoff))

    task = asyncio.create_task(stopping())
    await asyncio.sleep(0.01)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done and task.cancelled()
    assert recorded == ["recorded"] and calls == 3


async def test_cancel_and_wait_waits_for_the_task_and_passes_a_stop_of_its_caller_on() -> None:
    winding_down = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            winding_down.set()
            await asyncio.sleep(0.2)

    child = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    await cancel_and_wait(child)  # the caller is not stopped: it goes on
    assert child.cancelled()

    went_on = False

    async def caller() -> None:
        nonlocal went_on
        child = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)  # started: it has something to wind down
        await cancel_and_wait(child)
        went_on = True

    winding_down.clear()
    outer = asyncio.create_task(caller())
    await asyncio.wait_for(winding_down.wait(), 5)
    outer.cancel()  # the caller is stopped while it waits for its child
    done, _ = await asyncio.wait({outer}, timeout=5)
    assert done and outer.cancelled()
    assert not went_on

    cleaned_up = False

    async def stopped_caller() -> None:
        nonlocal cleaned_up
        child = asyncio.create_task(slow_to_stop())
        try:
            await asyncio.Event().wait()
        finally:  # its own stop: the cleanup runs to its end
            await cancel_and_wait(child)
            cleaned_up = True

    outer = asyncio.create_task(stopped_caller())
    await asyncio.sleep(0.01)
    outer.cancel()
    done, _ = await asyncio.wait({outer}, timeout=5)
    assert done and outer.cancelled()
    assert cleaned_up
