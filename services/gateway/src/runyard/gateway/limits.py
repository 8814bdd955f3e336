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

`submissions_per_tenant` (default 16): the requests one tenant has in flight at once
in one gateway process that the submission service carries out (submit, rerun and
clone a task, create and rerun a task group). One more waits its turn, first come
first served, at most `submission_wait_s` (default 10 s), then is refused: 429
`submission.busy`, Retry-After (gRPC `RESOURCE_EXHAUSTED`). A tenant's flood thus
waits behind itself, and the submission service works at most that many of its
requests beside everyone else's; a script with up to 16 requests in flight never
waits, and one with more (benchmarks/e2e.py keeps 32) waits a request's time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from runyard.api.errors import TooBusy
from runyard.api.slots import OpenStreams, TenantSlots

#: Streams one tenant keeps open at once (`streams_per_tenant`).
STREAMS_PER_TENANT = 64
#: Submissions of one tenant in flight at once (`submissions_per_tenant`).
SUBMISSIONS_PER_TENANT = 16
#: Seconds one more waits for its turn before it is refused (`submission_wait_s`).
SUBMISSION_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """The gateway's per-tenant bounds (see the module docstring)."""

    streams_per_tenant: int = STREAMS_PER_TENANT
    submissions_per_tenant: int = SUBMISSIONS_PER_TENANT
    submission_wait_s: float = SUBMISSION_WAIT_S

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> GatewayLimits:
        """The bounds of gateway.yaml's mapping (a key left out keeps its default)."""
        wait = config.get("submission_wait_s", SUBMISSION_WAIT_S)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
            raise ValueError(
                f"gateway.yaml: submission_wait_s must be a number of seconds, not {wait!r}"
            )
        return cls(
            streams_per_tenant=_positive(config, "streams_per_tenant", STREAMS_PER_TENANT),
            submissions_per_tenant=_positive(
                config, "submissions_per_tenant", SUBMISSIONS_PER_TENANT
            ),
            submission_wait_s=float(wait),
        )

    def open_streams(self) -> OpenStreams:
        return OpenStreams(self.streams_per_tenant, too_many_streams)

    def submission_slots(self) -> TenantSlots:
        return TenantSlots(self.submissions_per_tenant, self.submission_wait_s, submission_busy)


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


def submission_busy(per_tenant: int, wait_s: float) -> TooBusy:
    return TooBusy(
        "submission.busy",
        f"your tenant has {per_tenant} submissions in flight at the gateway, the most it"
        f" may at once, and none ended within {wait_s:g} s",
        f"send it again in a few seconds; a script keeps at most {per_tenant} requests in"
        " flight (a task group submits up to 1000 tasks in one request)",
    )


def _positive(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"gateway.yaml: {key} must be a whole number from 1, not {value!r}")
    return value
