"""Worker output that a broker loses is published again; a finished worker's output
files stay until the log service has stored every line.

The deployer publishes each output line on `runyard.logs` and moves its saved
offset on once the broker has it; the log service stores it later. A broker that
loses its memory in between (the embedded broker restarted, a Kafka leader lost
with acks=1) takes lines that were published but not yet stored, and nothing
else has them but the worker's output files. So:

- `BrokerWatch` notices such a loss: it remembers the highest offset the broker
  acknowledged in each partition of the logs topic (saved beside the scratch
  folders, so a restarted deployer remembers too) and, every round, asks the
  broker for the partitions' end offsets: an end at or below an acknowledged
  offset means the broker lost what it had acknowledged. The offsets compared
  are those acknowledged before the end offsets were asked for, so a line
  acknowledged meanwhile never looks like a loss.
- After a loss, `OutputKeeper` asks the log service which numbered lines of every
  followed worker are not stored (`POST /internal/v1/lines/missing`, with the
  platform's service credential) and publishes those again from the workers'
  files (`runyard.deployer.outputs.numbered_lines`: the same numbers, so the log
  store drops any that did arrive), each with the time of its mark.
- A finished deployment's output files are kept (`outputs.keep`) and checked
  each round, backing off to `MAX_CHECK_S`: once every line is stored they go.
  Lines still missing after a loss, or `repair_after_s` after the deployment
  finished (a loss nobody noticed), are published again; after `keep_s` the
  files go anyway, with a warning that names how many lines never arrived.

When no log service is known (no `logs` endpoint) or it does not answer, nothing
is removed and nothing republished: the next round asks again.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from runyard.api.internal import ServiceClient
from runyard.deployer import outputs
from runyard.deployer.outputs import DeploymentKey, KeptOutput, Marks, OutputStream, Stream
from runyard.deployer.retry import until_done
from runyard.deployer.runtime import OutputLine

log = logging.getLogger("runyard.deployer.keeper")

#: The endpoint name of the log service (`ServiceContext.endpoints`).
LOGS = "logs"
#: Streams asked about in one call (the log service's limit).
ASK_CHUNK = 256
#: The longest wait between two looks at one kept output.
MAX_CHECK_S = 30.0
#: Streams whose last acknowledgement `BrokerWatch` remembers (the oldest go first).
MAX_STREAMS_WATCHED = 100_000

Gaps = list[tuple[int, int]]
Probe = Callable[[], Awaitable[Mapping[int, int]]]
#: Publishes one line (what it returns is not looked at).
Publish = Callable[[OutputLine], Awaitable[object]]


@dataclass(frozen=True)
class Ask:
    """Lines [0, below) of one worker's stream."""

    key: DeploymentKey
    worker: int
    stream: Stream
    below: int

    def body(self) -> dict[str, object]:
        task_id, run, attempt = self.key
        return {
            "task_id": task_id,
            "run": run,
            "attempt": attempt,
            "worker": self.worker,
            "stream": self.stream,
            "below": self.below,
        }


class StoredLines(Protocol):
    async def missing(self, asks: Sequence[Ask]) -> list[Gaps] | None:
        """Per ask, the ranges [lo, hi) of numbers not stored; None: nobody to ask."""
        ...


class LogServiceLines:
    """The log service's `/internal/v1/lines/missing` (`runyard.api.internal.ServiceClient`)."""

    def __init__(self, endpoints: Mapping[str, str], token: str, *, timeout_s: float = 30.0):
        self.service = ServiceClient(endpoints, LOGS, token, timeout_s=timeout_s)

    async def missing(self, asks: Sequence[Ask]) -> list[Gaps] | None:
        if not self.service.known:
            return None
        gaps: list[Gaps] = []
        for i in range(0, len(asks), ASK_CHUNK):
            chunk = asks[i : i + ASK_CHUNK]
            answer = await self.service.post(
                "/internal/v1/lines/missing", {"streams": [a.body() for a in chunk]}
            )
            streams = answer["streams"]
            if len(streams) != len(chunk):
                raise ValueError(f"{len(streams)} answers to {len(chunk)} streams")
            gaps.extend([(int(lo), int(hi)) for lo, hi in s["missing"]] for s in streams)
        return gaps

    async def close(self) -> None:
        await self.service.aclose()


class BrokerWatch:
    """Notices the broker losing acknowledged lines of the logs topic (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: The highest offset acknowledged, by partition (saved: a restarted deployer's
        #: first look compares the broker's end offsets with it).
        self.acked: dict[int, int] = {}
        self.losses = 0
        self._saved: dict[int, int] = {}
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            raw = json.loads(path.read_text())
            self.acked = {int(p): int(o) for p, o in raw.items()}
            self._saved = dict(self.acked)
        self._at_start = dict(self.acked)
        #: The end offsets of the last look (None: no look answered yet).
        self._ends: dict[int, int] | None = None
        #: The last acknowledgement of each stream published in order: (partition, offset).
        self._last: OrderedDict[Hashable, tuple[int, int]] = OrderedDict()
        self._noticed: str | None = None

    def saw(self, stream: Hashable, partition: int, offset: int) -> None:
        """The broker acknowledged a line of `stream` at `offset` of `partition`; the
        lines of one stream are published one after the other, so an offset at or
        below the stream's last one means the broker started its partition again."""
        last = self._last.pop(stream, None)
        if last is not None and last[0] == partition and offset <= last[1]:
            self._noticed = (
                f"partition {partition} of the logs topic acknowledged offset {offset}"
                f" after offset {last[1]} of the same stream"
            )
        self._last[stream] = (partition, offset)
        if len(self._last) > MAX_STREAMS_WATCHED:
            self._last.popitem(last=False)
        if offset > self.acked.get(partition, -1):
            self.acked[partition] = offset

    async def look(self, probe: Probe) -> bool:
        """True when the broker lost acknowledged lines since the last look: an
        acknowledgement out of order, end offsets that went back, or (a restarted
        deployer's first look) end offsets at or below what it had acknowledged."""
        ends = await probe()
        if self._ends is None:
            start = self._at_start
            went = [(p, e, start[p]) for p, e in ends.items() if e <= start.get(p, -1)]
            what = "acknowledged before this deployer started"
        else:
            went = [(p, e, self._ends[p]) for p, e in ends.items() if e < self._ends.get(p, -1)]
            what = "at the last look"
        self._ends = dict(ends)
        why = [f"partition {p} ends at {e}, {what} {o}" for p, e, o in sorted(went)]
        if self._noticed is not None:
            why.append(self._noticed)
            self._noticed = None
        if not why:
            return False
        log.warning(
            "the broker lost output lines (%s): publishing again what is not stored",
            "; ".join(why),
        )
        for partition, _, _ in went:
            self.acked.pop(partition, None)
        self.losses += 1
        return True

    def save(self) -> None:
        if self.acked == self._saved:
            return
        tmp = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.acked))
            tmp.replace(self.path)
            self._saved = dict(self.acked)


@dataclass
class _Watching:
    """What the keeper knows of one kept output."""

    due: float = 0.0
    interval: float = 0.0
    repaired_at: float | None = None
    #: Lines of it may have gone with the broker: publish what is missing at once.
    lost: bool = False


class KeepsOutput(Protocol):
    """What the keeper needs of a runtime (the local one, or `PoolRuntimes`)."""

    def kept(self) -> dict[DeploymentKey, KeptOutput]: ...

    async def forget(self, key: DeploymentKey) -> None: ...

    def live_streams(self) -> list[OutputStream]: ...


class OutputKeeper:
    """Republishes what a broker lost; removes kept output once stored (module docstring)."""

    def __init__(
        self,
        runtime: KeepsOutput,
        lines: StoredLines,
        publish: Publish,
        *,
        watch: BrokerWatch | None = None,
        probe: Probe | None = None,
        check_s: float = 2.0,
        repair_after_s: float = 60.0,
        keep_s: float = 86400.0,
    ) -> None:
        self.runtime = runtime
        self.lines = lines
        self.publish = publish
        self.watch = watch
        self.probe = probe
        self.check_s = check_s
        self.repair_after_s = repair_after_s
        self.keep_s = keep_s
        self.republished = 0
        self._kept: dict[DeploymentKey, _Watching] = {}
        self._live_lost = False

    async def run(self) -> None:
        """A round every `check_s` seconds until cancelled. A failed round (the log
        service or the broker away) is logged when the failures start and when they end."""
        failing = 0
        while True:
            try:
                await self.round()
            except Exception as exc:
                failing += 1
                if failing == 1:
                    log.warning(
                        "output keeper: %s: %s; trying again every %ss",
                        type(exc).__name__,
                        exc,
                        self.check_s,
                    )
            else:
                if failing:
                    log.warning("output keeper: working again after %d failed round(s)", failing)
                failing = 0
            await asyncio.sleep(self.check_s)

    async def look(self) -> None:
        """Ask the broker whether it lost lines; mark everything that may have them."""
        if self.watch is None or self.probe is None:
            return
        try:
            lost = await self.watch.look(self.probe)
        finally:
            self.watch.save()
        if lost:
            self._live_lost = True
            for key in self.runtime.kept():
                self._kept.setdefault(key, _Watching()).lost = True

    async def round(self) -> None:
        await self.look()
        # Output kept while a loss is being seen to was live at the loss: it is marked
        # before the live streams are repaired (those are then the rest).
        kept = self.runtime.kept()
        for key in set(self._kept) - set(kept):
            del self._kept[key]
        for key, output in kept.items():
            self._kept.setdefault(key, _Watching(lost=self._live_lost or output.salvaged))
        if self._live_lost:
            await self._repair_live()
            self._live_lost = False
        await self._settle_kept()

    async def _repair_live(self) -> None:
        streams = self.runtime.live_streams()
        gaps = await self.lines.missing(
            [Ask(s.key, s.worker, s.stream, s.published) for s in streams]
        )
        if gaps is None:
            raise RuntimeError("no log service to ask which lines it has")
        for stream, missing in zip(streams, gaps, strict=True):
            if missing:
                await self._republish(stream.key, stream, missing, complete=False)

    async def _settle_kept(self) -> None:
        now = time.time()
        kept = self.runtime.kept().values()
        due = [k for k in kept if self._kept.setdefault(k.key, _Watching()).due <= now]
        if not due:
            return
        asks = [Ask(k.key, w, s, n) for k in due for (w, s), n in sorted(k.lines.items())]
        gaps = await self.lines.missing(asks)
        if gaps is None:
            return
        by_key: dict[DeploymentKey, list[tuple[Ask, Gaps]]] = {}
        for ask, missing in zip(asks, gaps, strict=True):
            by_key.setdefault(ask.key, []).append((ask, missing))
        for output in due:
            await self._settle(output, by_key.get(output.key, []), now)

    async def _settle(
        self, output: KeptOutput, answers: list[tuple[Ask, Gaps]], now: float
    ) -> None:
        watching = self._kept[output.key]
        missing = [(ask, gaps) for ask, gaps in answers if gaps]
        if not missing:
            await self.runtime.forget(output.key)
            del self._kept[output.key]
            return
        count = sum(hi - lo for _, gaps in missing for lo, hi in gaps)
        if now - output.kept_at > self.keep_s:
            log.warning(
                "output of %s kept %.0f s and %d line(s) still not stored: removing it",
                output.key,
                now - output.kept_at,
                count,
            )
            await self.runtime.forget(output.key)
            del self._kept[output.key]
            return
        last = watching.repaired_at or output.kept_at
        if watching.lost or now - last > self.repair_after_s:
            for ask, gaps in missing:
                path = output.path(ask.worker, ask.stream)
                marks = outputs.read_marks(path.parent)
                stream = OutputStream(output.key, ask.worker, ask.stream, path, ask.below, marks)
                await self._republish(output.key, stream, gaps, complete=True)
            watching.lost = False
            watching.repaired_at = now
            watching.interval = 0.0
        watching.interval = min(max(self.check_s, watching.interval * 2), MAX_CHECK_S)
        watching.due = now + watching.interval

    async def _republish(
        self, key: DeploymentKey, stream: OutputStream, gaps: Gaps, *, complete: bool
    ) -> None:
        """Publish the lines of `stream` whose numbers fall in `gaps`, from its file."""
        task_id, run, attempt = key
        wanted = _Ranges(gaps)
        sent = 0
        lines = await asyncio.to_thread(
            lambda: [
                (seq, raw)
                for seq, raw in outputs.numbered_lines(stream.path, complete=complete)
                if seq < stream.published and seq in wanted
            ]
        )
        for seq, raw in lines:
            line = OutputLine(
                task_id,
                run,
                attempt,
                stream.worker,
                stream.stream,
                outputs.text(raw),
                _when(stream.marks, stream.stream, seq),
                seq,
            )

            async def send(line: OutputLine = line) -> None:
                await self.publish(line)

            await until_done(
                send,
                what=f"publishing again output of {key}",
                component="deployer (worker output)",
                any_error=True,
            )
            sent += 1
        self.republished += sent
        if sent:
            log.warning(
                "published again %d line(s) of %s worker %d %s the log service did not have",
                sent,
                key,
                stream.worker,
                stream.stream,
            )


class _Ranges:
    """Membership in sorted, disjoint ranges [lo, hi)."""

    def __init__(self, gaps: Gaps) -> None:
        self.gaps = sorted(gaps)

    def __contains__(self, seq: object) -> bool:
        assert isinstance(seq, int)
        i = bisect.bisect_right(self.gaps, (seq, float("inf"))) - 1
        return i >= 0 and self.gaps[i][0] <= seq < self.gaps[i][1]


def _when(marks: Marks, stream: str, seq: int) -> datetime:
    at = marks.time_of(stream, seq)
    return datetime.fromtimestamp(at, UTC) if at is not None else datetime.now(UTC)
