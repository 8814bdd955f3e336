"""The whole platform as an operator runs it, on infrastructure a test may break.

`chaos_stack` gives each scenario:
- its own embedded PostgreSQL (not the session one other tests share), so the
  test can take it away (`postgres_down`: an immediate shutdown, what a crash
  looks like to clients) and bring it back (`postgres_up`);
- `runyard up` as a child process (its own session), on that database
  (DATABASE_URL) and with the embedded broker it starts itself on a port of
  this test (RUNYARD_KAFKA_PORT): `kill_platform` is `kill -9` of that
  process, `start` is the same command again, `kill_broker` is `kill -9` of
  the broker it runs (which `runyard up` must restart by itself);
- a copy of infra/config with a short stop grace and restart delay.

Whatever a scenario leaves running is stopped at teardown, and the platform's
output is printed when a scenario fails, to tell a platform crash from a test
failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from runyard.stack.embedded import EmbeddedPostgres
from runyard.stack.mounts import unmount_deployments_under
from runyard.stack.ports import free_port
from runyard.stack.up import DEFAULT_PORTS

from tests.chaos.harness import processes_matching
from tests.feishu_fake import FeishuFake

REPO = Path(__file__).resolve().parents[2]
RUNYARD = Path(sys.executable).parent / "runyard"
#: Variables of the test's own environment that would point `runyard up` elsewhere.
#: The Feishu bot the scenarios' alerts go to.
FEISHU_BOT = "chaos-alerts"
#: The scheduler's anti-entropy sweep, every 3 s: what it heals (events a restarted
#: broker lost) is done within the stall limit.
SWEEP_S = 3.0
_FOREIGN = ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "RUNYARD_OWNER_DATABASE_URL")


class PlatformDied(AssertionError):
    """`runyard up` exited although the test did not stop it."""


def service_endpoints() -> str:
    """RUNYARD_ENDPOINTS for a `runyard up` beside others on this host: every service
    (and the submission service's gRPC API) on a free port of its own."""
    endpoints = {name: f"http://127.0.0.1:{free_port()}" for name in DEFAULT_PORTS}
    endpoints["submission-grpc"] = f"127.0.0.1:{free_port()}"
    return json.dumps(endpoints)


@dataclass
class ChaosStack:
    """Postgres (owned by the test), and `runyard up` with its broker, in `root`."""

    root: Path
    postgres: EmbeddedPostgres
    #: Where the platform's Feishu alerts go (bot `FEISHU_BOT`, allowed in its config).
    feishu: FeishuFake
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    kafka_port: int = field(default_factory=free_port)
    #: The services' own ports (RUNYARD_ENDPOINTS), not `runyard up`'s fixed ones.
    endpoints: str = field(default_factory=service_endpoints)
    process: subprocess.Popen[bytes] | None = None
    #: How many times `runyard up` was started (a restart after a kill counts).
    starts: int = 0
    #: When (time.time()) a notification service was killed (alone or with the platform):
    #: a card Feishu accepted just before may be sent again after (at least once).
    notification_kills: list[float] = field(default_factory=list)

    @property
    def home(self) -> Path:
        """`runyard up`'s home: `.runyard` under its working directory."""
        return self.root / "work" / ".runyard"

    @property
    def log_path(self) -> Path:
        return self.root / "platform.log"

    @property
    def dsn(self) -> str:
        return str(self.postgres.dsn)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    # -- the platform -------------------------------------------------------------

    def start(self) -> None:
        """`runyard up` on this test's database and ports, in a session of its own."""
        assert self.process is None or self.process.poll() is not None, "already running"
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        env.update(
            DATABASE_URL=self.dsn,
            RUNYARD_KAFKA_PORT=str(self.kafka_port),
            RUNYARD_ENDPOINTS=self.endpoints,
            RUNYARD_CONFIG=str(self.root / "config"),
            RUNYARD_LOG_LEVEL="WARNING",
            RUNYARD_SETTINGS=json.dumps({"scheduler_sweep_s": SWEEP_S}),
            PYTHONUNBUFFERED="1",
        )
        (self.root / "work").mkdir(exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1} ---\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [
                    str(RUNYARD),
                    "up",
                    "--http-port",
                    str(self.http_port),
                    "--grpc-port",
                    str(self.grpc_port),
                ],
                cwd=self.root / "work",
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    async def wait_ready(self, within: float = 90.0) -> None:
        """Until the API answers with the pools the scheduler registered."""
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(base_url=self.base_url, timeout=5) as http:
            while True:
                self.check_alive()
                with contextlib.suppress(httpx.TransportError, OSError):
                    if (self.home / "token").exists():
                        headers = {"Authorization": f"Bearer {self.token()}"}
                        answer = await http.get("/v1/pools", headers=headers)
                        if answer.status_code == 200 and answer.json():
                            return
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"runyard up was not ready within {within:.0f} s\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.2)

    def check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise PlatformDied(f"runyard up exited ({code})\n{self.log_tail()}")

    def kill_platform(self) -> None:
        """`kill -9` of the `runyard up` process (its children are left as a crash leaves them)."""
        assert self.process is not None
        self.notification_kills.append(time.time())
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, grace: float = 40.0) -> int | None:
        """Ctrl-C (SIGINT) and wait; SIGKILL of its whole session if it does not end."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            raise AssertionError(
                f"runyard up did not stop within {grace:.0f} s of Ctrl-C\n{self.log_tail()}"
            ) from None

    def log_tail(self, chars: int = 4000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- platform output (last {chars} characters) ---\n{text[-chars:]}"

    # -- the broker -----------------------------------------------------------------

    def broker_pids(self) -> list[int]:
        """The Tansu processes listening on this test's broker port."""
        return processes_matching(cmdline=f"127.0.0.1:{self.kafka_port}")

    def kill_broker(self) -> int:
        """`kill -9` of the broker `runyard up` runs; returns its pid."""
        pids = self.broker_pids()
        assert len(pids) == 1, f"expected one broker on port {self.kafka_port}, found {pids}"
        os.kill(pids[0], signal.SIGKILL)
        return pids[0]

    # -- the database -----------------------------------------------------------------

    def postgres_down(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): connections drop, no checkpoint."""
        pid = int((self.postgres.data_dir / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, "Postgres did not go down within 30 s"
            time.sleep(0.05)

    def postgres_up(self) -> None:
        self.postgres.start()


def _config(target: Path) -> None:
    """infra/config with a 2 s stop grace and restarts capped at 1 s."""
    shutil.copytree(REPO / "infra/config", target)
    runtime = yaml.safe_load((target / "runtime.yaml").read_text())
    runtime["local"]["grace_s"] = 2
    runtime["deployer"] = {**(runtime.get("deployer") or {}), "max_restart_delay_s": 1}
    (target / "runtime.yaml").write_text(yaml.safe_dump(runtime))


@pytest.fixture
async def chaos_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ChaosStack]:
    # A short path: the Postgres socket lives in the data directory (107-byte limit).
    root = Path(tempfile.mkdtemp(prefix="ry-chaos-"))
    _config(root / "config")
    postgres = EmbeddedPostgres(
        root / "pg",
        settings={
            # fsync off survives the outage scenario's SIGQUIT (the OS keeps what was
            # written); synchronous_commit off would not: commits acknowledged just before
            # it would vanish, which no production server does and the platform relies on.
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "300",
        },
    )
    postgres.start()
    feishu = FeishuFake(bots={FEISHU_BOT: None})
    await feishu.start()
    origins = {"webhook_origins": [f"http://127.0.0.1:{feishu.port}"]}
    (root / "config" / "notification.yaml").write_text(yaml.safe_dump(origins))
    stack = ChaosStack(root, postgres, feishu=feishu)
    try:
        stack.start()
        await stack.wait_ready()
        yield stack
    finally:
        try:
            with contextlib.suppress(AssertionError):
                stack.stop()
            for pid in stack.broker_pids():  # a broker left behind: its test fails on it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(RuntimeError):  # already down: nothing to stop
                postgres.stop()
            await feishu.stop()
        finally:
            report = getattr(request.node, "rep_call", None)
            # failed, or failed as expected (xfail): the output says why
            if report is not None and report.outcome != "passed" and stack.log_path.exists():
                kept = tmp_path_factory.getbasetemp() / f"{request.node.name}.platform.log"
                shutil.copy(stack.log_path, kept)
                print(f"{stack.log_tail(8000)}\n--- the whole platform output: {kept}")
            unmount_deployments_under([root])  # what a deployer left for its successor
            shutil.rmtree(root, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Keep each phase's report on the item, so the fixture knows whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
