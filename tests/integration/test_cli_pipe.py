"""The installed `runyard` command writing into a pipe (`runyard events ID | cat`): every
table row is one whole line, nothing cut to a terminal width, against a real gateway."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import httpx
import pytest
from runyard.api.auth import authenticate, create_token, mark_revoked
from runyard.cli.detail import detail

from tests.unit.test_cli import NO_CONFIG, REPO, Served, cli
from tests.unit.test_cli import served_gateway as served_gateway  # the fixture

pytestmark = pytest.mark.integration

RUNYARD = Path(sys.executable).parent / "runyard"


async def piped(served: Served, command: str) -> list[str]:
    """Run `runyard COMMAND | cat` in a shell (stdout a pipe, no COLUMNS); its lines."""
    code, stdout, stderr = await run_piped(served, command)
    assert code == 0, stderr
    return stdout.splitlines()


async def run_piped(
    served: Served, command: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """`runyard COMMAND | cat`, its stderr a pipe too: exit status, stdout, stderr."""
    given = env or {}
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | given
    env |= {"RUNYARD_URL": served.url, "RUNYARD_TOKEN": served.token}
    env |= {"XDG_CONFIG_HOME": NO_CONFIG, "TERM": "xterm-256color"}
    shell = await asyncio.create_subprocess_shell(
        f"set -o pipefail; {shlex.quote(str(RUNYARD))} {command} | cat",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        executable="/bin/bash",
    )
    stdout, stderr = await shell.communicate()
    assert shell.returncode is not None
    return shell.returncode, stdout.decode(), stderr.decode()


async def test_an_error_into_a_pipe_is_whole_lines(served_gateway: Served, tmp_path: Path) -> None:
    missing = tmp_path / ("a-folder-with-a-long-name-" * 4) / "train-spec.yaml"
    code, _, stderr = await run_piped(served_gateway, f"submit -f {shlex.quote(str(missing))}")
    assert code != 0
    assert f"cannot read {missing}" in stderr, stderr

    pool = "a-pool-that-does-not-exist-" * 4
    spec = tmp_path / "spec.yaml"
    spec.write_text((REPO / "examples/hello.yaml").read_text().replace("dev-a100", pool))
    code, _, stderr = await run_piped(served_gateway, f"submit -f {shlex.quote(str(spec))}")
    assert code != 0
    [named] = [line for line in stderr.splitlines() if pool in line]
    assert len(named) > 100, "the refusal, its pool named, on one line"


async def test_events_into_a_pipe_keep_time_and_correlation_id_whole(
    served_gateway: Served,
) -> None:
    url, token = served_gateway.url, served_gateway.token
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    assert (await cli(url, token, "stop", task_id)).exit_code == 0
    timeline = json.loads((await cli(url, token, "events", task_id, "--json")).stdout)
    assert len(timeline) >= 2

    lines = await piped(served_gateway, f"events {task_id}")
    assert lines[0] == "#\ttime\ttype\tactor\tcorrelation id\tdetail"
    assert lines[1:] == [
        f"{e['version']}\t{e['occurred_at']}\t{e['type']}\t{e['actor']}\t{e['correlation_id']}"
        f"\t{detail(e['data'])}"
        for e in timeline
    ]
    assert any("stopped_by=" in line.split("\t")[-1] for line in lines)  # who stopped it
    assert all("…" not in line and "\x1b" not in line for line in lines)

    grepped = await piped(served_gateway, f"events {task_id} | grep TaskStopped")
    (stopped,) = [e for e in timeline if e["type"] == "TaskStopped"]
    assert grepped == [lines[1:][timeline.index(stopped)]]
    assert stopped["correlation_id"] in grepped[0] and stopped["occurred_at"] in grepped[0]


async def test_list_into_a_pipe_is_one_line_per_task(served_gateway: Served) -> None:
    url, token = served_gateway.url, served_gateway.token
    ids = []
    for _ in range(2):
        submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"))
        assert submitted.exit_code == 0, submitted.output
        ids.append(submitted.stdout.split()[0])
    lines = await piped(served_gateway, "ls")
    assert lines[0] == "id\tname\tstatus\tpool\trun\tcreator\tcreated"
    assert [line.split("\t")[0] for line in lines[1:]] == ids[::-1]
    assert all(len(line.split("\t")) == 7 for line in lines)
    paged = await piped(served_gateway, "ls --limit 1")  # `more: --cursor` goes to stderr
    assert paged == lines[:2]


async def test_a_watch_ends_saying_so_once_its_token_is_revoked(served_gateway: Served) -> None:
    """`runyard watch` of a task that goes on: its token revoked once the watch has shown
    the first event, the watch ends (exit 3) with the refusal the next request gets."""
    url, gateway = served_gateway.url, served_gateway.gateway
    submitted = await cli(
        url, served_gateway.token, "submit", "-f", str(REPO / "examples/hello.yaml")
    )
    task_id = submitted.stdout.split()[0]
    token = await create_token(gateway.db, "t1", "alice", "member")
    principal = await authenticate(gateway.db, token)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env |= {"RUNYARD_URL": url, "RUNYARD_TOKEN": token, "XDG_CONFIG_HOME": NO_CONFIG}
    watch = await asyncio.create_subprocess_exec(
        str(RUNYARD), "watch", task_id, stdout=PIPE, stderr=PIPE, env=env
    )
    assert watch.stdout is not None and watch.stderr is not None
    try:
        async with asyncio.timeout(60):
            assert "TaskSubmitted" in (await watch.stdout.readline()).decode()
            async with gateway.db.acquire() as conn:
                assert await mark_revoked(conn, principal.token_id, "user:t1/admin") is not None
            stderr = (await watch.stderr.read()).decode()
            assert await watch.wait() == 3, stderr
    finally:
        if watch.returncode is None:  # still watching: the gateway waits for it to stop
            watch.kill()
            await watch.wait()
    assert "error auth.token_revoked: this token was revoked" in stderr


async def on_a_terminal(served: Served, command: list[str], columns: int) -> str:
    """`runyard COMMAND` with its stdout a terminal (a pseudo-terminal) `columns` wide:
    what it shows, colours and styles taken out."""
    import pty
    import re

    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("LINES", "FORCE_COLOR")}
    env |= {"RUNYARD_URL": served.url, "RUNYARD_TOKEN": served.token}
    env |= {"XDG_CONFIG_HOME": NO_CONFIG, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    shown = await asyncio.create_subprocess_exec(
        str(RUNYARD), *command, stdout=follower, stderr=PIPE, env=env
    )
    os.close(follower)
    read = bytearray()
    try:
        async with asyncio.timeout(60):
            while chunk := await asyncio.to_thread(_read_some, leader):
                read += chunk
            _, stderr = await shown.communicate()
    finally:
        os.close(leader)
    assert shown.returncode == 0, stderr
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", read.decode()).replace("\r\n", "\n")


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the command has ended and closed its terminal
        return b""


async def test_a_list_on_an_80_column_terminal_keeps_each_task_id_whole(
    served_gateway: Served,
) -> None:
    """The other columns fold to fit 80 columns; an id is never cut or folded, so it can
    be selected and pasted whole. Into a pipe nothing is cut, whatever COLUMNS says."""
    url, token = served_gateway.url, served_gateway.token
    ids = []
    for name in ("a-rather-long-task-name-for-the-list", "short"):
        submitted = await cli(
            url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--set",
            f"name={name}", "--json",
        )  # fmt: skip
        assert submitted.exit_code == 0, submitted.output
        ids.append(json.loads(submitted.stdout)["task_id"])
    shown = await on_a_terminal(served_gateway, ["ls"], columns=80)
    lines = shown.splitlines()
    assert all(len(line) <= 80 for line in lines), shown
    for task_id in ids:
        assert any(task_id in line for line in lines), (task_id, shown)
    assert "a-rather-long-task-name-for-the-list" not in shown, "the name folds instead"

    code, stdout, stderr = await run_piped(served_gateway, "ls", env={"COLUMNS": "80"})
    assert code == 0, stderr
    rows = stdout.splitlines()[1:]
    assert [row.split("\t")[:2] for row in rows] == [
        [ids[1], "short"],
        [ids[0], "a-rather-long-task-name-for-the-list"],
    ]


async def test_a_watch_past_the_tenants_streams_waits_then_says_how_many_are_open(
    served_gateway: Served,
) -> None:
    """`runyard watch` while the tenant has all its streams open at the gateway
    (`streams_per_tenant`, 1 here): each wait is said, then the refusal (how many are
    open, close one) and exit 1, no traceback."""
    url, token, gateway = served_gateway.url, served_gateway.token, served_gateway.gateway
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"))
    task_id = submitted.stdout.split()[0]
    gateway.streams.per_tenant = 1
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(base_url=url, headers=auth) as http,
        http.stream("GET", f"/v1/tasks/{task_id}/watch") as held,
    ):
        assert held.status_code == 200
        watched = await cli(url, token, "watch", task_id)
    assert watched.exit_code == 1, watched.output
    assert watched.exception is None or isinstance(watched.exception, SystemExit)
    lines = watched.stderr.splitlines()
    assert lines.count("the gateway is busy (streams.too_many): retrying in 2 s") == 2
    assert lines[-2].startswith("error streams.too_many: your tenant has 1 streams open")
    assert lines[-1].startswith("hint: close one (a `runyard watch`")
