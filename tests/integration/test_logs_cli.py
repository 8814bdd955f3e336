"""`runyard logs` against a real gateway (uvicorn on a free port, real Postgres)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.logs import LogStore

from tests.integration.test_cli_pipe import RUNYARD
from tests.integration.test_gateway_routing import log_service, serving
from tests.log_records import log_record
from tests.unit.test_cli import NO_CONFIG, REPO, cli

pytestmark = pytest.mark.integration

T0 = (datetime.now(UTC) - timedelta(minutes=30)).replace(microsecond=0)
LINES = [
    (0, "stdout", "epoch 1 loss=2.0"),
    (1, "stdout", "epoch 1 loss=2.1"),
    (1, "stderr", "Traceback (most recent call last):"),
    (1, "stderr", '  File "train.py", line 3, in <module>'),
    (1, "stderr", "ModuleNotFoundError: No module named 'apex'"),
]


@dataclass
class Served:
    url: str
    token: str
    store: LogStore
    task_id: str

    async def add(self, start: int, lines: list[tuple[int, str, str]]) -> None:
        await self.store.ingest(
            [
                log_record(
                    T0 + timedelta(seconds=start + i), self.task_id, text, worker=w, stream=s
                )
                for i, (w, s, text) in enumerate(lines)
            ]
        )


@pytest.fixture
async def served(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Served]:
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "home"))
    gateway = await Gateway.connect(dsn, REPO / "infra/config")
    token = await create_token(gateway.db, "t1", "alice", "member")
    endpoints: dict[str, str] = {}
    app = create_app(gateway, endpoints)
    async with (
        log_service(dsn, tmp_path / "home" / "exports", endpoints) as logs,
        serving("gateway", app, {}) as url,
    ):
        submitted = await cli(
            url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json"
        )
        assert submitted.exit_code == 0, submitted.output
        here = Served(url, token, logs.store, json.loads(submitted.stdout)["task_id"])
        await here.add(0, LINES)
        yield here
    await app.state.owners.aclose()
    await gateway.close()


async def test_search_and_filter(served: Served) -> None:
    found = await cli(served.url, served.token, "logs", served.task_id, "--grep", "loss")
    assert found.exit_code == 0, found.output
    assert [ln.split(" | ", 1)[1] for ln in found.stdout.splitlines()] == [
        "epoch 1 loss=2.0",
        "epoch 1 loss=2.1",
    ]
    as_json = await cli(
        served.url, served.token, "logs", served.task_id, "--worker", "1", "--regex",
        "^module", "-i", "--json",
    )  # fmt: skip
    assert [json.loads(ln)["line"] for ln in as_json.stdout.splitlines()] == [LINES[4][2]]
    paged = await cli(served.url, served.token, "logs", served.task_id, "--limit", "2")
    assert len(paged.stdout.splitlines()) == 2 and "more: --cursor" in paged.stderr
    bad = await cli(served.url, served.token, "logs", served.task_id, "--regex", "((")
    assert bad.exit_code == 1 and "logs.bad_regex" in bad.stderr


async def test_each_line_names_its_run_and_attempt_and_attempt_filters(served: Served) -> None:
    restarted = log_record(
        T0 + timedelta(minutes=1), served.task_id, "resumed", attempt=2, worker=1, seq=0
    )
    await served.store.ingest([restarted])
    every = await cli(served.url, served.token, "logs", served.task_id)
    assert every.exit_code == 0, every.output
    prefixes = [ln.split(" | ", 1)[0].split(" ", 1)[1] for ln in every.stdout.splitlines()]
    assert prefixes[0] == "r1a1 w0 stdout" and prefixes[-1] == "r1a2 w1 stdout"
    second = await cli(served.url, served.token, "logs", served.task_id, "--attempt", "2")
    assert second.stdout.splitlines() == [every.stdout.splitlines()[-1]]


async def test_times_may_be_spans_ago(served: Served) -> None:
    # The lines were written about 30 minutes ago (T0), within 5 s.
    async def count(*args: str) -> int:
        shown = await cli(served.url, served.token, "logs", served.task_id, *args, "--json")
        assert shown.exit_code == 0, shown.output
        return len(shown.stdout.splitlines())

    assert await count("--since", "2d") == len(LINES)
    assert await count("--since", "1m") == 0
    assert await count("--until", "1m") == len(LINES)
    assert await count("--since", "2d", "--until", "1d") == 0
    bad = await cli(served.url, served.token, "logs", served.task_id, "--since", "99999999d")
    assert bad.exit_code == 2 and "before year 1" in bad.output


async def test_first_error(served: Served) -> None:
    shown = await cli(served.url, served.token, "logs", served.task_id, "--first-error")
    assert shown.exit_code == 0, shown.output
    assert "image, rule image.missing_package" in shown.stdout
    assert "> " in shown.stdout and "Traceback" in shown.stdout


async def test_export_downloads_the_file(served: Served, tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    done = await cli(
        served.url, served.token, "logs", served.task_id, "--worker", "1", "--export", str(target)
    )
    assert done.exit_code == 0, done.output
    rows = (await asyncio.to_thread(target.read_text)).splitlines()
    assert [r.split(" | ", 1)[1] for r in rows] == [t for w, _, t in LINES if w == 1]


async def test_an_export_to_a_file_that_cannot_be_written_is_refused_first(
    served: Served, tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    for target, why in (
        (tmp_path / "no-such-folder" / "out.txt", "no-such-folder does not exist"),
        (tmp_path / "taken", "it is a folder"),
    ):
        done = await cli(served.url, served.token, "logs", served.task_id, "--export", str(target))
        assert done.exit_code == 2, done.output
        assert f"error: cannot write {target}: " in done.stderr and why in done.stderr
        assert "hint: give a file in a folder you can write" in done.stderr
        assert "Traceback" not in done.output
    async with httpx.AsyncClient(base_url=served.url) as http:
        started = await http.get("/v1/exports", headers={"Authorization": f"Bearer {served.token}"})
    assert started.status_code == 200 and started.json() == []  # nothing was asked of it
    assert list(tmp_path.glob("**/*.part")) == []


async def test_follow_prints_new_lines_until_the_task_ends(served: Served) -> None:
    following = asyncio.create_task(cli(served.url, served.token, "logs", served.task_id, "-f"))
    await asyncio.sleep(1.5)
    await served.add(100, [(0, "stdout", "a line written while following")])
    await asyncio.sleep(1.5)
    stopped = await cli(served.url, served.token, "stop", served.task_id)
    assert stopped.exit_code == 0
    result = await asyncio.wait_for(following, timeout=30)
    assert result.exit_code == 0, result.output
    printed = [ln.split(" | ", 1)[1] for ln in result.stdout.splitlines()]
    assert printed == [t for _, _, t in LINES] + ["a line written while following"]


async def test_show_of_a_failed_task_prints_its_first_error(served: Served, dsn: str) -> None:
    """R-42: `runyard show` of a failed task says where its failure most likely
    comes from, without a separate `logs` call."""
    from runyard.contracts import Metadata, NewEvent, default_mapper, utcnow
    from runyard.domain import Fail, decide, fold
    from runyard.eventstore import PostgresEventStore

    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        stream = f"task-{served.task_id}"
        history = await store.read_stream(stream)
        failed = decide(
            fold(history), Fail(served.task_id, "exit 1"), now=utcnow(), ids=lambda: "x"
        )
        meta = Metadata(actor="service:deployer")
        await store.append(stream, [NewEvent(e, meta, utcnow()) for e in failed], len(history))
    finally:
        await store.close()
    shown = await cli(served.url, served.token, "show", served.task_id)
    assert shown.exit_code == 0, shown.output
    assert "first error (image" in shown.stdout
    assert "ModuleNotFoundError: No module named 'apex'" in shown.stdout
    as_json = await cli(served.url, served.token, "show", served.task_id, "--json")
    assert json.loads(as_json.stdout)["first_error"]["found"] is True


async def test_a_search_that_matches_nothing_says_so_on_stderr(served: Served) -> None:
    """Nothing on stdout (a pipe gets no line), the reason on stderr, exit 0 as `ls` of
    an empty list; the options are named as they were typed."""
    none = await cli(
        served.url, served.token, "logs", served.task_id, "--grep", "no such words",
        "--worker", "1", "--since", "2d",
    )  # fmt: skip
    assert none.exit_code == 0, none.output
    assert none.stdout == ""
    typed = "--worker 1 --since 2d --grep 'no such words'"
    named = f"no line matches {typed} in the logs of {served.task_id}"
    assert " ".join(none.stderr.split()) == named, none.stderr
    as_json = await cli(
        served.url, served.token, "logs", served.task_id, "--phrase", "x" * 9, "--json"
    )
    assert as_json.exit_code == 0 and as_json.stdout == "", as_json.output
    found = await cli(served.url, served.token, "logs", served.task_id, "--grep", "loss")
    assert found.exit_code == 0 and found.stderr == "", found.output


@pytest.mark.parametrize("mode", ["", "--raw", "--json"])
async def test_the_more_hint_is_a_line_of_its_own_when_both_streams_share_a_pipe(
    served: Served, mode: str
) -> None:
    """`runyard logs ID --limit 2 2>&1 | cat`: the two lines whole, then the hint on its
    own line (stdout flushed, its last line ended, before stderr is written)."""
    # As a user's shell: stdout block-buffered (no PYTHONUNBUFFERED), no terminal width.
    unset = ("COLUMNS", "LINES", "PYTHONUNBUFFERED")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env |= {"RUNYARD_URL": served.url, "RUNYARD_TOKEN": served.token}
    env |= {"XDG_CONFIG_HOME": NO_CONFIG}
    command = f"{shlex.quote(str(RUNYARD))} logs {served.task_id} --limit 2 {mode} 2>&1 | cat"
    shell = await asyncio.create_subprocess_shell(
        f"set -o pipefail; {command}", stdout=PIPE, stderr=PIPE, env=env, executable="/bin/bash"
    )
    stdout, stderr = await shell.communicate()
    assert shell.returncode == 0, stderr
    lines = stdout.decode().split("\n")
    assert lines[-1] == "", "the output ends with a newline"
    first, second, hint = lines[:-1]
    texts = [LINES[0][2], LINES[1][2]]
    if mode == "--json":
        assert [json.loads(first)["line"], json.loads(second)["line"]] == texts
    else:
        assert [first.split(" | ", 1)[1], second.split(" | ", 1)[1]] == texts
    assert hint.startswith("more: --cursor ") and " " not in hint.removeprefix("more: --cursor ")
