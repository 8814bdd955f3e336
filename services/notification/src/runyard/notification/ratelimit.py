"""Feishu's per-bot limits, 5 requests a second and 100 a minute, shared by every instance.

Feishu counts a custom bot's requests whoever sends them, so the count is kept
in Postgres (`alert_bot_sends`: one row per request of the last minute, per bot),
not in an instance's memory: two instances together stay within the limits.
A request may go when fewer than N requests were sent to its bot in each
window (1 s, 60 s) before now: "at most N in any window", the strict promise
Feishu checks (a bucket refilled at a steady rate would break it right after a
burst). A request counts from when it was answered (its row is restamped
then), never before Feishu saw it. Times are Postgres's clock, the one clock
all instances share; the windows are settings, so tests run the limits fast.

Feishu's own "too fast" answer (11232) is honoured by the delivery's per-bot
backoff (`alert_bots`, shared too): nothing more goes to that bot until then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True, slots=True)
class Limits:
    """Requests allowed per bot: `per_second` in `second_s` and `per_minute` in `minute_s`."""

    per_second: int = 5
    per_minute: int = 100
    second_s: float = 1.0
    minute_s: float = 60.0
    #: Added to each window, for the time between Feishu's count and the answer.
    margin_s: float = 0.01

    def windows(self) -> tuple[tuple[int, float], ...]:
        """(requests, seconds) of each window, margin included."""
        return (
            (self.per_second, self.second_s + self.margin_s),
            (self.per_minute, self.minute_s + self.margin_s),
        )

    def wait_s(self, sent: Sequence[float], now: float) -> float:
        """Seconds until one more request may go to a bot whose requests were sent
        (answered) at `sent` (seconds, any origin; `now` in the same): 0 when now."""
        wait = 0.0
        for capacity, window_s in self.windows():
            recent = sorted(t for t in sent if now - t < window_s)
            if len(recent) >= capacity:
                wait = max(wait, recent[-capacity] + window_s - now)
        return wait

    @property
    def longest_s(self) -> float:
        return max(window_s for _, window_s in self.windows())


@dataclass(frozen=True, slots=True)
class SharedLimiter:
    """The limits of every bot, kept in `alert_bot_sends` for all instances."""

    pool: asyncpg.Pool
    limits: Limits

    async def try_acquire(self, bot: str) -> int | None:
        """A token (its row's id) for one request to `bot`, or None when one more
        request now would pass a limit. Takers of one bot go one at a time."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('alert_bot_sends:' || $1))", bot
            )
            await conn.execute(
                """DELETE FROM alert_bot_sends WHERE webhook_url = $1
                   AND sent_at < clock_timestamp() - make_interval(secs => $2::float8)""",
                bot,
                self.limits.longest_s,
            )
            row = await conn.fetchrow(
                """SELECT extract(epoch FROM clock_timestamp())::float8 AS now,
                          array(SELECT extract(epoch FROM sent_at)::float8 FROM alert_bot_sends
                                WHERE webhook_url = $1) AS sent""",
                bot,
            )
            assert row is not None
            if self.limits.wait_s(row["sent"], row["now"]) > 0:
                return None
            token: int = await conn.fetchval(
                """INSERT INTO alert_bot_sends (webhook_url, sent_at)
                   VALUES ($1, clock_timestamp()) RETURNING id""",
                bot,
            )
            return token

    async def answered(self, token: int) -> None:
        """The request of `token` is answered: it counts from now.

        Feishu counts a request when it arrives, which is somewhere between
        taking the token and the answer; counting from the answer is never early."""
        await self.pool.execute(
            "UPDATE alert_bot_sends SET sent_at = greatest(sent_at, clock_timestamp()) "
            "WHERE id = $1",
            token,
        )
