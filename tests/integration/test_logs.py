"""The log service on the real stack: search kinds, filters, paging, tenants,
exports, retention, and redelivery through the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaProducer
from runyard.api.auth import create_token
from runyard.contracts.loglines import LogRecord
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.logs import LogIngester, LogQuery, LogStore
from runyard.logs.exports import KEEP
from runyard.logs.http import LogApi
from runyard.logs.search import WORDS_SQL
from runyard.logs.slots import OpenFollows
from runyard.messaging import KafkaSettings

from tests.integration.test_gateway import BASE, config_dir
from tests.integration.test_gateway_routing import log_service
from tests.log_records import log_record

pytestmark = pytest.mark.integration

T0 = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)

# (seconds after T0, worker, stream, line): the corpus every API test reads.
CORPUS: list[tuple[float, int, str, str]] = [
    (0.0, 0, "stdout", "starting training on 2 workers"),
    (0.5, 1, "stdout", "starting training on 2 workers"),
    (1.0, 0, "stdout", "epoch 1 loss=2.31 lr=0.001"),
    (1.2, 1, "stdout", "epoch 1 loss=2.29 lr=0.001"),
    (2.0, 0, "stderr", "UserWarning: the dataloader is slow"),
    (3.0, 1, "stdout", "Saving checkpoint to /out/ckpt-1.pt"),
    (4.0, 0, "stdout", "epoch 2 loss=1.87 lr=0.001"),
    (4.5, 2, "stdout", "validation accuracy 0.71"),
    (5.0, 1, "stderr", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    (6.0, 0, "stdout", "the Loss went down: LOSS IS FINE"),
    (7.0, 2, "stdout", "done with worker duties at run end"),
]


def line_text(i: int) -> str:
    return CORPUS[i][3]


@dataclass
class LogsApi:
    gateway: Gateway
    http: httpx.AsyncClient
    tokens: dict[str, str]
    store: LogStore
    task_id: str
    app: Any
    api: LogApi
    #: The log service's own address (a real port: its streams, unbuffered).
    url: str

    async def get(self, path: str, who: str = "alice", **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.get(path, headers=headers, params=params)

    async def post(self, path: str, who: str = "alice", **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return await self.http.post(path, headers=headers, **kw)

    async def lines(self, **params: Any) -> list[str]:
        answer = await self.get(f"/v1/tasks/{self.task_id}/logs", **params)
        assert answer.status_code == 200, answer.text
        return [ln["line"] for ln in answer.json()["lines"]]

    @property
    def exports(self) -> Any:
        return self.api.exports


def records(
    task_id: str, corpus: list[tuple[float, int, str, str]], run: int = 1
) -> list[LogRecord]:
    return [
        log_record(T0 + timedelta(seconds=s), task_id, text, run=run, worker=w, stream=st)
        for s, w, st, text in corpus
    ]


@pytest.fixture
async def logs(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LogsApi]:
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "home"))
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "alice": await create_token(gateway.db, "t1", "alice", "member"),
        "bob": await create_token(gateway.db, "t1", "bob", "member"),
        "carol": await create_token(gateway.db, "t2", "carol", "member"),
    }
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    transport = httpx.ASGITransport(app=app)
    async with (
        log_service(dsn, tmp_path / "home" / "exports", endpoints) as service,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        created = await client.post(
            "/v1/tasks", json=BASE, headers={"Authorization": f"Bearer {tokens['alice']}"}
        )
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]
        store = service.store
        assert await store.ingest(records(task_id, CORPUS)) == len(CORPUS)
        yield LogsApi(gateway, client, tokens, store, task_id, app, service.api, service.url)
    await app.state.owners.aclose()
    await gateway.close()


# --- search kinds --------------------------------------------------------------


async def test_all_lines_in_time_order(logs: LogsApi) -> None:
    assert await logs.lines() == [c[3] for c in CORPUS]
    newest = await logs.lines(order="newest")
    assert newest == [c[3] for c in reversed(CORPUS)]


async def test_words_are_full_text_in_any_order_and_case(logs: LogsApi) -> None:
    assert await logs.lines(words="training starting") == [line_text(0), line_text(1)]
    assert await logs.lines(words="LOSS") == [line_text(i) for i in (2, 3, 6, 9)]
    assert await logs.lines(words="loss nothere") == []


async def test_words_are_whole_words_as_grep_w_sees_them(logs: LogsApi) -> None:
    lines = [
        (0.0, 0, "stdout", "torch.utils.checkpoint: use_reentrant should be passed"),
        (1.0, 0, "stdout", "checkpoint_dir=/out"),
        (2.0, 0, "stdout", "checkpoints saved"),
        (3.0, 1, "stderr", "CHECKPOINT 3 done"),
        (4.0, 1, "stdout", "un café noir"),
    ]
    await logs.store.ingest(records("words-task", lines))

    async def found(words: str) -> list[str]:
        page = await logs.store.page(LogQuery("words-task", words=words))
        return [ln.line for ln in page.lines]

    assert await found("checkpoint") == [lines[0][3], lines[3][3]]
    assert await found("use_reentrant") == [lines[0][3]]
    assert await found("reentrant") == []  # `_` is part of a word, as for grep -w
    assert await found("3 Checkpoint") == [lines[3][3]]
    # whichever letters the database's locale counts as letters, a word found in a
    # line is one for the search as well
    assert await found("CAFÉ") == [lines[4][3]]
    assert await logs.store.count(LogQuery("words-task", words="checkpoint dir")) == 0


async def test_the_words_of_a_search_are_split_once_for_all_its_pages(
    logs: LogsApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    splits: list[str] = []

    class Counted:  # the store's pool, counting the word splits it is asked for
        def __init__(self, pool: asyncpg.Pool) -> None:
            self.pool = pool

        def __getattr__(self, name: str) -> Any:
            return getattr(self.pool, name)

        async def fetchval(self, sql: str, *args: Any) -> Any:
            if sql == WORDS_SQL:
                splits.append(args[0])
            return await self.pool.fetchval(sql, *args)

    monkeypatch.setattr(logs.store, "pool", Counted(logs.store.pool))
    pages = [page async for page in logs.store.scan(LogQuery(logs.task_id, words="loss"), 1)]
    assert [ln.line for page in pages for ln in page] == [line_text(i) for i in (2, 3, 6, 9)]
    assert splits == ["loss"]
    long_words = "loss " + "x" * 2000  # longer than kept: split for every page
    assert await logs.store.count(LogQuery(logs.task_id, words=long_words)) == 0
    assert await logs.store.count(LogQuery(logs.task_id, words=long_words)) == 0
    assert splits == ["loss", long_words, long_words]


async def test_too_many_words_are_a_400(logs: LogsApi) -> None:
    answer = await logs.get(f"/v1/tasks/{logs.task_id}/logs", words=" ".join(["loss"] * 33))
    assert answer.status_code == 400
    assert answer.json()["code"] == "logs.too_many_words"
    assert await logs.lines(words=" ".join(["loss"] * 32)) == [line_text(i) for i in (2, 3, 6, 9)]


async def test_phrase_is_exact_and_case_sensitive_unless_asked(logs: LogsApi) -> None:
    assert await logs.lines(phrase="CUDA out of memory") == [line_text(8)]
    assert await logs.lines(phrase="out of CUDA") == []
    assert await logs.lines(phrase="LOSS IS") == [line_text(9)]
    assert await logs.lines(phrase="loss is") == []
    assert await logs.lines(phrase="loss is", ignore_case="true") == [line_text(9)]
    assert await logs.lines(phrase="100%_") == []  # LIKE wildcards are literal


async def test_regex_with_and_without_case(logs: LogsApi) -> None:
    assert await logs.lines(regex=r"loss=[0-9]\.[0-9]+") == [line_text(i) for i in (2, 3, 6)]
    assert await logs.lines(regex=r"^runtimeerror") == []
    assert await logs.lines(regex=r"^runtimeerror", ignore_case="true") == [line_text(8)]


async def test_the_prefix_is_never_matched(logs: LogsApi) -> None:
    year = str(T0.year)
    assert await logs.lines(regex=f"^{year}") == []
    assert await logs.lines(phrase="stderr") == []
    assert await logs.lines(words="stdout") == []
    assert await logs.lines(phrase="worker=1") == []
    assert await logs.lines(regex="run=1") == []
    # ...but the line's own words are: "worker" and "run" appear in the last line only.
    assert await logs.lines(words="worker run") == [line_text(10)]


async def test_bad_regex_is_a_clear_400(logs: LogsApi) -> None:
    answer = await logs.get(f"/v1/tasks/{logs.task_id}/logs", regex="loss=([0-9")
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "logs.bad_regex"
    assert body["field"] == "regex"
    # Postgres's own words follow, without saying it twice
    assert body["message"].startswith("invalid regular expression: ")
    assert body["message"].count("invalid regular expression") == 1, body["message"]


#: Back-references Postgres's engine tries every split of the line for: minutes of
#: CPU on a line of a few hundred characters (0.6 s at 101, over 10 s at 401).
SLOW_REGEX = r"^(a*)(a*)(a*)\3\2\1$"


async def test_a_regex_that_runs_too_long_is_stopped_in_postgres_and_refused(
    logs: LogsApi, dsn: str
) -> None:
    """A tenant's own line and a regular expression that would hold a Postgres process
    (and its share of the CPU every tenant's work uses) for minutes: the query is
    cancelled in Postgres after `query_timeout_s` and the search is refused."""
    long_line = [(8.0, 0, "stdout", "a" * 401)]  # odd: no split matches
    assert await logs.store.ingest(records(logs.task_id, long_line)) == 1
    logs.store.query_timeout_s = 1.0
    async with asyncio.timeout(30):
        answer = await logs.get(f"/v1/tasks/{logs.task_id}/logs", regex=SLOW_REGEX)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "logs.query_too_slow"
    assert "1 s" in body["message"] and "back-references" in body["hint"]
    conn = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(10):
            while await conn.fetchval(  # noqa: ASYNC110 (another process's state)
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                " AND query LIKE '%line ~%' AND pid <> pg_backend_pid()"
            ):
                await asyncio.sleep(0.05)
    finally:
        await conn.close()
    assert await logs.lines(regex="^a+$") == ["a" * 401]  # other searches still answer


#: Postgres backends running a search of the lines (a regular expression).
SEARCHING = (
    "SELECT pid FROM pg_stat_activity WHERE state = 'active'"
    " AND query LIKE '%line ~%' AND pid <> pg_backend_pid()"
)


async def test_a_tenant_running_slow_searches_stalls_no_other_tenant(
    logs: LogsApi, dsn: str
) -> None:
    """A member sends six searches at once that would each keep Postgres busy for
    minutes: one runs, the others wait their tenant's turn (`search_wait_s`) and are
    refused with 429 `logs.busy`; meanwhile another tenant's search and the first
    tenant's plain pages are answered: one tenant's searches never hold every
    connection of the log service (before, they held all four here)."""
    long_line = [(8.0, 0, "stdout", "a" * 801)]  # odd: no split matches, minutes
    assert await logs.store.ingest(records(logs.task_id, long_line)) == 1
    created = await logs.post("/v1/tasks", who="carol", json=BASE)
    assert created.status_code == 201, created.text
    theirs = created.json()["task_id"]
    assert await logs.store.ingest(records(theirs, CORPUS)) == len(CORPUS)
    logs.store.search_wait_s = 0.5
    path = f"/v1/tasks/{logs.task_id}/logs"
    slow = [asyncio.ensure_future(logs.get(path, regex=SLOW_REGEX)) for _ in range(6)]
    conn = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(20):
            while not await conn.fetch(SEARCHING):  # noqa: ASYNC110 (another process's)
                await asyncio.sleep(0.05)
            refused = []
            for answer in asyncio.as_completed(slow):  # all but the one running
                refused.append(await answer)
                if len(refused) == 5:
                    break
        assert [a.status_code for a in refused] == [429] * 5, [a.text for a in refused]
        body = refused[0].json()
        assert body["code"] == "logs.busy" and refused[0].headers["retry-after"] == "2"
        assert "your tenant's searches (1 at once)" in body["message"], body
        async with asyncio.timeout(20):
            other = await logs.get(f"/v1/tasks/{theirs}/logs", who="carol", regex="epoch [0-9]")
            assert other.status_code == 200, other.text
            assert await logs.lines(limit=2) == [line_text(0), line_text(1)]
        assert [ln["line"] for ln in other.json()["lines"]] == [line_text(i) for i in (2, 3, 6)]
        assert len(await conn.fetch(SEARCHING)) == 1, "one of the six held its slot all along"
    finally:
        await conn.execute(f"SELECT pg_cancel_backend(pid) FROM ({SEARCHING}) s")
        await conn.close()
        answers = await asyncio.gather(*slow)
    assert sum(a.json()["code"] == "logs.query_too_slow" for a in answers) == 1
    assert await logs.lines(regex="^a+$") == ["a" * 801]  # its slot is given back


async def test_a_tenant_keeps_at_most_its_live_tails_open(logs: LogsApi) -> None:
    """Live tails of one tenant open at once are bounded (`follows_per_tenant`): one
    more is refused with 429 `logs.busy` before any stream starts, another tenant
    still follows its own task, and a tail its reader closed is counted closed, so
    the tenant may open one again."""
    logs.api.follows = OpenFollows(per_tenant=2)
    created = await logs.post("/v1/tasks", who="carol", json=BASE)
    theirs = created.json()["task_id"]
    assert await logs.store.ingest(records(theirs, CORPUS[:1])) == 1
    ours = f"/v1/tasks/{logs.task_id}/logs/follow"
    everything = [line_text(i) for i in range(len(CORPUS))]

    readers: list[AsyncIterator[str]] = []  # kept: a reader dropped closes its stream

    async def first_page(stack: contextlib.AsyncExitStack, path: str, who: str) -> list[str]:
        headers = {"Authorization": f"Bearer {logs.tokens[who]}"}
        answer = await stack.enter_async_context(http.stream("GET", path, headers=headers))
        assert answer.status_code == 200, await answer.aread()
        readers.append(answer.aiter_lines())
        page = json.loads(await anext(readers[-1]))
        return [ln["line"] for ln in page["lines"]]

    async with httpx.AsyncClient(base_url=logs.url) as http, asyncio.timeout(30):
        async with contextlib.AsyncExitStack() as second:
            async with contextlib.AsyncExitStack() as first:
                assert await first_page(first, ours, "alice") == everything
                assert await first_page(second, ours, "alice") == everything
                refused = await logs.get(ours, who="bob")
                assert refused.status_code == 429, refused.text
                assert refused.json()["code"] == "logs.busy", refused.text
                assert "2 live tails open" in refused.json()["message"]
                async with contextlib.AsyncExitStack() as other:  # another tenant's own
                    theirs_path = f"/v1/tasks/{theirs}/logs/follow"
                    assert await first_page(other, theirs_path, "carol") == [line_text(0)]
            while logs.api.follows.open["t1"] > 1:  # noqa: ASYNC110 (the server sees it go)
                await asyncio.sleep(0.02)
            async with contextlib.AsyncExitStack() as again:
                assert await first_page(again, ours, "bob") == everything
        while logs.api.follows.open:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_punctuation_only_words_are_a_400(logs: LogsApi) -> None:
    answer = await logs.get(f"/v1/tasks/{logs.task_id}/logs", words="--- ::")
    assert answer.status_code == 400
    assert answer.json()["code"] == "logs.no_words"


# --- filters, alone and combined -----------------------------------------------------


async def test_filter_by_one_or_several_workers(logs: LogsApi) -> None:
    assert await logs.lines(worker=2) == [line_text(7), line_text(10)]
    both = [c[3] for c in CORPUS if c[1] in (1, 2)]
    assert await logs.lines(worker=[1, 2]) == both


async def test_filter_by_attempt_of_a_run_or_of_every_run(logs: LogsApi) -> None:
    """The crash before a restart is attempt 1's output; attempt 2 is the restart's."""
    second = timedelta(seconds=1)
    at = T0 + timedelta(minutes=5)
    restarts = [
        log_record(at, logs.task_id, "crashed here", run=1, attempt=1, worker=0),
        log_record(at + second, logs.task_id, "resumed", run=1, attempt=2, worker=0, seq=0),
        log_record(at + 2 * second, logs.task_id, "rerun resumed", run=2, attempt=2, seq=0),
    ]
    assert await logs.store.ingest(restarts) == 3
    assert await logs.lines(attempt=2) == ["resumed", "rerun resumed"]
    assert await logs.lines(attempt=2, run=1) == ["resumed"]
    first = await logs.lines(attempt=1, words="crashed")
    assert first == ["crashed here"]
    assert await logs.lines(attempt=3) == []

    done = await export(logs, {"attempt": 2, "run": 1})
    assert done["lines_done"] == 1
    file = await logs.get(f"/v1/exports/{done['export_id']}/file")
    assert file.text.endswith("run=1 attempt=2 worker=0 stdout | resumed\n"), file.text
    past = await logs.get(f"/v1/tasks/{logs.task_id}/logs", attempt=2**31)
    assert (past.status_code, past.json()["field"]) == (400, "attempt")


async def test_time_range_to_the_second(logs: LogsApi) -> None:
    since = (T0 + timedelta(seconds=1)).isoformat()
    until = (T0 + timedelta(seconds=4)).isoformat()
    # 1.0 and 1.2 are in second 1; 4.0 and 4.5 in second 4, which `until` includes.
    expected = [c[3] for c in CORPUS if 1 <= c[0] < 5]
    assert await logs.lines(since=since, until=until) == expected
    backwards = await logs.get(f"/v1/tasks/{logs.task_id}/logs", since=until, until=since)
    assert backwards.status_code == 400 and backwards.json()["code"] == "logs.time_range"
    naive = await logs.get(f"/v1/tasks/{logs.task_id}/logs", since="2026-01-01T00:00:00")
    assert naive.status_code == 400 and naive.json()["field"] == "since"


async def test_filters_and_searches_combine_in_either_order(logs: LogsApi) -> None:
    since = (T0 + timedelta(seconds=2)).isoformat()
    a = await logs.lines(worker=0, words="loss", since=since)
    b = await logs.lines(since=since, words="loss", worker=0)
    assert a == b == [line_text(6), line_text(9)]
    combined = await logs.lines(worker=[0, 1], regex="loss=", phrase="epoch 1")
    assert combined == [line_text(2), line_text(3)]


async def test_paging_with_a_cursor_both_ways(logs: LogsApi) -> None:
    for order, expected in (
        ("oldest", [c[3] for c in CORPUS]),
        ("newest", [c[3] for c in reversed(CORPUS)]),
    ):
        seen: list[str] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 3, "order": order}
            if cursor:
                params["cursor"] = cursor
            answer = (await logs.get(f"/v1/tasks/{logs.task_id}/logs", **params)).json()
            seen += [ln["line"] for ln in answer["lines"]]
            cursor = answer["next_cursor"]
            if not cursor:
                break
        assert seen == expected
    bad = await logs.get(f"/v1/tasks/{logs.task_id}/logs", cursor="!!nope")
    assert bad.status_code == 400


async def test_other_tenants_do_not_see_the_logs(logs: LogsApi) -> None:
    for path in ("logs", "first-error"):
        answer = await logs.get(f"/v1/tasks/{logs.task_id}/{path}", who="carol")
        assert answer.status_code == 404
        assert answer.json()["code"] == "task_not_found"
    answer = await logs.post(f"/v1/tasks/{logs.task_id}/logs/exports", who="carol")
    assert answer.status_code == 404
    unauth = await logs.http.get(f"/v1/tasks/{logs.task_id}/logs")
    assert unauth.status_code == 401


async def test_first_error_endpoint(logs: LogsApi) -> None:
    answer = await logs.get(f"/v1/tasks/{logs.task_id}/first-error")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["found"] is True
    assert body["line"]["line"] == line_text(8)
    assert body["line"]["worker"] == 1
    assert body["layer"] == "training_code"
    assert body["rule"] == "training.cuda_oom"
    assert [ln["line"] for ln in body["before"]] == [line_text(i) for i in (1, 3, 5)]


# --- exports ------------------------------------------------------------------------


async def export(logs: LogsApi, params: dict[str, Any], fmt: str = "text") -> dict[str, Any]:
    started = await logs.post(
        f"/v1/tasks/{logs.task_id}/logs/exports", params=params, json={"format": fmt}
    )
    assert started.status_code == 202, started.text
    await logs.exports.wait()
    done = (await logs.get(f"/v1/exports/{started.json()['export_id']}")).json()
    assert done["state"] == "done", done
    return dict(done)


async def test_export_without_filters_has_every_line(logs: LogsApi) -> None:
    old = log_record(datetime.now(UTC) - timedelta(days=31), logs.task_id, "x")
    await logs.store.ingest([old], now=old.at)  # ingested long ago; past the 30 days now
    done = await export(logs, {})
    assert done["lines_done"] == done["lines_total"] == len(CORPUS)
    file = await logs.get(f"/v1/exports/{done['export_id']}/file")
    assert file.status_code == 200
    rows = file.text.splitlines()
    assert len(rows) == len(CORPUS)
    for row, (s, w, st, text) in zip(rows, CORPUS, strict=True):
        at = (T0 + timedelta(seconds=s)).isoformat()
        assert row == f"{at} run=1 attempt=1 worker={w} {st} | {text}"


async def test_export_with_filters_has_exactly_the_matches(logs: LogsApi) -> None:
    params = {"worker": [0, 1], "words": "loss"}
    done = await export(logs, params, fmt="jsonl")
    rows = (await logs.get(f"/v1/exports/{done['export_id']}/file")).text.splitlines()
    expected = [c for c in CORPUS if c[1] in (0, 1) and "loss" in c[3].lower()]
    assert done["lines_total"] == len(expected) == 4
    for row, (s, w, st, text) in zip(rows, expected, strict=True):
        got = json.loads(row)
        assert (got["worker"], got["stream"], got["line"]) == (w, st, text)
        assert datetime.fromisoformat(got["at"]) == T0 + timedelta(seconds=s)
    page = await logs.lines(worker=[0, 1], words="loss")
    assert [json.loads(r)["line"] for r in rows] == page


async def test_only_the_last_five_exports_per_user_are_kept(logs: LogsApi) -> None:
    made = [await export(logs, {"worker": 0}) for _ in range(KEEP + 2)]
    mine = (await logs.get("/v1/exports")).json()
    assert [e["export_id"] for e in mine] == [e["export_id"] for e in reversed(made[-KEEP:])]
    folder = Path(logs.exports.folder)
    assert len(await asyncio.to_thread(lambda: list(folder.iterdir()))) == KEEP
    gone = await logs.get(f"/v1/exports/{made[0]['export_id']}")
    assert gone.status_code == 404
    # another user's list is their own, and they cannot read alice's exports
    assert (await logs.get("/v1/exports", who="bob")).json() == []
    theirs = await logs.get(f"/v1/exports/{made[-1]['export_id']}/file", who="bob")
    assert theirs.status_code == 404


async def test_export_with_a_bad_regex_is_refused_up_front(logs: LogsApi) -> None:
    answer = await logs.post(f"/v1/tasks/{logs.task_id}/logs/exports", params={"regex": "(("})
    assert answer.status_code == 400
    assert answer.json()["code"] == "logs.bad_regex"


# --- store: idempotence, partitions, retention ----------------------------------------


async def test_redelivered_batch_stores_nothing_twice(logs: LogsApi) -> None:
    again = records(logs.task_id, CORPUS)
    assert await logs.store.ingest(again) == 0
    numbered = [log_record(T0, logs.task_id, "same text", run=2, seq=i) for i in range(3)]
    assert await logs.store.ingest(numbered) == 3  # same text and time, distinct seq
    assert await logs.store.ingest(numbered) == 0
    assert await logs.store.count(LogQuery(logs.task_id)) == len(CORPUS) + 3


async def test_partitions_ahead_and_retention_drops_old_days(dsn: str) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        store = LogStore(pool, retention_days=30)
        await store.migrate()
        now = datetime(2026, 3, 10, 12, tzinfo=UTC)
        old = log_record(now - timedelta(days=40), "t", "old line")
        recent = log_record(now - timedelta(days=2), "t", "recent line")
        assert await store.ingest([old], now=old.at) == 1  # stored back then
        assert await store.ingest([recent], now=now) == 1
        assert await store.ingest([old], now=now) == 0  # arrives past retention: dropped
        dropped = await store.maintain(now, ahead_days=3)
        assert dropped == ["log_lines_p20260129"]
        days = await store.partitions()
        assert days[-1] == (now + timedelta(days=3)).date()
        assert [ln.line for ln in (await store.page(LogQuery("t"))).lines] == ["recent line"]
    finally:
        await pool.close()


# --- the consumer on the real broker ---------------------------------------------------


async def wait_until(condition: Any, within: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_consumer_restart_redelivers_without_duplicates(
    dsn: str, kafka: KafkaSettings
) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    try:
        store = LogStore(pool)
        await store.migrate()
        sent = records("task-k", CORPUS * 1)
        for record in sent:
            await producer.send_and_wait(kafka.topics.logs, record.to_bytes(), key=b"task-k")
        await producer.send_and_wait(kafka.topics.logs, b"not json", key=b"task-k")

        first = LogIngester(store, kafka, group="logs-a")
        task = asyncio.create_task(first.run())
        await wait_until(lambda: first.consumer.stats.received == len(sent) + 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert first.stats.stored == len(sent)
        assert first.consumer.stats.malformed == 1

        # A new group reads everything again: as if no offset had been committed.
        second = LogIngester(store, kafka, group="logs-b")
        task = asyncio.create_task(second.run())
        await wait_until(lambda: second.consumer.stats.received == len(sent) + 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert second.stats.stored == 0
        assert second.stats.duplicates == len(sent)
        page = await store.page(LogQuery("task-k", limit=1000))
        assert [ln.line for ln in page.lines] == [c[3] for c in CORPUS]
    finally:
        await producer.stop()
        await pool.close()


@pytest.mark.parametrize("writers", [1, 3])
async def test_pipeline_commits_each_batch_after_it_is_stored(logs: LogsApi, writers: int) -> None:
    ingester = LogIngester(logs.store, KafkaSettings(), writers=writers)
    committed: list[tuple[int, int]] = []

    async def source() -> AsyncIterator[tuple[list[bytes | None], Any]]:
        for b in range(3):
            values: list[bytes | None] = [
                r.to_bytes()
                for r in records(
                    "piped", [(b * 10 + i, i % 2, "stdout", f"b{b} l{i}") for i in range(4)]
                )
            ]

            async def done(b: int = b) -> None:
                committed.append((b, await logs.store.count(LogQuery("piped"))))

            yield values, done

    await ingester.consumer.pipeline(source())
    # batch b is committed, in order, only once its 4 lines and those before are stored
    assert [b for b, _ in committed] == [0, 1, 2]
    assert all(stored >= 4 * (b + 1) for b, stored in committed)
    assert await logs.store.count(LogQuery("piped")) == 12


async def test_the_service_ingests_the_deployers_records(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    from runyard.deployer.runtime import OutputLine
    from runyard.logs import main as service
    from runyard.stack.context import ServiceContext

    ctx = ServiceContext(dsn=dsn, kafka=kafka, data_dir=tmp_path, config_dir=tmp_path)
    running = asyncio.create_task(service.run(ctx))
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    try:
        line = OutputLine("task-d", 1, 1, 0, "stderr", "hello from a worker", datetime.now(UTC))
        # what the deployer publishes (services/deployer/src/runyard/deployer/main.py `publish`)
        await producer.send_and_wait(kafka.topics.logs, line.record().to_bytes(), key=b"task-d")
        await wait_until(lambda: "logs" in ctx.endpoints)  # migrated, serving
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        try:
            page = await LogStore(pool).page(LogQuery("task-d"))
            while not page.lines:  # the service stores it (the test's timeout bounds this)
                await asyncio.sleep(0.05)
                page = await LogStore(pool).page(LogQuery("task-d"))
        finally:
            await pool.close()
        assert [(ln.worker, ln.stream, ln.line, ln.at) for ln in page.lines] == [
            (0, "stderr", "hello from a worker", line.at)
        ]
        # its HTTP face is up beside the ingester, its URL published
        async with httpx.AsyncClient(base_url=ctx.endpoints["logs"]) as http:
            assert (await http.get("/healthz")).json()["service"] == "logs"
            assert (await http.get("/readyz")).status_code == 200
    finally:
        await producer.stop()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


# --- numbers past int32: the log routes' own 400 ----------------------------------


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("logs", {"run": 2**31}, "run"),
        ("logs", {"run": -(2**31) - 1}, "run"),
        ("logs", {"worker": [0, 2**40]}, "worker"),
        ("first-error", {"run": 99999999999}, "run"),
        # no line has them: runs and attempts count from 1, workers from 0
        ("first-error", {"run": 0}, "run"),
        ("first-error", {"run": -1}, "run"),
        ("logs", {"attempt": 0}, "attempt"),
        ("logs", {"worker": [-1]}, "worker"),
    ],
)
async def test_a_number_past_int32_is_the_log_routes_own_400(
    logs: LogsApi, path: str, params: dict[str, Any], field: str
) -> None:
    answer = await logs.get(f"/v1/tasks/{logs.task_id}/{path}", **params)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    # not the gateway's safety net (`request.invalid` from a database DataError)
    assert (body["code"], body["field"]) == ("logs.out_of_range", field), body
    least = 0 if field == "worker" else 1
    assert body["hint"] == f"{field} must be between {least} and 2147483647"


async def test_an_export_with_a_number_past_int32_is_refused_up_front(logs: LogsApi) -> None:
    path = f"/v1/tasks/{logs.task_id}/logs/exports"
    answer = await logs.post(path, params={"run": 2**31})
    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("logs.out_of_range", "run")
    assert await logs.exports.list("t1", "alice") == []
    # the edges themselves are fine
    edge = await logs.get(f"/v1/tasks/{logs.task_id}/logs", run=2**31 - 1, worker=[2**31 - 1])
    assert edge.status_code == 200 and edge.json()["lines"] == []


# --- exports whose gateway stopped mid-way ------------------------------------------


async def test_an_export_left_running_by_a_stopped_log_service_is_marked_failed(
    logs: LogsApi, dsn: str, tmp_path: Path
) -> None:
    """A log service stops while its export runs: the record stays `running` with a
    partial file. The next log service marks it failed, with the reason, and removes
    the file; an export that another live instance runs (fresh heartbeat) is left alone."""
    from runyard.logs.exports import ABANDONED, Exports

    blocked = asyncio.Event()

    class Stuck(Exports):
        """An export that writes part of its file, then waits (until its process dies)."""

        async def _run(self, export_id: str, query: Any, path: Path, fmt: str) -> None:
            await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
            path.write_text("a partial line\n")
            await self.store.pool.execute(
                "UPDATE log_exports SET lines_total = 11, lines_done = 3 WHERE export_id = $1",
                export_id,
            )
            blocked.set()
            await asyncio.Event().wait()

    folder = logs.exports.folder
    stopped = Stuck(logs.store, folder)  # the instance that stops
    alive = Stuck(logs.store, folder)  # another instance, still running
    orphan = await stopped.start("t1", "alice", LogQuery(logs.task_id, words="loss"))
    await blocked.wait()
    blocked.clear()
    kept = await alive.start("t1", "alice", LogQuery(logs.task_id, words="epoch"))
    await blocked.wait()
    await stopped.close()  # the process ends: nothing marks its export
    partial = folder / f"{orphan['export_id']}.txt"
    assert partial.exists()
    # its last heartbeat was over a minute ago
    await logs.store.pool.execute(
        "UPDATE log_exports SET heartbeat_at = now() - interval '2 minutes' WHERE export_id = $1",
        orphan["export_id"],
    )

    (tmp_path / "again").mkdir()
    restarted = await Gateway.connect(dsn, config_dir(tmp_path / "again"))
    endpoints: dict[str, str] = {}
    app = create_app(restarted, endpoints)
    try:
        async with (
            log_service(dsn, folder, endpoints),  # the restarted log service
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw"
            ) as client,
        ):
            headers = {"Authorization": f"Bearer {logs.tokens['alice']}"}
            answer = await client.get(f"/v1/exports/{orphan['export_id']}", headers=headers)
            assert answer.status_code == 200, answer.text
            failed = answer.json()
            assert (failed["state"], failed["error"]) == ("failed", ABANDONED)
            assert failed["finished_at"] is not None and failed["lines_done"] == 3
            assert not partial.exists()
            other = await client.get(f"/v1/exports/{kept['export_id']}", headers=headers)
            assert other.json()["state"] == "running"  # its instance still beats for it
            file = await client.get(f"/v1/exports/{orphan['export_id']}/file", headers=headers)
            assert (file.status_code, file.json()["code"]) == (404, "export.not_ready")
    finally:
        await app.state.owners.aclose()
        await alive.close()
        await restarted.close()


async def test_a_running_export_beats_while_it_runs(logs: LogsApi) -> None:
    """The heartbeat keeps a long export of a live gateway from being taken for abandoned."""
    from runyard.logs.exports import Exports

    stale_after_s = 2.0  # many beats apart, so a loaded machine's late beat is no miss
    slow = Exports(
        logs.store, logs.exports.folder, batch=1, heartbeat_s=0.05, stale_after_s=stale_after_s
    )
    original = logs.store.scan
    release = asyncio.Event()

    async def crawl(query: LogQuery, batch: int = 1000) -> Any:
        async for lines in original(query, batch):
            yield lines
            await release.wait()  # the export runs until the test lets it finish

    slow.store = LogStore(logs.store.pool)
    slow.store.scan = crawl  # type: ignore[method-assign]
    started = await slow.start("t1", "alice", LogQuery(logs.task_id))
    # longer than stale_after_s: only the heartbeat keeps it owned
    await asyncio.sleep(stale_after_s + 0.5)
    running = await slow.get("t1", "alice", started["export_id"])
    assert running["state"] == "running"
    other = Exports(logs.store, logs.exports.folder, stale_after_s=stale_after_s)
    assert await other.recover() == []
    release.set()
    await slow.wait()
    done = await slow.get("t1", "alice", started["export_id"])
    assert (done["state"], done["lines_done"]) == ("done", len(CORPUS))
    await slow.close()


async def test_a_part_that_fails_fails_the_batch_and_leaves_its_caller_uncancelled(
    dsn: str,
) -> None:
    """A batch is inserted in parts at once; one that fails (here a trigger refuses one
    task's lines, as an outage would end one part) fails the batch, which is then
    stored whole when tried again. The caller's task is left as it was: no stop is
    counted on it (the batch's retry would take one for a stop)."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        store = LogStore(pool, parts=2)
        await store.migrate()
        await pool.execute(
            """CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                 IF NEW.task_id = 'boom' THEN RAISE EXCEPTION 'refused'; END IF;
                 RETURN NEW;
               END $$;
               CREATE TRIGGER refuse_boom BEFORE INSERT ON log_lines
               FOR EACH ROW EXECUTE FUNCTION refuse_boom()"""
        )
        batch = records("fine", CORPUS) + records("boom", CORPUS)
        with pytest.raises(asyncpg.RaiseError, match="refused"):
            await store.ingest(batch)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await pool.execute("DROP TRIGGER refuse_boom ON log_lines")
        await store.ingest(batch)  # tried again: every line once
        for task_id in ("fine", "boom"):
            assert await store.count(LogQuery(task_id)) == len(CORPUS)
    finally:
        await pool.close()
