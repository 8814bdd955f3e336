"""Offset commits at most once per interval: what a reader has handled, committed
in the background.

Every reader of Runyard's topics makes a redelivery harmless (the inbox for
events, the dedupe key and idempotent detections for log lines), so a committed
offset only bounds how much is read again after a restart or a rebalance. A
commit per batch made that bound tiny and cost one broker round trip per batch:
under a burst, a batch holds a message or two, and commits were most of the
requests a consumer sent. Here a reader says which offsets it has handled; they
are committed in the background, at once when the last commit is at least
`interval_s` old, else at the end of the interval with whatever was handled by
then. So a busy reader commits once per interval, an idle one within an
interval of its last batch, a broker that is slow to answer a commit never
holds up the reader, and a reader that stops before the commit gives back at
most one interval of messages to be read again.

Only handled offsets are committed (never the consumer's position, which runs
ahead of the batch being handled), commits go out one at a time in order, and
only for partitions the consumer still holds; before a rebalance takes
partitions away, what was handled is committed (`CommitOnRevoke`). A failed
commit is only a redelivery: it is counted and never stops the reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

log = logging.getLogger("runyard.messaging.commits")

#: How long one commit may wait for the broker.
COMMIT_TIMEOUT_S = 5.0


async def commit_offsets(
    reader: str, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]
) -> bool:
    """Commit `offsets`; False when that failed. A commit that fails only means a
    redelivery, so it never stops the consumer (e.g. a partition that moved to another
    member meanwhile)."""
    try:
        await asyncio.wait_for(consumer.commit(offsets), timeout=COMMIT_TIMEOUT_S)
    except Exception as exc:
        log.debug("%s: offset commit failed (%r); the batch may come again", reader, exc)
        return False
    return True


class OffsetCommits:
    """The handled offsets of one reader's consumer, committed at most every
    `interval_s` (see the module); 0 commits every batch at once."""

    def __init__(self, reader: str, interval_s: float) -> None:
        self.reader = reader
        self.interval_s = interval_s
        #: Commits made (answered or given up), and those that failed.
        self.commits = 0
        self.failures = 0
        self._pending: dict[TopicPartition, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._last = float("-inf")
        self._timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def handled(self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        """`offsets` (partition -> the next offset to read) are handled: they go with
        the next commit, in the background (with no interval: committed before this
        returns)."""
        self._consumer = consumer
        for tp, offset in offsets.items():
            if offset > self._pending.get(tp, -1):
                self._pending[tp] = offset
        if self.interval_s <= 0:
            await self.flush()
        elif self._timer is None:
            wait = self._last + self.interval_s - asyncio.get_running_loop().time()
            self._timer = asyncio.create_task(self._flush_after(max(wait, 0.0)))

    async def flush(self) -> bool:
        """Commit what is handled and not committed yet; False when that failed."""
        async with self._lock:
            consumer, pending = self._consumer, self._pending
            self._pending = {}
            self._last = asyncio.get_running_loop().time()
            if consumer is None or not pending:
                return True
            held = consumer.assignment()
            offsets = {tp: offset for tp, offset in pending.items() if tp in held}
            if not offsets:
                return True
            done = await commit_offsets(self.reader, consumer, offsets)
            self.commits += 1
            self.failures += not done
            return done

    async def close(self) -> None:
        """Commit what is pending (the consumer still open), and stop the timer."""
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        with contextlib.suppress(Exception):
            await self.flush()

    async def _flush_after(self, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
        finally:
            self._timer = None
        try:
            await self.flush()
        except Exception as exc:  # e.g. the consumer closed meanwhile: only a redelivery
            log.debug("%s: offset commit failed (%r)", self.reader, exc)


class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commits what `commits` has handled before a rebalance gives partitions away."""

    def __init__(self, commits: OffsetCommits) -> None:
        self.commits = commits

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        with contextlib.suppress(Exception):
            await self.commits.flush()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        return None
