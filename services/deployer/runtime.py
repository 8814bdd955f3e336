"""Where workers run: the `Runtime` interface and the local (embedded) runtime.

The deployer drives a runtime through one deployment (one attempt of one run
of a task) in this order; every step is keyed by the deployment's `key`
(task id, run, attempt):

    allocate -> pull_image -> mount_storage -> init_env      the 4 deploy stages (R-20)
    start_workers(on_output, on_exit)                         all at once (gang)
    stop(key, grace_s)  |  workers exit by themselves         on_exit per worker
    cleanup(key)                                              scratch removed (R-22)

A stage that cannot be done raises `StageFailed(reason)`; the reason goes into
`DeployStageFailed` as is, so it must say what a person can fix.

How a Kubernetes runtime maps onto it
-------------------------------------
- `allocate`: create the task's namespace objects (a headless Service for
  rank discovery, a ConfigMap, a Secret holding the resolved creator-only
  variables) and one Pod per worker, pinned to the placed node
  (`nodeName` / node affinity) with `nvidia.com/gpu: len(gpus)` limits;
  Pods start suspended (a `wait-for-go` init container) so no launch command
  runs before the whole gang is ready.
- `pull_image`: wait until every Pod's image is pulled (ImagePullBackOff /
  ErrImagePull -> `StageFailed` with the kubelet message).
- `mount_storage`: PVCs / CSI volumes for each `VolumeMount` at its
  `mount_path` (readOnly as asked; public data read-only); an `emptyDir`
  for the worker-local scratch (HOME, TMPDIR, working dir), which disappears
  with the Pod (R-22). Wait for volumes attached (FailedMount -> StageFailed).
- `init_env`: the same variables as here (`worker_env`), MASTER_ADDR being
  the rank-0 Pod's Service DNS name instead of 127.0.0.1; wait for Ready.
- `start_workers`: release the gate of every Pod (e.g. write the go file
  through `exec`, or patch an annotation the init container watches); the
  container runs `bash --login -c "<launch command>"`. Output comes from the
  Pod log stream (`follow=True`) per container, one line at a time; exits come
  from a Pod watch (`containerStatuses[].state.terminated.exitCode`).
- `stop`: delete the Pods with `gracePeriodSeconds` = grace_s (kubelet sends
  SIGTERM, then SIGKILL), exactly what the local runtime does to a process group.
- `capture_stacks`: `kubectl exec py-spy dump` in each container.
- `cleanup`: delete what `allocate` created; `deployments()`: list Pods by the
  `runyard.io/task` label, used by the deployer to reconcile after a restart.

The local runtime
-----------------
Each worker is a real process group on this machine (`start_new_session`),
running `bash --login -c "<launch command>"`:

- images: a local catalogue maps an image name to a directory whose `bin/`
  goes first on PATH (a virtualenv is such a directory). `bash --login` reads
  /etc/profile, which may reset PATH, so the worker's private HOME gets a
  `.bash_profile` that puts the image's `bin/` first again;
- storage: each volume is a host directory `<volumes_root>/<file system>/<volume>`.
  Without a private mount namespace (no root, no bubblewrap here) a worker
  cannot see it at the absolute mount path; the fallback is a symlink at the
  mount path taken relative to the worker's working directory
  (`/mnt/ckpt` -> `./mnt/ckpt`), and `RUNYARD_MOUNT_<N>=<mount path>=<host dir>`;
- scratch: a private directory per worker (HOME, TMPDIR and working
  directory), removed at cleanup;
- output: stdout and stderr line by line into one bounded queue per
  deployment, drained by a pump that awaits the `on_output` callback; a full
  queue drops the line and counts it (the worker never blocks on a slow sink);
- stop: SIGTERM to the process group, SIGKILL after `grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import WorkerPlacement

log = logging.getLogger("runyard.deployer.runtime")

Stream = Literal["stdout", "stderr"]
DeploymentKey = tuple[str, int, int]
"""(task id, run, attempt)."""

DEFAULT_MASTER_PORT = 29500


class StageFailed(Exception):
    """A deploy stage could not be done; `reason` is what a person reads."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Deployment:
    """What a runtime needs to run one attempt of one run of a task."""

    task_id: str
    run: int
    attempt: int
    spec: TaskSpec
    workers: tuple[WorkerPlacement, ...]

    @property
    def key(self) -> DeploymentKey:
        return (self.task_id, self.run, self.attempt)

    @property
    def run_id(self) -> str:
        """Distinct per run of the task (and the same for every worker of it)."""
        return f"{self.task_id}-run{self.run}"


@dataclass(frozen=True, slots=True)
class OutputLine:
    """One line a worker wrote (without its newline)."""

    task_id: str
    run: int
    attempt: int
    worker: int
    stream: Stream
    line: str
    at: datetime


OnOutput = Callable[[OutputLine], Awaitable[None]]
OnExit = Callable[[DeploymentKey, int, int], Awaitable[None]]
"""(deployment key, worker index, exit code): 128+N when killed by signal N."""


@runtime_checkable
class Runtime(Protocol):
    """What the deployer needs from wherever workers run; see the module docstring."""

    async def allocate(self, deployment: Deployment) -> None: ...

    async def pull_image(self, deployment: Deployment) -> None: ...

    async def mount_storage(self, deployment: Deployment) -> None: ...

    async def init_env(self, deployment: Deployment) -> None: ...

    async def start_workers(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        """Start every worker at once; their process (or pod) ids by worker index."""
        ...

    async def stop(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        """End every worker of the deployment; returns once all of them are gone."""
        ...

    async def capture_stacks(self, key: DeploymentKey) -> dict[int, str]: ...

    async def cleanup(self, key: DeploymentKey) -> None:
        """Release what the deployment holds (scratch space); stops it first if needed."""
        ...

    def deployments(self) -> list[DeploymentKey]:
        """Deployments this runtime holds now (for reconciliation after a restart)."""
        ...


# --- the local runtime ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalRuntimeConfig:
    """Where the local runtime keeps things, and its image catalogue."""

    #: Worker scratch space: `<scratch_root>/<task>/run<r>-a<a>/w<i>/`.
    scratch_root: Path
    #: Host directories of volumes: `<volumes_root>/<file system>/<volume>`.
    volumes_root: Path
    #: Image name -> directory whose bin/ goes first on PATH.
    images: Mapping[str, Path] = field(default_factory=dict)
    #: Seconds between SIGTERM and SIGKILL on stop.
    grace_s: float = 10.0
    #: Output lines buffered per deployment before lines are dropped.
    output_buffer: int = 10_000
    #: Resolves a creator-only variable's `secret_ref` to its value (None: unset).
    resolve_secret: Callable[[str], str | None] | None = None

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], *, data_dir: Path, base_dir: Path
    ) -> LocalRuntimeConfig:
        """Build from `runtime.yaml`'s `local:` section; see infra/config/runtime.yaml."""
        images: dict[str, Path] = {}
        for name, where in (raw.get("images") or {}).items():
            images[str(name)] = _image_dir(str(where), base_dir)
        return cls(
            scratch_root=Path(raw.get("scratch_root") or data_dir / "scratch"),
            volumes_root=Path(raw.get("volumes_root") or data_dir / "volumes"),
            images=images,
            grace_s=float(raw.get("grace_s", 10.0)),
            output_buffer=int(raw.get("output_buffer", 10_000)),
        )


def _image_dir(where: str, base_dir: Path) -> Path:
    if where == "@python":  # the environment Runyard itself runs in
        return Path(sys.prefix)
    path = Path(where).expanduser()
    return path if path.is_absolute() else base_dir / path


@dataclass
class _Worker:
    index: int
    placement: WorkerPlacement
    scratch: Path
    env: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = None
    exit_code: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Local:
    deployment: Deployment
    root: Path
    workers: dict[int, _Worker]
    image_bin: Path | None = None
    mounts: list[tuple[str, Path, bool]] = field(default_factory=list)
    queue: asyncio.Queue[OutputLine | None] | None = None
    pump: asyncio.Task[None] | None = None
    watchers: list[asyncio.Task[None]] = field(default_factory=list)
    dropped: int = 0
    stopping: bool = False


class LocalRuntime:
    """Workers as process groups on this machine; see the module docstring."""

    def __init__(self, config: LocalRuntimeConfig) -> None:
        self.config = config
        self._deps: dict[DeploymentKey, _Local] = {}
        self.dropped_lines = 0

    # -- stages ------------------------------------------------------------------

    async def allocate(self, deployment: Deployment) -> None:
        key = deployment.key
        if key in self._deps:
            return
        task, run, attempt = key
        root = self.config.scratch_root / task / f"run{run}-a{attempt}"
        workers: dict[int, _Worker] = {}
        for placement in deployment.workers:
            scratch = root / f"w{placement.index}"
            for sub in ("home", "tmp", "work"):
                (scratch / sub).mkdir(parents=True, exist_ok=True)
            scratch.chmod(0o700)
            workers[placement.index] = _Worker(placement.index, placement, scratch)
        self._deps[key] = _Local(deployment, root, workers)

    async def pull_image(self, deployment: Deployment) -> None:
        local = self._get(deployment.key)
        image = deployment.spec.image
        where = self.config.images.get(image)
        if where is None:
            known = ", ".join(sorted(self.config.images)) or "none"
            raise StageFailed(
                f"image {image!r} is not in the local image catalogue (known images: {known})"
            )
        if not (where / "bin").is_dir():
            raise StageFailed(
                f"image {image!r} maps to {where}, which has no bin/ directory on this machine"
            )
        local.image_bin = where / "bin"

    async def mount_storage(self, deployment: Deployment) -> None:
        local = self._get(deployment.key)
        local.mounts = []
        for mount in deployment.spec.mounts:
            host = self.config.volumes_root / mount.file_system / mount.volume
            try:
                host.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StageFailed(
                    f"volume {mount.file_system}/{mount.volume} cannot be prepared at {host}: {exc}"
                ) from exc
            local.mounts.append((mount.mount_path, host, mount.read_only))
        for worker in local.workers.values():
            for mount_path, host, _ in local.mounts:
                link = worker.scratch / "work" / mount_path.lstrip("/")
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.exists():
                    link.symlink_to(host, target_is_directory=True)

    async def init_env(self, deployment: Deployment) -> None:
        local = self._get(deployment.key)
        if local.image_bin is None:
            raise StageFailed("the image was not prepared (image_pull did not run)")
        port = free_port(DEFAULT_MASTER_PORT) if deployment.spec.framework == "pytorch_ddp" else 0
        hostfile: Path | None = None
        if deployment.spec.framework == "mpi":
            hostfile = local.root / "hostfile"
            slots = "".join(f"127.0.0.1 slots={len(w.gpus)}\n" for w in deployment.workers)
            hostfile.write_text(slots)
        for worker in local.workers.values():
            worker.env = self.worker_env(
                deployment, worker, local, master_port=port, hostfile=hostfile
            )
            profile = (
                "# written by the Runyard local runtime: the image's bin/ first on PATH\n"
                f'export PATH="{local.image_bin}:$PATH"\n'
            )
            (worker.scratch / "home" / ".bash_profile").write_text(profile)

    def worker_env(
        self,
        deployment: Deployment,
        worker: _Worker,
        local: _Local,
        *,
        master_port: int,
        hostfile: Path | None,
    ) -> dict[str, str]:
        """The environment of one worker (R-15). Values of user variables are never logged."""
        spec = deployment.spec
        home = worker.scratch / "home"
        base_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env: dict[str, str] = {
            "PATH": f"{local.image_bin}:{base_path}",
            "HOME": str(home),
            "TMPDIR": str(worker.scratch / "tmp"),
            "PWD": str(worker.scratch / "work"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "USER": os.environ.get("USER", "runyard"),
            "PYTHONUNBUFFERED": "1",
            "RUNYARD_TASK_ID": deployment.task_id,
            "RUNYARD_RUN_ID": deployment.run_id,
            "RUNYARD_ATTEMPT": str(deployment.attempt),
            "RUNYARD_WORKER_INDEX": str(worker.index),
            "RUNYARD_WORKER_COUNT": str(len(deployment.workers)),
            "RUNYARD_NODE": worker.placement.node,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in worker.placement.gpus),
        }
        if local.image_bin is not None:
            env["VIRTUAL_ENV"] = str(local.image_bin.parent)
        for n, (mount_path, host, _) in enumerate(local.mounts):
            env[f"RUNYARD_MOUNT_{n}"] = f"{mount_path}={host}"
        if spec.framework == "pytorch_ddp":
            env.update(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(master_port),
                WORLD_SIZE=str(len(deployment.workers)),
                RANK=str(worker.index),
                LOCAL_RANK="0",
            )
        elif spec.framework == "mpi" and hostfile is not None:
            env.update(
                RUNYARD_MPI_HOSTFILE=str(hostfile), OMPI_MCA_orte_default_hostfile=str(hostfile)
            )
        elif spec.framework == "ray":
            env["RAY_ADDRESS"] = "127.0.0.1:6379"
            env["RUNYARD_RAY_HEAD"] = "1" if worker.index == 0 else "0"
        for var in spec.env:
            value = var.value
            if value is None and var.secret_ref and self.config.resolve_secret is not None:
                value = self.config.resolve_secret(var.secret_ref)
            if value is not None:
                env[var.name] = value
        return env

    # -- workers -----------------------------------------------------------------

    async def start_workers(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        local = self._get(deployment.key)
        if any(w.process is not None for w in local.workers.values()):
            raise RuntimeError(f"workers of {deployment.key} already started")
        local.queue = asyncio.Queue(maxsize=self.config.output_buffer)
        local.pump = asyncio.create_task(self._pump(local, on_output))
        pids: dict[int, int] = {}
        for worker in local.workers.values():
            worker.process = await asyncio.create_subprocess_exec(
                "bash",
                "--login",
                "-c",
                deployment.spec.command,
                cwd=worker.scratch / "work",
                env=worker.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            pids[worker.index] = worker.process.pid
        for worker in local.workers.values():
            local.watchers.append(asyncio.create_task(self._watch(local, worker, on_exit)))
        return pids

    async def _watch(self, local: _Local, worker: _Worker, on_exit: OnExit) -> None:
        process = worker.process
        assert process is not None and process.stdout is not None and process.stderr is not None
        readers = [
            asyncio.create_task(self._read(local, worker, process.stdout, "stdout")),
            asyncio.create_task(self._read(local, worker, process.stderr, "stderr")),
        ]
        code = await process.wait()
        # The launch command ended: whatever it left in its group goes with it.
        _signal_group(process.pid, signal.SIGKILL)
        await _until_gone(process.pid)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 5.0)
        for reader in readers:
            reader.cancel()
        worker.exit_code = 128 - code if code < 0 else code
        worker.done.set()
        try:
            await on_exit(local.deployment.key, worker.index, worker.exit_code)
        except Exception:
            log.exception(
                "exit handler failed for %s worker %s", local.deployment.key, worker.index
            )

    async def _read(
        self, local: _Local, worker: _Worker, pipe: asyncio.StreamReader, stream: Stream
    ) -> None:
        d = local.deployment
        while True:
            try:
                raw = await pipe.readline()
            except ValueError:  # a line longer than the reader's limit: take a chunk
                raw = await pipe.read(64 * 1024)
            if not raw:
                return
            line = OutputLine(
                d.task_id,
                d.run,
                d.attempt,
                worker.index,
                stream,
                raw.decode("utf-8", "replace").rstrip("\r\n"),
                datetime.now(UTC),
            )
            assert local.queue is not None
            try:
                local.queue.put_nowait(line)
            except asyncio.QueueFull:
                local.dropped += 1
                self.dropped_lines += 1

    async def _pump(self, local: _Local, on_output: OnOutput) -> None:
        assert local.queue is not None
        while True:
            line = await local.queue.get()
            try:
                if line is None:
                    return
                await on_output(line)
            except Exception:
                log.exception("output sink failed; line of %s dropped", local.deployment.key)
                local.dropped += 1
                self.dropped_lines += 1
            finally:
                local.queue.task_done()

    async def flush_output(self, key: DeploymentKey) -> None:
        """Wait until every line read so far reached the output callback."""
        local = self._deps.get(key)
        if local is not None and local.queue is not None and local.pump and not local.pump.done():
            await local.queue.join()

    def dropped(self, key: DeploymentKey) -> int:
        local = self._deps.get(key)
        return local.dropped if local else 0

    def pids(self, key: DeploymentKey) -> dict[int, int]:
        local = self._deps.get(key)
        if local is None:
            return {}
        return {i: w.process.pid for i, w in local.workers.items() if w.process is not None}

    async def stop(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        local = self._deps.get(key)
        if local is None:
            return
        local.stopping = True
        grace = self.config.grace_s if grace_s is None else grace_s
        live = [w for w in local.workers.values() if w.process is not None and not w.done.is_set()]
        for worker in live:
            assert worker.process is not None
            _signal_group(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in live:
            left = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(worker.done.wait(), left)
        for worker in live:
            if not worker.done.is_set():
                assert worker.process is not None
                _signal_group(worker.process.pid, signal.SIGKILL)
        for worker in live:
            await worker.done.wait()

    async def wait(self, key: DeploymentKey) -> dict[int, int]:
        """Wait until every started worker has exited and been reported; exit codes by index."""
        local = self._deps.get(key)
        if local is None:
            return {}
        if local.watchers:
            await asyncio.gather(*local.watchers, return_exceptions=True)
        return {i: w.exit_code for i, w in local.workers.items() if w.exit_code is not None}

    async def capture_stacks(self, key: DeploymentKey) -> dict[int, str]:
        # Not implemented locally yet (would run py-spy dump on each group's processes).
        return {}

    async def cleanup(self, key: DeploymentKey) -> None:
        local = self._deps.get(key)
        if local is None:
            return
        await self.stop(key, grace_s=0 if local.stopping else None)
        for task in local.watchers:
            with contextlib.suppress(BaseException):
                await task
        if local.queue is not None and local.pump is not None:
            with contextlib.suppress(asyncio.QueueFull):
                local.queue.put_nowait(None)
            if local.queue.full():
                local.pump.cancel()
            with contextlib.suppress(BaseException):
                await local.pump
        await asyncio.to_thread(shutil.rmtree, local.root, True)
        with contextlib.suppress(OSError):
            local.root.parent.rmdir()  # the task's folder, when no other run is in it
        del self._deps[key]

    def deployments(self) -> list[DeploymentKey]:
        return list(self._deps)

    def scratch_dir(self, key: DeploymentKey, worker: int) -> Path | None:
        local = self._deps.get(key)
        return local.workers[worker].scratch if local and worker in local.workers else None

    def _get(self, key: DeploymentKey) -> _Local:
        local = self._deps.get(key)
        if local is None:
            raise StageFailed(
                f"deployment {key} holds no resources (resource_allocation did not run)"
            )
        return local


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc (Linux)."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


async def _until_gone(pgid: int, timeout_s: float = 2.0) -> None:
    """SIGKILL the group until none of its members is left (or the timeout passes)."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        _signal_group(pgid, signal.SIGKILL)
        await asyncio.sleep(0.01)


def free_port(preferred: int = DEFAULT_MASTER_PORT) -> int:
    """`preferred` when nothing listens on it, otherwise a free port the kernel picks."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError("no free TCP port on 127.0.0.1")
