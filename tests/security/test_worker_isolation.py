"""A task cannot reach the control plane from its workers (local runtime).

The whole platform runs (each service in its own process, as `runyard up` runs
them; one platform for the module, each test with tasks of its own), its data folder
outside /tmp and readable by everyone, like a `.runyard/` folder in a project
checkout, with the dev token file in it. Each test submits tasks whose launch
command probes an escape that used to work when workers ran as root in the
host's PID and network namespaces: reading the token or Postgres' data, seeing
the control plane's processes through /proc, reading another task's working
folder, connecting to Postgres, the broker or the gateway on 127.0.0.1. Every
probe prints `PROBE <name>=<yes|no>`, read back through the log API; each test
also runs a probe that must succeed, so a broken probe cannot pass as "no".
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from runyard.deployer.main import build_runtime

from tests.e2e.audit import assert_audit_chain
from tests.e2e.conftest import Platform, SharedPlatform

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxed workers need a root deployer"),
]

REPO = Path(__file__).resolve().parents[2]
#: munge's socket, where Slurm is installed (the host's, hidden from workers).
MUNGE_SOCKET = "/run/munge/munge.socket.2"


@pytest.fixture(scope="module")
async def sandboxed(postgres_url: str, kafka_bootstrap: str) -> AsyncIterator[Platform]:
    """One platform for the module's tests (each has tasks of its own), in the processes
    layout, its home outside /tmp and open to everyone (0755): only the sandbox can keep
    workers out."""
    build = REPO / "build"
    build.mkdir(exist_ok=True)
    homes: list[Path] = []

    def home() -> Path:
        made = Path(tempfile.mkdtemp(prefix="runyard-isolation-", dir=build))
        made.chmod(0o755)
        homes.append(made)
        return made

    shared = SharedPlatform(postgres_url, kafka_bootstrap, home)
    try:
        running = await shared.get("processes")
        if not build_runtime(running.ctx).namespaces:
            pytest.skip("this machine does not permit sandboxed workers (unshare)")
        running.ctx.data_dir.mkdir(parents=True, exist_ok=True)
        running.ctx.data_dir.chmod(0o755)
        (running.ctx.data_dir / "token").write_text(running.token + "\n")
        (running.ctx.data_dir / "token").chmod(0o644)
        yield running
    finally:
        try:
            await shared.close()
        finally:
            for made in homes:
                shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
async def platform(sandboxed: Platform) -> AsyncIterator[Platform]:
    """The module's platform; its audit chain checked after each test."""
    yield sandboxed
    await assert_audit_chain(sandboxed.ctx.dsn)


def probe_read(name: str, path: str) -> str:
    return f'cat {path} >/dev/null 2>&1 && echo "PROBE {name}=yes" || echo "PROBE {name}=no"'


def probe_connect(name: str, port: int) -> str:
    return (
        f"timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null "
        f'&& echo "PROBE {name}=yes" || echo "PROBE {name}=no"'
    )


async def probes(platform: Platform, task_id: str, want: int) -> dict[str, str]:
    """`PROBE name=value` lines of the task's output, once `want` of them are in."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(found) < want and time.monotonic() < deadline:
        answer = await platform.http.get(f"/v1/tasks/{task_id}/logs", params={"limit": 1000})
        assert answer.status_code == 200, answer.text
        for line in answer.json()["lines"]:
            text = line["line"]
            if text.startswith("PROBE "):
                name, _, value = text.removeprefix("PROBE ").partition("=")
                found[name] = value
        await asyncio.sleep(0.2)
    return found


async def run_probes(platform: Platform, lines: list[str], **spec: Any) -> dict[str, str]:
    command = "\n".join(lines)
    created = await platform.submit(name="probe", command=command, **spec)
    await platform.wait_status(created["task_id"], "succeeded", within=60)
    return await probes(platform, created["task_id"], len(lines))


async def test_a_task_cannot_read_control_plane_files_or_see_its_processes(
    platform: Platform,
) -> None:
    data = platform.ctx.data_dir
    conn = await asyncpg.connect(platform.ctx.dsn)
    try:
        pg_data = await conn.fetchval("SHOW data_directory")
    finally:
        await conn.close()
    # the deployer's own process (it started the workers)
    deployer_pid = (
        await platform.http.get(f"{platform.ctx.endpoints['deployer']}/healthz")
    ).json()["pid"]
    found = await run_probes(
        platform,
        [
            'echo mine > "$HOME/own" && ' + probe_read("own_file", '"$HOME/own"'),
            probe_read("token", f"{data}/token"),
            # the path down to its own scratch is all it sees of the data folder
            f"ls -A {data} | grep -qv '^scratch$' "
            '&& echo "PROBE data_dir=yes" || echo "PROBE data_dir=no"',
            probe_read("pg_version", f"{pg_data}/PG_VERSION"),
            probe_read("pg_hba", f"{pg_data}/pg_hba.conf"),
            probe_read("control_plane_cwd", f"/proc/{deployer_pid}/cwd/pyproject.toml"),
            probe_read("control_plane_environ", f"/proc/{deployer_pid}/environ"),
            probe_read("wrapper_environ", "/proc/1/environ"),
            'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " " | grep -q "py[t]est" '
            '&& echo "PROBE sees_test_runner=yes" || echo "PROBE sees_test_runner=no"',
            '[ "$(id -u)" != 0 ] && echo "PROBE unprivileged=yes" || echo "PROBE unprivileged=no"',
            # munge mints a credential of the caller's uid, which Slurm takes for sbatch
            f'[ -S {MUNGE_SOCKET} ] && echo "PROBE munge=yes" || echo "PROBE munge=no"',
        ],
    )
    assert found == {
        "own_file": "yes",
        "token": "no",
        "data_dir": "no",
        "pg_version": "no",
        "pg_hba": "no",
        "control_plane_cwd": "no",
        "control_plane_environ": "no",
        "wrapper_environ": "no",
        "sees_test_runner": "no",
        "unprivileged": "yes",
        "munge": "no",
    }
    # The token file is still there for the host: the sandbox hid it, nothing removed it.
    assert (data / "token").read_text().strip() == platform.token


async def test_a_task_cannot_connect_to_postgres_the_broker_or_the_gateway(
    platform: Platform,
) -> None:
    pg_port = urlsplit(platform.ctx.dsn).port
    broker_port = int(platform.kafka.bootstrap.rsplit(":", 1)[1])
    gateway_port = int(platform.ctx.settings["http_port"])
    assert pg_port is not None
    loopback = (
        'python -c \'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); '
        's.listen(); socket.create_connection(s.getsockname()); print("PROBE loopback=yes")\''
    )
    found = await run_probes(
        platform,
        [
            loopback,
            probe_connect("postgres", pg_port),
            probe_connect("broker", broker_port),
            probe_connect("gateway", gateway_port),
        ],
        image="pytorch:2.3-cuda12",
    )
    assert found == {"loopback": "yes", "postgres": "no", "broker": "no", "gateway": "no"}


async def test_a_task_cannot_read_another_tasks_working_folder(platform: Platform) -> None:
    other = await platform.submit(name="other", command="echo private > marker; sleep 60")
    other_id = other["task_id"]
    await platform.wait_status(other_id, "running", within=60)
    pids = {}
    for _ in range(100):
        if pids := platform.worker_pids((other_id, 1, 1)):
            break
        await asyncio.sleep(0.1)
    assert pids, "the other task's worker is not running"
    # its working folder (the path the deployer gave it, as the worker names it)
    marker = Path(os.readlink(f"/proc/{pids[0]}/cwd")) / "marker"
    for _ in range(100):
        if Path(f"/proc/{pids[0]}/cwd/marker").exists():
            break
        await asyncio.sleep(0.1)
    assert Path(f"/proc/{pids[0]}/cwd/marker").read_text() == "private\n"
    scratch_root = build_runtime(platform.ctx).config.scratch_root
    found = await run_probes(
        platform,
        [
            "echo mine > own && " + probe_read("own_work", "own"),
            probe_read("other_marker", str(marker)),
            f"ls -A {scratch_root} | grep -q {other_id} "
            '&& echo "PROBE lists_other=yes" || echo "PROBE lists_other=no"',
        ],
    )
    assert found == {"own_work": "yes", "other_marker": "no", "lists_other": "no"}
    stopped = await platform.http.post(f"/v1/tasks/{other_id}/stop")
    assert stopped.status_code in (200, 202), stopped.text
    await platform.wait_status(other_id, "stopped", within=30)
