"""Each tenant's share of the gateway as gateway.yaml sets it (`runyard.gateway.limits`)."""

from __future__ import annotations

import pytest
from runyard.api.errors import TooBusy
from runyard.gateway.limits import STREAMS_PER_TENANT, GatewayLimits


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
