"""Feishu's per-bot limits as token buckets: 5 requests a second and 100 a minute.

Each bot (webhook URL) has two buckets. A request takes one token from both;
a token comes back exactly one window (1 s, 60 s) after it was taken. That
refill keeps the strict promise Feishu checks, "at most N in any window",
which a bucket refilled at a steady rate would break right after a burst
(a full bucket of 5 plus 5 refilled tokens is 10 in one second); and a token
counts from when its request was answered, never before Feishu saw it. The clock
is passed in, and the windows are settings, so tests run the limits fast.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """`capacity` tokens; each taken token returns `window_s` after it was taken."""

    capacity: int
    window_s: float
    _taken: deque[float] = field(default_factory=deque)

    def wait_s(self, now: float) -> float:
        """Seconds until one token is there (0 when one is there now)."""
        while self._taken and now - self._taken[0] >= self.window_s:
            self._taken.popleft()
        if len(self._taken) < self.capacity:
            return 0.0
        return self._taken[0] + self.window_s - now

    def take(self, now: float) -> None:
        self._taken.append(now)

    def restamp(self, now: float) -> None:
        """The last token was taken at `now` after all (when its request was answered)."""
        if self._taken:
            self._taken[-1] = max(self._taken[-1], now)

    def drain(self, now: float) -> None:
        """No token until a full window from now (the server said we were too fast)."""
        self._taken = deque([now] * self.capacity)


@dataclass(frozen=True, slots=True)
class Limits:
    """Requests allowed per bot: `per_second` in `second_s` and `per_minute` in `minute_s`."""

    per_second: int = 5
    per_minute: int = 100
    second_s: float = 1.0
    minute_s: float = 60.0
    #: Added to each window, for clocks that disagree a little.
    margin_s: float = 0.01


@dataclass
class BotLimiter:
    """The two token buckets of every bot, by webhook URL."""

    limits: Limits
    clock: Callable[[], float]
    _buckets: dict[str, tuple[TokenBucket, TokenBucket]] = field(default_factory=dict)

    def _pair(self, bot: str) -> tuple[TokenBucket, TokenBucket]:
        if bot not in self._buckets:
            lim = self.limits
            self._buckets[bot] = (
                TokenBucket(lim.per_second, lim.second_s + lim.margin_s),
                TokenBucket(lim.per_minute, lim.minute_s + lim.margin_s),
            )
        return self._buckets[bot]

    def wait_s(self, bot: str) -> float:
        """Seconds until `bot` may take one more request."""
        now = self.clock()
        return max(bucket.wait_s(now) for bucket in self._pair(bot))

    def try_acquire(self, bot: str) -> bool:
        """Take a token from both buckets of `bot`, or none when either is empty."""
        if self.wait_s(bot) > 0:
            return False
        now = self.clock()
        for bucket in self._pair(bot):
            bucket.take(now)
        return True

    def answered(self, bot: str) -> None:
        """The request that took the last token is answered: count it from now.

        Feishu counts a request when it arrives, which is somewhere between
        taking the token and the answer; counting from the answer is never early.
        """
        now = self.clock()
        for bucket in self._pair(bot):
            bucket.restamp(now)

    def rate_limited(self, bot: str) -> None:
        """Feishu answered 11232: send nothing more to `bot` for a second's window."""
        self._pair(bot)[0].drain(self.clock())
