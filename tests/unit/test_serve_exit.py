"""A service process whose singleton work would not stop exits at once, with 1."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: A service whose term's work ignores its cancellation (the bug `WorkDidNotStop`
#: reports), run by `runyard.stack.serve.main` as `runyard serve` would.
SERVICE = textwrap.dedent(
    """
    import asyncio, contextlib, types
    from runyard.stack import serve
    from runyard.stack.leader import WorkDidNotStop

    async def stuck() -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def runner(ctx: object) -> None:
        asyncio.ensure_future(stuck())
        await asyncio.sleep(0.1)
        raise WorkDidNotStop("relay: the work did not stop within 30 s")

    async def prepare(name: str, ctx: object) -> None:
        pass

    serve.load_runner = lambda name: runner
    serve.prepare = prepare
    context = types.SimpleNamespace(for_service=lambda name: None)
    serve.ServiceContext.from_env = classmethod(lambda cls: context)
    serve.main("relay")
    """
)


def test_a_service_whose_work_does_not_stop_exits_1_without_waiting_for_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVICE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "exiting now, leaving a task that ignores its cancellation" in done.stderr
