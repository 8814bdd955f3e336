"""Text that reaches a terminal cannot forge lines or send escape sequences.

A user name, task name, reason or worker output line with a newline, a
carriage return or an escape sequence used to print as is: a newline in a user
name forged a whole line of `runyard tail` and `runyard events`. The values
here are put straight into the event store and the log store, as events written
before today's input rules (or by any other writer) would be: whatever is
stored, the CLI prints each value on its own line, inert.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from runyard.api.auth import create_token
from runyard.api.errors import GatewayError
from runyard.cli.main import app
from runyard.contracts import Metadata, NewEvent
from runyard.contracts.task_events import TaskPlaced, WorkerPlacement
from runyard.domain.task import FailStage, StartStage
from runyard.logs import LogStore
from typer.testing import CliRunner

from tests.log_records import log_record
from tests.unit.test_cli import REPO, Served, cli, drive
from tests.unit.test_cli import served_gateway as served_gateway  # the fixture

pytestmark = pytest.mark.integration

#: A user name that, printed raw, ends the real line and writes a success line of its own.
FORGED_USER = "eve\n       9 12:00:00.000 task-t-x v9 TaskSucceeded actor=user:t1/admin"
#: Clears the screen, retitles the window, and reverses the text after it.
ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202e\r"


def no_raw_controls(text: str) -> bool:
    """Nothing in `text` acts on a terminal: only newlines between lines and the tabs
    between the columns of a piped table are left."""
    return (
        re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]", text)
        is None
    )


async def submit(served: Served) -> str:
    done = await cli(served.url, served.token, "submit", "-f", str(REPO / "examples/hello.yaml"))
    assert done.exit_code == 0, done.output
    return done.stdout.split()[0]


async def forge(served: Served, task_id: str) -> None:
    """An event by the forged user, with escapes in its correlation id, then a failed stage
    whose reason carries escapes (reasons quote user input: image names, paths)."""
    store = served.gateway.store
    stream = f"task-{task_id}"
    meta = Metadata(actor=f"user:t1/{FORGED_USER}", correlation_id=f"c-1{ESCAPES}")
    placed = TaskPlaced(
        run=1, attempt=1, pool="dev-a100", workers=(WorkerPlacement(index=0, node="n", gpus=(0,)),)
    )
    version = await store.stream_version(stream)
    await store.append(stream, [NewEvent(placed, meta, datetime.now(UTC))], version)
    reason = f"image not found{ESCAPES}\nTaskSucceeded"
    await drive(
        store,
        task_id,
        StartStage(task_id, "resource_allocation"),
        FailStage(task_id, "resource_allocation", reason),
    )


async def test_the_api_refuses_a_user_name_with_a_newline(served_gateway: Served) -> None:
    with pytest.raises(GatewayError):
        await create_token(served_gateway.gateway.db, "t1", FORGED_USER, "member")


async def test_a_newline_in_a_user_name_forges_no_line_of_events_or_watch(
    served_gateway: Served,
) -> None:
    s = served_gateway
    task_id = await submit(s)
    await forge(s, task_id)
    count = len(await s.gateway.store.read_stream(f"task-{task_id}"))

    events = await cli(s.url, s.token, "events", task_id)
    assert events.exit_code == 0, events.output
    lines = events.stdout.splitlines()
    assert len(lines) == 1 + count  # the header, then one line per event
    assert not any(line.lstrip().startswith("9 12:00:00.000") for line in lines)
    assert "eve\\n       9 12:00:00.000 task-t-x v9 TaskSucceeded" in events.stdout
    assert no_raw_controls(events.stdout)

    watched = await cli(s.url, s.token, "watch", task_id)  # the task has failed: it ends
    assert watched.exit_code == 0, watched.output
    assert len(watched.stdout.splitlines()) == count
    assert no_raw_controls(watched.stdout)


async def test_a_newline_in_a_user_name_forges_no_line_of_tail(
    served_gateway: Served, dsn: str
) -> None:
    s = served_gateway
    task_id = await submit(s)
    await forge(s, task_id)
    runner = CliRunner()
    tailed = await asyncio.to_thread(
        runner.invoke, app, ["tail", "--no-follow"], env={"DATABASE_URL": dsn}
    )
    assert tailed.exit_code == 0, tailed.output
    logged = await s.gateway.store.all_reader(0).read(10_000)
    lines = tailed.stdout.splitlines()
    assert len(lines) == len(logged)  # one line per event of the whole log
    assert [int(line.split()[0]) for line in lines] == [e.global_position for e in logged]
    assert "actor=user:t1/eve\\n       9 12:00:00.000 task-t-x v9 TaskSucceeded" in tailed.stdout
    assert no_raw_controls(tailed.stdout)


async def test_reasons_and_ids_in_show_and_ls_are_inert(served_gateway: Served) -> None:
    s = served_gateway
    task_id = await submit(s)
    await forge(s, task_id)
    for command in (["show", task_id], ["ls"], ["show", task_id, "--json"]):
        shown = await cli(s.url, s.token, *command)
        assert shown.exit_code == 0, shown.output
        assert no_raw_controls(shown.stdout), command
    page = (await cli(s.url, s.token, "show", task_id)).stdout
    assert (
        "last failure: " in page and "\\x1b[2J\\x1b]0;owned\\x07\\u202e\\r\\nTaskSucceeded" in page
    )
    assert not any(line.startswith("TaskSucceeded") for line in page.splitlines())


async def test_worker_output_loses_its_escape_sequences_unless_raw(served_gateway: Served) -> None:
    s = served_gateway
    task_id = await submit(s)
    store = LogStore(s.gateway.db)
    await store.migrate()
    at = datetime.now(UTC) - timedelta(minutes=5)
    text = "\x1b[31mloss=nan\x1b[0m\rFAKE 2026-01-01 w0 stdout | ok \x1b]0;owned\x07done"
    await store.ingest([log_record(at, task_id, text)])

    shown = await cli(s.url, s.token, "logs", task_id)
    assert shown.exit_code == 0, shown.output
    (line,) = shown.stdout.splitlines()
    assert line.endswith(" | loss=nan\\rFAKE 2026-01-01 w0 stdout | ok done")
    assert no_raw_controls(shown.stdout)

    raw = await cli(s.url, s.token, "logs", task_id, "--raw")
    assert raw.exit_code == 0, raw.output
    assert raw.stdout.rstrip("\n").endswith(f" | {text}")


async def test_a_name_with_rich_markup_or_emoji_codes_prints_as_written(
    served_gateway: Served, tmp_path: Path
) -> None:
    s = served_gateway
    name = "sft [red]x[/] [/bold] :fire:"
    spec = tmp_path / "task.yaml"
    spec.write_text(
        (REPO / "examples/hello.yaml").read_text().replace("name: hello", f"name: '{name}'")
    )
    submitted = await cli(s.url, s.token, "submit", "-f", str(spec))
    assert submitted.exit_code == 0, submitted.output  # a closing tag once crashed the CLI
    task_id = submitted.stdout.split()[0]
    assert f"{task_id}  {name}  status=new" in submitted.stdout
    listed = await cli(s.url, s.token, "ls")
    assert f"{task_id}\t{name}\tnew\t" in listed.stdout
