"""Log service benchmark: ingest rate and search latency beside GNU grep.

Runs on a real Postgres with its default durability settings: DATABASE_URL,
or an embedded one started here in a temp dir. The corpus is one task's
output from 8 workers (training steps, NCCL chatter, warnings, checkpoint
saves, a few errors), 1,000,000 lines (`--quick`: 100,000).

- ingest: the log consumer's own path, on numbered lines as the deployer
  publishes them (the `LogIngester`'s
  `LogBatchConsumer.pipeline`: decode the topic's JSON records, one multi-row
  insert per batch of 5,000 while the next batch is decoded, the dedupe,
  b-tree and trigram indexes maintained), lines per second. The broker
  is left out: it is the same for any consumer.
- search: the number of matching lines (`LogStore.count`) for a word, an
  exact phrase and a regular expression, beside `grep -c` on the same lines
  written to a plain file (grep -w -i for the word, -F for the phrase, -E
  for the regex), both measured here; each figure is the median of 5 runs,
  after one warm-up run each. Counts are checked to agree.
- filtered: the first page (200 lines) of one worker in a 10-second window.

The last line is exactly
`logs: ingest_lines_per_s=<n> word_vs_grep=<r1> phrase_vs_grep=<r2> regex_vs_grep=<r3> filtered_ms=<t>`
where each `_vs_grep` is Runyard's time divided by grep's (lower is better).
"""  # noqa: E501

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from bench_db import fresh_database
from runyard.logs import LogIngester, LogQuery, LogStore
from runyard.messaging import KafkaSettings
from runyard.messaging.batches import Polled
from runyard.stack.embedded import EmbeddedPostgres

WORKERS = 8
BATCH = 5000
FULL, QUICK = 1_000_000, 100_000
TASK = "bench-task"
WORD = "checkpoint"
PHRASE = "saved checkpoint to"
REGEX = r"grad_norm=[0-9]+\.[0-9]+e\+0[3-9]"


def corpus(n: int, start: datetime, seed: int = 7) -> list[dict[str, Any]]:
    """`n` realistic lines from 8 workers, about 2 ms apart, each numbered in its
    worker's stream as the deployer numbers what it reads (`seq`, the store's
    dedupe key for such a line)."""
    rnd = random.Random(seed)
    lines = []
    numbers: dict[tuple[int, str], int] = {}
    for i in range(n):
        worker = i % WORKERS
        step = i // WORKERS
        roll = rnd.random()
        if roll < 0.002:
            text = f"[rank{worker}] saved checkpoint to /ckpt/run1/checkpoint-{step}.pt in 3.1s"
        elif roll < 0.004:
            text = (
                f"[rank{worker}] step {step}"
                f" grad_norm={rnd.uniform(1, 9):.3f}e+0{rnd.randint(0, 9)} (clipped)"
            )
        elif roll < 0.03:
            peer = (worker + 1) % WORKERS
            text = f"NCCL INFO Channel {rnd.randint(0, 31):02d}/0 : {worker}[{worker}] -> {peer}"
        elif roll < 0.04:
            text = (
                "UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed"
            )
        elif roll < 0.0401:
            text = "RuntimeError: CUDA error: an illegal memory access was encountered"
        else:
            text = (
                f"epoch {step // 5000} step {step} loss={rnd.uniform(0.5, 3):.4f}"
                f" lr={rnd.uniform(1e-5, 3e-4):.2e} tokens/s={rnd.randint(90_000, 130_000)}"
            )
        at = start + timedelta(microseconds=2000 * i + rnd.randint(0, 999))
        stream = "stderr" if "Warning" in text or "Error" in text else "stdout"
        seq = numbers.get((worker, stream), 0)
        numbers[(worker, stream)] = seq + 1
        lines.append(
            {
                "at": at.isoformat(),
                "task_id": TASK,
                "run": 1,
                "attempt": 1,
                "worker": worker,
                "stream": stream,
                "seq": seq,
                "line": text,
            }
        )
    return lines


async def batches(values: list[bytes]) -> AsyncIterator[Polled]:
    """The topic's messages as the consumer would poll them (no broker)."""

    async def committed() -> None:
        return None

    for i in range(0, len(values), BATCH):
        yield list(values[i : i + BATCH]), committed


async def timed(fn: Callable[[], Awaitable[Any]], runs: int = 5) -> tuple[float, Any]:
    """Median seconds of `runs` calls after one warm-up, and the last result."""
    result = await fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        result = await fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def grep_count(args: list[str], path: Path, runs: int = 5) -> tuple[float, int]:
    def once() -> int:
        done = subprocess.run(["grep", "-c", *args, str(path)], capture_output=True, check=False)
        return int(done.stdout or 0)

    count = once()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        count = once()
        times.append(time.perf_counter() - t)
    return statistics.median(times), count


async def bench(dsn: str, n: int, workdir: Path) -> str:
    start = (datetime.now(UTC) - timedelta(seconds=n * 0.002 + 60)).replace(microsecond=0)
    lines = corpus(n, start)
    plain = workdir / "lines.txt"
    plain.write_text("".join(ln["line"] + "\n" for ln in lines))
    values = [json.dumps(ln).encode() for ln in lines]

    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    try:
        store = LogStore(pool)
        await store.migrate()
        ingester = LogIngester(store, KafkaSettings())
        t = time.perf_counter()
        await ingester.consumer.pipeline(batches(values))
        ingest_s = time.perf_counter() - t
        assert ingester.stats.stored == n, ingester.stats
        again = await ingester.ingest(ingester.consumer.decode(values[:BATCH]))
        assert again == 0, "a redelivered batch must store nothing"
        reread = await ingester.ingest(ingester.consumer.decode(read_again_later(lines)))
        assert reread == 0, "lines a new deployer reads again (later, same numbers) are stored once"
        async with pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE log_lines")  # what autovacuum does after a load

        rows: list[tuple[str, float, float, int]] = []
        searches = (
            ("word", LogQuery(TASK, words=WORD), ["-w", "-i", WORD]),
            ("phrase", LogQuery(TASK, phrase=PHRASE), ["-F", PHRASE]),
            ("regex", LogQuery(TASK, regex=REGEX), ["-E", REGEX]),
        )
        for name, query, grep_args in searches:
            ours, count = await timed(lambda q=query: store.count(q))  # type: ignore[misc]
            theirs, expected = grep_count(grep_args, plain)
            assert count == expected, f"{name}: runyard {count} != grep {expected}"
            rows.append((name, ours, theirs, count))

        window_start = start + timedelta(seconds=n * 0.002 / 2)
        filtered = LogQuery(
            TASK, workers=(3,), since=window_start, until=window_start + timedelta(seconds=9)
        )
        filtered_s, page = await timed(lambda: store.page(filtered))
    finally:
        await pool.close()

    print(f"corpus: {n:,} lines, {WORKERS} workers, {plain.stat().st_size / 1e6:.0f} MB as text")
    print(f"ingest: {n / ingest_s:,.0f} lines/s ({ingest_s:.1f} s, batches of {BATCH})")
    print(f"{'search':8} {'runyard ms':>11} {'grep ms':>9} {'ratio':>6} {'matches':>8}")
    for name, ours, theirs, count in rows:
        print(f"{name:8} {ours * 1e3:11.1f} {theirs * 1e3:9.1f} {ours / theirs:6.2f} {count:8}")
    print(f"filtered: worker 3, 10 s window: {len(page.lines)} lines in {filtered_s * 1e3:.1f} ms")
    ratio = {name: ours / theirs for name, ours, theirs, _ in rows}
    return (
        f"logs: ingest_lines_per_s={n / ingest_s:.0f} word_vs_grep={ratio['word']:.2f}"
        f" phrase_vs_grep={ratio['phrase']:.2f} regex_vs_grep={ratio['regex']:.2f}"
        f" filtered_ms={filtered_s * 1e3:.1f}"
    )


@contextlib.asynccontextmanager
async def postgres(prefix: str) -> AsyncIterator[tuple[Callable[[], Awaitable[str]], Path]]:
    """A way to make fresh databases on a Postgres server (DATABASE_URL, else an
    embedded one with its default durability), and a temp dir; the databases, the
    embedded server and the dir are gone afterwards."""
    base = os.environ.get("DATABASE_URL")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    pg: EmbeddedPostgres | None = None
    made: list[str] = []
    try:
        if base is None:
            pg = EmbeddedPostgres(root / "data")  # default durability
            base = pg.start()
        server = base

        async def fresh() -> str:
            dsn = await fresh_database(server)
            made.append(dsn.rpartition("/")[2])
            return dsn

        yield fresh, root
    finally:
        if made and base is not None:
            admin = await asyncpg.connect(base)
            try:
                for name in made:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def read_again_later(lines: list[dict[str, Any]], seconds: float = 30) -> list[bytes]:
    """The first batch of `lines` as a new deployer publishes it when it reads the
    files again: the same numbers, stamped `seconds` later."""
    later = timedelta(seconds=seconds)
    return [
        json.dumps({**ln, "at": (datetime.fromisoformat(ln["at"]) + later).isoformat()}).encode()
        for ln in lines[:BATCH]
    ]


async def with_server(args: argparse.Namespace) -> str:
    async with postgres("runyard-bench-logs-") as (fresh, root):
        return await bench(await fresh(), QUICK if args.quick else FULL, root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK:,} lines instead of {FULL:,}")
    print(asyncio.run(with_server(parser.parse_args())))


if __name__ == "__main__":
    main()
