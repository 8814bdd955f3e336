"""Each tenant's share of the gateway (gateway.yaml in the config folder, or the
`gateway` settings of whoever starts it; docs/limits.md).

`streams_per_tenant` (default 64): the long-lived answers one tenant may keep open
at once in one gateway process: watches of a task's events (HTTP server-sent events,
gRPC `WatchTask`), live tails of its logs routed to the log service (HTTP
`logs/follow`, gRPC `FollowLogs`) and the console's live task list. Each looks at
Postgres every second or so for as long as it is open, so without a bound one
tenant opening thousands would load the database for everybody. One more is
refused before its stream starts: 429 `streams.too_many`, Retry-After (gRPC
`RESOURCE_EXHAUSTED`). A stream counts until it ends, its reader goes away, or it
is dropped before it started.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from runyard.api.errors import TooBusy
from runyard.api.slots import OpenStreams

#: Streams one tenant keeps open at once (`streams_per_tenant`).
STREAMS_PER_TENANT = 64


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """The gateway's per-tenant bounds (see the module docstring)."""

    streams_per_tenant: int = STREAMS_PER_TENANT

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> GatewayLimits:
        """The bounds of gateway.yaml's mapping (a key left out keeps its default)."""
        return cls(
            streams_per_tenant=_positive(config, "streams_per_tenant", STREAMS_PER_TENANT),
        )

    def open_streams(self) -> OpenStreams:
        return OpenStreams(self.streams_per_tenant, too_many_streams)


class CountedStream(StreamingResponse):
    """A streamed answer counted open until it ends, however it ends: sent whole, cut
    short, its client gone, or (never sent) dropped. `close`: counts it closed (once
    however often it is called, as `OpenStreams.take` answers it)."""

    def __init__(self, content: Any, close: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.close = close
        weakref.finalize(self, close)  # an answer never sent counts closed too

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.close()


def too_many_streams(per_tenant: int) -> TooBusy:
    return TooBusy(
        "streams.too_many",
        f"your tenant has {per_tenant} streams open at the gateway, the most it may"
        " (watches of tasks, live tails of logs, console pages following the task list)",
        "close one (a `runyard watch`, a log follow, a gRPC WatchTask or FollowLogs, a"
        " console tab), or send it again once one has ended",
    )


def _positive(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"gateway.yaml: {key} must be a whole number from 1, not {value!r}")
    return value
