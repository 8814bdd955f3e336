"""Turns of a machine's deploy work shared between tenants (`runyard.deployer.turns`)."""

from __future__ import annotations

import asyncio

from runyard.deployer.turns import FairTurns


async def served_in_order(turns: FairTurns, arrivals: list[str]) -> list[str]:
    """The tenants of `arrivals` (all waiting behind a first holder of the one turn) in
    the order they get it, each deployment ending once it has it."""
    order: list[int] = []
    done = [asyncio.Event() for _ in arrivals]

    async def deploy(i: int) -> None:
        async with turns.turn(arrivals[i]):
            order.append(i)
            await done[i].wait()

    hold = asyncio.Event()
    first = asyncio.ensure_future(_hold(turns, "first", hold))
    await asyncio.sleep(0)
    tasks = [asyncio.ensure_future(deploy(i)) for i in range(len(arrivals))]
    await asyncio.sleep(0.01)
    assert order == [] and turns.waiting() == len(arrivals)
    hold.set()
    await first
    for k in range(len(arrivals)):
        async with asyncio.timeout(5):
            while len(order) <= k:  # noqa: ASYNC110 (the next one's turn comes)
                await asyncio.sleep(0)
        done[order[k]].set()
    await asyncio.gather(*tasks)
    return [arrivals[i] for i in order]


async def _hold(turns: FairTurns, tenant: str, release: asyncio.Event) -> None:
    async with turns.turn(tenant):
        await release.wait()


async def test_one_turn_goes_round_the_tenants_not_to_a_burst_first() -> None:
    turns = FairTurns(1)
    order = await served_in_order(turns, ["burst", "burst", "burst", "other", "third"])
    assert order == ["burst", "other", "third", "burst", "burst"]
    assert (turns.free, dict(turns.held), turns.waiting(), turns._served) == (1, {}, 0, {})


async def test_a_free_turn_goes_to_the_tenant_holding_fewest() -> None:
    turns = FairTurns(2)
    release = asyncio.Event()
    held = [asyncio.ensure_future(_hold(turns, "burst", release)) for _ in range(2)]
    await asyncio.sleep(0)
    got: list[str] = []

    async def deploy(tenant: str) -> None:
        async with turns.turn(tenant):
            got.append(tenant)

    waiting = [asyncio.ensure_future(deploy(t)) for t in ("burst", "burst", "other")]
    await asyncio.sleep(0.01)
    assert got == [] and dict(turns.held) == {"burst": 2}
    release.set()
    await asyncio.gather(*held, *waiting)
    assert got[0] == "other", got
    assert turns.free == 2 and not turns.held


async def test_a_waiter_cancelled_before_or_after_its_turn_came_leaks_none() -> None:
    turns = FairTurns(1)
    release = asyncio.Event()
    holder = asyncio.ensure_future(_hold(turns, "a", release))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(_hold(turns, "b", asyncio.Event()))
    await asyncio.sleep(0)
    gone.cancel()  # still waiting: it leaves the queue
    await asyncio.gather(gone, return_exceptions=True)
    assert turns.waiting() == 0
    late = asyncio.ensure_future(_hold(turns, "c", asyncio.Event()))
    await asyncio.sleep(0)
    release.set()
    await holder  # the turn is handed to "c" ...
    late.cancel()  # ... which is cancelled before it ran: the turn is given back
    await asyncio.gather(late, return_exceptions=True)
    assert (turns.free, dict(turns.held), turns.waiting(), turns._served) == (1, {}, 0, {})
    async with asyncio.timeout(1), turns.turn("d"):
        pass
