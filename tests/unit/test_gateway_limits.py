"""Each tenant's share of the gateway as gateway.yaml sets it (`runyard.gateway.limits`)."""

from __future__ import annotations

import asyncio

import pytest
from runyard.api.errors import TooBusy
from runyard.gateway.limits import STREAMS_PER_TENANT, SUBMISSIONS_PER_TENANT, GatewayLimits


def test_a_key_left_out_keeps_its_default_and_a_bad_one_is_named() -> None:
    assert GatewayLimits.from_config({}) == GatewayLimits()
    assert GatewayLimits().streams_per_tenant == STREAMS_PER_TENANT == 64
    assert GatewayLimits.from_config({"streams_per_tenant": 3}).streams_per_tenant == 3
    for bad in (0, -1, "64", True, 1.5):
        with pytest.raises(ValueError, match="streams_per_tenant"):
            GatewayLimits.from_config({"streams_per_tenant": bad})


def test_one_stream_past_the_share_is_a_429_that_asks_to_come_back() -> None:
    streams = GatewayLimits(streams_per_tenant=1).open_streams()
    close = streams.take("t1")
    with pytest.raises(TooBusy, match="1 streams open") as refused:
        streams.take("t1")
    assert refused.value.code == "streams.too_many" and refused.value.http_status == 429
    assert refused.value.headers == {"Retry-After": "2"}
    assert refused.value.grpc_status == "RESOURCE_EXHAUSTED"
    streams.take("t2")()  # another tenant: its own share
    close()
    streams.take("t1")()
    assert streams.open == {}


def test_submission_keys_keep_their_defaults_and_a_bad_wait_is_named() -> None:
    limits = GatewayLimits.from_config({"submissions_per_tenant": 4, "submission_wait_s": 0})
    assert (limits.submissions_per_tenant, limits.submission_wait_s) == (4, 0.0)
    assert GatewayLimits().submissions_per_tenant == SUBMISSIONS_PER_TENANT == 16
    for bad in (-1, "10", None):
        with pytest.raises(ValueError, match="submission_wait_s"):
            GatewayLimits.from_config({"submission_wait_s": bad})


async def test_one_submission_past_the_share_waits_its_turn_then_is_refused() -> None:
    slots = GatewayLimits(submissions_per_tenant=1, submission_wait_s=0.05).submission_slots()
    release = asyncio.Event()

    async def submit(tenant: str) -> None:
        async with slots.taken(tenant):
            await release.wait()

    first = asyncio.ensure_future(submit("t1"))
    await asyncio.sleep(0)
    with pytest.raises(TooBusy, match="1 submissions in flight") as refused:
        await submit("t1")
    assert refused.value.code == "submission.busy" and refused.value.retryable
    other = asyncio.ensure_future(submit("t2"))  # another tenant: not behind t1's
    slots.wait_s = 30
    waiting = asyncio.ensure_future(submit("t1"))
    await asyncio.sleep(0)
    assert (slots.busy("t1"), slots.busy("t2")) == (2, 1)
    release.set()
    await asyncio.gather(first, other, waiting)
    assert slots.busy("t1") == 0 and slots._tenants == {}
