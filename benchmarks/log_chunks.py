"""A candidate design for the log store, measured beside the running one.

Not what Runyard runs (that is `runyard.logs.store`, measured by
`benchmarks/logs.py`): the design of docs/adr/0010-chunked-log-store.md, on the
same corpus (`logs.corpus`: numbered lines of 8 workers) and the same embedded
Postgres with its default durability, in the same run as the running store's
own ingest path, so that `vs_store` compares the two under the same load.

The candidate keeps one row per chunk: at most `--chunk` (16) consecutive lines
of one worker stream from one batch, the lines joined by newlines in one text
column (`body`), their times and numbers as arrays. The indexes work per chunk:
a trigram GIN index on the body and, unless `--no-words`, the word index
(`log_words`) on the body; a b-tree on (task, first time); and a b-tree on
(worker stream, first number) for repeats. A batch reads, in one statement, the
number ranges its worker streams already have stored and drops the lines in
them (a line read again by a new deployer, or a redelivered batch); the chunks
are written with COPY, in parts on four connections, while the next batch is
decoded.

Searches first take the chunks whose index matches, then count the lines in
them: a regular expression with `regexp_count` over the body (newline-sensitive,
so `^` and `$` are a line's ends), a phrase and a word per line (a word as
`\\m<word>\\M`, case-insensitive: the running store's words are runs of letters,
digits and `_`, which is what those bounds delimit). Each figure is the median
of 5 runs after a warm-up; counts must agree with grep's.

The last line is exactly
`log_chunks: chunk=<c> ingest_lines_per_s=<n> vs_store=<r> word_vs_grep=<r1> phrase_vs_grep=<r2> regex_vs_grep=<r3>`
where `vs_store` is the candidate's ingest rate over the running store's.
"""  # noqa: E501

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from logs import (
    BATCH,
    PHRASE,
    QUICK,
    REGEX,
    TASK,
    WORD,
    batches,
    corpus,
    grep_count,
    postgres,
    read_again_later,
)
from runyard.contracts.loglines import LogRecord
from runyard.logs import LogIngester, LogStore
from runyard.messaging import KafkaSettings

PARTS = 4
SCHEMA = """
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE OR REPLACE FUNCTION log_words(line text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN to_tsvector('simple', regexp_replace(line, '[^[:alnum:]_]+', ' ', 'g'));
CREATE TABLE log_chunks (
    id        bigserial,
    task_id   text        NOT NULL,
    run       int         NOT NULL,
    attempt   int         NOT NULL,
    worker    int         NOT NULL,
    stream    text        NOT NULL,
    first_at  timestamptz NOT NULL,
    last_at   timestamptz NOT NULL,
    first_seq bigint,
    last_seq  bigint,
    ats       timestamptz[] NOT NULL,
    seqs      bigint[],
    body      text        NOT NULL
);
CREATE INDEX log_chunks_task_time ON log_chunks (task_id, first_at);
CREATE INDEX log_chunks_numbers ON log_chunks (task_id, run, attempt, worker, stream, first_seq)
    WHERE first_seq IS NOT NULL;
CREATE INDEX log_chunks_trigrams ON log_chunks USING gin (body gin_trgm_ops);
"""
WORDS_INDEX = "CREATE INDEX log_chunks_words ON log_chunks USING gin (log_words(body));"
COLUMNS = (
    "task_id",
    "run",
    "attempt",
    "worker",
    "stream",
    "first_at",
    "last_at",
    "first_seq",
    "last_seq",
    "ats",
    "seqs",
    "body",
)
#: The stored number ranges of the batch's worker streams that overlap its own.
STORED = """
SELECT c.task_id, c.run, c.attempt, c.worker, c.stream, c.first_seq, c.last_seq
FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::text[], $6::bigint[], $7::bigint[])
    AS s(task_id, run, attempt, worker, stream, lo, hi)
JOIN LATERAL (
    SELECT * FROM log_chunks c
    WHERE c.task_id = s.task_id AND c.run = s.run AND c.attempt = s.attempt
      AND c.worker = s.worker AND c.stream = s.stream
      AND c.first_seq IS NOT NULL AND c.first_seq <= s.hi AND c.last_seq >= s.lo
) c ON true
"""
Stream = tuple[str, int, int, int, str]
COUNTS = {
    "word": (
        "SELECT coalesce(sum((SELECT count(*) FROM unnest(string_to_array(body, E'\\n')) l"
        " WHERE l ~* $2)), 0) FROM log_chunks WHERE task_id = $1 AND {words}"
    ),
    "phrase": (
        "SELECT coalesce(sum((SELECT count(*) FROM unnest(string_to_array(body, E'\\n')) l"
        " WHERE strpos(l, $2) > 0)), 0)"
        " FROM log_chunks WHERE task_id = $1 AND body LIKE '%' || $2 || '%'"
    ),
    "regex": (
        "SELECT coalesce(sum(regexp_count(body, '^.*(?:' || $2 || ')', 1, 'n')), 0)"
        " FROM log_chunks WHERE task_id = $1 AND body ~ $2"
    ),
}


class ChunkStore:
    """The candidate's ingest (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, chunk: int) -> None:
        self.pool = pool
        self.chunk = chunk

    async def ingest(self, records: Sequence[LogRecord]) -> int:
        streams: dict[Stream, list[LogRecord]] = {}
        for r in records:
            streams.setdefault((r.task_id, r.run, r.attempt, r.worker, r.stream), []).append(r)
        stored = await self._stored(streams)
        rows: list[tuple[Any, ...]] = []
        for key, lines in streams.items():
            taken = sorted(stored.get(key, []))
            fresh = [r for r in lines if r.seq is None or not _within(r.seq, taken)]
            for i in range(0, len(fresh), self.chunk):
                part = fresh[i : i + self.chunk]
                seqs = [r.seq for r in part if r.seq is not None]
                numbered = len(seqs) == len(part)
                rows.append(
                    (
                        *key,
                        part[0].at,
                        part[-1].at,
                        min(seqs) if numbered else None,
                        max(seqs) if numbered else None,
                        [r.at for r in part],
                        [r.seq for r in part],
                        "\n".join(r.line for r in part),
                    )
                )
        await asyncio.gather(*(self._copy(rows[p::PARTS]) for p in range(PARTS)))
        return sum(len(row[9]) for row in rows)  # the lines stored (their times)

    async def _stored(
        self, streams: dict[Stream, list[LogRecord]]
    ) -> dict[Stream, list[tuple[int, int]]]:
        keys = [
            (key, [r.seq for r in lines if r.seq is not None]) for key, lines in streams.items()
        ]
        keys = [(key, seqs) for key, seqs in keys if seqs]
        if not keys:
            return {}
        columns: list[list[Any]] = [[k[i] for k, _ in keys] for i in range(5)]
        found = await self.pool.fetch(
            STORED, *columns, [min(s) for _, s in keys], [max(s) for _, s in keys]
        )
        stored: dict[Stream, list[tuple[int, int]]] = {}
        for row in found:
            key = (row["task_id"], row["run"], row["attempt"], row["worker"], row["stream"])
            stored.setdefault(key, []).append((row["first_seq"], row["last_seq"]))
        return stored

    async def _copy(self, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            async with self.pool.acquire() as conn:
                await conn.copy_records_to_table("log_chunks", records=rows, columns=COLUMNS)


def _within(seq: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether `seq` lies in one of the sorted, closed `ranges`."""
    at = bisect.bisect_right(ranges, (seq, math.inf)) - 1
    return at >= 0 and ranges[at][0] <= seq <= ranges[at][1]


async def timed(pool: asyncpg.Pool, sql: str, *args: Any) -> tuple[float, int]:
    """Median seconds of 5 runs after a warm-up, and the count."""
    count = int(await pool.fetchval(sql, *args))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        count = int(await pool.fetchval(sql, *args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


async def pool_on(fresh: Callable[[], Awaitable[str]]) -> asyncpg.Pool:
    """A pool on a fresh database."""
    return await asyncpg.create_pool(await fresh(), min_size=PARTS, max_size=PARTS)


async def store_rate(fresh: Callable[[], Awaitable[str]], values: list[bytes]) -> float:
    """The running store's ingest on the same corpus (benchmarks/logs.py's path)."""
    pool = await pool_on(fresh)
    try:
        store = LogStore(pool)
        await store.migrate()
        ingester = LogIngester(store, KafkaSettings())
        start = time.perf_counter()
        await ingester.consumer.pipeline(batches(values))
        return len(values) / (time.perf_counter() - start)
    finally:
        await pool.close()


async def bench(
    fresh: Callable[[], Awaitable[str]], n: int, chunk: int, words: bool, workdir: Path
) -> str:
    start = (datetime.now(UTC) - timedelta(seconds=n * 0.002 + 60)).replace(microsecond=0)
    lines = corpus(n, start)
    plain = workdir / "lines.txt"
    plain.write_text("".join(ln["line"] + "\n" for ln in lines))
    values = [json.dumps(ln).encode() for ln in lines]
    baseline = await store_rate(fresh, values)

    pool = await pool_on(fresh)
    try:
        await pool.execute(SCHEMA + (WORDS_INDEX if words else ""))
        store = ChunkStore(pool, chunk)
        ingester = LogIngester(LogStore(pool), KafkaSettings())
        began = time.perf_counter()
        writing: asyncio.Future[int] | None = None
        stored = 0
        for i in range(0, n, BATCH):
            records = ingester.consumer.decode(values[i : i + BATCH])
            if writing is not None:
                stored += await writing
            writing = asyncio.ensure_future(store.ingest(records))
        stored += await writing if writing is not None else 0
        rate = n / (time.perf_counter() - began)
        assert stored == n, f"{stored} of {n} lines stored"
        again = await store.ingest(ingester.consumer.decode(read_again_later(lines)))
        assert again == 0, "lines read again (later, same numbers) must be stored once"
        async with pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE log_chunks")
        chunks = await pool.fetchval("SELECT count(*) FROM log_chunks")

        word_match = "log_words(body) @@ plainto_tsquery('simple', $3)" if words else "body ~* $2"
        searches: list[tuple[str, str, list[Any], list[str]]] = [
            (
                "word",
                COUNTS["word"].format(words=word_match),
                [TASK, rf"\m{WORD}\M", *([WORD] if words else [])],
                ["-w", "-i", WORD],
            ),
            ("phrase", COUNTS["phrase"], [TASK, PHRASE], ["-F", PHRASE]),
            ("regex", COUNTS["regex"], [TASK, REGEX], ["-E", REGEX]),
        ]
        ratios = {}
        print(f"{'search':8} {'chunks ms':>10} {'grep ms':>9} {'ratio':>6} {'matches':>8}")
        for name, sql, args, grep_args in searches:
            ours, count = await timed(pool, sql, *args)
            theirs, expected = grep_count(grep_args, plain)
            assert count == expected, f"{name}: chunks {count} != grep {expected}"
            ratios[name] = ours / theirs
            print(f"{name:8} {ours * 1e3:10.1f} {theirs * 1e3:9.1f} {ours / theirs:6.2f} {count:8}")
    finally:
        await pool.close()
    print(
        f"ingest: running store {baseline:,.0f} lines/s; chunks of {chunk}"
        f" ({chunks:,} rows{'' if words else ', no word index'}) {rate:,.0f} lines/s"
    )
    return (
        f"log_chunks: chunk={chunk} ingest_lines_per_s={rate:.0f} vs_store={rate / baseline:.2f}"
        f" word_vs_grep={ratios['word']:.2f} phrase_vs_grep={ratios['phrase']:.2f}"
        f" regex_vs_grep={ratios['regex']:.2f}"
    )


async def with_server(args: argparse.Namespace) -> str:
    async with postgres("runyard-bench-chunks-") as (fresh, root):
        return await bench(fresh, args.n, args.chunk, not args.no_words, root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=QUICK, help=f"lines (default {QUICK:,})")
    parser.add_argument("--chunk", type=int, default=16, help="most lines a chunk holds")
    parser.add_argument("--no-words", action="store_true", help="no word index: words by trigram")
    print(asyncio.run(with_server(parser.parse_args())))


if __name__ == "__main__":
    main()
