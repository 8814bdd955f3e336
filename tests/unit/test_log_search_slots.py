"""The searches of the log lines that run at once (`runyard.logs.slots`): a tenant's
share, everyone's, the wait, and what a refusal says."""

from __future__ import annotations

import asyncio

import pytest
from runyard.logs.errors import LogBusy
from runyard.logs.slots import OpenFollows, SearchSlots


async def test_a_tenant_runs_its_share_and_waits_for_more_while_others_run() -> None:
    slots = SearchSlots(total=3, per_tenant=1)
    release = asyncio.Event()
    running: list[str] = []

    async def search(tenant: str, wait_s: float | None) -> None:
        async with slots.taken(tenant, wait_s):
            running.append(tenant)
            await release.wait()

    first = asyncio.ensure_future(search("t1", None))
    waiting = asyncio.ensure_future(search("t1", None))  # t1's second: its turn comes later
    await asyncio.sleep(0.01)
    with pytest.raises(LogBusy) as busy:
        await search("t1", 0.05)
    assert busy.value.code == "logs.busy" and busy.value.http_status == 429
    assert "your tenant's searches (1 at once)" in busy.value.message
    others = [asyncio.ensure_future(search(t, 0.05)) for t in ("t2", "t3")]
    await asyncio.sleep(0.01)
    assert running == ["t1", "t2", "t3"], "t1's waiting search stood in no one's way"
    with pytest.raises(LogBusy) as busy:
        await search("t4", 0.05)
    assert "of all tenants (3 at once)" in busy.value.message
    release.set()
    await asyncio.gather(first, waiting, *others)
    assert running == ["t1", "t2", "t3", "t1"]
    assert slots._tenants == {}, "no tenant is kept once its searches are over"


async def test_a_refused_search_gives_back_what_it_held() -> None:
    slots = SearchSlots(total=1, per_tenant=1)
    async with slots.taken("t1", None):
        with pytest.raises(LogBusy):
            async with slots.taken("t2", 0.01):
                pass  # pragma: no cover (never reached)
    async with asyncio.timeout(1), slots.taken("t2", 0.01):  # t2's own slot was given back
        pass
    assert slots._tenants == {}


def test_a_busy_answer_asks_to_come_back_and_is_resource_exhausted_over_grpc() -> None:
    busy = LogBusy("why")
    assert busy.headers == {"Retry-After": "2"} and busy.retryable
    assert busy.grpc_status == "RESOURCE_EXHAUSTED"
    assert busy.to_dict()["hint"].startswith("send it again in a few seconds")


def test_a_tenant_opens_its_live_tails_up_to_its_limit_and_again_once_one_closes() -> None:
    follows = OpenFollows(per_tenant=2)
    first, second = follows.take("t1"), follows.take("t1")
    with pytest.raises(LogBusy, match="2 live tails open"):
        follows.take("t1")
    follows.take("t2")()  # another tenant's: its own count
    first()
    first()  # counted closed once, however often
    assert follows.open == {"t1": 1}
    follows.take("t1")()
    second()
    assert follows.open == {}
