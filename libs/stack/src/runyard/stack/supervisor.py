"""Every service as a child process, kept running: what `runyard up` supervises.

Each child runs in a process group of its own (signals to the terminal's
group do not reach it; the supervisor decides when it stops) and is tied to
the supervisor by the kernel (PR_SET_PDEATHSIG, `die_with_parent`): a
supervisor killed with -9 leaves no service behind. Processes a service
starts in sessions of their own (the deployer's workers) are not in its group
and outlive it, for the next deployer to adopt.

A child that exits is started again after a delay that doubles with each quick
exit (`restart_delay`: exponential, with jitter, capped at `cap_s`), back to
the shortest once it had run `healthy_after_s`; each restart is reported with
the exit code, and `before_restart` (when given) is awaited first. `stop`
sends SIGTERM to every child's group, waits `grace_s`, then sends SIGKILL.

The state (name, pid, started_at, restarts, port, url, last_exit) is written to
`state_path` (`.runyard/run/services.json`) at each change, whole or not at all,
for `runyard ps`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runyard.stack.context import ROLE_DSN_VARIABLES, ServiceContext
from runyard.stack.ports import free_port
from runyard.stack.processes import (
    ProcessIdentity,
    boot_id,
    die_with_parent,
    end_process,
    start_ticks,
)

log = logging.getLogger("runyard.supervisor")


def restart_delay(
    quick_exits: int, *, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None
) -> float:
    """Seconds to wait before a restart after `quick_exits` exits in a row that came
    before the child ran healthy: base, doubling, capped; drawn in [half, whole] so
    that services that failed together do not come back in lockstep."""
    bound = min(cap_s, base_s * 2.0 ** max(quick_exits - 1, 0))
    draw: float = (rng or random).random()
    return bound * (0.5 + 0.5 * draw)


def describe_exit(code: int | None) -> str:
    """An exit status in words: `code 3`, `killed by SIGKILL`."""
    if code is None:
        return "no exit status"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"code {code}"


@dataclass(frozen=True)
class ChildSpec:
    """How to start one service: its command, environment and the URL it serves on."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    url: str = ""


@dataclass
class Child:
    spec: ChildSpec
    process: asyncio.subprocess.Process | None = None
    identity: ProcessIdentity | None = None
    started_at: float | None = None
    started_mono: float = 0.0
    restarts: int = 0
    quick_exits: int = 0
    last_exit: int | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def state(self) -> dict[str, Any]:
        """This child as `services.json` records it."""
        url = self.spec.url
        started = self.started_at
        return {
            "name": self.spec.name,
            "pid": self.process.pid if self.running and self.process else None,
            "start_ticks": self.identity.start_ticks if self.running and self.identity else None,
            "started_at": datetime.fromtimestamp(started, UTC).isoformat() if started else None,
            "restarts": self.restarts,
            "port": urlsplit(url).port if url.startswith("http") else None,
            "url": url,
            "last_exit": self.last_exit,
        }


@dataclass
class Supervisor:
    """Starts `specs` as children, restarts them when they exit, stops them all."""

    specs: Sequence[ChildSpec]
    state_path: Path | None = None
    #: False: a child that exits stays down (tests that want to see it).
    restart: bool = True
    base_s: float = 0.5
    cap_s: float = 30.0
    healthy_after_s: float = 60.0
    grace_s: float = 30.0
    report: Callable[[str], None] = log.warning
    #: Awaited with a child's name before each restart (not before its first start): what
    #: the code it starts again may need that the first start did not (`runyard up`: its
    #: migrations). An error is reported and the child starts all the same.
    before_restart: Callable[[str], Awaitable[None]] | None = None
    children: dict[str, Child] = field(default_factory=dict)
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)
    _stopping: bool = False

    async def start(self) -> None:
        """Start every child (all at once) and watch them."""
        self.children = {spec.name: Child(spec) for spec in self.specs}
        for child in self.children.values():
            await self._spawn(child)
        self._watchers = [
            asyncio.create_task(self._watch(child), name=f"watch-{child.spec.name}")
            for child in self.children.values()
        ]

    async def run(self) -> None:
        """`start`, then keep the children running until cancelled; then `stop`."""
        try:
            if not self.children:
                await self.start()
            await asyncio.gather(*self._watchers)
            await asyncio.Event().wait()  # every child stays down (restart=False)
        finally:
            await asyncio.shield(self.stop())

    def kill_groups(self) -> None:
        """SIGKILL to every child's process group (after `stop`: whatever a child left)."""
        for child in self.children.values():
            if child.process is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.process.pid, signal.SIGKILL)

    def exited(self) -> dict[str, int | None]:
        """Children that are not running now, with their last exit status."""
        return {n: c.last_exit for n, c in self.children.items() if not c.running}

    async def _spawn(self, child: Child, restarts: int = 0) -> None:
        """Starts `child`; its fields, the restart count included, change together
        with the state file, once the process exists."""
        argv = die_with_parent(list(child.spec.argv))
        child.process = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(child.spec.env),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a process group of its own
        )
        child.restarts = restarts
        child.identity = ProcessIdentity.of(child.process.pid)
        child.started_at = time.time()
        child.started_mono = time.monotonic()
        self.write_state()

    async def _watch(self, child: Child) -> None:
        while True:
            assert child.process is not None
            code = await child.process.wait()
            child.last_exit = code
            self.write_state()
            if self._stopping:
                return
            ran_s = time.monotonic() - child.started_mono
            if not self.restart:
                self.report(f"{child.spec.name} exited ({describe_exit(code)}) after {ran_s:.1f} s")
                return
            child.quick_exits = 0 if ran_s >= self.healthy_after_s else child.quick_exits + 1
            delay = restart_delay(child.quick_exits, base_s=self.base_s, cap_s=self.cap_s)
            self.report(
                f"{child.spec.name} exited ({describe_exit(code)}) after {ran_s:.1f} s:"
                f" restarting it in {delay:.1f} s (restart {child.restarts + 1})"
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            if self.before_restart is not None:
                try:
                    await self.before_restart(child.spec.name)
                except Exception as exc:
                    self.report(f"{child.spec.name}: before restarting it: {exc!r}")
            await self._spawn(child, restarts=child.restarts + 1)

    async def stop(self) -> None:
        """SIGTERM to every child's group, SIGKILL to those still there after `grace_s`."""
        self._stopping = True
        for watcher in self._watchers:
            watcher.cancel()
        for watcher in self._watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        live = [c for c in self.children.values() if c.running and c.process is not None]
        for child in live:
            _signal_group(child, signal.SIGTERM)
        if live:
            waits = [asyncio.ensure_future(c.process.wait()) for c in live if c.process]
            _, pending = await asyncio.wait(waits, timeout=self.grace_s)
            for child in live:
                if child.running:
                    self.report(
                        f"{child.spec.name}: still running {self.grace_s:.0f} s after SIGTERM"
                    )
                _signal_group(child, signal.SIGKILL)  # and whatever it left in its group
            if pending:
                await asyncio.wait(pending)
            for child in live:
                child.last_exit = child.process.returncode if child.process else None
        if self.state_path is not None:
            self.state_path.unlink(missing_ok=True)

    def write_state(self) -> None:
        """`state_path`, replaced whole (a reader never sees half of it)."""
        if self.state_path is None:
            return
        state = {
            "supervisor": {
                "pid": os.getpid(),
                "start_ticks": start_ticks(os.getpid()),
                "boot_id": boot_id(),
            },
            "services": [child.state() for child in self.children.values()],
        }
        partial = self.state_path.with_name(self.state_path.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(state, out, indent=2)
        os.replace(partial, self.state_path)


def _signal_group(child: Child, sig: int) -> None:
    """`sig` to the child's process group; the child is not reaped yet (the watcher
    only reaps through its own `wait`), so the group id still names it."""
    if child.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, sig)


@contextlib.asynccontextmanager
async def service_processes(
    ctx: ServiceContext, names: Sequence[str], *, grace_s: float = 15.0, restart: bool = False
) -> AsyncIterator[Supervisor]:
    """Every service of `names` as a child process on the platform `ctx` describes, each
    on a free port (`free_endpoints`), all started at once and by default never restarted
    (a test or a benchmark wants a crash seen, not hidden: `Supervisor.exited`). On the way out
    they are stopped, then SIGKILL goes to every child's process group, so nothing of
    theirs outlives the caller. With `restart`, a child that exits is started again, as
    `runyard up` does (a test of a service's crash and its recovery)."""
    free_endpoints(ctx, names)
    supervisor = Supervisor(service_specs(ctx, names), restart=restart, grace_s=grace_s)
    try:
        await supervisor.start()
        yield supervisor
    finally:
        try:
            await supervisor.stop()
        finally:
            supervisor.kill_groups()


def free_endpoints(ctx: ServiceContext, names: Sequence[str], host: str = "127.0.0.1") -> None:
    """A free port for each service of `names` (the gateway keeps its `http_port`) and
    for the submission service's gRPC API, in `ctx.settings` and `ctx.endpoints`: the
    ports of a platform whose services start as children on one host beside others
    (tests, benchmarks), where `runyard up`'s fixed ports could be taken."""
    for name in names:
        if name != "gateway":
            ctx.settings[f"{name}_port"] = port = free_port(host)
            ctx.endpoints[name] = f"http://{host}:{port}"
    ctx.endpoints["gateway"] = f"http://{host}:{ctx.settings['http_port']}"
    ctx.settings["submission_grpc_port"] = port = free_port(host)
    ctx.endpoints["submission-grpc"] = f"{host}:{port}"


def service_specs(ctx: ServiceContext, names: Sequence[str]) -> list[ChildSpec]:
    """How to start each of `names` as a child on the platform `ctx` describes:
    `python -m runyard.stack.serve <name>` with the environment from which
    `ServiceContext.from_env` builds that context again (its own DSN, the broker
    and topic prefix, home, config, settings, every service's URL) and its port
    (RUNYARD_SERVICE_PORT). Settings that are not JSON (a bound socket) stay
    behind, and so does the dev token (each reads its file)."""
    settings = {k: v for k, v in ctx.settings.items() if k != "token" and _is_json(v)}
    for name, url in ctx.endpoints.items():
        if port := urlsplit(url if "://" in url else f"//{url}").port:
            settings[f"{name.replace('-', '_')}_port"] = port
    private = {"DATABASE_URL", "RUNYARD_OWNER_DATABASE_URL", *ROLE_DSN_VARIABLES.values()}
    base = {k: v for k, v in os.environ.items() if k not in private}
    base.update(
        KAFKA_BOOTSTRAP_SERVERS=ctx.kafka.bootstrap,
        RUNYARD_TOPIC_PREFIX=ctx.kafka.topics.prefix,
        RUNYARD_HOME=str(Path(ctx.data_dir).resolve()),
        RUNYARD_CONFIG=str(Path(ctx.config_dir).resolve()),
        RUNYARD_SETTINGS=json.dumps(settings),
        RUNYARD_ENDPOINTS=json.dumps(ctx.endpoints),
        PYTHONUNBUFFERED="1",
    )
    specs = []
    for name in names:
        url = ctx.endpoints.get(name, "")
        env = {**base, "DATABASE_URL": ctx.service_dsns.get(name, ctx.dsn)}
        if url.startswith("http") and (port := urlsplit(url).port):
            env["RUNYARD_SERVICE_PORT"] = str(port)
        argv = [sys.executable, "-m", "runyard.stack.serve", name]
        specs.append(ChildSpec(name, argv, env, url))
    return specs


def _is_json(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def read_state(path: Path) -> dict[str, Any] | None:
    """What `services.json` says (None when there is none, or it is not ours)."""
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def recorded(service: Mapping[str, Any], boot: str) -> ProcessIdentity | None:
    """The identity of a service `services.json` records (None without a pid)."""
    pid, ticks = service.get("pid"), service.get("start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return None
    return ProcessIdentity(pid, boot, ticks)


def end_leftovers(path: Path) -> list[str]:
    """End the services a crashed supervisor recorded in `path` that still run (the
    kernel ties them to it where it can; this covers where it cannot). Returns their
    names; the file is removed."""
    state = read_state(path) or {}
    boot = str((state.get("supervisor") or {}).get("boot_id", ""))
    ended = []
    for service in state.get("services") or []:
        identity = recorded(service, boot)
        if identity is not None and end_process(identity, signal.SIGKILL):
            ended.append(str(service.get("name")))
    path.unlink(missing_ok=True)
    return ended
