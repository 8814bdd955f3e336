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

- sandbox (when the deployer runs as root and `unshare` is permitted; detected
  once, `namespaces:` in runtime.yaml overrides): every worker runs in a PID
  namespace and a mount namespace of its own, inside a network and an IPC
  namespace per deployment (its workers share a loopback of their own; the
  host's is unreachable), as an unprivileged user (`local.worker_user`,
  default `runyard-worker`, created as a system user when missing) with no
  capabilities and `no_new_privs`, its `/proc` read-only (so it cannot lower its
  `oom_score_adj` where root lacks CAP_SYS_RESOURCE), no kernel keyring and no
  user namespace of its own (a seccomp filter: `_WORKER_FILTER`). An empty
  tmpfs covers the control plane's paths (scratch and volume roots, the data
  dir, `local.hide`); the worker's own scratch, the image and Runyard's
  interpreter are bound back at their paths (see `_mount_script`). The
  processes that run as root before the privilege drop get no user variable;
  the worker's shell sources them from a file. Without the sandbox (the
  fallback) workers run as the deployer's user in its namespaces, and a warning
  says what is then not isolated;
- images: a local catalogue maps an image name to a directory whose `bin/`
  goes first on PATH (a virtualenv is such a directory). `bash --login` reads
  /etc/profile, which may reset PATH, so the worker's private HOME gets a
  `.bash_profile` that puts the image's `bin/` first again;
- storage: each volume is a host directory `<volumes_root>/<file system>/<volume>`
  (owned by the worker user when the runtime creates it). Sandboxed, each
  volume is bind-mounted at its mount path (read-only volumes read-only) and
  the worker's scratch `tmp/` is bind-mounted over /tmp (and /var/tmp, and every
  other folder of the host anyone may write to: `_world_writable_dirs`), so
  nothing it writes outside volumes outlives it. In the fallback a worker cannot see a volume at
  the absolute mount path: it is a symlink at the mount path taken relative to
  the worker's working directory (`/mnt/ckpt` -> `./mnt/ckpt`), read-only is
  not enforced, and /tmp is shared. Both set
  `RUNYARD_MOUNT_<N>=<mount path>=<host dir>`;
- scratch: a private directory per worker (HOME, TMPDIR and working directory,
  owned by the worker user), removed at cleanup; the runtime's own files of the
  worker (output, exit status, offsets) sit in the folder above, which the
  worker cannot change. Sandboxed, the three lie on the worker's system disk
  (`worker_disk_bytes`, R-13: a sparse file loop-mounted at `w<i>/disk`, linked
  at their usual places; a copy of one empty file system made once, `_new_disk`;
  mounted by system call, `runyard.deployer.mounts`), the deployment's /dev/shm
  is a tmpfs (`worker_shm_bytes` per worker), both mounted on the host at
  allocate and unmounted with the namespaces (`_release_namespaces`), and the
  device nodes of GPUs not the worker's (`gpu_devices`) are covered by a file
  nobody may open;
- exit status: a small bash wrapper runs the launch command and writes its
  exit status to `<worker scratch>/exit_status` before exiting with it, so
  the status survives a restart of the deployer;
- output: each worker writes stdout and stderr to files in its scratch; the
  runtime follows them line by line into one bounded queue per deployment,
  drained by a pump that awaits the `on_output` callback. A worker never
  blocks on a slow sink (a full queue only slows the reading) and never dies
  of SIGPIPE when the deployer goes away; the published offsets are saved so
  a new deployer resumes after them; lines are cut as
  `runyard.deployer.outputs` says (at newlines, and every 64 KiB of a longer
  line); with `keep_output` cleanup keeps the output files until the log
  service has stored them (`runyard.deployer.keeper`);
- line numbers: each line of a worker's output file gets `seq`, its number
  in that file (per task, run, attempt, worker and stream, from 0), when it
  is read, before the bounded queue. It is a property of the file (not of
  how the two streams interleave), so a line the pump dropped leaves a gap,
  two identical lines in one microsecond stay two, and a new deployer that
  re-reads lines after the last saved offset gives them the same numbers as
  before (the log store skips such a repeat: it looks its identity up around
  its time, docs/logs.md). The next number is saved with the offsets;
  a deployment whose saved offsets have no number (an older deployer) goes
  on without `seq`. Env check lines (pipes, never re-read) have none;
- recovery: `<scratch_root>/<task>/run<r>-a<a>/state.json` records the phase
  (`allocated`, `starting`, `started`; `finished` for kept output) and each
  worker's pid (its process group), start time and when it was started, each
  worker as soon as it is spawned; `recover` lists what an earlier process
  started, `adopt` follows those workers, `discard` ends them;
- env check (R-30): `start_env_check` runs the Bootcheck program through the
  same wrapper as the launch command (same environment, namespace, mounts),
  its output through pipes straight to `on_output`;
- stop: SIGTERM to the process group, SIGKILL after `grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar, runtime_checkable

from runyard.contracts.loglines import LogRecord
from runyard.contracts.spec import TaskSpec
from runyard.contracts.stacks import WorkerStacks
from runyard.contracts.task_events import WorkerPlacement
from runyard.deployer import mounts, outputs, spawns
from runyard.deployer.outputs import KeptOutput, LineSplitter, Marks, OutputStream, Stream
from runyard.deployer.retry import until_done
from runyard.deployer.stacks import capture_group
from runyard.deployer.turns import FairTurns

log = logging.getLogger("runyard.deployer.runtime")
T = TypeVar("T")

DeploymentKey = tuple[str, int, int]
"""(task id, run, attempt)."""

DEFAULT_MASTER_PORT = 29500
#: Defaults of `LocalRuntimeConfig.output_lines_per_s` and `output_backlog_bytes`.
OUTPUT_LINES_PER_S = 5_000
OUTPUT_BACKLOG_BYTES = 4 * 1024 * 1024
#: Processes and threads of one sandboxed worker (`LocalRuntimeConfig.worker_pids_max`).
WORKER_PIDS_MAX = 16_384
#: A sandboxed worker's system disk (R-13; `LocalRuntimeConfig.worker_disk_bytes`).
WORKER_DISK_BYTES = 50 * 2**30
#: A sandboxed worker's share of its deployment's /dev/shm (`worker_shm_bytes`).
WORKER_SHM_BYTES = 8 * 2**30
#: The nice value a sandboxed worker runs at (`LocalRuntimeConfig.worker_nice`).
WORKER_NICE = 10
#: Where the GPUs' device nodes are, `{gpu}` standing for a GPU's index (its minor
#: number): `LocalRuntimeConfig.gpu_devices`.
GPU_DEVICES = "/dev/nvidia{gpu}"


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
    #: Values of the spec's creator-only variables, by name, resolved by the deployer
    #: at deploy time for a run its creator started (never logged, never in events).
    creator_values: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

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
    #: The line's number in its worker's stream (from 0); None when unknown.
    seq: int | None = None

    def record(self) -> LogRecord:
        """The record the deployer publishes on `runyard.logs` (`record().to_bytes()`)."""
        return LogRecord(
            at=self.at,
            task_id=self.task_id,
            run=self.run,
            attempt=self.attempt,
            worker=self.worker,
            stream=self.stream,
            line=self.line,
            seq=self.seq,
        )


OnOutput = Callable[[OutputLine], Awaitable[None]]


@runtime_checkable
class PipelinedSink(Protocol):
    """An output sink that also takes a line without waiting for it to be confirmed:
    `submit` hands it over and returns what to await for its confirmation (the pump
    keeps up to `MAX_IN_FLIGHT` lines out; calling the sink publishes one and waits)."""

    async def __call__(self, line: OutputLine) -> None: ...

    async def submit(self, line: OutputLine) -> Awaitable[object]: ...


#: Lines a pipelined pump hands to its sink before the first of them is confirmed.
MAX_IN_FLIGHT = 1000
OnExit = Callable[[DeploymentKey, int, int, datetime], Awaitable[None]]
"""(deployment key, worker index, exit code, when it exited): the code is 128+N when
killed by signal N; the time is the one the worker's wrapper wrote with the status (so
an exit seen late, e.g. by a restarted deployer, keeps its own time)."""


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

    async def capture_stacks(
        self, key: DeploymentKey, *, native: bool = True
    ) -> tuple[WorkerStacks, ...]:
        """The stacks of every worker of the deployment that has a process here, by
        worker index; empty when the deployment is not held here."""
        ...

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
    #: Lines per second read from each output stream of a worker (bursts of five
    #: seconds' worth pass at once); a worker that writes faster is read at this pace.
    output_lines_per_s: int = OUTPUT_LINES_PER_S
    #: How far (bytes) reading may fall behind a stream before the stretch in between
    #: is skipped, but for its last quarter, with one notice line in its place
    #: (`outputs.Skip`): a flooding worker costs the platform a bounded share.
    output_backlog_bytes: int = OUTPUT_BACKLOG_BYTES
    #: Sandboxed workers (private mount, PID, network and IPC namespaces, an
    #: unprivileged user): None detects once whether this machine permits it.
    namespaces: bool | None = None
    #: The unprivileged user sandboxed workers run as: a name (created as a system
    #: user when missing) or `uid[:gid]`.
    worker_user: str = "runyard-worker"
    #: Control-plane paths hidden from sandboxed workers (an empty tmpfs over each),
    #: besides `scratch_root` and `volumes_root`, which are always hidden.
    hidden: tuple[Path, ...] = ()
    #: Seconds between looks at an adopted worker (one this process did not start).
    poll_s: float = 0.2
    #: Keep a finished deployment's output files until the log service has stored
    #: every line (`runyard.deployer.outputs`); otherwise cleanup removes them at once.
    keep_output: bool = False
    #: Deployments whose deploy stages run at once; the others wait their turn, so a
    #: burst of placements finishes one by one rather than all slowly together. Turns
    #: go round the tenants waiting (`FairTurns`): no tenant's burst is a queue to others.
    deploys_at_once: int = 16
    #: Processes and threads one sandboxed worker may have at once (a pids cgroup of
    #: its own): a fork bomb fails its own forks, not the host's.
    worker_pids_max: int = WORKER_PIDS_MAX
    #: Processes and threads all sandboxed workers of this host may have together;
    #: None: three quarters of kernel.pid_max, the rest left to the control plane.
    workers_pids_max: int | None = None
    #: Bytes of a sandboxed worker's system disk (R-13): its home, /tmp and working
    #: folder lie on a file system of their own of this size (a sparse file in the
    #: deployment's folder, loop-mounted), gone with the deployment; writing past it
    #: fails (ENOSPC) in the worker only. None: no limit (plain folders).
    worker_disk_bytes: int | None = WORKER_DISK_BYTES
    #: Bytes of /dev/shm per worker of a sandboxed deployment: its workers share one
    #: tmpfs of this size times their number. None: no limit (a folder on disk).
    worker_shm_bytes: int | None = WORKER_SHM_BYTES
    #: The GPUs' device nodes, `{gpu}` standing for a GPU's index: a sandboxed worker
    #: can open its own GPUs' only (the others are covered by an unreadable file).
    gpu_devices: str = GPU_DEVICES
    #: The nice value sandboxed workers run at (0-19): the control plane on the same
    #: host comes first when the CPUs are short; idle CPUs are the workers' all the same.
    worker_nice: int = WORKER_NICE
    #: Hold each sandboxed worker to the CPUs and memory its placement gives it (its
    #: spec's): a cgroup of its own with a CPU quota and a memory limit, past which the
    #: kernel ends its largest process, not another task's. False: no such limit.
    worker_limits: bool = True

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], *, data_dir: Path, base_dir: Path
    ) -> LocalRuntimeConfig:
        """Build from `runtime.yaml`'s `local:` section; see infra/config/runtime.yaml."""
        images: dict[str, Path] = {}
        for name, where in (raw.get("images") or {}).items():
            images[str(name)] = _image_dir(str(where), base_dir)
        lines_per_s, backlog = output_limits(raw)
        return cls(
            scratch_root=Path(raw.get("scratch_root") or data_dir / "scratch").absolute(),
            volumes_root=Path(raw.get("volumes_root") or data_dir / "volumes").absolute(),
            images=images,
            grace_s=float(raw.get("grace_s", 10.0)),
            output_buffer=int(raw.get("output_buffer", 10_000)),
            output_lines_per_s=lines_per_s,
            output_backlog_bytes=backlog,
            namespaces=raw.get("namespaces"),
            worker_user=str(raw.get("worker_user") or "runyard-worker"),
            hidden=(data_dir.absolute(), *(Path(str(p)) for p in raw.get("hide") or ())),
            deploys_at_once=_at_least_one(raw.get("deploys_at_once", 16), "deploys_at_once"),
            worker_pids_max=_at_least_one(
                raw.get("worker_pids_max", WORKER_PIDS_MAX), "worker_pids_max"
            ),
            workers_pids_max=(
                None
                if raw.get("workers_pids_max") is None
                else _at_least_one(raw["workers_pids_max"], "workers_pids_max")
            ),
            worker_disk_bytes=_bytes_or_none(raw, "worker_disk_bytes", WORKER_DISK_BYTES),
            worker_shm_bytes=_bytes_or_none(raw, "worker_shm_bytes", WORKER_SHM_BYTES),
            gpu_devices=_gpu_pattern(str(raw.get("gpu_devices") or GPU_DEVICES)),
            worker_nice=worker_nice(raw),
            worker_limits=flag(raw, "worker_limits", True, section="local"),
        )


def flag(raw: Mapping[str, Any], name: str, default: bool, *, section: str) -> bool:
    """A true-or-false setting of runtime.yaml's `section` (anything else refused)."""
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"runtime.yaml: {section}.{name} is {value!r}: use true or false")
    return value


def worker_nice(raw: Mapping[str, Any]) -> int:
    """`worker_nice` of a runtime's settings: a whole number from 0 to 19."""
    value = raw.get("worker_nice", WORKER_NICE)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
        raise ValueError(
            f"runtime.yaml: worker_nice is {value!r}: use a whole number from 0 (as the"
            " control plane) to 19 (the last to get a CPU)"
        )
    return value


def output_limits(raw: Mapping[str, Any]) -> tuple[int, int]:
    """(`output_lines_per_s`, `output_backlog_bytes`) of a runtime's settings; the
    backlog at least one longest line."""
    per_s = raw.get("output_lines_per_s", OUTPUT_LINES_PER_S)
    backlog = raw.get("output_backlog_bytes", OUTPUT_BACKLOG_BYTES)
    return (
        _at_least_one(per_s, "output_lines_per_s"),
        max(outputs.LINE_MAX, _at_least_one(backlog, "output_backlog_bytes")),
    )


def _at_least_one(value: Any, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ValueError(f"runtime.yaml: local.{name} is {value!r}: use a whole number >= 1")
    return number


#: The smallest system disk a worker may be given (ext4 needs some room of its own).
MIN_DISK_BYTES = 8 * 2**20


def _bytes_or_none(raw: Mapping[str, Any], name: str, default: int) -> int | None:
    """A size setting of `local:`: null turns the limit off; a number is bytes."""
    if name not in raw:
        return default
    if raw[name] is None:
        return None
    number = _at_least_one(raw[name], name)
    if name == "worker_disk_bytes" and number < MIN_DISK_BYTES:
        raise ValueError(
            f"runtime.yaml: local.{name} is {raw[name]!r}: use at least {MIN_DISK_BYTES} "
            "(8 MiB), or null for no limit"
        )
    return number


def _gpu_pattern(pattern: str) -> str:
    if (
        pattern.count("{gpu}") != 1
        or not pattern.startswith("/")
        or any(c in pattern for c in "*?[")
        or "/" in pattern.partition("{gpu}")[2]
    ):
        raise ValueError(
            f"runtime.yaml: local.gpu_devices is {pattern!r}: use an absolute path with one"
            " {gpu} (the GPU's index), e.g. /dev/nvidia{gpu}"
        )
    return pattern


def gpu_nodes(pattern: str) -> dict[int, Path]:
    """The GPU device nodes on this machine by GPU index (`pattern`: `gpu_devices`)."""
    prefix, _, suffix = pattern.partition("{gpu}")
    found: dict[int, Path] = {}
    folder = Path(prefix).parent
    start = Path(prefix).name
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    # By name alone (a Path per entry of /dev cost about a twentieth of the
    # deployer's CPU in a burst: it is looked at for every worker started).
    for name in names:
        if not (name.startswith(start) and name.endswith(suffix)):
            continue
        middle = name[len(start) : len(name) - len(suffix)]
        if middle.isdigit():
            found[int(middle)] = folder / name
    return found


def _runyard_root() -> Path:
    """The folder Runyard's code is imported from (a source checkout or site-packages).

    `runyard` is a namespace package whose portions are the members' src folders
    (`<root>/libs/<name>/src/runyard`, `<root>/services/<name>/src/runyard`) in a
    checkout, or one `site-packages/runyard`; the checkout holds them all."""
    import runyard.errors

    package = Path(runyard.errors.__file__).resolve().parent  # <root>/libs/errors/src/runyard
    checkout = package.parents[3]
    return checkout if (checkout / "pyproject.toml").exists() else package.parent


def _python_home(image: Path | None) -> Path | None:
    """The base interpreter's prefix of a virtualenv image (its pyvenv.cfg `home`'s parent)."""
    if image is None:
        return None
    try:
        text = (image / "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent
    return None


def _enterable(folder: Path, ids: tuple[int, int, str]) -> bool:
    """Whether the user `ids` may list and enter `folder` (by its mode bits)."""
    st = folder.stat()
    if st.st_uid == ids[0]:
        bits = stat.S_IRUSR | stat.S_IXUSR
    elif st.st_gid == ids[1]:
        bits = stat.S_IRGRP | stat.S_IXGRP
    else:
        bits = stat.S_IROTH | stat.S_IXOTH
    return st.st_mode & bits == bits


def _untraversable(path: Path) -> Path | None:
    """The outermost folder above (or at) `path` that other users cannot enter, if any."""
    current = Path("/")
    for part in path.resolve().parts[1:]:
        current = current / part
        try:
            mode = current.stat().st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None


#: Links followed while a mount path is looked at (the kernel's own limit).
_MAX_LINKS = 40


def _changeable_folder(mount_path: str) -> str | None:
    """Why someone other than root could redirect `mount_path`, or None when nobody can.

    The sandbox's wrapper binds a volume at its mount path as root, and the kernel
    follows every link on the way. A link a worker made (in a folder it may write to: a
    world-writable /data, its own scratch, a volume) would send the bind anywhere, e.g.
    over /usr/bin, whose programs the wrapper runs as root next. So the path is walked
    as the kernel would walk it (links followed), and every folder looked into must be
    changeable by root alone: owned by root, writable by no other user and no group but
    root's. Past the first missing entry nothing is looked at: `mount` creates the rest
    as root, in a folder only root can change.
    """
    current = Path("/")
    pending = list(Path(mount_path).parts[1:])
    links = 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        try:
            folder = os.lstat(current)
        except OSError:
            return None  # gone meanwhile: mount fails with its own error
        if (
            folder.st_uid != 0
            or folder.st_mode & stat.S_IWOTH
            or (folder.st_mode & stat.S_IWGRP and folder.st_gid != 0)
        ):
            mode = stat.S_IMODE(folder.st_mode)
            return f"{current} (owner uid {folder.st_uid}, group {folder.st_gid}, mode {mode:o})"
        entry = current / name
        try:
            found = os.lstat(entry)
        except FileNotFoundError:
            return None
        except OSError:
            return None  # not a folder on the way: mount fails with its own error
        if stat.S_ISLNK(found.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return f"{entry} (more than {_MAX_LINKS} links on the way)"
            target = Path(os.readlink(entry))
            if target.is_absolute():
                current = Path("/")
            pending = [*target.parts[1 if target.is_absolute() else 0 :], *pending]
            continue
        current = entry
    return None


#: `_changeable_folder` in bash, run as root just before the mounts: fails, its reason on
#: stderr, when a folder on the way to the mount path ($1; links followed) can be changed
#: by someone other than root. One `stat` per folder looked into.
_MOUNT_PATH_CHECK = """runyard_mount_path_check() {{
  local path=$1 cur=/ rest=$1 name info links=0 next target
  while [ -n "$rest" ]; do
    rest=${{rest#/}}; name=${{rest%%/*}}; rest=${{rest#"$name"}}
    case $name in ''|.) continue ;; ..) cur=${{cur%/*}}; cur=${{cur:-/}}; continue ;; esac
    info=$({stat} -c '%u %g %a' -- "$cur") || return 0
    set -- $info
    if [ "$1" != 0 ] || (( 8#$3 & 2 )) || {{ (( 8#$3 & 16 )) && [ "$2" != 0 ]; }}; then
      printf 'mount path %s cannot be used: it leads through %s (owner uid %s, group %s,'\
' mode %s), which users other than root can change\\n' "$path" "$cur" "$1" "$2" "$3" >&2
      return 1
    fi
    next=${{cur%/}}/$name
    if [ -L "$next" ]; then
      links=$((links + 1)); [ "$links" -le 40 ] || return 1
      target=$({readlink} -- "$next") || return 0
      case $target in /*) cur=/ ;; esac
      rest=/$target$rest; continue
    fi
    [ -e "$next" ] || return 0
    cur=$next
  done
}}
"""


#: bash: lazily unmount every mount of this namespace below the folder $1 but those below
#: $2 (paths as /proc/self/mountinfo writes them). Builtins but for one `umount`.
_DETACH = """runyard_detach() {{
  local id parent dev root mp rest places=()
  while read -r id parent dev root mp rest; do
    case $mp in "$2"/*) ;; "$1"/*) places+=("$mp") ;; esac
  done < /proc/self/mountinfo
  [ ${{#places[@]}} -eq 0 ] || {umount} -l "${{places[@]}}"
}}
"""


#: Run (Runyard's interpreter, -I -S) between the privilege drop and a sandboxed worker's
#: shell: a seccomp filter, then exec of its arguments. It refuses the worker
#: - the kernel's keyrings (add_key, request_key, keyctl: EPERM). Every task's workers
#:   run as one uid, and a uid's user keyring is one for all its processes: what one task
#:   put there (a Kerberos ticket cache, a token) any other could read, and two could
#:   talk through it;
#: - a user namespace of its own (unshare or clone with CLONE_NEWUSER: EPERM; clone3,
#:   whose flags a filter cannot read: ENOSYS, on which the C library falls back to
#:   clone, as under Docker's default profile). In one, an unprivileged process holds
#:   every capability over what it makes there (network, mounts, netfilter), which opens
#:   the parts of the kernel that most container escapes went through;
#: - io_uring (its three calls: EPERM), a second way into the kernel that many of the
#:   last years' privilege escalations used, off in Docker's and containerd's default
#:   profiles and on Google's servers; programs fall back to plain reads and writes.
#: The filter knows x86-64 (with x32 and i386) and arm64 (with arm); elsewhere it lets
#: every call through. `no_new_privs` (setpriv) lets an unprivileged process set it.
#: Its first argument is the nice value the worker runs at (`worker_nice`), the rest
#: what it execs. `_FILTER_PROGRAM` builds the filter (`raw`, `prog`): the local runtime
#: sets the same on a thread of its own that starts the workers (`spawns`) and needs
#: no interpreter per worker then.
_FILTER_PROGRAM = """
import struct
# audit arch, call number mask, add_key, request_key, keyctl, unshare, clone, clone3
ARCHES = ((0xC000003E, 0xBFFFFFFF, (248, 249, 250), 272, 56, 435),
          (0x40000003, 0, (286, 287, 288), 310, 120, 435),
          (0xC00000B7, 0, (217, 218, 219), 97, 220, 435),
          (0x40000028, 0, (309, 310, 311), 337, 120, 435))
LD, JEQ, JSET, AND, RET = 0x20, 0x15, 0x45, 0x54, 0x06
ALLOW, EPERM, ENOSYS, NEWUSER = 0x7FFF0000, 0x00050001, 0x00050026, 0x10000000
prog, jumps = [], []
for arch, mask, keys, unshare, clone, clone3 in ARCHES:
    body = [[LD, 0, 0, 0]] + ([[AND, 0, 0, mask]] if mask else [])
    denied = (*keys, 425, 426, 427)  # and io_uring_setup, io_uring_enter, io_uring_register
    calls = [(n, "deny") for n in denied] + [(clone3, "nosys")]
    calls += [(unshare, "flags"), (clone, "flags")]
    for n, to in calls:
        jumps.append((len(prog) + 2 + len(body), to))
        body.append([JEQ, 0, 0, n])
    prog += [[LD, 0, 0, 4], [JEQ, 0, len(body) + 1, arch], *body, [RET, 0, 0, ALLOW]]
prog.append([RET, 0, 0, ALLOW])  # an architecture not named above
tail = {"flags": len(prog), "deny": len(prog) + 3, "nosys": len(prog) + 4}
prog += [[LD, 0, 0, 16], [JSET, 1, 0, NEWUSER], [RET, 0, 0, ALLOW], [RET, 0, 0, EPERM],
         [RET, 0, 0, ENOSYS]]
for n, to in jumps:
    prog[n][1] = tail[to] - (n + 1)
raw = b"".join(struct.pack("HBBI", *i) for i in prog)
"""
_WORKER_FILTER = (
    "\nimport ctypes, os, sys"
    + _FILTER_PROGRAM
    + """
buf = ctypes.create_string_buffer(raw)
fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(buf))
fbuf = ctypes.create_string_buffer(fprog)
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(22, 2, ctypes.c_void_p(ctypes.addressof(fbuf)), 0, 0) != 0:
    why = os.strerror(ctypes.get_errno())
    sys.exit(f"runyard: the worker's seccomp filter could not be set: {why}")
os.nice(int(sys.argv[1]))
os.execv(sys.argv[2], sys.argv[2:])
"""
)


#: Where `_world_writable_dirs` looks: these folders and the folders in them.
_SHARED_TOPS = ("/", "/var", "/var/lib", "/var/cache", "/run", "/opt", "/srv", "/home", "/mnt")


def _world_writable_dirs() -> tuple[Path, ...]:
    """Folders (not links) anyone may write to, at or one level below `_SHARED_TOPS`,
    but /tmp, /var/tmp and /dev/shm (a sandboxed worker has its own of those): e.g.
    /run/lock, a site's shared /scratch. Looked at once, at start."""
    found: set[Path] = set()
    for top in map(Path, _SHARED_TOPS):
        try:
            children = [top, *(top / name for name in os.listdir(top))]
        except OSError:
            continue
        for path in children:
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode) and mode & stat.S_IWOTH:
                found.add(path)
    return tuple(sorted(found - {Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")}))


def _mountinfo_path(path: Path) -> str:
    """`path` as /proc/self/mountinfo writes a mount point (space, tab, newline and
    backslash as octal escapes)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in str(path))


def _covered(path: Path, covers: list[Path]) -> bool:
    """Whether `path` lies in one of `covers` (and so is hidden once they are covered)."""
    resolved = path.resolve()
    return any(resolved.is_relative_to(c) for c in covers)


#: The first descriptor of a worker's mount batches (the opened folders take 10 on).
_FSTAB_FD = 30


@dataclass(frozen=True, slots=True)
class _Mount:
    """One mount of a worker's view, as an fstab entry. With `test` (an operator of
    `test`: -d), it is made only when its target passes the test at that point of the
    sequence, else `otherwise` when the target exists at all (None: nothing)."""

    source: str
    target: str
    kind: str
    options: str
    test: str | None = None
    otherwise: _Mount | None = None

    def fstab(self) -> str:
        """Its fstab line: each field with every byte but letters, digits and
        `/._,=+:@-` written as `\\ooo` (libmount reads such escapes in any field)."""
        fields = (self.source, self.target, self.kind, self.options)
        return " ".join(map(_fstab_field, fields)) + " 0 0"

    def shell(self) -> str:
        """bash (builtins only: no program started) printing this entry's fstab line."""
        q = shlex.quote
        line = f"printf '%s\\n' {q(self.fstab())}"
        if self.test is None:
            return line
        target = q(self.target)
        text = f"if [ {self.test} {target} ]; then {line}"
        if self.otherwise is not None:
            text += f"; elif [ -e {target} ]; then {self.otherwise.shell()}"
        return f"{text}; fi"


_FSTAB_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._,=+:@-")


def _fstab_field(text: str) -> str:
    return "".join(chr(b) if b in _FSTAB_SAFE else f"\\{b:03o}" for b in text.encode())


def _mount_batches(mounts: list[_Mount]) -> list[list[_Mount]]:
    """`mounts` cut into batches that one `mount --all` each can make, in order, with
    every test giving what it would give at its own place in the sequence.

    A batch's fstab is written (its tests run) before any of its mounts, so a mount
    whose test looks at a path that an earlier mount of the same batch may change
    starts a new batch: a path at or below that mount's target (covered by it), or
    above it (a folder X-mount.mkdir may make). Unconditional mounts join the batch
    they follow.
    """
    batches: list[list[_Mount]] = []
    for mount in mounts:
        current = batches[-1] if batches else None
        if current is not None and not (
            mount.test is not None and any(_related(mount.target, m.target) for m in current)
        ):
            current.append(mount)
        else:
            batches.append([mount])
    return batches


def _mount_lines(
    mounts: list[_Mount], fstabs: Path, mount: str, *, fd: int = _FSTAB_FD
) -> list[str]:
    """Shell lines (each to be followed by its failure handling) making `mounts` in
    order, a batch (`_mount_batches`) per `mount --all`.

    Each batch's fstab is the file `<fstabs><n>` (written by the shell with builtins,
    its tests run just before its mounts). All are opened first, while their folder
    is still visible (it lies in the scratch root, which the mounts then hide), and
    `mount` reads each through the shell's descriptor (/proc/self/fd), the first one
    being `fd`."""
    q = shlex.quote
    batches = _mount_batches(mounts)
    first = fd
    lines = [f"exec {first + n}>{q(f'{fstabs}{n}')}" for n in range(len(batches))]
    for n, batch in enumerate(batches):
        fd = first + n
        lines.append("{ " + "; ".join(m.shell() for m in batch) + f"; }} >&{fd}")
        lines.append(f"{q(mount)} --all -c --fstab /proc/self/fd/{fd}")
        lines.append(f"exec {fd}>&-")
    return lines


def _related(one: str, other: str) -> bool:
    """Whether either path lies at or below the other."""
    return Path(one).is_relative_to(other) or Path(other).is_relative_to(one)


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
    process: asyncio.subprocess.Process | spawns.Spawned | None = None
    #: Process id (= process group id) and its start time (/proc, clock ticks).
    pid: int | None = None
    starttime: int | None = None
    #: When it was started (unix time; saved in state.json for a deployer that adopts it).
    started_at: float | None = None
    exit_code: int | None = None
    #: When the worker exited (from its `exit_status`; when it was found gone otherwise).
    exited_at: datetime | None = None
    #: Set once the worker's process group is gone (its output is complete).
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    #: The number the next line read from each stream gets (None: unknown).
    read_seq: dict[str, int | None] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    #: The number after the last published line of each stream (saved with `offsets`).
    next_seq: dict[str, int | None] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    #: When publishing reached which numbers (saved with `offsets`).
    marks: Marks = field(default_factory=Marks)
    #: Stretches of each stream left unread (saved with `offsets`; `outputs.Skip`).
    skips: dict[str, list[outputs.Skip]] = field(default_factory=dict)

    @property
    def status_file(self) -> Path:
        return self.scratch / "exit_status"


@dataclass
class _Local:
    deployment: Deployment
    root: Path
    workers: dict[int, _Worker]
    image_bin: Path | None = None
    mounts: list[tuple[str, Path, bool]] = field(default_factory=list)
    #: (line, worker, end offset of the line in its file); None ends the pump.
    queue: asyncio.Queue[tuple[OutputLine, _Worker, int] | None] | None = None
    pump: asyncio.Task[None] | None = None
    watchers: list[asyncio.Task[None]] = field(default_factory=list)
    #: The tasks following each worker's output files.
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    dropped: int = 0
    stopping: bool = False
    #: Found on disk after a restart (workers not started by this process).
    adopted: bool = False
    offsets_saved: float = 0.0
    #: The env check program (R-30) per worker, and the tasks following its output.
    checks: dict[int, asyncio.subprocess.Process] = field(default_factory=dict)
    check_readers: list[asyncio.Task[None]] = field(default_factory=list)
    #: Taken by the file work done in a thread (`LocalRuntime._files`): in order.
    files_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class LocalRuntime:
    """Workers as process groups on this machine; see the module docstring."""

    #: Each sandboxed worker's system disk, in bytes (None: plain folders, no limit).
    disk_bytes: int | None = None
    #: /dev/shm per worker of a sandboxed deployment, in bytes (None: a folder on disk).
    shm_bytes: int | None = None
    #: Where the GPUs' device nodes are (None: not hidden from workers).
    gpu_devices: str | None = None
    #: Folders of the host anyone may write to, besides /tmp, /var/tmp and /dev/shm
    #: (`_world_writable_dirs`): a sandboxed worker gets its own `tmp/` there.
    shared_dirs: tuple[Path, ...] = ()
    #: The thread behind the workers' filter that starts sandboxed workers (None: each
    #: worker's own interpreter sets the filter).
    spawns: spawns.FilteredSpawns | None = None

    def __init__(self, config: LocalRuntimeConfig) -> None:
        self.config = config
        self._stage_slots = FairTurns(config.deploys_at_once)
        self._deps: dict[DeploymentKey, _Local] = {}
        self._kept: dict[DeploymentKey, KeptOutput] | None = None
        self.dropped_lines = 0
        self.tools = _Tools.find()
        #: Empty file systems workers' disks are copied from, by size (`_disk_template`).
        self._templates: dict[int, tuple[Path, list[tuple[int, int]]] | None] = {}
        self._template_lock = threading.Lock()
        #: Loop devices set up by the `mount` program (a kernel without LOOP_CONFIGURE).
        self._loop_program = False
        why_not = _sandbox_unavailable(self.tools) if config.namespaces is not False else None
        if config.namespaces is None:
            self.namespaces = why_not is None
        elif config.namespaces and why_not is not None:
            raise RuntimeError(
                f"local.namespaces is true but workers cannot be sandboxed here: {why_not}; "
                "run the deployer as root with util-linux installed, or remove the setting"
            )
        else:
            self.namespaces = bool(config.namespaces)
        #: The unprivileged user sandboxed workers run as (None: not sandboxed).
        self.worker_ids: tuple[int, int, str] | None = None
        #: The pids cgroup every sandboxed worker's own one lies in (None: no limit).
        self.pids_base: Path | None = None
        #: cgroup v1: the memory and cpu hierarchies' groups every sandboxed worker's own
        #: ones lie in (v2: the pids base's groups hold those limits too).
        self.limit_bases: tuple[Path, ...] = ()
        #: The base whose worker groups hold the memory limit (None: not limited).
        self.memory_base: Path | None = None
        #: This host's CPUs and bytes of memory (0: unknown), against which a worker's
        #: limits are weighed (`_binds`).
        self._host = (len(os.sched_getaffinity(0)), _memory_total())
        if self.namespaces:
            self.worker_ids = _worker_user(config.worker_user, self.tools)
            self.spawns = _filtered_spawns(config.worker_nice)
            self.shm_bytes = config.worker_shm_bytes
            self.gpu_devices = config.gpu_devices
            self.shared_dirs = _world_writable_dirs()
            why_no_disk = _disks_unavailable(self.tools)
            if config.worker_disk_bytes is not None and why_no_disk is not None:
                log.warning(
                    "sandboxed workers' system disks are NOT limited (%s): a worker that"
                    " writes without end fills the scratch root's disk, the control plane's"
                    " too when it lies there",
                    why_no_disk,
                )
            else:
                self.disk_bytes = config.worker_disk_bytes
            self.pids_base, why = _pids_base(config.workers_pids_max, config.worker_nice)
            if self.pids_base is None:
                log.warning(
                    "sandboxed workers' processes are NOT limited (%s): a worker that forks"
                    " without end can take every pid of this machine, the control plane's"
                    " next process included",
                    why,
                )
            if config.worker_limits:
                self.limit_bases, self.memory_base, why = _limit_bases(self.pids_base)
                if self.memory_base is None:
                    log.warning(
                        "sandboxed workers' memory and CPUs are NOT limited to their"
                        " specs' (%s): one worker can take the memory and CPUs of every"
                        " other task's workers on this machine",
                        why,
                    )
            for base in self._group_bases():
                _sweep_groups(base)
        else:
            log.warning(
                "workers are NOT sandboxed (%s): they run as this deployer's user, in its "
                "PID, network and mount namespaces, so they can read every file this user "
                "can (the dev token, Postgres data, other tasks' scratch), see and signal "
                "its processes and connect to Postgres, the broker and the gateway on "
                "127.0.0.1; volumes are symlinks relative to the working directory, "
                "/tmp and /dev/shm are shared, no disk limit holds them and every GPU's "
                "device node is theirs to open. Run the deployer as root for sandboxed "
                "workers",
                why_not or "local.namespaces is false",
            )

    # -- stages ------------------------------------------------------------------

    def stage_slots(self, deployment: Deployment) -> FairTurns | None:
        """What a deployment's stages take a turn of (`deploys_at_once`): they are this
        machine's own work, so only so many run at once, shared fairly by tenants."""
        return self._stage_slots

    async def allocate(self, deployment: Deployment) -> None:
        key = deployment.key
        if key in self._deps:
            return
        task, run, attempt = key
        root = self.config.scratch_root / task / f"run{run}-a{attempt}"
        workers = {p.index: _Worker(p.index, p, root / f"w{p.index}") for p in deployment.workers}
        self._deps[key] = local = _Local(deployment, root, workers)
        try:
            await self._files(local, self._make_scratch, local, self._state(local, "allocated"))
        except BaseException:
            self._deps.pop(key, None)  # allocated again from the start when asked again
            raise
        if self.namespaces:
            try:
                await asyncio.to_thread(_make_namespaces, root, self.tools)
            except (OSError, subprocess.SubprocessError) as exc:
                raise StageFailed(
                    f"the deployment's network namespace could not be created: {exc}"
                ) from exc
            if self._group_bases():
                groups = self._worker_groups(local)
                files = {i: self._group_files(w.placement) for i, w in local.workers.items()}
                try:
                    await asyncio.to_thread(_make_groups, groups, files)
                except OSError as exc:
                    raise StageFailed(
                        "the workers' limits of processes, memory or CPUs (their cgroups)"
                        f" could not be set: {exc}"
                    ) from exc
            try:
                await self._files(local, self._make_disks, local)
            except (OSError, subprocess.SubprocessError) as exc:
                raise StageFailed(
                    f"the workers' system disk or /dev/shm could not be made: {exc}; set"
                    " local.worker_disk_bytes (or worker_shm_bytes) to null in runtime.yaml"
                    " to run without that limit"
                ) from exc

    def _make_scratch(self, local: _Local, state: dict[str, Any]) -> None:
        """The deployment's folders and its first `state.json` (in a thread). With a
        worker user, it reaches its own folders (home, tmp, work) through its scratch,
        and the deployment's `shm/` (shared by its workers) is its /dev/shm."""
        self.config.scratch_root.mkdir(parents=True, exist_ok=True)
        self.config.scratch_root.chmod(0o700)
        for worker in local.workers.values():
            worker.scratch.mkdir(parents=True, exist_ok=True)
            # The worker's own folders; the folder above them (logs, exit status,
            # offsets) stays the runtime's, so a worker can neither replace nor
            # redirect what the runtime reads back. With a system disk they lie on it
            # (`disk/`, made by `_make_disks`), each linked at its usual place.
            for sub in ("home", "tmp", "work"):
                if self.disk_bytes is not None:
                    (worker.scratch / "disk").mkdir(mode=0o755, exist_ok=True)
                    if not (worker.scratch / sub).is_symlink():
                        (worker.scratch / sub).symlink_to(f"disk/{sub}")
                    continue
                (worker.scratch / sub).mkdir(exist_ok=True)
                self._give(worker.scratch / sub)
            worker.scratch.chmod(0o755 if self.worker_ids is not None else 0o700)
        self._save_state(local, state)
        if self.worker_ids is not None:
            (local.root / "shm").mkdir(exist_ok=True)
            self._give(local.root / "shm")
            # What covers the device nodes of GPUs not the worker's: nobody may open it.
            cover = local.root / "nodev"
            cover.touch(exist_ok=True)
            cover.chmod(0)

    def _make_disks(self, local: _Local) -> None:
        """The deployment's /dev/shm (a tmpfs of `shm_bytes` per worker) and each
        worker's system disk (`disk_bytes`), mounted here, on the host, below the
        deployment's folder (in a thread; after `_make_namespaces`, which unmounts what
        an earlier try left). Every worker's mount namespace binds them where the worker
        sees them; `_release_namespaces` unmounts them."""
        assert self.worker_ids is not None
        uid, gid, _ = self.worker_ids
        shm = local.root / "shm"
        if self.shm_bytes is not None and not os.path.ismount(shm):
            size = self.shm_bytes * len(local.workers)
            options = f"size={size},mode=0700,uid={uid},gid={gid}"
            mounts.mount_tmpfs("runyard-shm", shm, mounts.MS_NOSUID | mounts.MS_NODEV, options)
        if self.disk_bytes is None:
            return
        for worker in local.workers.values():
            disk = worker.scratch / "disk"
            image = local.root / f"{worker.scratch.name}.disk"
            if os.path.ismount(disk):
                continue  # made before (its folders may be the worker's to change now)
            self._new_disk(image, self.disk_bytes)
            self._mount_disk(image, disk)
            for sub in ("home", "tmp", "work"):
                (disk / sub).mkdir(exist_ok=True)
                self._give(disk / sub)

    def _mount_disk(self, image: Path, disk: Path) -> None:
        """A worker's system disk `image` mounted at `disk` on a loop device of its own
        (by system call; by the `mount` program on a kernel before Linux 5.8)."""
        flags, options = mounts.MS_NOSUID | mounts.MS_NODEV, "noinit_itable,discard"
        if not self._loop_program:
            try:
                mounts.mount_image(image, disk, "ext4", flags, options)
                return
            except mounts.Unsupported as exc:
                log.info("workers' disks mounted by the mount program: %s", exc)
                self._loop_program = True
        options = f"loop,nosuid,nodev,{options}"
        _run([self.tools.mount, "-t", "ext4", "-o", options, str(image), str(disk)])

    def _new_disk(self, image: Path, size: int) -> None:
        """An empty ext4 file system of `size` bytes at `image`: a copy of the one
        `_disk_template` made (the few megabytes mkfs wrote, copied in the kernel: a
        quarter of what running mkfs costs a worker), or mkfs's own where no copy
        could be made. Sparse: it takes on the host's disk what the worker writes, no
        more (`discard` gives back what it deleted)."""
        for _ in range(2):  # a template removed meanwhile is made again, once
            template = self._disk_template(size)
            if template is None:
                break
            try:
                source = open(template[0], "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                with self._template_lock:
                    if self._templates.get(size) is template:
                        del self._templates[size]
                continue
            try:
                with source:
                    _copy_sparse(source, template[1], image, size)
                return
            except OSError as exc:
                log.warning("workers' disks made by mkfs (a copy failed: %s)", exc)
                with self._template_lock:
                    self._templates[size] = None
                break
        _make_ext4(self.tools.mkfs, image, size)

    def _disk_template(self, size: int) -> tuple[Path, list[tuple[int, int]]] | None:
        """The empty file system every worker disk of `size` bytes is copied from, and
        where its data lies (the rest is holes): made by mkfs once per size and
        process (one an earlier process left is not trusted), below the scratch root
        (hidden from workers, as every deployment's folder is). None when it could
        not be made: each disk is then made by mkfs itself."""
        with self._template_lock:
            if size in self._templates:
                return self._templates[size]
            folder = self.config.scratch_root / ".disks"
            path = folder / f"ext4-{_DISK_FORMAT}-{size}.img"
            made: tuple[Path, list[tuple[int, int]]] | None = None
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                partial = folder / f".{path.name}.partial"
                _make_ext4(self.tools.mkfs, partial, size)
                with open(partial, "rb") as file:
                    made = path, _data_extents(file.fileno(), size)
                os.replace(partial, path)
            except OSError as exc:
                log.warning("no template for workers' disks (%s): each made by mkfs", exc)
                made = None
            self._templates[size] = made
            return made

    async def _files(self, local: _Local, work: Callable[..., T], *args: Any) -> T:
        """Run `work` (folders and files of `local`'s scratch) in a thread, one at a
        time per deployment and in the order asked.

        Creating folders and replacing files on a journaling disk takes milliseconds
        each (about 1.4 ms for a write and rename, 3 ms for four folders on ext4 here,
        against 0.05 ms on tmpfs); on the event loop they would hold every other
        deployment's events and lines for that long.
        """
        async with local.files_lock:
            return await asyncio.to_thread(work, *args)

    def _give(self, path: Path) -> None:
        """Hand a folder to the worker user (mode 0700), when workers are sandboxed."""
        path.chmod(0o700)
        if self.worker_ids is not None:
            uid, gid, _ = self.worker_ids
            os.chown(path, uid, gid)

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
        if self.worker_ids is not None:
            for folder in (where, where / "bin"):
                if not _enterable(folder, self.worker_ids):
                    raise StageFailed(
                        f"image {image!r} maps to {where}, but the worker user "
                        f"{self.worker_ids[2]!r} cannot read {folder} (mode "
                        f"{stat.S_IMODE(folder.stat().st_mode):04o}): make it readable by "
                        "others (chmod o+rx)"
                    )
        local.image_bin = where / "bin"

    async def mount_storage(self, deployment: Deployment) -> None:
        local = self._get(deployment.key)
        await self._files(local, self._mount_storage, local)

    def _mount_storage(self, local: _Local) -> None:
        deployment = local.deployment
        mounts = []
        for mount in deployment.spec.mounts:
            unsafe = _changeable_folder(mount.mount_path) if self.namespaces else None
            if unsafe is not None:
                raise StageFailed(
                    f"mount path {mount.mount_path} cannot be used: it leads through {unsafe},"
                    " which users other than root can change, so a worker could turn the path"
                    " into a link to a system folder before the volume is bound there; mount"
                    " the volume at a path whose folders only root can change (e.g."
                    f" /mnt/{mount.volume})"
                )
            host = self.config.volumes_root / mount.file_system / mount.volume
            try:
                created = not host.exists()
                host.mkdir(parents=True, exist_ok=True)
                if created and self.worker_ids is not None:
                    os.chown(host, self.worker_ids[0], self.worker_ids[1])
            except OSError as exc:
                raise StageFailed(
                    f"volume {mount.file_system}/{mount.volume} cannot be prepared at {host}: {exc}"
                ) from exc
            mounts.append((mount.mount_path, host, mount.read_only))
        local.mounts = mounts
        if self.namespaces:
            return  # bind-mounted at each mount path when the worker starts
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
        _check_env(deployment)
        port = 0
        if deployment.spec.framework == "pytorch_ddp":
            # A sandboxed deployment has a network namespace of its own: every port is free.
            port = DEFAULT_MASTER_PORT if self.namespaces else free_port(DEFAULT_MASTER_PORT)
        files: list[tuple[Path, str, bool]] = []  # (path, text, private)
        for worker in local.workers.values():
            hostfile: Path | None = None
            if deployment.spec.framework == "mpi":
                hostfile = worker.scratch / "hostfile"
                slots = "".join(f"127.0.0.1 slots={len(w.gpus)}\n" for w in deployment.workers)
                files.append((hostfile, slots, False))
            worker.env = self.worker_env(
                deployment, worker, local, master_port=port, hostfile=hostfile
            )
            profile = (
                "# written by the Runyard local runtime: the image's bin/ first on PATH\n"
                f'export PATH="{local.image_bin}:$PATH"\n'
            )
            files.append((worker.scratch / "home" / ".bash_profile", profile, True))
        await self._files(local, self._write_files, files)

    def _write_files(self, files: list[tuple[Path, str, bool]]) -> None:
        for path, text, private in files:
            if private:
                _write_private(path, text, self.worker_ids)
            else:
                path.write_text(text)

    def worker_env(
        self,
        deployment: Deployment,
        worker: _Worker,
        local: _Local,
        *,
        master_port: int,
        hostfile: Path | None,
    ) -> dict[str, str]:
        """The environment of one worker (R-15). Values of user variables are never logged.

        The user's variables come first and the platform's last, so a platform value
        (PATH, CUDA_VISIBLE_DEVICES, RUNYARD_*, the framework's) always wins. A
        creator-only variable gets the value the deployer resolved for this run
        (`Deployment.creator_values`); without one it is left unset.
        """
        spec = deployment.spec
        env: dict[str, str] = {}
        for var in spec.env:
            value = deployment.creator_values.get(var.name) if var.creator_only else var.value
            if value is not None:
                env[var.name] = value
        home = worker.scratch / "home"
        base_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        user = self.worker_ids[2] if self.worker_ids else os.environ.get("USER", "runyard")
        env |= {
            "PATH": f"{local.image_bin}:{base_path}",
            "HOME": str(home),
            "TMPDIR": str(worker.scratch / "tmp"),
            "PWD": str(worker.scratch / "work"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "USER": user,
            "LOGNAME": user,
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
        return env

    # -- workers -----------------------------------------------------------------

    async def start_workers(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        local = self._get(deployment.key)
        if any(w.pid is not None for w in local.workers.values()):
            raise RuntimeError(f"workers of {deployment.key} already started")
        # Written before any process exists: a deployer that dies now leaves a trace that
        # the next one follows (it ends stray processes instead of starting a second gang).
        await self._write_state(local, "starting")
        pids: dict[int, int] = {}
        try:
            for worker in local.workers.values():
                env_file, files = await self._files(local, self._launch_files, worker)
                filtered = self.spawns is not None
                args = self._launch_args(local, worker, env_file=env_file, filtered=filtered)
                cwd, env = worker.scratch / "work", _wrapper_env(local.deployment, worker.index)
                try:
                    if self.spawns is not None:
                        worker.process = await self.spawns.spawn(
                            args, cwd=cwd, env=env, stdout=files[0], stderr=files[1]
                        )
                    else:
                        worker.process = await asyncio.create_subprocess_exec(
                            *args,
                            cwd=cwd,
                            env=env,
                            stdin=asyncio.subprocess.DEVNULL,
                            stdout=files[0],
                            stderr=files[1],
                            start_new_session=True,
                        )
                finally:
                    for f in files:
                        f.close()
                worker.pid = worker.process.pid
                worker.starttime = _starttime(worker.pid)
                worker.started_at = time.time()
                pids[worker.index] = worker.pid
                # Each worker named as soon as it runs: a deployer that dies now leaves
                # the next one every process it started (see `recover`).
                await self._write_state(local, "starting")
        except BaseException:
            # No half-started gang: the workers already started go, the caller fails the
            # attempt (e.g. E2BIG for a launch command over the kernel's argument limit).
            await self._kill_started(local)
            raise
        await self._write_state(local, "started")
        self._watch_all(local, on_output, on_exit)
        return pids

    async def _kill_started(self, local: _Local) -> None:
        """SIGKILL the process groups of the workers started so far, and wait for them."""
        for worker in local.workers.values():
            if worker.pid is None:
                continue
            _signal_group(worker.pid, signal.SIGKILL)
            if worker.process is not None:
                await worker.process.wait()
            await _until_gone(worker.pid)
            worker.pid = worker.process = None

    def _launch_files(self, worker: _Worker) -> tuple[Path, list[BinaryIO]]:
        """The worker's variables file, and its output files opened to append."""
        env_file = self._write_env(worker, worker.env, "env")
        files: list[BinaryIO] = []
        try:
            for name in ("stdout", "stderr"):
                files.append(open(worker.scratch / f"{name}.log", "ab"))  # noqa: SIM115
                if self.worker_ids is not None:
                    # The worker's own, so `echo x > /dev/stderr` (opened again through
                    # /proc/self/fd) works as it does anywhere; it could change them
                    # through its descriptors anyway, and their folder stays root's.
                    os.fchown(files[-1].fileno(), self.worker_ids[0], self.worker_ids[1])
        except BaseException:
            for f in files:
                f.close()
            raise
        return env_file, files

    def _write_env(self, worker: _Worker, env: Mapping[str, str], name: str) -> Path:
        """The worker's variables as a shell file its unprivileged shell sources.

        The processes that run as root (nsenter, unshare, the wrapper, mount) never
        get the worker's variables (an LD_PRELOAD or BASH_ENV there would run as root):
        only the shell that has already dropped privileges reads them.
        """
        text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        path = worker.scratch / name
        _write_private(path, text, self.worker_ids)
        return path

    # -- env check (R-30) ----------------------------------------------------------

    async def start_env_check(
        self, deployment: Deployment, on_output: OnOutput, *, port: int
    ) -> dict[int, int]:
        """Run the env check program in every worker at once; its pids by worker index.

        Each worker runs `python -m runyard.faulttolerance.bootcheck --worker <i>
        [--rdma] [--mount <path>[:ro] ...]` exactly as its launch command would run
        (same wrapper, mount namespace, variables, image PATH, working directory), with
        `RUNYARD_BOOTCHECK_PORT=<port>` (one free port for all workers: the all-reduce's
        rendezvous). Every line it prints goes to `on_output` as a line of that worker
        (stdout as `stdout`, its errors as `stderr`). Ends on its own; `end_env_check`
        (or `stop`) kills whatever is left.
        """
        local = self._get(deployment.key)
        if local.checks:
            return {i: p.pid for i, p in local.checks.items()}
        for worker in local.workers.values():
            command = bootcheck_command(deployment, worker.index)
            status = worker.scratch / "bootcheck_status"
            env = {**worker.env, "RUNYARD_BOOTCHECK_PORT": str(port)}
            env_file = await self._files(local, self._write_env, worker, env, "bootcheck.env")
            args = self._launch_args(
                local, worker, command=command, status_file=status, env_file=env_file
            )
            process = await asyncio.create_subprocess_exec(
                *args,
                cwd=worker.scratch / "work",
                env=_wrapper_env(local.deployment, worker.index),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            local.checks[worker.index] = process
            pipes: tuple[tuple[Stream, asyncio.StreamReader | None], ...] = (
                ("stdout", process.stdout),
                ("stderr", process.stderr),
            )
            for stream, pipe in pipes:
                assert pipe is not None
                reader = self._follow_check(local, worker.index, stream, pipe, on_output)
                local.check_readers.append(asyncio.create_task(reader))
        return {i: p.pid for i, p in local.checks.items()}

    async def _follow_check(
        self,
        local: _Local,
        worker: int,
        stream: Stream,
        pipe: asyncio.StreamReader,
        on_output: OnOutput,
    ) -> None:
        d = local.deployment
        while True:
            try:
                raw = await pipe.readline()
            except ValueError:  # a line over the reader's limit: take what is there
                raw = await pipe.read(64 * 1024)
            if not raw:
                return
            text = raw.decode("utf-8", "replace").rstrip("\n").rstrip("\r")
            line = OutputLine(d.task_id, d.run, d.attempt, worker, stream, text, datetime.now(UTC))
            try:
                await on_output(line)
            except Exception:
                log.exception("output sink failed; env check line of %s dropped", d.key)

    async def wait_env_check(self, key: DeploymentKey) -> dict[int, int]:
        """Wait until the env check program ended in every worker; exit codes by index."""
        local = self._deps.get(key)
        if local is None:
            return {}
        codes = {i: await p.wait() for i, p in list(local.checks.items())}
        await asyncio.gather(*local.check_readers, return_exceptions=True)
        return codes

    async def end_env_check(self, key: DeploymentKey) -> None:
        """Kill what is left of the env check program (its result is known by now).

        Two ends of one check may overlap (a new placement ends an older attempt
        while that attempt's check is being ended): each works on what was there
        when it began and removes only that."""
        local = self._deps.get(key)
        if local is None or not local.checks:
            return
        checks, readers = dict(local.checks), list(local.check_readers)
        for process in checks.values():
            if process.returncode is None:
                _signal_group(process.pid, signal.SIGKILL)
        for process in checks.values():
            await process.wait()
            await _until_gone(process.pid)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await asyncio.gather(*readers, return_exceptions=True)
        for reader in readers:
            reader.cancel()
        for index, process in checks.items():
            if local.checks.get(index) is process:
                del local.checks[index]
        local.check_readers[:] = [r for r in local.check_readers if r not in readers]

    def _launch_args(
        self,
        local: _Local,
        worker: _Worker,
        *,
        env_file: Path,
        command: str | None = None,
        status_file: Path | None = None,
        filtered: bool = False,
    ) -> list[str]:
        """The command line of one worker process: a bash wrapper running the launch command.

        The wrapper runs `bash --login -c "<launch command>"` with the worker's variables
        (sourced from `env_file` by a shell of the worker's own), then writes its exit
        status to the worker's `exit_status` file (so a deployer that restarts meanwhile
        still learns it exactly) and exits with it. It survives SIGTERM itself (`trap :`),
        so a stop's grace period is the launch command's, as if it ran alone.

        Sandboxed, the wrapper is the first process of a PID namespace of its own, in a
        mount namespace of its own, inside the deployment's network and IPC namespaces:
        it sets up the worker's view of the file system as root (`_mount_script`), then
        runs the launch command as the worker user with no capabilities and
        `no_new_privs` (setpriv), behind the seccomp filter at `worker_nice`: set by an
        interpreter between setpriv and the shell, or, `filtered`, already on the
        thread that starts the wrapper (`spawns`).
        """
        t = self.tools
        q = shlex.quote
        user_shell = f'{q(t.bash)} -c \'. "$0" && exec {q(t.bash)} --login -c "$1"\' "$3" "$1"'
        setup = ""
        if self.namespaces:
            assert self.worker_ids is not None
            uid, gid, _ = self.worker_ids
            tag = Path(status_file or worker.status_file).name
            setup = self._mount_script(local, worker, tag)
            if self._group_bases():
                # Before anything forks: the wrapper (and so all it starts) joins the
                # worker's cgroups; `echo` is a builtin, no process of its own.
                # A group swept away meanwhile (`_sweep_groups`) is made again.
                groups = self._worker_groups(local)[worker.index]
                join = _join_groups(groups, self._group_files(worker.placement), t.mkdir)
                setup = f"{join} || finish 112\n{setup}"
            # The kernel's first choice when memory runs out, before the control plane
            # (Postgres, the services): set as root, so the worker cannot lower it.
            setup = f"{{ echo 1000 > /proc/self/oom_score_adj; }} 2>/dev/null\n{setup}"
            # The launch command's shell starts behind a seccomp filter (`_WORKER_FILTER`):
            # no keyring (every task's workers share one uid, so its user keyring too),
            # no user namespace, no io_uring; at `worker_nice`.
            nice = self.config.worker_nice
            keyless = (
                "" if filtered else f"{q(sys.executable)} -I -S -c {q(_WORKER_FILTER)} {nice} "
            )
            user_shell = (
                f"{q(t.setpriv)} --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all "
                f"--bounding-set=-all --no-new-privs -- {keyless}{user_shell}"
            )
        wrapper = (
            # Every way out writes the status and the time it was known (bash's
            # EPOCHREALTIME): a deployer that reads it later records the exit at the
            # time it happened, also for a worker stopped while its mounts were set up.
            # The stop signals are ignored while it is written, by `mv` too (a signal
            # ignored stays so across exec): a SIGTERM sent again (two stops of one
            # attempt) must not kill `mv` halfway, leaving no status to read.
            'status_file="$2"\n'
            "finish() { trap '' TERM INT HUP; "
            'printf "%s %s\\n" "$1" "$EPOCHREALTIME" > "$status_file.tmp" && '
            f'{q(t.mv)} -f "$status_file.tmp" "$status_file"; exit "$1"; }}\n'
            "trap : TERM INT HUP\n"
            f"{setup}cd {q(str(worker.scratch / 'work'))} || finish 111\n"
            # The wrapper's own messages ("Terminated") are not the worker's output.
            "exec 3>&2 2>/dev/null\n"
            f"{user_shell} 2>&3 3>&-\n"
            "code=$?\n"
            f"{self._oom_note(local, worker)}"
            'finish "$code"\n'
        )
        args = [t.bash, "-c", wrapper, "runyard-worker", command or local.deployment.spec.command]
        args += [str(status_file or worker.status_file), str(env_file)]
        if not self.namespaces:
            return args
        root = local.root
        return [
            t.nsenter,
            f"--net={root / 'netns'}",
            f"--ipc={root / 'ipcns'}",
            "--",
            t.unshare,
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "--",
            *args,
        ]

    def _mount_script(self, local: _Local, worker: _Worker, tag: str) -> str:
        """Shell lines, run as root in the worker's own mount namespace, that set up its view.

        First every folder the worker must see but that would be hidden is opened: its
        scratch, and the image, the image's base interpreter (a virtualenv's `home`),
        Runyard itself and the interpreter it runs on, when they lie under a hidden path,
        under /tmp, or below a folder the worker user cannot traverse (e.g. an
        interpreter under /root). Then each volume is bind-mounted at its mount path
        (read-only when asked); the deployment's shared `shm/` goes over /dev/shm and
        the worker's scratch `tmp/` over /tmp and /var/tmp (nothing of the host's /tmp
        stays visible). Then, outermost first, an empty tmpfs goes over every hidden
        path (the scratch and volume roots, the data dir, `local.hide`, and those
        untraversable folders) and the opened folders are bind-mounted back at their
        own paths through /proc/self/fd (a hidden path inside one of them is covered
        again after it). Any failure ends the worker (exit 112, written as its status)
        before the launch command runs: a worker never runs with a partial view.

        The mounts go in batches, one `mount --all` each (`_mount_batches`): starting
        `mount` costs a millisecond or two of CPU, and a worker needs about ten.
        """
        q = shlex.quote
        scratch = worker.scratch.resolve()
        image = local.image_bin.parent.resolve() if local.image_bin is not None else None
        # Runyard and its interpreter too: the env check runs Runyard's bootcheck module.
        runyard = (_runyard_root(), Path(sys.prefix), Path(sys.base_prefix))
        needed = [p for p in (image, _python_home(image), *runyard) if p is not None]
        blocked = [a for a in map(_untraversable, needed) if a is not None]
        hidden = sorted({*self._hidden_paths(), *blocked})
        covers = [Path("/tmp"), *hidden]
        keep = list(dict.fromkeys([scratch, *(p for p in needed if _covered(p, covers))]))
        opened = [f"exec {10 + n}<{q(str(path))}" for n, path in enumerate(keep)]
        # X-mount.mkdir: mount makes a missing mount point (mode 0755) itself.
        mounts = [
            _Mount(str(host), mount_path, "none", "bind,X-mount.mkdir" + ",ro" * read_only)
            for mount_path, host, read_only in local.mounts
        ]
        # Other GPUs' device nodes: covered by a file nobody may open (`gpu_devices`); as every
        # source below, before /tmp (where the deployment's folder may lie) is covered.
        if self.gpu_devices is not None:
            cover = str(local.root / "nodev")
            mine = set(worker.placement.gpus)
            for gpu, node in sorted(gpu_nodes(self.gpu_devices).items()):
                if gpu not in mine:
                    mounts.append(_Mount(cover, str(node), "none", "bind"))
        tmp = str(scratch / "tmp")
        mounts.append(_Mount(str(local.root / "shm"), "/dev/shm", "none", "bind"))
        # The host's other folders anyone may write to (/var/tmp, /run/lock, ...): no
        # channel between tasks there, and nothing written past the worker's disk.
        mounts.append(_Mount(tmp, "/var/tmp", "none", "bind", test="-d"))
        theirs = [*hidden, *needed, *(Path(m) for m, _, _ in local.mounts), scratch]
        for shared in self.shared_dirs:
            if not any(_related(str(shared), str(path)) for path in theirs):
                mounts.append(_Mount(tmp, str(shared), "none", "bind", test="-d"))
        mounts.append(_Mount(tmp, "/tmp", "none", "bind"))
        early, mounts = mounts, []
        steps = [(len(p.parts), 0, p, -1) for p in hidden]
        steps += [(len(p.parts), 1, p, 10 + n) for n, p in enumerate(keep)]
        for _, bind, path, fd in sorted(steps):
            if bind:
                # The scratch with what is mounted below it (the worker's system disk):
                # a mount of the disk's own would be taken as made already (`mount -a`
                # finds the hidden one at that path) and skipped.
                kind = "rbind" if path == scratch and self.disk_bytes is not None else "bind"
                mounts.append(
                    _Mount(f"/proc/self/fd/{fd}", str(path), "none", f"{kind},X-mount.mkdir")
                )
            else:
                tmpfs = "size=1m,mode=0755,nosuid,nodev"
                file = _Mount("/dev/null", str(path), "none", "bind")
                mounts.append(
                    _Mount("runyard-hidden", str(path), "tmpfs", tmpfs, test="-d", otherwise=file)
                )
        fstabs = local.root / f"{tag}.w{worker.index}.mounts"
        # Where the bind is made, at the moment it is made (a Slurm node's folders are
        # not the deployer's to look at): see `_changeable_folder`.
        checks = [f"runyard_mount_path_check {q(path)}" for path, _, _ in local.mounts]
        lines = [*checks, *opened]
        if self.disk_bytes is not None or self.shm_bytes is not None:
            # This namespace's copies of the mounts of other deployments (their disks,
            # /dev/shm and namespace files) go first, while their paths are still theirs:
            # kept, they would hold those disks' space and that memory until this worker
            # ends. A failure only keeps them.
            root = _mountinfo_path(self.config.scratch_root.resolve())
            own = _mountinfo_path(local.root.resolve())
            lines.append(f"{{ runyard_detach {q(root)} {q(own)}; }} 2>/dev/null || :")
        # Every fstab file is opened before the first mount: /tmp (where the deployment's
        # folder may lie) is the worker's own after it.
        first = _mount_lines(early, fstabs, self.tools.mount)
        hides = local.root / f"{tag}.w{worker.index}.hides"
        fd = _FSTAB_FD + len(_mount_batches(early))
        then = _mount_lines(mounts, hides, self.tools.mount, fd=fd)
        opens = len(_mount_batches(early)), len(_mount_batches(mounts))
        lines += [*first[: opens[0]], *then[: opens[1]], *first[opens[0] :], *then[opens[1] :]]
        lines += [f"exec {10 + n}<&-" for n in range(len(keep))]
        # Last: the worker's /proc read-only (its own mount of it; a worker has no
        # capability to make it writable again). Without CAP_SYS_RESOURCE (which some VMs
        # and containers take from root) the 1000 root wrote to oom_score_adj is no floor
        # the kernel keeps: a worker could write 0 there and have the OOM killer pick
        # Postgres instead. Writing any /proc file fails (EROFS); reading works.
        lines.append(f"{q(self.tools.mount)} -o remount,bind,ro /proc")
        check = _MOUNT_PATH_CHECK.format(stat=q(self.tools.stat), readlink=q(self.tools.readlink))
        prelude = check if checks else ""
        if self.disk_bytes is not None or self.shm_bytes is not None:
            prelude += _DETACH.format(umount=q(self.tools.umount))
        return prelude + "".join(f"{line} || finish 112\n" for line in lines)

    def _group_bases(self) -> list[Path]:
        """Where the workers' cgroups lie: the pids base first, then cgroup v1's
        memory and cpu ones."""
        return [*([self.pids_base] if self.pids_base is not None else []), *self.limit_bases]

    def _group_folders(self, root: Path) -> list[Path]:
        """A deployment's folder in each of `_group_bases`."""
        return [base / _group_name(root) for base in self._group_bases()]

    def _worker_groups(self, local: _Local) -> dict[int, list[Path]]:
        """Each worker's cgroups (`w<i>` in each of the deployment's folders; on cgroup
        v1 the memory and cpu ones only where its limits can bind: `_binds`)."""
        folders = self._group_folders(local.root)
        own = folders[: 1 if self.pids_base is not None else 0]  # the pids one
        return {
            i: [folder / f"w{i}" for folder in (folders if self._binds(w.placement) else own)]
            for i, w in local.workers.items()
        }

    def _binds(self, placement: WorkerPlacement) -> bool:
        """Whether a limit of the placement's memory or CPUs can hold the worker on this
        host: one at or above what the host has holds nothing, and is not made (on
        cgroup v1 each of its groups costs the kernel work: in a burst of 150 trivial
        tasks on 2 cores, 4-5 tasks/s with them against 10.7 without)."""
        if self.memory_base is None:
            return False
        cpus, memory = self._host
        return bool(
            (placement.memory_gib and (not memory or placement.memory_gib * 2**30 < memory))
            or (placement.cpus and placement.cpus < cpus)
        )

    def _group_files(self, placement: WorkerPlacement) -> dict[str, str]:
        """The limits of one worker's cgroups, by file (those its groups lack are not
        written: each v1 hierarchy has its own): its processes, and where
        `worker_limits` holds, the memory and CPUs of its placement. Swap is no way
        around the memory limit."""
        files = {"pids.max": str(self.config.worker_pids_max)}
        if not self._binds(placement):
            return files
        if placement.memory_gib:
            limit = str(placement.memory_gib * 2**30)
            files |= {
                "memory.limit_in_bytes": limit,
                "memory.memsw.limit_in_bytes": limit,
                "memory.max": limit,
                "memory.swap.max": "0",
            }
        if placement.cpus:
            quota = placement.cpus * CPU_PERIOD_US
            files |= {
                "cpu.cfs_period_us": str(CPU_PERIOD_US),
                "cpu.cfs_quota_us": str(quota),
                "cpu.max": f"{quota} {CPU_PERIOD_US}",
            }
        return files

    def _oom_note(self, local: _Local, worker: _Worker) -> str:
        """The wrapper's lines that say, on the worker's stderr, that the kernel ended
        processes of it at its memory limit (the OOM kills its memory cgroup counts:
        v1 `memory.oom_control`, v2 `memory.events`); the exit status is kept."""
        memory = self.memory_base
        if memory is None or not worker.placement.memory_gib or not self._binds(worker.placement):
            return ""
        name = self._group_folders(local.root)[self._group_bases().index(memory)]
        group = shlex.quote(str(name / f"w{worker.index}"))
        note = (
            "runyard: out of memory: the kernel ended $n process(es) of this worker at its"
            f" limit of {worker.placement.memory_gib} GiB (its spec's memory); choose a"
            " spec with more memory, or have the worker use less"
        )
        return (
            f"for f in {group}/memory.oom_control {group}/memory.events; do\n"
            '  [ -e "$f" ] && while read -r k n; do\n'
            f'    [ "$k" = oom_kill ] && [ "$n" != 0 ] && printf "%s\\n" "{note}" >&3\n'
            '  done < "$f"\n'
            "done\n"
        )

    def _hidden_paths(self) -> list[Path]:
        """The control-plane paths a sandboxed worker must not see (`CREDENTIAL_PATHS`
        too: each covered where it exists on the worker's machine, as every one)."""
        wanted = [
            self.config.scratch_root,
            self.config.volumes_root,
            *self.config.hidden,
            *map(Path, CREDENTIAL_PATHS),
        ]
        return sorted({p.resolve() for p in wanted})

    def _watch_all(self, local: _Local, on_output: OnOutput, on_exit: OnExit) -> None:
        local.queue = asyncio.Queue(maxsize=self.config.output_buffer)
        local.pump = asyncio.create_task(self._pump(local, on_output))
        for worker in local.workers.values():
            local.watchers.append(asyncio.create_task(self._watch(local, worker, on_exit)))

    async def _watch(self, local: _Local, worker: _Worker, on_exit: OnExit) -> None:
        """Follow one worker until it is gone, its output is read and its exit reported.

        `on_exit` is awaited to the end: the deployer's handler returns once the exit is
        recorded (it retries through a store outage), so everything after a worker's
        `wait` (cleanup: scratch removed) happens only once its exit is in the log.
        """
        readers = [
            asyncio.create_task(self._tail(local, worker, "stdout")),
            asyncio.create_task(self._tail(local, worker, "stderr")),
        ]
        local.readers.extend(readers)
        assert worker.pid is not None
        if worker.process is not None:
            code: int | None = await worker.process.wait()
            assert code is not None
            code = 128 - code if code < 0 else code
        else:  # adopted: not our child, so look at /proc until it is gone
            while _alive(worker.pid, worker.starttime):  # noqa: ASYNC110 (no event for a non-child)
                await asyncio.sleep(self.config.poll_s)
            code = None
        # The launch command ended: whatever it left in its group goes with it.
        _signal_group(worker.pid, signal.SIGKILL)
        await _until_gone(worker.pid)
        exited_at = datetime.now(UTC)  # when the wrapper itself was killed: no status
        worker.gone.set()
        # Every line is read (a full queue only slows this down; lines are never cut off).
        await asyncio.gather(*readers, return_exceptions=True)
        status = _read_status(worker.status_file)
        if status is not None:
            code, exited_at = status[0], min(status[1], exited_at)
        worker.exit_code = UNKNOWN_EXIT_CODE if code is None else code
        worker.exited_at = exited_at
        worker.done.set()
        try:
            await on_exit(local.deployment.key, worker.index, worker.exit_code, exited_at)
        except Exception:
            log.exception(
                "exit handler failed for %s worker %s", local.deployment.key, worker.index
            )

    async def _tail(self, local: _Local, worker: _Worker, stream: Stream) -> None:
        """Follow one output file of a worker, line by line, until the worker is gone.

        The worker writes to a file, never to a pipe: it can neither block on a slow
        reader nor die of SIGPIPE when the deployer goes away, and a new deployer
        resumes reading where the last saved offset says.
        """
        path = worker.scratch / f"{stream}.log"
        offset = worker.offsets[stream]
        # Cut as `outputs.numbered_lines` cuts a whole file: the numbers match.
        splitter = LineSplitter(offset)
        pace = _Pace(self.config.output_lines_per_s)
        skips = worker.skips.setdefault(stream, [])
        delay = 0.005
        try:
            with open(path, "rb") as f:  # noqa: ASYNC230 (local file, small reads)
                f.seek(offset)
                while True:
                    last = worker.gone.is_set()
                    # A skip saved by an earlier deployer, else a new one if reading
                    # fell too far behind: its notice in place of the stretch.
                    skip = next((k for k in skips if k.start >= splitter.line_start), None)
                    if skip is None:
                        skip = self._behind(f, splitter, stream, skips)
                    if skip is not None and f.tell() >= skip.start:
                        if f.tell() == skip.start:  # as numbered_lines reads it
                            for raw, end in splitter.finish():
                                await self._emit(local, worker, stream, raw, end)
                        await self._emit(
                            local, worker, stream, skip.notice.encode(), skip.end, notice=True
                        )
                        # Saved (with the notice): no reader goes into the stretch again,
                        # so it leaves the host's disk (a flood costs it the backlog).
                        _punch(path, skip.start, skip.end)
                        f.seek(skip.end)
                        splitter = LineSplitter(skip.end)
                        continue
                    size = 256 * 1024 if skip is None else min(256 * 1024, skip.start - f.tell())
                    chunk = f.read(size)
                    if not chunk:
                        if last:
                            break
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.2)
                        continue
                    delay = 0.005
                    lines = splitter.feed(chunk)
                    for raw, end in lines:
                        await self._emit(local, worker, stream, raw, end)
                    # Other deployments' work runs between chunks, and a worker that
                    # writes faster than its pace waits here (its file holds the rest).
                    await asyncio.sleep(pace.wait(len(lines)))
                for raw, end in splitter.finish():
                    await self._emit(local, worker, stream, raw, end)
        except FileNotFoundError:
            return

    def _behind(
        self, f: Any, splitter: LineSplitter, stream: Stream, skips: list[outputs.Skip]
    ) -> outputs.Skip | None:
        """A new skip when reading `f` fell more than `output_backlog_bytes` behind:
        from the line being read to a line start in the last quarter of that distance;
        saved at once (a deployer that restarts skips the same stretch). None else."""
        here = f.tell()
        size = os.fstat(f.fileno()).st_size
        budget = self.config.output_backlog_bytes
        if size - here <= budget:
            return None
        target = size - budget // 4
        f.seek(target)
        probe = f.read(outputs.LINE_MAX)
        f.seek(here)
        newline = probe.find(b"\n")
        end = target + newline + 1 if newline >= 0 else target
        start = splitter.line_start
        notice = outputs.skip_notice(end - start, stream, self.config.output_lines_per_s)
        skip = outputs.Skip(start, end, notice)
        skips.append(skip)
        return skip

    async def _emit(
        self,
        local: _Local,
        worker: _Worker,
        stream: Stream,
        raw: bytes,
        end: int,
        *,
        notice: bool = False,
    ) -> None:
        if notice:  # a new skip is saved before its notice goes out (and the lines after)
            _save_offsets(worker)
            log.warning("%s worker %d: %s", local.deployment.key, worker.index, raw.decode())
        d = local.deployment
        seq = worker.read_seq[stream]
        if seq is not None:  # numbered here, before the queue: a dropped line leaves a gap
            worker.read_seq[stream] = seq + 1
        line = OutputLine(
            d.task_id,
            d.run,
            d.attempt,
            worker.index,
            stream,
            outputs.text(raw),
            datetime.now(UTC),
            seq,
        )
        assert local.queue is not None
        # The file holds what is not read yet: waiting here slows reading, never the worker.
        await local.queue.put((line, worker, end))

    async def _pump(self, local: _Local, on_output: OnOutput) -> None:
        """Publish the read lines in order; a line the sink refuses is tried again.

        A sink that fails (the broker is away) is retried with backoff, never skipped:
        the offsets saved are those of published lines, so the worker's output files
        hold what is not out yet, and cleanup waits for this pump to finish.
        """
        assert local.queue is not None
        if isinstance(on_output, PipelinedSink):
            return await self._pump_pipelined(local, on_output)
        while True:
            item = await local.queue.get()
            try:
                if item is None:
                    return
                line, worker, end = item
                await _until_published(local, on_output, line)
                _published(local, line, worker, end)
            finally:
                local.queue.task_done()

    async def _pump_pipelined(self, local: _Local, sink: PipelinedSink) -> None:
        """`_pump` with up to `MAX_IN_FLIGHT` lines handed to the sink before the first
        is confirmed (one round trip to the broker per line held a deployment's output
        to a few hundred lines a second). Lines are confirmed, and count as published,
        in the order read; when one fails, it and every line after it are published
        again one by one, as `_pump` does (a line published twice is dropped by the
        log store: same number)."""
        assert local.queue is not None
        sent: deque[tuple[Awaitable[object], tuple[OutputLine, _Worker, int]]] = deque()
        done = False
        while not done or sent:
            # Hand over what is queued; wait for the queue only when nothing is out.
            while not done and len(sent) < MAX_IN_FLIGHT and (not sent or local.queue.qsize()):
                item = await local.queue.get()
                if item is None:
                    local.queue.task_done()
                    done = True
                    break
                try:
                    sent.append((await sink.submit(item[0]), item))
                except Exception as exc:
                    sent.append((_failed(exc), item))
            if not sent:
                continue
            confirm, (line, worker, end) = sent[0]
            try:
                await confirm
            except Exception:
                for other, _ in sent:
                    _quiet(other)
                for _, (again, w, e) in sent:  # this one and all after it, in order
                    await _until_published(local, sink, again)
                    _published(local, again, w, e)
                    local.queue.task_done()
                sent.clear()
                continue
            sent.popleft()
            _published(local, line, worker, end, more_out=bool(sent))
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
        return {i: w.pid for i, w in local.workers.items() if w.pid is not None}

    async def stop(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        local = self._deps.get(key)
        if local is None:
            return
        local.stopping = True
        await self.end_env_check(key)
        grace = self.config.grace_s if grace_s is None else grace_s
        live = [w for w in local.workers.values() if w.pid is not None and not w.done.is_set()]
        # Every process of each worker, also those in sessions of their own (torchrun's
        # ranks), taken while their launcher still links them to the worker: without a
        # PID namespace (the fallback) one that outlives its launcher is nobody's child
        # that a group signal reaches, and would keep its GPU after the stop.
        everyone: list[tuple[int, int | None]] = []
        for worker in live:
            assert worker.pid is not None
            if not self.namespaces:
                everyone += [(pid, _starttime(pid)) for pid in worker_processes(worker.pid)]
            _signal_group(worker.pid, signal.SIGTERM)
        for pid, started in everyone:
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in live:
            left = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await worker.done.wait()
        for worker in live:
            if not worker.done.is_set():
                assert worker.pid is not None
                _signal_group(worker.pid, signal.SIGKILL)
        until = time.monotonic() + 2.0
        while (still := [p for p, t in everyone if _alive(p, t)]) and time.monotonic() < until:
            for pid in still:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)
        for worker in live:
            if local.watchers:
                await worker.done.wait()

    async def wait(self, key: DeploymentKey) -> dict[int, int]:
        """Wait until every started worker has exited and been reported; exit codes by index."""
        local = self._deps.get(key)
        if local is None:
            return {}
        if local.watchers:
            await asyncio.gather(*local.watchers, return_exceptions=True)
        return {i: w.exit_code for i, w in local.workers.items() if w.exit_code is not None}

    async def capture_stacks(
        self, key: DeploymentKey, *, native: bool = True
    ) -> tuple[WorkerStacks, ...]:
        """py-spy dumps of every Python process of each worker (`worker_processes`)."""
        pids = self.pids(key)
        indexes = sorted(pids)
        dumps = await asyncio.gather(
            *(capture_group(pids[i], worker_processes, native=native) for i in indexes)
        )
        return tuple(
            WorkerStacks(worker=i, processes=tuple(d)) for i, d in zip(indexes, dumps, strict=True)
        )

    async def cleanup(self, key: DeploymentKey) -> None:
        local = self._deps.get(key)
        if local is None:
            return
        await self.stop(key, grace_s=0 if local.stopping else None)
        for task in local.watchers:
            with contextlib.suppress(BaseException):
                await task
        if local.queue is not None and local.pump is not None:
            # Every line read is published before the output files go (the pump retries a
            # sink that fails; only a detach, i.e. a crash, leaves lines to the next one).
            if not local.pump.done():
                await local.queue.put(None)
            with contextlib.suppress(BaseException):
                await local.pump
        await asyncio.to_thread(_release_namespaces, local.root, self.tools)
        for folder in self._group_folders(local.root):
            await asyncio.to_thread(_release_groups, folder)
        lines = {
            (w.index, s): n
            for w in local.workers.values()
            for s in outputs.STREAMS
            if (n := w.next_seq.get(s))  # a stream with no numbered line has nothing to confirm
        }
        if self.config.keep_output and lines:
            kept = await asyncio.to_thread(outputs.keep, local.root, key, lines)
            self.kept()[key] = kept
        else:
            await asyncio.to_thread(outputs.forget, local.root)
        del self._deps[key]

    def deployments(self) -> list[DeploymentKey]:
        return list(self._deps)

    # -- output kept until stored (runyard.deployer.outputs) --------------------------

    def kept(self) -> dict[DeploymentKey, KeptOutput]:
        """The finished deployments whose output files are kept (found on disk at first)."""
        if self._kept is None:
            self._kept = outputs.load_kept(self.config.scratch_root)
        return self._kept

    async def forget(self, key: DeploymentKey) -> None:
        """Remove a kept output (every line of it is stored)."""
        kept = self.kept().pop(key, None)
        if kept is not None:
            await asyncio.to_thread(outputs.forget, kept.root)

    def live_streams(self) -> list[OutputStream]:
        """The output streams of the workers being followed, with how far each is
        published: what a broker that lost its memory may have taken."""
        found = []
        for local in self._deps.values():
            if local.queue is None:
                continue  # not started, or only its env check ran
            for w in local.workers.values():
                for stream in outputs.STREAMS:
                    published = w.next_seq[stream]
                    if published:
                        path = w.scratch / f"{stream}.log"
                        key = local.deployment.key
                        found.append(OutputStream(key, w.index, stream, path, published, w.marks))
        return found

    # -- after a deployer restart ------------------------------------------------------

    def recover(self) -> dict[DeploymentKey, dict[int, int]]:
        """Deployments whose workers were started by an earlier deployer process.

        Reads every `state.json` under the scratch root. A deployment cut while its
        workers were being started (`starting`) is started when the file names every
        worker (each is written down as soon as it runs); otherwise its processes are
        found by their environment and ended, their output removed (a gang that never
        started whole ran nothing of the task), and the deployment is left to be
        deployed again. Returns the process ids, by worker, of every started
        deployment; `adopt` then watches them.
        """
        found: dict[DeploymentKey, dict[int, int]] = {}
        for key, raw, state_file in self._saved_states():
            named = raw.get("workers", [])
            whole = raw.get("worker_count") == len(named)
            if raw.get("phase") == "starting" and not whole:
                _end_strays(key)
                _forget_output(state_file.parent)
                continue
            if raw.get("phase") not in ("started", "starting"):
                continue
            found[key] = {int(w["index"]): int(w["pid"]) for w in raw.get("workers", [])}
        return found

    def _saved_states(self) -> Iterator[tuple[DeploymentKey, dict[str, Any], Path]]:
        """(key, saved state, its file) of every deployment an earlier process left
        under the scratch root that this runtime does not hold; an unreadable state is
        logged and skipped."""
        root = self.config.scratch_root
        if not root.is_dir():
            return
        for state_file in sorted(root.glob("*/run*-a*/state.json")):
            try:
                raw = json.loads(state_file.read_text())
                key: DeploymentKey = (str(raw["task_id"]), int(raw["run"]), int(raw["attempt"]))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("unreadable deployment state %s", state_file)
                continue
            if key not in self._deps:
                yield key, raw, state_file

    async def adopt(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        """Watch the workers an earlier deployer started: their output and their exits.

        A worker whose process is still there (same pid and start time) is watched
        until it goes; one already gone is reported at once, with the status its wrapper
        wrote (`UNKNOWN_EXIT_CODE` when the wrapper itself was killed and wrote none).
        """
        key = deployment.key
        task, run, attempt = key
        root = self.config.scratch_root / task / f"run{run}-a{attempt}"
        raw = json.loads((root / "state.json").read_text())
        workers: dict[int, _Worker] = {}
        for placement in deployment.workers:
            workers[placement.index] = _Worker(
                placement.index, placement, root / f"w{placement.index}"
            )
        for entry in raw.get("workers", []):
            worker = workers.get(int(entry["index"]))
            if worker is None:
                continue
            worker.pid = int(entry["pid"])
            worker.starttime = entry.get("starttime")
            worker.started_at = entry.get("started_at")
            _load_offsets(worker)
        local = _Local(deployment, root, workers, adopted=True)
        self._deps[key] = local
        self._watch_all(local, on_output, on_exit)
        return self.pids(key)

    async def discard(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        """End the workers of a deployment found on disk that must not go on; remove it,
        but for its output (`_salvage`).

        Used by reconciliation for attempts the log has moved past (or stopped, or
        finished): their process groups get SIGTERM, then SIGKILL after the grace period.
        """
        task, run, attempt = key
        root = self.config.scratch_root / task / f"run{run}-a{attempt}"
        try:
            raw = json.loads((root / "state.json").read_text())
        except (OSError, ValueError):
            raw = {}
        groups = [
            int(w["pid"])
            for w in raw.get("workers", [])
            if _alive(int(w["pid"]), w.get("starttime"))
        ]
        for pgid in groups:
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + (self.config.grace_s if grace_s is None else grace_s)
        while any(group_members(g) for g in groups) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for pgid in groups:
            await _until_gone(pgid)
        await asyncio.to_thread(_release_namespaces, root, self.tools)
        for folder in self._group_folders(root):
            await asyncio.to_thread(_release_groups, folder)
        await self._salvage(key, root)

    async def _salvage(self, key: DeploymentKey, root: Path) -> None:
        """The output of a deployment an earlier deployer left and this one discards:
        kept until the log service has every line (`outputs.salvage`; the keeper
        publishes at once what it lacks), as a finished deployment's is. The earlier
        deployer may have been cut after a worker's exit was recorded and before its
        last lines were out (or while a broker that lost its memory had them)."""
        if not self.config.keep_output:
            await asyncio.to_thread(outputs.forget, root)
        elif (kept := await asyncio.to_thread(outputs.salvage, root, key)) is not None:
            self.kept()[key] = kept

    def detach(self) -> None:
        """Forget every deployment without touching its processes (what a crash does)."""
        for local in self._deps.values():
            for task in [*local.watchers, *local.readers, local.pump]:
                if task is not None:
                    task.cancel()
        self._deps.clear()

    async def _write_state(self, local: _Local, phase: str) -> None:
        await self._files(local, self._save_state, local, self._state(local, phase))

    def _state(self, local: _Local, phase: str) -> dict[str, Any]:
        """What `state.json` holds for a deployment in `phase`."""
        d = local.deployment
        state: dict[str, Any] = {
            "task_id": d.task_id,
            "run": d.run,
            "attempt": d.attempt,
            "phase": phase,
            "namespaces": self.namespaces,
            "worker_count": len(local.workers),
            "workers": [
                {
                    "index": w.index,
                    "pid": w.pid,
                    "starttime": w.starttime,
                    "started_at": w.started_at,
                }
                for w in local.workers.values()
                if w.pid is not None
            ],
        }
        return state

    def _save_state(self, local: _Local, state: dict[str, Any]) -> None:
        """Replace `state.json` whole (a reader never sees half of it)."""
        tmp = local.root / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(local.root / "state.json")

    def start_times(self, key: DeploymentKey) -> dict[int, datetime]:
        """When each started worker of the deployment was started, by worker index."""
        local = self._deps.get(key)
        if local is None:
            return {}
        return {
            i: datetime.fromtimestamp(w.started_at, UTC)
            for i, w in local.workers.items()
            if w.started_at is not None
        }

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


#: The exit code recorded for a worker whose exit status nobody could learn: it ended
#: while no deployer watched it and its wrapper was killed before writing `exit_status`.
UNKNOWN_EXIT_CODE = -1


#: PATH of the processes that run as root before a worker drops its privileges.
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Brings `lo` up in the network namespace it runs in (a new one has it down).
_LOOPBACK_UP = """
import fcntl, socket, struct
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    req = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, req))[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))
"""


@dataclass(frozen=True, slots=True)
class _Tools:
    """Absolute paths of the programs the runtime runs (never looked up in a worker's PATH)."""

    bash: str
    mv: str
    mkdir: str
    mount: str
    umount: str
    unshare: str
    nsenter: str
    setpriv: str
    #: iproute2's `ip`, where installed (optional: the loopback comes up without it).
    ip: str = ""
    #: coreutils' `stat` and `readlink`: a mount path's folders looked at where the
    #: volumes are bound (`_MOUNT_PATH_CHECK`).
    stat: str = ""
    readlink: str = ""
    #: e2fsprogs' `mkfs.ext4`: the workers' system disks (optional: none without it).
    mkfs: str = ""
    #: coreutils' `rm`: a Slurm worker's disk file, unlinked once mounted.
    rm: str = ""

    @classmethod
    def find(cls) -> _Tools:
        path = f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}"
        found = {name: shutil.which(name, path=path) or "" for name in cls.__slots__}
        found["mkfs"] = shutil.which("mkfs.ext4", path=path) or ""
        found["bash"] = found["bash"] or "bash"
        found["stat"] = found["stat"] or "stat"
        found["readlink"] = found["readlink"] or "readlink"
        found["rm"] = found["rm"] or "rm"
        return cls(**found)

    def missing(self) -> list[str]:
        optional = ("ip", "mkfs")
        return [name for name in self.__slots__ if not getattr(self, name) and name not in optional]


def _sandbox_unavailable(tools: _Tools) -> str | None:
    """Why workers cannot be sandboxed here (None: they can). Checked once, at start."""
    if os.geteuid() != 0:
        return "the deployer does not run as root"
    if missing := tools.missing():
        return f"{', '.join(missing)} not found (install util-linux)"
    probe = [tools.unshare, "--mount", "--propagation", "private", "--pid", "--fork"]
    probe += ["--mount-proc", "--net", "--ipc", tools.mount, "--bind", "/", "/"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`unshare` failed: {exc}"
    if done.returncode != 0:
        return f"`unshare` is not permitted: {done.stderr.decode(errors='replace').strip()}"
    return None


def _worker_user(spec: str, tools: _Tools) -> tuple[int, int, str]:
    """(uid, gid, name) of the user sandboxed workers run as; a missing name is created."""
    if spec.replace(":", "", 1).isdigit():
        uid_text, _, gid_text = spec.partition(":")
        uid, gid = int(uid_text), int(gid_text or uid_text)
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = f"uid{uid}"
    else:
        try:
            entry = pwd.getpwnam(spec)
        except KeyError:
            entry = _create_user(spec)
        uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
    if uid == 0 or gid == 0:
        raise RuntimeError(
            f"local.worker_user {spec!r} is root: workers must run as an unprivileged user"
        )
    return uid, gid, name


def _create_user(name: str) -> pwd.struct_passwd:
    """Create `name` as a system user with a group of its own, no home and no login shell."""
    useradd = shutil.which("useradd", path=f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}")
    if useradd is None:
        raise RuntimeError(
            f"the worker user {name!r} does not exist and useradd is not installed: create "
            "it, or set local.worker_user in runtime.yaml to an unused `uid:gid`"
        )
    args = [useradd, "--system", "--user-group", "--no-create-home"]
    args += ["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name]
    done = subprocess.run(args, capture_output=True, timeout=30, check=False)
    try:
        entry = pwd.getpwnam(name)  # also when another process created it meanwhile
    except KeyError:
        why = done.stderr.decode(errors="replace").strip()
        raise RuntimeError(
            f"the worker user {name!r} could not be created ({why}): create it, or set "
            "local.worker_user in runtime.yaml to an unused `uid:gid`"
        ) from None
    log.info("created the system user %r (uid %d) for sandboxed workers", name, entry.pw_uid)
    return entry


def loopback_up(tools: _Tools) -> list[str]:
    """What brings `lo` up in the network namespace it runs in: `ip` (3 ms of CPU here),
    else a bare interpreter (-I -S: no site, no user paths; 25 ms)."""
    if tools.ip:
        return [tools.ip, "link", "set", "lo", "up"]
    return [sys.executable, "-I", "-S", "-c", _LOOPBACK_UP]


def _make_namespaces(root: Path, tools: _Tools) -> None:
    """The deployment's network and IPC namespaces, kept by bind mounts on two files.

    Every worker of the deployment enters both (`nsenter`): they share a loopback of
    their own (DDP rendezvous on 127.0.0.1) and nothing else; the host's loopback
    (Postgres, the broker, the gateway) is not reachable from there.
    """
    _release_namespaces(root, tools)
    net, ipc = root / "netns", root / "ipcns"
    net.touch()
    ipc.touch()
    # One process: unshare makes both (kept by the bind mounts) and runs, inside them,
    # what brings the loopback up.
    args = [tools.unshare, f"--net={net}", f"--ipc={ipc}", *loopback_up(tools)]
    done = subprocess.run(args, capture_output=True, timeout=30, check=False)
    if done.returncode != 0:
        raise OSError(done.stderr.decode(errors="replace").strip() or f"{args[0]} failed")


def _release_namespaces(root: Path, tools: _Tools) -> None:
    """Unmount the files that keep a deployment's namespaces (they go with the last user),
    its /dev/shm and its workers' system disks (`LocalRuntime._make_disks`; a disk's
    loop device goes once no worker uses it)."""
    places = [root / name for name in ("netns", "ipcns", "shm")]
    with contextlib.suppress(OSError):
        places += sorted(root.glob("w*/disk"))
    kept = [place for place in places if os.path.ismount(place)]
    try:
        mounts.detach(kept)
    except OSError as exc:
        log.warning("deployment mounts detached by the umount program (%s)", exc)
        left = [str(place) for place in kept if os.path.ismount(place)]
        if tools.umount and left:
            args = [tools.umount, "-l", *left]
            subprocess.run(args, capture_output=True, timeout=30, check=False)


def _filtered_spawns(nice: int) -> spawns.FilteredSpawns | None:
    """The thread that starts sandboxed workers behind their filter (`spawns`), or None
    (said once) where it cannot be had: each worker's interpreter sets it then."""
    space: dict[str, Any] = {}
    exec(_FILTER_PROGRAM, space)  # this module's own text: the one filter there is
    starter = spawns.FilteredSpawns(space["raw"], len(space["prog"]), nice)
    why = starter.start()
    if why is None:
        return starter
    log.info("sandboxed workers' filter set by an interpreter each (%s)", why)
    return None


def _disks_unavailable(tools: _Tools) -> str | None:
    """Why sandboxed workers cannot get a system disk of their own here (None: they can)."""
    if not tools.mkfs:
        return "mkfs.ext4 not found (install e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


#: Bumped whenever `_make_ext4`'s options change: a template of the old format is not used.
_DISK_FORMAT = "v1"


def _make_ext4(mkfs: str, image: Path, size: int) -> None:
    """A sparse file of `size` bytes at `image` holding an empty ext4 file system
    (no journal, no reserved blocks, its root owned by root, inode tables zeroed
    lazily: the mount says `noinit_itable`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(image, flags, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    features = "lazy_itable_init=1,nodiscard,root_owner=0:0"
    _run([mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", features, str(image)])


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of every stretch of the file `fd` that holds data (not a hole)."""
    extents: list[tuple[int, int]] = []
    at = 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here on
                break
            raise
        at = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, at))
    return extents


def _copy_sparse(source: BinaryIO, extents: list[tuple[int, int]], image: Path, size: int) -> None:
    """`image`: a file of `size` bytes holding `source`'s data stretches (`extents`),
    holes elsewhere, copied in the kernel (`copy_file_range`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(image, flags, 0o600)
    try:
        os.ftruncate(fd, size)
        for start, end in extents:
            at = start
            while at < end:
                copied = os.copy_file_range(source.fileno(), fd, end - at, at, at)
                if copied == 0:
                    raise OSError(f"the template {source.name} ended at {at}, before {end}")
                at += copied
    finally:
        os.close(fd)


def _run(args: list[str]) -> None:
    """Run a program of the runtime's own (in a thread); OSError with its message when
    it fails."""
    done = subprocess.run(args, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        raise OSError(f"{Path(args[0]).name}: {message}")


#: Services that hand out the control plane's credentials, hidden from sandboxed workers
#: with the paths of `hide:`: munge's socket folder mints a credential of the caller's
#: uid, with which Slurm takes `sbatch`, `scancel`, `scontrol` from any process of the
#: worker user (every task's), past Runyard's queue and quotas.
CREDENTIAL_PATHS = ("/run/munge", "/var/run/munge")

#: The pids cgroup the sandboxed workers' own ones are made in, below the hierarchy's root
#: (and cgroup v1's memory and cpu ones, below this process's own group there).
PIDS_BASE = "runyard-workers"
#: The cgroup controllers a sandboxed worker's own group is limited by.
WORKER_CONTROLLERS = ("pids", "memory", "cpu")
#: The period of a worker's CPU quota (its placement's CPUs times this, per period).
CPU_PERIOD_US = 100_000


def _pids_base(total: int | None, nice: int = 0) -> tuple[Path | None, str]:
    """The pids cgroup every worker's own one goes in, its limit set to `total` (None:
    three quarters of kernel.pid_max); or None and why there is none.

    cgroup v1: the `pids` hierarchy; v2: the unified one, `+pids` given to the folders
    below its root (which holds no process of its own there, as v2 asks). On v2 the
    workers' CPU share against the rest of the host is that group's, not their nice
    value's: its `cpu.weight.nice` is set to `nice` where the cpu controller is on."""
    v1 = Path("/sys/fs/cgroup/pids")
    unified = Path("/sys/fs/cgroup")
    try:
        if (v1 / "cgroup.procs").exists():
            hierarchy, v2 = v1, False
        elif "pids" in (unified / "cgroup.controllers").read_text().split():
            hierarchy, v2 = unified, True
        else:
            return None, "no pids controller under /sys/fs/cgroup"
        if total is None:
            total = int(Path("/proc/sys/kernel/pid_max").read_text()) * 3 // 4
        base = hierarchy / PIDS_BASE
        base.mkdir(exist_ok=True)
        if v2:
            for folder in (hierarchy, base):
                if "pids" not in (folder / "cgroup.subtree_control").read_text().split():
                    (folder / "cgroup.subtree_control").write_text("+pids")
                _enable_controllers(folder)  # memory and cpu too, where there are
        (base / "pids.max").write_text(str(total))
        if v2 and "cpu" in (hierarchy / "cgroup.subtree_control").read_text().split():
            with contextlib.suppress(OSError):
                (base / "cpu.weight.nice").write_text(str(nice))
    except (OSError, ValueError) as exc:
        return None, f"the pids cgroup could not be set up: {exc}"
    return base, ""


def _memory_total() -> int:
    """This host's memory in bytes (`MemTotal`), 0 when unknown."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _group_name(root: Path) -> str:
    """The name of a deployment's folder of cgroups, after its scratch folder (unique on
    this host, the same for a deployer that adopts the deployment)."""
    return "d-" + hashlib.sha256(str(root).encode()).hexdigest()[:20]


def _limit_bases(pids_base: Path | None) -> tuple[tuple[Path, ...], Path | None, str]:
    """Where the workers' memory and CPU limits go: (v1 bases, the memory one, "") or
    ((), None, why not): none without a memory controller, no CPU quota without a cpu one.

    cgroup v1: a `runyard-workers` group in the memory and the cpu hierarchy, below
    this process's own group in each (a container's limit holds its workers too).
    v2: the pids base's groups hold them, where its memory and cpu controllers are on."""
    root = Path("/sys/fs/cgroup")
    own: dict[str, str] = {}
    try:
        if not (root / "memory" / "cgroup.procs").exists():
            if pids_base is None or not (pids_base / "cgroup.subtree_control").exists():
                return (), None, "no cgroup v1 memory hierarchy, nor a v2 pids group for it"
            if "memory" not in (pids_base / "cgroup.subtree_control").read_text().split():
                return (), None, f"no cgroup v2 memory controller below {pids_base}"
            return (), pids_base, ""  # and the CPUs where the cpu controller is on there
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own |= dict.fromkeys(controllers.split(","), path)
        bases = []
        for controller in ("memory", "cpu"):  # no CPU limit without a cpu hierarchy
            hierarchy = root / controller
            if not (hierarchy / "cgroup.procs").exists():
                continue
            base = hierarchy / own.get(controller, "/").lstrip("/") / PIDS_BASE
            base.mkdir(exist_ok=True)
            bases.append(base)
    except (OSError, ValueError) as exc:
        return (), None, f"the memory or cpu cgroup could not be set up: {exc}"
    return tuple(bases), bases[0], ""


def _make_groups(groups: Mapping[int, list[Path]], files: Mapping[int, Mapping[str, str]]) -> None:
    """Each worker's cgroups, with its limits (in a thread): of `files[i]`, what a group
    has. One another deployer's sweep removed between its mkdir and its limits is made
    again."""
    for index, paths in groups.items():
        for group in paths:
            for attempt in range(3):
                try:
                    group.mkdir(parents=True, exist_ok=True)
                    _enable_controllers(group.parent)
                    for name, value in files[index].items():
                        if (group / name).exists():
                            (group / name).write_text(value)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise


def _enable_controllers(folder: Path) -> None:
    """cgroup v2: the controllers the workers' groups need, given to those below
    `folder` (each that `folder` has; v1 has no such file)."""
    control = folder / "cgroup.subtree_control"
    if not control.exists():
        return
    have = (folder / "cgroup.controllers").read_text().split()
    on = control.read_text().split()
    for controller in WORKER_CONTROLLERS:
        if controller in have and controller not in on:
            with contextlib.suppress(OSError):
                control.write_text(f"+{controller}")


def _hierarchy(group: Path) -> str | None:
    """The controller of the cgroup v1 hierarchy `group` lies in (None: v2's unified one)."""
    parts = (
        group.relative_to("/sys/fs/cgroup").parts if group.is_relative_to("/sys/fs/cgroup") else ()
    )
    return parts[0] if parts and parts[0] in WORKER_CONTROLLERS else None


def _join_groups(groups: list[Path], files: Mapping[str, str], mkdir: str) -> str:
    """The wrapper's shell that puts itself in a worker's cgroups, or when one is gone
    (swept), makes them again with their limits first (as `_make_groups` does)."""
    q = shlex.quote
    join = " && ".join(f"echo 0 > {q(str(g))}/cgroup.procs" for g in groups)
    again = [f"{q(mkdir)} -p {' '.join(q(str(g)) for g in groups)}"]
    controllers = " ".join(WORKER_CONTROLLERS)
    for parent in sorted({q(str(g.parent)) for g in groups}):
        control = f"{parent}/cgroup.subtree_control"
        again.append(
            f"{{ [ ! -e {control} ] || for c in {controllers}; do echo +$c > {control};"
            " done 2>/dev/null; :; }"
        )
    for g in groups:
        for name, value in files.items():
            if _hierarchy(g) in (None, name.split(".")[0]):  # v1: its controller's files
                path = f"{q(str(g))}/{name}"
                again.append(f"{{ [ ! -e {path} ] || echo {q(value)} > {path}; }}")
    return f"{{ {join}; }} 2>/dev/null || {{ {' && '.join([*again, join])}; }}"


#: A deployment's pids cgroups younger than this are not swept at a deployer's start:
#: they may be another live deployer's, made for a deployment about to start.
PIDS_SWEEP_AGE_S = 120.0


def _sweep_groups(base: Path) -> None:
    """Remove the deployments' cgroups in `base` no process is in and none was made in
    for `PIDS_SWEEP_AGE_S` (at start): those of deployments a crashed deployer left, whose
    scratch may be gone. One of a deployment that has not started yet for that long
    goes too: its wrapper makes it again."""
    now = time.time()
    with contextlib.suppress(OSError):
        for folder in base.glob("d-*"):
            with contextlib.suppress(OSError):
                groups = [*folder.glob("w*"), folder]
                if any(now - g.stat().st_mtime < PIDS_SWEEP_AGE_S for g in groups):
                    continue  # a live deployment's, or just made
                for group in groups:
                    with contextlib.suppress(OSError):  # processes in it: kept
                        group.rmdir()


def _release_groups(folder: Path) -> None:
    """Remove a deployment's cgroups in one base once their last process is gone (in a
    thread; the kernel refuses while one still exits, so a few tries)."""
    try:
        groups = [p for p in folder.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return
    for group in [*groups, folder]:
        for _ in range(50):
            try:
                group.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
                continue
            break


def _write_private(path: Path, text: str, owner: tuple[int, int, str] | None) -> None:
    """Write a new file (mode 0600) that never follows a link a worker may have left there."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as f:
        if owner is not None:
            os.fchown(fd, owner[0], owner[1])
        f.write(text.encode())


def _check_env(deployment: Deployment) -> None:
    """Refuse variables a shell cannot carry (the message names them, never a value)."""
    for var in deployment.spec.env:
        if (
            not var.name.isascii()
            or not var.name.replace("_", "a").isalnum()
            or (var.name[:1].isdigit())
        ):
            raise StageFailed(
                f"environment variable name {var.name!r} is not a valid shell name: use "
                "letters, digits and _ (not first a digit)"
            )
        value = deployment.creator_values.get(var.name) if var.creator_only else var.value
        if value is not None and "\0" in value:
            raise StageFailed(f"the value of environment variable {var.name} has a NUL byte")


def _wrapper_env(deployment: Deployment, worker: int) -> dict[str, str]:
    """The environment of a worker's wrapper: no user variable (see `_write_env`).

    The ids let a new deployer find the processes of a deployment cut while starting.
    """
    return {
        "PATH": _SYSTEM_PATH,
        "LANG": "C.UTF-8",
        "RUNYARD_TASK_ID": deployment.task_id,
        "RUNYARD_RUN_ID": deployment.run_id,
        "RUNYARD_ATTEMPT": str(deployment.attempt),
        "RUNYARD_WORKER_INDEX": str(worker),
    }


def _starttime(pid: int) -> int | None:
    """The process's start time since boot in clock ticks (with the pid: its identity)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def _alive(pid: int, starttime: int | None) -> bool:
    """Whether `pid` is still the same live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return False
    return starttime is None or (len(fields) > 19 and int(fields[19]) == starttime)


def _read_status(path: Path) -> tuple[int, datetime] | None:
    """The exit status a worker's wrapper wrote, and when: `<code> <epoch seconds>`.

    The time is the wrapper's (bash's EPOCHREALTIME); a file without one (an older
    wrapper) gives its modification time, which the wrapper set at the same moment.
    """
    try:
        text = path.read_text().split()
        code = int(text[0])
        # EPOCHREALTIME is written with the locale's decimal point
        at = float(text[1].replace(",", ".")) if len(text) > 1 else path.stat().st_mtime
    except (OSError, ValueError, IndexError):
        return None
    return code, datetime.fromtimestamp(at, UTC)


async def _until_published(local: _Local, on_output: OnOutput, line: OutputLine) -> None:
    """Hand `line` to the sink, again and again with backoff while the sink fails."""

    async def publish() -> None:
        await on_output(line)

    what = f"publishing output of {local.deployment.key} worker {line.worker}"
    await until_done(publish, what=what, component="deployer (worker output)", any_error=True)


class _Pace:
    """How long a stream's reader waits after a chunk so that it reads at most
    `per_s` lines a second on average, bursts of five seconds' worth at once."""

    def __init__(self, per_s: int) -> None:
        self.per_s = per_s
        self.burst = 5.0 * per_s
        self.tokens = self.burst
        self.at = time.monotonic()

    def wait(self, lines: int) -> float:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s) - lines
        self.at = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.per_s


def _published(
    local: _Local, line: OutputLine, worker: _Worker, end: int, *, more_out: bool = False
) -> None:
    """What was published: a new deployer resumes after it. Saved at the end of every
    burst (nothing queued, nothing `more_out`) and at least once a second within one (a
    crash in a burst repeats at most about a second of lines, and loses none)."""
    assert local.queue is not None
    worker.offsets[line.stream] = end
    worker.next_seq[line.stream] = None if line.seq is None else line.seq + 1
    now = time.monotonic()
    if (local.queue.empty() and not more_out) or now - local.offsets_saved > 1.0:
        local.offsets_saved = now
        _save_offsets(worker)


def _failed(exc: Exception) -> asyncio.Future[None]:
    """A confirmation that failed with `exc` (the sink refused to take the line)."""
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(exc)
    return failed


def _quiet(confirm: Awaitable[object]) -> None:
    """Mark a confirmation no one will await as seen (no 'never retrieved' report)."""
    if isinstance(confirm, asyncio.Future):
        confirm.add_done_callback(lambda f: f.cancelled() or f.exception())


def _punch(path: Path, start: int, end: int) -> None:
    """Give the disk space of bytes `start`..`end` of a file back (a hole: they read as
    zeros, the file's size stays); nothing where the file system cannot."""
    if end <= start:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        punch_hole_keep_size = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        offset, length = ctypes.c_int64(start), ctypes.c_int64(end - start)
        libc.fallocate(fd, punch_hole_keep_size, offset, length)
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)


def _save_offsets(worker: _Worker) -> None:
    """The published offsets, per stream the number of the next line, and when."""
    worker.marks.add(worker.next_seq)
    saved: dict[str, Any] = {
        **worker.offsets,
        "seq": worker.next_seq,
        "marks": worker.marks.entries,
    }
    if any(worker.skips.values()):
        saved["skips"] = {s: [k.to_json() for k in ks] for s, ks in worker.skips.items() if ks}
    with contextlib.suppress(OSError):
        (worker.scratch / "offsets.json").write_text(json.dumps(saved))


def _load_offsets(worker: _Worker) -> None:
    """What `_save_offsets` wrote: reading resumes there, numbering too. A stream
    already read whose next number was not saved (an older deployer) goes on
    without numbers rather than reuse ones its earlier lines had."""
    try:
        saved = json.loads((worker.scratch / "offsets.json").read_text())
        offsets = {s: int(saved[s]) for s in ("stdout", "stderr") if s in saved}
        seqs = saved.get("seq") if isinstance(saved.get("seq"), dict) else {}
    except (OSError, ValueError, TypeError, AttributeError):
        return
    worker.offsets.update(offsets)
    worker.marks = Marks.from_json(saved.get("marks"))
    worker.skips = outputs.read_skips(worker.scratch)
    for stream, offset in worker.offsets.items():
        value = seqs.get(stream)
        seq = int(value) if isinstance(value, int) else (0 if offset == 0 else None)
        worker.read_seq[stream] = worker.next_seq[stream] = seq


def _forget_output(root: Path) -> None:
    """Remove what the workers of a deployment that never started wrote (output,
    offsets, exit status): the deployment starts again from nothing."""
    for worker in root.glob("w*"):
        for name in outputs.KEPT_FILES:
            with contextlib.suppress(OSError):
                (worker / name).unlink()


def _end_strays(key: DeploymentKey) -> None:
    """SIGKILL the process groups of workers of `key` that no state file names."""
    task, run, attempt = key
    wanted = {
        f"RUNYARD_TASK_ID={task}".encode(),
        f"RUNYARD_RUN_ID={task}-run{run}".encode(),
        f"RUNYARD_ATTEMPT={attempt}".encode(),
    }
    groups: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= env:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(int(entry.name)))
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    # Gone before the deployment is started again (a PID namespace takes a moment to
    # empty once its first process is killed).
    deadline = time.monotonic() + 5.0
    while any(group_members(g) for g in groups) and time.monotonic() < deadline:
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        time.sleep(0.01)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_exists(pgid: int) -> bool:
    """Whether any process (zombies too) is left in group `pgid`: one system call, so
    the scan of /proc in `group_members` is skipped when the whole group is gone."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_processes() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live (not zombie) process, from one
    scan of /proc (Linux)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X"):
            yield int(entry.name), int(fields[1]), int(fields[2])


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc (Linux)."""
    return [pid for pid, _, group in _live_processes() if group == pgid]


def worker_processes(pgid: int) -> list[int]:
    """Live processes of a worker: its process group `pgid` and every descendant of a
    member, also one that left the group (a launcher's child in a session of its own:
    torchrun starts each rank with `start_new_session`), from one scan of /proc.

    Deepest first: the training processes before the launchers that wait for them, so
    a stack report's summary names where the ranks are, not where torchrun waits."""
    members: set[int] = set()
    children: dict[int, list[int]] = {}
    for pid, parent, group in _live_processes():
        children.setdefault(parent, []).append(pid)
        if group == pgid:
            members.add(pid)
    depth = dict.fromkeys(members, 0)
    pending = list(members)
    while pending:
        parent = pending.pop()
        for child in children.get(parent, ()):
            if child not in depth:
                depth[child] = depth[parent] + 1
                pending.append(child)
    return sorted(depth, key=lambda pid: (-depth[pid], pid))


async def _until_gone(pgid: int, timeout_s: float = 2.0) -> None:
    """SIGKILL the group until none of its members is left (or the timeout passes)."""
    deadline = time.monotonic() + timeout_s
    while _group_exists(pgid) and group_members(pgid) and time.monotonic() < deadline:
        _signal_group(pgid, signal.SIGKILL)
        await asyncio.sleep(0.01)


#: Exit statuses of the env check program once it printed `Bootcheck Finished`: 0, or
#: 3 when a blocking item failed (docs/fault-tolerance.md).
_BOOTCHECK_FINISHED = (0, 3)


def bootcheck_command(deployment: Deployment, worker: int) -> str:
    """The env check command line of one worker (R-30), run in its environment.

    A program that ends any other way (no `python` in the image, Runyard not importable
    there, a crash) printed no `Bootcheck Finished`: the line after it then reports the
    `runtime` item failed with the exit status and finishes the worker's check, in the
    program's own line format, so the fault-tolerance service decides at once instead
    of after its 600 s timeout (a warning, as that timeout gives)."""
    spec = deployment.spec
    parts = ["python", "-m", "runyard.faulttolerance.bootcheck", "--worker", str(worker)]
    if spec.rdma:
        parts.append("--rdma")
    for mount in spec.mounts:
        parts += ["--mount", f"{mount.mount_path}:ro" if mount.read_only else mount.mount_path]
    detail = (
        "the env check program ended with exit status @CODE@ before it finished (its"
        " error is on this worker's stderr): the image needs a `python` that can import"
        " runyard.faulttolerance.bootcheck, as the @python image has"
    )
    item = {"runyard_bootcheck": 1, "worker": worker, "item": "runtime", "result": "fail"}
    head, tail = json.dumps({**item, "detail": detail, "blocking": False}).split("@CODE@")
    finished = " && ".join(f"[ $code -ne {c} ]" for c in _BOOTCHECK_FINISHED)
    return (
        f"{shlex.join(parts)}; code=$?; if {finished}; then"
        f" printf '%s%s%s\\n%s\\n' {shlex.quote(head)} \"$code\" {shlex.quote(tail)}"
        " 'Bootcheck Finished'; fi; exit $code"
    )


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
