"""The log store (asyncpg): batched idempotent ingest, day partitions,
retention, paged queries and the first error.

Ingest is one multi-row `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
NOTHING` per part of a batch: a redelivered line hits the unique `(dedupe, at)`
index and is skipped. A numbered line (`seq`) read again by a new deployer has
the same `dedupe` and a later `at`: it is skipped when a line of that identity
is stored within `REPEAT_WINDOW` of it (and a batch keeps the first of several).
A batch is split by worker stream into `parts` written at once on their own
connections, so every line of one stream, and so every repeat of a line, is in
the same insert; batches are written one after the other.
Partitions are one per UTC day, created ahead of time and on demand for the
days a batch touches; retention drops whole partitions.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence, Sized
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from runyard.contracts.loglines import LogRecord, numbered_key
from runyard.eventstore import Migration, apply_migrations, load_migrations
from runyard.logs import firsterror
from runyard.logs.errors import InvalidQuery
from runyard.logs.search import (
    WORDS_SQL,
    LogQuery,
    Position,
    check_words,
    count_sql,
    page_sql,
)
from runyard.logs.slots import SEARCH_WAIT_S, SearchSlots

DEFAULT_RETENTION_DAYS = 30
_PARTITION = re.compile(r"^log_lines_p(\d{8})$")
#: Connections a batch is written on at once (`ingest_parts` in logs.yaml): index
#: upkeep (the trigram index above all) is most of an insert's time and runs on
#: one core per connection. `benchmarks/logs.py --quick` on 2 cores, with the
#: text search index the store then had: 15,000 lines/s in one part, 17,700 in
#: two, 19,000 in four; without it, 25,000-29,000 in two, four or eight.
DEFAULT_PARTS = 4
#: Seconds one query of the lines may run (`LogStore.query_timeout_s`; logs.yaml
#: `query_timeout_s`): below the gateway's wait for the log service.
QUERY_TIMEOUT_S = 50.0
#: How many searches' words `LogStore` keeps split, and the longest `words` kept
#: (a longer one is split again for every page): at most about 0.5 MiB.
KEPT_WORD_SPLITS, KEPT_WORDS_CHARS = 256, 1024
#: How far apart in time a numbered line and its repeat may be stored (a deployer
#: reads a worker's file again after a restart: seconds to hours later).
REPEAT_WINDOW = timedelta(days=2)
#: Each line's own fields are arrays ($1-$5: its stream's number in $6-$10, time,
#: seq, identity, text); its stream's fields are given once per stream ($6-$10).
_INSERT = """
INSERT INTO log_lines (at, task_id, run, attempt, worker, stream, seq, dedupe, line)
SELECT r.at, ($6::text[])[r.s], ($7::int[])[r.s], ($8::int[])[r.s], ($9::int[])[r.s],
       ($10::text[])[r.s], r.seq, r.dedupe, r.line
FROM unnest($1::int[], $2::timestamptz[], $3::bigint[], $4::uuid[], $5::text[])
    AS r(s, at, seq, dedupe, line)
WHERE r.seq IS NULL OR NOT EXISTS (
    SELECT 1 FROM log_lines l
    WHERE l.dedupe = r.dedupe AND l.at BETWEEN r.at - $11::interval AND r.at + $11::interval
)
ON CONFLICT DO NOTHING
"""

#: The stored numbers of one worker's stream in [$6, $7), as ranges [lo, hi).
_STORED_RANGES = """
SELECT min(seq) AS lo, max(seq) + 1 AS hi FROM (
    SELECT seq, seq - row_number() OVER (ORDER BY seq) AS island FROM (
        SELECT DISTINCT seq FROM log_lines
        WHERE task_id = $1 AND run = $2 AND attempt = $3 AND worker = $4 AND stream = $5
          AND seq IS NOT NULL AND seq >= $6 AND seq < $7
    ) numbers
) islands GROUP BY island ORDER BY lo
"""
#: The most missing ranges one answer of `missing` lists.
MAX_MISSING_RANGES = 1000

#: Tracebacks looked at for the first error: the run's last ones (the failure is
#: near the workers' exits).
MAX_TRACEBACKS = 200
#: The run's last tracebacks, each with the line naming its exception: the next
#: line of the same worker, stream and rank prefix not indented as a frame (within
#: 10 min). A program's stdout, block-buffered in a pipe, lands between the lines of
#: a traceback on stderr; it is not part of it.
_TRACEBACKS = rf"""
WITH heads AS (
    SELECT at, id, task_id, run, attempt, worker, stream, seq, line,
           coalesce(substring(line FROM '{firsterror.SQL_RANK_PREFIX}'), '') AS prefix
    FROM log_lines
    WHERE task_id = $1 AND run = $2 AND line LIKE '%{firsterror.TRACEBACK}%'
    ORDER BY at DESC, id DESC LIMIT $3
)
SELECT h.at, h.id, h.task_id, h.run, h.attempt, h.worker, h.stream, h.seq, h.line,
       x.line AS exception
FROM heads h LEFT JOIN LATERAL (
    SELECT l.line FROM log_lines l
    WHERE l.task_id = $1 AND l.worker = h.worker AND l.run = $2 AND l.attempt = h.attempt
      AND l.stream = h.stream
      AND (l.at, l.id) > (h.at, h.id) AND l.at < h.at + interval '10 minutes'
      AND starts_with(l.line, h.prefix)
      AND (h.prefix <> '' OR l.line !~ '{firsterror.SQL_RANK_PREFIX}')
      AND substr(l.line, length(h.prefix) + 1) ~ '^[^[:space:]]'
    ORDER BY l.at, l.id LIMIT 1
) x ON true
ORDER BY h.at, h.id
"""


_G = TypeVar("_G", bound=Sized)
#: A worker stream's fields: task, run, attempt, worker, stream.
StreamKey = tuple[str, int, int, int, str]


def _streams(records: Iterable[LogRecord]) -> dict[StreamKey, list[LogRecord]]:
    """`records` by worker stream, each in its order."""
    streams: dict[StreamKey, list[LogRecord]] = {}
    for r in records:
        key = (r.task_id, r.run, r.attempt, r.worker, r.stream)
        lines = streams.get(key)
        if lines is None:
            streams[key] = [r]
        else:
            lines.append(r)
    return streams


def _balanced(groups: Iterable[_G], parts: int) -> list[list[_G]]:
    """`groups` in at most `parts` parts of about the same number of items (the largest
    groups first, each into the smallest part)."""
    ordered = sorted(groups, key=len, reverse=True)
    split: list[list[_G]] = [[] for _ in range(min(parts, len(ordered)))]
    sizes = [0] * len(split)
    for group in ordered:
        smallest = sizes.index(min(sizes))
        split[smallest].append(group)
        sizes[smallest] += len(group)
    return split


def _split(records: Sequence[LogRecord], parts: int) -> list[list[LogRecord]]:
    """`records` in at most `parts` parts of about the same size, each worker stream
    whole in one part (the largest streams first, each into the smallest part)."""
    return [
        [r for lines in part for r in lines]
        for part in _balanced(_streams(records).values(), parts)
    ]


@dataclass(frozen=True, slots=True)
class _StreamLines:
    """The lines of one worker stream in a batch, each with its identity under
    redelivery (the store's `dedupe`), as asyncpg takes a uuid."""

    key: StreamKey
    records: list[LogRecord]
    identities: list[uuid.UUID | str]

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def of(cls, key: StreamKey, records: Iterable[LogRecord]) -> _StreamLines:
        """`records` of the stream `key` with their identities, the repeats of a
        numbered line dropped (the first is kept).

        A numbered line's identity is `LogRecord.dedupe`: the MD5 of the stream's
        fields and the number. The stream's part is hashed once and the hash state
        copied for each number: the same value (rows stored before dedupe against
        it) at a fifth of the time of hashing each line's key whole. An unnumbered
        line's is the record's own (the hash of its message)."""
        kept: list[LogRecord] = []
        identities: list[uuid.UUID | str] = []
        seen: set[int] = set()
        stream: Any = None
        for r in records:
            if r.seq is None:
                kept.append(r)
                identities.append(r.dedupe)
                continue
            if r.seq in seen:
                continue
            seen.add(r.seq)
            if stream is None:
                stream = hashlib.md5(numbered_key(*key).encode(), usedforsecurity=False)
            h = stream.copy()
            h.update(b"%d" % r.seq)
            kept.append(r)
            identities.append(h.hexdigest())
        return cls(key, kept, identities)


@dataclass(frozen=True, slots=True)
class WorkerStream:
    """One output stream of one worker of one attempt: where a line's `seq` counts."""

    task_id: str
    run: int
    attempt: int
    worker: int
    stream: str

    def key(self) -> list[Any]:
        return [self.task_id, self.run, self.attempt, self.worker, self.stream]


def logs_migrations() -> list[Migration]:
    """The log service's tables."""
    return load_migrations("logs", Path(str(resources.files("runyard.logs") / "migrations")))


def _line(row: asyncpg.Record) -> LogLine:
    return LogLine(**{k: row[k] for k in LogLine.__slots__})


def partition_name(day: date) -> str:
    return f"log_lines_p{day:%Y%m%d}"


@dataclass(frozen=True, slots=True)
class LogLine:
    """A stored line, as the API answers it."""

    at: datetime
    id: int
    task_id: str
    run: int
    attempt: int
    worker: int
    stream: str
    seq: int | None
    line: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "run": self.run,
            "attempt": self.attempt,
            "worker": self.worker,
            "stream": self.stream,
            "line": self.line,
        }

    @property
    def position(self) -> Position:
        return Position(self.at, self.id)


@dataclass(frozen=True)
class LogPage:
    lines: list[LogLine]
    #: Where the next page starts; None when this page was the last.
    next_cursor: str | None
    #: Where this page ended (the cursor given when it is empty): a live tail
    #: passes it back to get the lines written since.
    tail_cursor: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": [ln.to_json() for ln in self.lines],
            "next_cursor": self.next_cursor,
            "tail_cursor": self.tail_cursor,
        }


@dataclass(frozen=True)
class FirstError:
    line: LogLine
    before: list[LogLine]
    after: list[LogLine]
    classification: firsterror.Classification
    #: For a traceback, the line naming its exception (None: not one, or cut short).
    exception: LogLine | None = None

    def to_json(self) -> dict[str, Any]:
        c = self.classification
        return {
            "line": self.line.to_json(),
            "exception": self.exception.to_json() if self.exception else None,
            "before": [ln.to_json() for ln in self.before],
            "after": [ln.to_json() for ln in self.after],
            "layer": c.layer,
            "rule": c.rule,
            "why": c.why,
            "evidence": c.evidence,
        }


class LogStore:
    """Log lines in Postgres."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        parts: int = DEFAULT_PARTS,
        query_timeout_s: float = QUERY_TIMEOUT_S,
        searches: SearchSlots | None = None,
        search_wait_s: float = SEARCH_WAIT_S,
    ):
        self.pool = pool
        #: The searches that run at once, per tenant and in all (`_fetch`), and how
        #: long one asked through the API waits for its turn.
        self.searches = searches or SearchSlots()
        self.search_wait_s = search_wait_s
        #: How long one query of a search, count, export or follow page may run in
        #: Postgres before it is cancelled there (`_fetch`).
        self.query_timeout_s = query_timeout_s
        self.retention_days = retention_days
        #: Connections a batch is written on at once (see `ingest`).
        self.parts = max(1, parts)
        self._days: set[date] = set()
        #: `words` of recent searches -> their words (`_words`).
        self._word_splits: dict[str, list[str]] = {}

    async def migrate(self) -> None:
        async with self.pool.acquire() as conn:
            await apply_migrations(conn, logs_migrations())

    # --- partitions -------------------------------------------------------------

    async def ensure_partitions(self, days: Iterable[date]) -> list[str]:
        """Create the day partitions that do not exist yet; return those created."""
        created = []
        for day in sorted(set(days) - self._days):
            name = partition_name(day)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            async with self.pool.acquire() as conn:
                exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name)
                if not exists:
                    try:
                        await conn.execute(
                            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF log_lines"
                            f" FOR VALUES FROM ('{start.isoformat()}')"
                            f" TO ('{(start + timedelta(days=1)).isoformat()}')"
                        )
                        created.append(name)
                    except (asyncpg.DuplicateTableError, asyncpg.UniqueViolationError):
                        pass  # another ingester created it meanwhile
            self._days.add(day)
        return created

    async def partitions(self) -> list[date]:
        rows = await self.pool.fetch(
            """SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'log_lines'::regclass"""
        )
        days = []
        for row in rows:
            if match := _PARTITION.match(row["relname"]):
                days.append(datetime.strptime(match.group(1), "%Y%m%d").date())
        return sorted(days)

    async def maintain(self, now: datetime, *, ahead_days: int = 3) -> list[str]:
        """Create partitions up to `ahead_days` ahead; drop those past retention.
        Returns the partitions dropped."""
        today = now.astimezone(UTC).date()
        await self.ensure_partitions(today + timedelta(days=d) for d in range(ahead_days + 1))
        cutoff = self.cutoff(now).date()
        dropped = []
        for day in await self.partitions():
            if day < cutoff:  # the whole day is older than the retention window
                async with self.pool.acquire() as conn:
                    await conn.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
                self._days.discard(day)
                dropped.append(partition_name(day))
        return dropped

    def cutoff(self, now: datetime) -> datetime:
        """Lines older than this are past retention."""
        return now - timedelta(days=self.retention_days)

    # --- ingest -----------------------------------------------------------------

    async def ingest(self, records: Sequence[LogRecord], *, now: datetime | None = None) -> int:
        """Store a batch; return how many lines were new (redelivered ones are skipped).
        Lines already past retention are dropped."""
        cutoff = self.cutoff(now or datetime.now(UTC))
        streams = [
            _StreamLines.of(key, lines)
            for key, lines in _streams(r for r in records if r.at >= cutoff).items()
        ]
        if not streams:
            return 0
        ats = [r.at for lines in streams for r in lines.records]
        days = {min(ats).astimezone(UTC).date(), max(ats).astimezone(UTC).date()}
        if len(days) > 1:  # not all of one day (seldom): the days the lines are of
            days = {at.astimezone(UTC).date() for at in ats}
        await self.ensure_partitions(days)
        parts = _balanced(streams, self.parts)
        if len(parts) == 1:
            return await self._insert(parts[0])
        # Not a TaskGroup: on Python 3.11 a failed child leaves a cancellation counted
        # on the caller's task (the batch that then waits out the outage).
        inserts = [asyncio.ensure_future(self._insert(part)) for part in parts]
        try:
            stored = await asyncio.gather(*inserts)
        except BaseException:  # the first error raised (an outage is waited out)
            for insert in inserts:  # a part that fails cancels the others
                insert.cancel()
            await asyncio.gather(*inserts, return_exceptions=True)
            raise
        return sum(stored)

    async def _insert(self, part: Sequence[_StreamLines]) -> int:
        """One insert of whole worker streams: each line's own fields as arrays, and
        its stream's fields once per stream (a line has its stream's number)."""
        numbers: list[int] = []
        for n, lines in enumerate(part, 1):
            numbers += [n] * len(lines.records)
        records = [r for lines in part for r in lines.records]
        result = await self.pool.execute(
            _INSERT,
            numbers,
            [r.at for r in records],
            [r.seq for r in records],
            [i for lines in part for i in lines.identities],
            [r.line for r in records],
            [lines.key[0] for lines in part],
            [lines.key[1] for lines in part],
            [lines.key[2] for lines in part],
            [lines.key[3] for lines in part],
            [lines.key[4] for lines in part],
            REPEAT_WINDOW,
        )
        return int(result.rsplit(" ", 1)[-1])

    async def missing(
        self, stream: WorkerStream, start: int, below: int
    ) -> tuple[list[tuple[int, int]], bool]:
        """The numbers in [start, below) of `stream` with no stored line, as ranges
        [lo, hi), and whether there were more than `MAX_MISSING_RANGES` of them (the
        list then holds the first ones)."""
        rows = await self._timed(_STORED_RANGES, [*stream.key(), start, below])
        gaps: list[tuple[int, int]] = []
        at = start
        for row in rows:
            if row["lo"] > at:
                gaps.append((at, int(row["lo"])))
            at = int(row["hi"])
        if at < below:
            gaps.append((at, below))
        return gaps[:MAX_MISSING_RANGES], len(gaps) > MAX_MISSING_RANGES

    # --- queries ----------------------------------------------------------------

    async def page(self, query: LogQuery) -> LogPage:
        """One page of matching lines and the cursor of the next (None: no more)."""
        sql, args = page_sql(query, await self._words(query))
        rows = await self._fetch(sql, args, query)
        lines = [LogLine(**dict(r)) for r in rows[: query.limit]]
        last = lines[-1].position.encode() if lines else query.cursor
        return LogPage(lines, last if len(rows) > query.limit else None, last)

    async def count(self, query: LogQuery) -> int:
        sql, args = count_sql(query, await self._words(query))
        return int((await self._fetch(sql, args, query))[0][0])

    async def scan(self, query: LogQuery, batch: int = 1000) -> AsyncIterator[list[LogLine]]:
        """Every matching line, page by page."""
        page = await self.page(replace(query, limit=batch, cursor=None))
        yield page.lines
        while page.next_cursor:
            page = await self.page(replace(query, limit=batch, cursor=page.next_cursor))
            yield page.lines

    async def latest_run(self, task_id: str) -> int | None:
        value = await self.pool.fetchval(
            "SELECT max(run) FROM log_lines WHERE task_id = $1", task_id
        )
        return None if value is None else int(value)

    async def first_error(
        self, task_id: str, run: int | None = None, *, before: int = 5, asker: str | None = None
    ) -> FirstError | None:
        """The first error of a run (the latest by default), across workers: the failing
        worker's final traceback, else the earliest error line that is not a warning,
        else the earliest warning (the rules: `runyard.logs.firsterror`). Its search of
        error lines is `asker`'s (a tenant's share of the searches at once)."""
        if run is None and (run := await self.latest_run(task_id)) is None:
            return None
        rows = await self.pool.fetch(_TRACEBACKS, task_id, run, MAX_TRACEBACKS)
        heads = {(r["at"], r["id"]): _line(r) for r in rows}
        chosen = firsterror.choose_traceback(
            [
                firsterror.Traceback(r["attempt"], r["worker"], r["at"], r["id"], r["exception"])
                for r in rows
            ]
        )
        if chosen is not None:
            return await self._explain(heads[(chosen.at, chosen.id)], before)
        warning: LogLine | None = None
        query = LogQuery(
            task_id, run=run, regex=firsterror.SQL_CANDIDATE, ignore_case=True, asker=asker
        )
        async for lines in self.scan(query, batch=500):
            for line in lines:
                if not firsterror.is_error(line.line):
                    continue
                if not firsterror.is_warning(line.line):
                    return await self._explain(line, before)
                warning = warning or line
        return None if warning is None else await self._explain(warning, before)

    async def _explain(self, line: LogLine, before: int) -> FirstError:
        """`line` with its context: the lines before it of its worker, and after it
        those of the same rank (a traceback's lines carry the rank's prefix), up to a
        traceback's exception line (and of the same stream: see `_TRACEBACKS`); the
        layer from that block."""
        same = "task_id = $1 AND run = $2 AND attempt = $3 AND worker = $4"
        args = (line.task_id, line.run, line.attempt, line.worker, line.at, line.id)
        columns = "at, id, task_id, run, attempt, worker, stream, seq, line"
        earlier = await self.pool.fetch(
            f"SELECT {columns} FROM log_lines WHERE {same} AND (at, id) < ($5, $6)"
            f" ORDER BY at DESC, id DESC LIMIT {before}",
            *args,
        )
        later = await self.pool.fetch(
            f"SELECT {columns} FROM log_lines WHERE {same} AND (at, id) > ($5, $6)"
            " ORDER BY at, id LIMIT 240",
            *args,
        )
        after = [LogLine(**dict(r)) for r in later]
        if firsterror.is_traceback(line.line):
            rank = firsterror.rank_prefix(line.line)
            after = [
                a
                for a in after
                if a.stream == line.stream and firsterror.rank_prefix(a.line) == rank
            ]
        texts = [line.line] + [a.line for a in after]
        block = firsterror.error_block(texts)
        end = firsterror.traceback_exception(texts)
        return FirstError(
            line,
            [LogLine(**dict(r)) for r in reversed(earlier)],
            after[: max(len(block) - 1, 5)],
            firsterror.classify(block),
            after[end - 1] if end is not None else None,
        )

    async def _words(self, query: LogQuery) -> list[str]:
        """The words of `query.words` as the database splits them (`WORDS_SQL`); kept
        for the last `KEPT_WORD_SPLITS` searches, since a follow, an export or a
        reader paging asks again for every page (the split depends only on the
        database's locale)."""
        if query.words is None:
            return []
        words = self._word_splits.get(query.words)
        if words is None:
            words = list(await self.pool.fetchval(WORDS_SQL, query.words))
            if len(query.words) <= KEPT_WORDS_CHARS:
                if len(self._word_splits) >= KEPT_WORD_SPLITS:
                    del self._word_splits[next(iter(self._word_splits))]  # the oldest
                self._word_splits[query.words] = words
        check_words(query, words)
        return words

    async def _fetch(self, sql: str, args: list[Any], query: LogQuery) -> list[asyncpg.Record]:
        """Run a query of the lines; one that runs past `query_timeout_s` is cancelled
        in Postgres (asyncpg's timeout sends the cancel) and refused: a regular
        expression Postgres takes minutes on (back-references on a long line) must not
        hold a database process, and the CPU every tenant's work shares, after its
        asker gave up. A tenant's search waits for a slot of `searches` first."""
        if query.asker is None or not query.searches:
            return await self._timed(sql, args)
        wait_s = None if query.patient else self.search_wait_s
        async with self.searches.taken(query.asker, wait_s):
            return await self._timed(sql, args)

    async def _timed(self, sql: str, args: list[Any]) -> list[asyncpg.Record]:
        try:
            return list(await self.pool.fetch(sql, *args, timeout=self.query_timeout_s))
        except (TimeoutError, asyncpg.QueryCanceledError) as exc:
            raise InvalidQuery(
                "logs.query_too_slow",
                f"the log query was stopped after {self.query_timeout_s:g} s",
                "narrow it with a worker, a run or attempt, or a time range, or search"
                " words or a phrase; a regular expression with back-references (\\1)"
                " can take Postgres minutes on a long line",
            ) from exc
        except asyncpg.InvalidRegularExpressionError as exc:
            why = str(exc).removeprefix("invalid regular expression: ")  # Postgres says it
            raise InvalidQuery(
                "logs.bad_regex",
                f"invalid regular expression: {why}",
                "POSIX regular expressions, e.g. 'loss=[0-9.]+'",
                "regex",
            ) from exc
