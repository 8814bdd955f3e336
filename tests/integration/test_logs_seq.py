"""Per-line sequence numbers: the deployer's runtime numbers each line of a
worker's stream before its bounded queue, the record carries `seq`, and the log
store dedupes on it (the hash of the line stays the key of records without it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from runyard.contracts.loglines import LogRecord
from runyard.logs import LogQuery, LogStore

from tests.integration.test_deployer import Harness, h, make_spec  # noqa: F401 (fixture)
from tests.integration.test_deployer_recovery import World, world  # noqa: F401 (fixture)
from tests.integration.test_deployer_recovery import make_spec as recovery_spec
from tests.log_records import log_record

pytestmark = pytest.mark.integration

AT = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=123456)


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[LogStore]:
    import asyncpg

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        logs = LogStore(pool)
        await logs.migrate()
        yield logs
    finally:
        await pool.close()


def numbered(text: str, seqs: range, stream: str = "stdout") -> list[LogRecord]:
    return [log_record(AT, "t-seq", text, stream=stream, seq=s) for s in seqs]


async def test_identical_lines_in_one_microsecond_are_kept_when_seq_differs(
    store: LogStore,
) -> None:
    assert await store.ingest(numbered("step done", range(3))) == 3
    # the same numbers on the other stream are other lines (numbered per stream)
    assert await store.ingest(numbered("step done", range(3), "stderr")) == 3
    # without seq the same line at the same microsecond is one line (the hash fallback)
    plain = [log_record(AT, "t-seq", "step done", worker=1) for _ in range(3)]
    assert await store.ingest(plain) == 1
    lines = (await store.page(LogQuery("t-seq"))).lines
    assert sorted((ln.worker, ln.stream, ln.seq) for ln in lines) == [
        (0, "stderr", 0),
        (0, "stderr", 1),
        (0, "stderr", 2),
        (0, "stdout", 0),
        (0, "stdout", 1),
        (0, "stdout", 2),
        (1, "stdout", None),
    ]


async def test_redelivery_with_seq_stores_nothing_twice(store: LogStore) -> None:
    messages = [r.to_bytes() for r in numbered("loss=1.0", range(5))]
    assert await store.ingest([LogRecord.from_bytes(m) for m in messages]) == 5
    # the consumer restarts: the same messages again, and a batch overlapping them
    assert await store.ingest([LogRecord.from_bytes(m) for m in messages]) == 0
    more = numbered("loss=1.0", range(3, 8))
    assert await store.ingest(more) == 3  # 3 and 4 were stored already
    assert await store.ingest([LogRecord.from_bytes(m) for m in reversed(messages)]) == 0
    assert await store.count(LogQuery("t-seq")) == 8
    # a record built in code and the parsed message of the same line are one line
    assert LogRecord.from_bytes(messages[0]).dedupe == numbered("loss=1.0", range(1))[0].dedupe


async def test_the_runtime_numbers_each_stream_of_each_worker(h: Harness) -> None:  # noqa: F811
    command = "for i in 1 2 3; do echo same; echo same >&2; done; echo last"
    await h.launch("seq", make_spec(command, workers=2))
    assert (await h.state("seq")).status == "succeeded"
    for worker in (0, 1):
        for stream, count in (("stdout", 4), ("stderr", 3)):
            mine = [x for x in h.lines if x.worker == worker and x.stream == stream]
            assert [x.seq for x in mine] == list(range(count)), mine
    # what the deployer publishes carries it, and the store keeps every line
    published = [LogRecord.from_bytes(x.record().to_bytes()) for x in h.lines]
    assert all(r.seq is not None for r in published)
    same_time = [r.model_copy(update={"at": AT}) for r in published]
    pool = h.store.pool
    logs = LogStore(pool)
    await logs.migrate()
    assert await logs.ingest(same_time) == 14  # identical lines, one microsecond: all kept
    assert await logs.ingest(same_time) == 0


async def test_a_new_deployer_numbers_on_where_the_last_one_stopped(world: World) -> None:  # noqa: F811
    app1, _ = world.deployer()
    placed = await world.submit_and_place(
        "resume", recovery_spec("echo one; echo two; sleep 2; echo three; exit 0")
    )
    for event in placed:
        await app1.handle(event)
    await world.until("resume", lambda s: s.status == "running")
    await asyncio.sleep(0.5)  # "one" and "two" published, their offset and numbers saved
    app1.detach()  # the deployer dies; its worker does not
    app2, _ = world.deployer()
    assert await app2.reconcile() == ["resume"]
    await asyncio.wait_for(app2.drain(), 8)
    assert [(x.line, x.seq) for x in world.lines] == [("one", 0), ("two", 1), ("three", 2)]


async def test_a_numbered_line_read_again_later_is_stored_once(store: LogStore) -> None:
    first = numbered("step", range(4))
    assert await store.ingest(first) == 4
    # A new deployer reads the file again from an older offset: the same numbers,
    # read (and stamped) seconds later. Only the lines not stored yet are new.
    later = [
        r.model_copy(update={"at": r.at + timedelta(seconds=7)})
        for r in numbered("step", range(2, 6))
    ]
    assert await store.ingest(later) == 2
    # Twice in one batch, at two times: the first is kept.
    twice = numbered("step", range(6, 7))
    twice += [twice[0].model_copy(update={"at": twice[0].at + timedelta(seconds=1)})]
    assert await store.ingest(twice) == 1
    assert await store.count(LogQuery("t-seq")) == 7


async def test_a_batch_written_in_parts_keeps_each_stream_whole_and_in_order(dsn: str) -> None:
    """A batch is split by worker stream over several connections: every line is
    stored once, a repeat read again later is still skipped, and each stream reads
    back in its order."""
    import asyncpg
    from runyard.logs.store import _split

    streams = [(w, s) for w in range(4) for s in ("stdout", "stderr")]
    batch = [
        log_record(
            AT + timedelta(milliseconds=seq),
            "t-parts",
            f"w{w} {s} {seq}",
            worker=w,
            stream=s,
            seq=seq,
        )
        for seq in range(40)
        for w, s in streams
        if s == "stdout" or seq % 4 == 0  # stderr streams are smaller
    ]
    parts = _split(batch, 3)
    assert len(parts) == 3 and sorted(map(len, parts)) == [60, 60, 80]
    for part in parts:  # each stream whole in one part
        others = [p for p in parts if p is not part]
        mine = {(r.worker, r.stream) for r in part}
        assert not mine & {(r.worker, r.stream) for p in others for r in p}
    assert [len(p) for p in _split(batch[:1], 3)] == [1]

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        logs = LogStore(pool, parts=3)
        await logs.migrate()
        assert await logs.ingest(batch) == len(batch) == 200
        # a new deployer reads every stream again from line 30: later times, same numbers
        again = [
            r.model_copy(update={"at": r.at + timedelta(seconds=30)})
            for r in batch
            if (r.seq or 0) >= 30
        ]
        assert await logs.ingest(again) == 0
        assert await logs.count(LogQuery("t-parts")) == 200
        for w, s in streams:
            page = await logs.page(LogQuery("t-parts", workers=(w,), limit=1000))
            seqs = [ln.seq or 0 for ln in page.lines if ln.stream == s]
            assert seqs == sorted(seqs) and len(seqs) == (40 if s == "stdout" else 10)
    finally:
        await pool.close()


async def test_a_line_stored_before_is_found_by_the_identity_the_store_works_out(
    store: LogStore,
) -> None:
    # A row as stored by earlier versions: its `dedupe` is the record's own identity
    # (`LogRecord.dedupe`, the MD5 of the stream's fields and the number).
    old = log_record(AT, "t-seq-ü", "loss=1.0", run=2, attempt=3, worker=7, stream="stderr", seq=41)
    async with store.pool.acquire() as conn:
        await store.ensure_partitions([AT.date()])
        await conn.execute(
            "INSERT INTO log_lines (at, task_id, run, attempt, worker, stream, seq, dedupe, line)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            old.at, old.task_id, old.run, old.attempt, old.worker, old.stream, old.seq,
            old.dedupe, old.line,
        )  # fmt: skip
    # the same line read again later (a new deployer), beside the next ones of its stream
    again = [old.model_copy(update={"at": AT + timedelta(minutes=5), "seq": s}) for s in (41, 42)]
    assert await store.ingest(again) == 1
    assert [ln.seq for ln in (await store.page(LogQuery("t-seq-ü"))).lines] == [41, 42]


async def test_numbered_and_unnumbered_lines_of_one_stream_in_one_batch(store: LogStore) -> None:
    # an older publisher's lines (no number) beside numbered ones, in one insert
    plain = [log_record(AT, "t-mixed", f"plain {i}") for i in range(3)]
    batch = plain + [log_record(AT, "t-mixed", "n", seq=s) for s in range(3)]
    assert await store.ingest(batch) == 6
    assert await store.ingest(batch) == 0  # redelivered: every line is known by its identity
    assert await store.count(LogQuery("t-mixed")) == 6
