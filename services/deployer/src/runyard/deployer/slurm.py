"""Workers as Slurm job steps: the Slurm runtime.

One Slurm job per deployment (one attempt of one run of a task), on exactly
the placed nodes (`--nodelist`), with the placed GPUs as generic resources
(`--gres=gpu:<n>`), one job step per worker. The four deploy stages map onto
it like this:

    allocate        sbatch a job whose batch script reports in the deployment's
                    folder, then waits for a gate file (`go`); the stage ends when
                    the script's `started` report is there (Slurm is asked only
                    while it is not: while PENDING, its reason; a job that ends
                    or is refused: StageFailed with Slurm's words)
    pull_image      the image of the catalogue exists on every node: the batch
                    script's `image` report (the test runs in the script itself
                    on one node, in one step with a task per node on several)
    mount_storage   volumes as host directories under `volumes_root`, bound at
                    their mount paths in a mount (and PID) namespace of each
                    worker's own (read-only ones read-only; root with
                    util-linux), and linked at the mount path relative to the
                    working directory
    init_env        the same variables as the local runtime (`worker_env`), with
                    MASTER_ADDR = the address Slurm gives the first worker's node
                    (127.0.0.1 for a deployment on one host with worker
                    namespaces: its own loopback); written to one env file per
                    worker, never on a command line
    start_workers   the gate opens: the batch script runs
                    `srun --overlap -N1 -n1 -w <node> <worker's run.sh>` per worker

Until the gate opens, a deployment costs the cluster one sbatch: the batch
script's reports (`<job id> <what>`, one line each, written whole) take the
place of steps and of polling Slurm, the nodes' addresses are asked once for
all deployments (kept a minute), and Slurm is asked about a job only when a
file it should have written is late (`_Pace`: the files are looked at after
short naps that grow, Slurm after a second or two). `slurm_calls` counts the
client commands run.

Each worker's `run.sh` sends its stdout/stderr to files in the worker's folder,
which the runtime follows line by line while it runs (as the local runtime:
`runyard.deployer.outputs`, seq numbers, saved offsets), and runs the launch
command through the local runtime's wrapper, which writes the command's exit
status and time to `exit_status`. A worker's exit status is that file, never
Slurm's step state: Slurm knows the step, not the command.

- stop: `scancel --signal=TERM` (the steps: each launch command gets SIGTERM,
  its wrapper writes 143), after the grace period `scancel --signal=KILL
  --full` and `scancel`; returns once Slurm says the job is over (no
  process of it is left: a job stays COMPLETING until its processes are gone);
- capture_stacks: `py-spy dump` of every Python process under each worker's
  wrapper, run on the worker's node by `srun --jobid=<job> --overlap -w <node>`;
- recovery: `state.json` in the deployment's folder records the Slurm job id
  (written as soon as sbatch answers) and the phase; `allocate` of a
  deployment whose job still runs takes that job (by the saved id, else by
  its name `runyard-<task>-r<run>-a<attempt>`) instead of submitting a second
  one, and `recover`/`adopt` follow the workers of a job whose gate is open;
- env check (R-30): the check program runs in every worker as a step of its
  own (`srun --jobid=<job> --overlap`), through the same wrapper and
  variables, before the gate opens.

The deployment's folder (`<scratch_root>/<task>/run<r>-a<a>/`) and the volume
root must be the same path on the deployer's host and on every node (a
shared file system; on one host, trivially). Client commands find the
cluster through `slurm_conf` (SLURM_CONF) when it is set, and get no other
variable of the deployer (so neither do the workers). With `worker_namespaces`
(a deployer and slurmd running as root, util-linux and setpriv on the nodes),
each worker sees only its own processes, its volumes at their mount paths and,
of the control plane's folders, only its own scratch (the local sandbox's view:
`LocalRuntime._mount_script`), the device nodes of only the GPUs Slurm gave
its step, a /dev/shm of its own (`worker_shm_bytes`), and its launch command
runs as `worker_user` with no capabilities, `no_new_privs` and no kernel
keyring; the wrapper stays root to write the exit status. Its home, tmp and
working folder lie on a system disk of its own (`worker_disk_bytes`), made on
its node in its namespace (`_node_lines`).
Without them, workers run as the user the deployer submits as.
With them, the workers of a deployment placed on one node, or on nodes that are one
host, share a network and an IPC namespace of their own, as local workers do (a
loopback, nothing else; held by a process the batch script starts, `_network_holder`):
what listens on the host, the control plane where it runs there, is out of their
reach. Workers on several hosts, and any without worker namespaces, share the node's
network namespace (NCCL and gloo between hosts need it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runyard.contracts.stacks import ProcessStacks, WorkerStacks
from runyard.contracts.task_events import WorkerPlacement
from runyard.deployer.runtime import (
    _WORKER_FILTER,
    GPU_DEVICES,
    UNKNOWN_EXIT_CODE,
    WORKER_DISK_BYTES,
    WORKER_SHM_BYTES,
    Deployment,
    DeploymentKey,
    LocalRuntime,
    LocalRuntimeConfig,
    OnExit,
    OnOutput,
    StageFailed,
    _bytes_or_none,
    _disks_unavailable,
    _gpu_pattern,
    _image_dir,
    _load_offsets,
    _Local,
    _read_status,
    _Tools,
    _Worker,
    _worker_user,
    loopback_up,
    output_limits,
    worker_nice,
)
from runyard.deployer.stacks import parse_dump, py_spy_binary
from runyard.deployer.turns import FairTurns

log = logging.getLogger("runyard.deployer.slurm")

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Job states after which Slurm holds nothing of the job any more.
_OVER = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
#: Exit codes of a launch command ended by SIGTERM or SIGKILL (128 + the signal).
_SIGNALLED = {128 + signal.SIGTERM, 128 + signal.SIGKILL}
#: The name of the env check's steps (`end_env_check` cancels them by it).
_CHECK_STEP = "runyard-env-check"
#: What a deployment's batch script reports in its folder (`_batch_script`).
_REPORTS = ("started", "image")
#: The line of a batch script that reports (`_batch_script`); an older deployer's has none.
_REPORTS_MARK = "report started"
#: What each step of a deployment with a network of its own runs before the rest (its
#: arguments: the holder's pid file, the worker's status file, then the rest): it waits
#: for the batch script's holder (10 s at most: the env check's step may start as it
#: does), enters its network and IPC namespaces and runs the rest; without one, the
#: worker's status is 112, the reason on its stderr. Builtins but for `nsenter` (and a
#: sleep's pipe when the holder is not there yet).
_JOIN_NETWORK = r"""netns=$1 status=$2 holder= nap=; shift 2
for _ in {1..500}; do
  [ -s "$netns" ] && read -r holder < "$netns" && [ -n "$holder" ] && break
  [ -n "$nap" ] || exec {nap}<> <(:)
  read -t 0.02 -u "$nap" || :
done
[ -z "$nap" ] || exec {nap}<&-
if [ -z "$holder" ] || [ ! -e "/proc/$holder/ns/net" ]; then
  echo "runyard: the deployment's network namespace is missing on $SLURMD_NODENAME" \
    "(its batch script could not make it)" >&2
  printf '%s %s\n' 112 "$EPOCHREALTIME" > "$status.tmp" && MV -f "$status.tmp" "$status"
  exit 112
fi
exec NSENTER --net="/proc/$holder/ns/net" --ipc="/proc/$holder/ns/ipc" -- "$@"
"""
#: The first line of a batch script's holder of the workers' own network
#: (`_network_holder`): a deployer that finds the job after a restart reads it there.
_HOLDER_MARK = "rm -f netns"
#: How long a job Slurm says is RUNNING may take to start its batch script.
_SCRIPT_WITHIN_S = 60.0
#: How long the nodes' addresses Slurm gave are used before it is asked again.
_ADDRESSES_FOR_S = 60.0


class SlurmError(Exception):
    """A Slurm client command failed; `message` is what it said."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(f"{command}: {message}")
        self.command = command
        self.message = message


@dataclass(frozen=True, slots=True)
class SlurmRuntimeConfig(LocalRuntimeConfig):
    """The local runtime's settings (scratch, volumes, images, grace) plus the cluster's."""

    #: The partition every job of the pool goes to (None: the cluster's default).
    partition: str | None = None
    #: The cluster's slurm.conf (SLURM_CONF of every client command; None: Slurm's default).
    slurm_conf: Path | None = None
    #: Seconds a job may stay PENDING before `resource_allocation` fails (None: no limit).
    allocate_timeout_s: float | None = 600.0
    #: A mount and PID namespace per worker step (volumes bound at their mount paths;
    #: every process of the worker ends with it); needs root and util-linux on the
    #: nodes. None: when the deployer runs as root with util-linux.
    worker_namespaces: bool | None = None

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], *, data_dir: Path, base_dir: Path
    ) -> SlurmRuntimeConfig:
        """Build from a `runtime.yaml` `slurm:` section; see infra/config/runtime.yaml."""
        images = {
            str(name): _image_dir(str(where), base_dir)
            for name, where in (raw.get("images") or {}).items()
        }
        conf = raw.get("slurm_conf")
        timeout = raw.get("allocate_timeout_s", 600.0)
        lines_per_s, backlog = output_limits(raw)
        return cls(
            scratch_root=Path(raw.get("scratch_root") or data_dir / "slurm-scratch").absolute(),
            volumes_root=Path(raw.get("volumes_root") or data_dir / "volumes").absolute(),
            images=images,
            grace_s=float(raw.get("grace_s", 10.0)),
            output_buffer=int(raw.get("output_buffer", 10_000)),
            output_lines_per_s=lines_per_s,
            output_backlog_bytes=backlog,
            namespaces=False,
            poll_s=float(raw.get("poll_s", 0.2)),
            partition=raw.get("partition"),
            slurm_conf=Path(str(conf)) if conf else None,
            allocate_timeout_s=float(timeout) if timeout is not None else None,
            worker_namespaces=raw.get("worker_namespaces"),
            worker_user=str(raw.get("worker_user") or "runyard-worker"),
            hidden=(data_dir.absolute(), *(Path(str(p)) for p in raw.get("hide") or ())),
            worker_disk_bytes=_bytes_or_none(raw, "worker_disk_bytes", WORKER_DISK_BYTES),
            worker_shm_bytes=_bytes_or_none(raw, "worker_shm_bytes", WORKER_SHM_BYTES),
            worker_nice=worker_nice(raw),
            gpu_devices=_gpu_pattern(str(raw.get("gpu_devices") or GPU_DEVICES)),
        )


class SlurmRuntime(LocalRuntime):
    """Workers as steps of one Slurm job per deployment; see the module docstring.

    It keeps the local runtime's folder layout, environment, volume links and
    output following (they are the same on a node that shares the file system),
    and replaces everything that starts, watches or ends a process.
    """

    config: SlurmRuntimeConfig

    def __init__(self, config: SlurmRuntimeConfig) -> None:
        # Not LocalRuntime.__init__: no sandbox here (Slurm's nodes are the workers' hosts).
        self.config = config
        self._deps: dict[DeploymentKey, _Local] = {}
        self._kept = None
        self.dropped_lines = 0
        self.tools = _Tools.find()
        self.namespaces = False
        self.worker_ids = None
        self.pids_base = None  # the nodes' pids are Slurm's (its cgroup plugin)
        self.limit_bases, self.memory_base = (), None  # so are memory and CPUs (sbatch)
        self._jobs: dict[DeploymentKey, str] = {}
        self._killed: set[DeploymentKey] = set()
        self._states: dict[str, tuple[float, tuple[str, str] | None]] = {}
        #: Each node's (when asked, NodeAddr, NodeHostName), from `scontrol show node`.
        self._addresses: dict[str, tuple[float, str, str]] = {}
        #: Whether each deployment's workers have a network of their own (`_own_network`).
        self._own_networks: dict[DeploymentKey, bool] = {}
        self._asking = asyncio.Lock()
        self._state_error: tuple[float, SlurmError] | None = None
        #: Slurm client commands run, by program (scontrol: with what it shows); what a
        #: deployment costs the cluster.
        self.slurm_calls: Counter[str] = Counter()
        self.bin = {name: _program(name) for name in ("sbatch", "srun", "scancel", "scontrol")}
        tools = self.tools.unshare and self.tools.mount and self.tools.mkdir and self.tools.setpriv
        possible = os.geteuid() == 0 and bool(tools)
        if config.worker_namespaces and not possible:
            raise RuntimeError(
                "worker_namespaces is true but this deployer cannot make namespaces: run it "
                "as root with util-linux installed, or remove the setting"
            )
        #: A mount and PID namespace per worker step (root, nodes with util-linux): volumes
        #: bound at their mount paths, and no process of a worker outlives it. Otherwise
        #: only the links of the local fallback, and Slurm's process tracking.
        wanted = config.worker_namespaces
        self.worker_namespaces = possible if wanted is None else wanted
        #: With worker namespaces, the unprivileged user the launch command runs as
        #: (`worker_user`, by uid and gid on the nodes: no capabilities, no_new_privs),
        #: seeing only its own scratch of the control plane's folders.
        self.worker_ids = (
            _worker_user(config.worker_user, self.tools) if self.worker_namespaces else None
        )
        if self.worker_ids is None:
            log.warning(
                "Slurm workers are NOT sandboxed (worker_namespaces is off: it needs a root"
                " deployer and slurmd with util-linux): they run as the user the deployer"
                " submits as, share its kernel keyring, see every folder it may, open every"
                " GPU's device node of their node and share its /dev/shm"
            )
        elif config.worker_disk_bytes is not None:
            why_no_disk = _disks_unavailable(self.tools)
            if why_no_disk is None:
                #: Each worker's system disk (R-13), made on its node (`_node_lines`).
                self.disk_bytes = config.worker_disk_bytes
            else:
                log.warning(
                    "Slurm workers' system disks are NOT limited (%s): a worker that writes"
                    " without end fills the file system of its scratch",
                    why_no_disk,
                )

    # -- Slurm client commands -------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {"PATH": _SYSTEM_PATH, "LANG": "C.UTF-8"}
        if self.config.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.config.slurm_conf)
        return env

    async def _slurm(self, *args: str, timeout_s: float = 60.0) -> str:
        """Run a Slurm client command; its stdout, or SlurmError with its stderr."""
        name = Path(args[0]).name
        self.slurm_calls[" ".join([name, *args[1:3]]) if name == "scontrol" else name] += 1
        proc = await asyncio.create_subprocess_exec(
            *args,
            env=self._env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(timeout_s):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(Path(args[0]).name, f"no answer within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
            raise SlurmError(Path(args[0]).name, text or f"exit {proc.returncode}")
        return out.decode(errors="replace")

    async def job_state(self, job_id: str) -> tuple[str, str] | None:
        """(state, reason) of a job as Slurm says it; None once Slurm forgot the job."""
        try:
            out = await self._slurm(self.bin["scontrol"], "show", "job", "-o", job_id)
        except SlurmError as exc:
            if "Invalid job id" in exc.message:
                return None
            raise
        fields = _fields(out)
        return fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None")

    async def _cached_state(self, job_id: str, max_age_s: float = 1.0) -> tuple[str, str] | None:
        """(state, reason) of a job, None once Slurm forgot it; Slurm is asked at most
        once per `max_age_s` for all the jobs held here together (one `squeue` however
        many workers' watchers ask), and a failed answer stands as long."""
        async with self._asking:
            now = time.monotonic()
            seen = self._states.get(job_id)
            if seen is not None and now - seen[0] < max_age_s:
                return seen[1]
            if self._state_error is not None and now - self._state_error[0] < max_age_s:
                raise self._state_error[1]
            jobs = sorted({job_id, *self._jobs.values()})
            try:
                out = await self._slurm(
                    _program("squeue"), "-h", "-t", "all", "-j", ",".join(jobs), "-o", "%i %T %r"
                )
            except SlurmError as exc:
                if "Invalid job id" not in exc.message:
                    self._state_error = (time.monotonic(), exc)
                    raise
                out = ""  # none of them is known any more
            self._state_error = None
            found: dict[str, tuple[str, str]] = {}
            for line in out.splitlines():
                job, _, rest = line.strip().partition(" ")
                state, _, reason = rest.partition(" ")
                found[job] = (state, reason or "None")
            now = time.monotonic()
            for job in jobs:
                self._states[job] = (now, found.get(job))
            return self._states[job_id][1]

    async def _job_over(self, job_id: str) -> bool:
        """Whether Slurm is done with the job; False while Slurm does not answer (a
        slurmctld restart must not count as the end of every worker)."""
        try:
            state = await self._cached_state(job_id)
        except SlurmError as exc:
            log.warning("cannot learn the state of Slurm job %s: %s", job_id, exc)
            return False
        return state is None or state[0] in _OVER

    async def _state_or_wait(self, job_id: str, within_s: float = 120.0) -> tuple[str, str] | None:
        """`job_state`, asked again (every 2 s) while Slurm does not answer, for up to
        `within_s` seconds (then the last SlurmError)."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                return await self.job_state(job_id)
            except SlurmError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("cannot learn the state of Slurm job %s: %s", job_id, exc)
                await asyncio.sleep(2.0)

    def job_id(self, key: DeploymentKey) -> str | None:
        """The Slurm job of a deployment held here."""
        return self._jobs.get(key)

    # -- stages ------------------------------------------------------------------------

    def stage_slots(self, deployment: Deployment) -> FairTurns | None:
        """None: a Slurm job waits in the cluster's queue during `allocate`, and must
        not hold back the pools whose stages are this machine's work."""
        return None

    async def allocate(self, deployment: Deployment) -> None:
        key = deployment.key
        if key in self._deps:
            return
        await super().allocate(deployment)
        local = self._deps[key]
        job = await self._job_of_earlier(local)
        if job is not None and _REPORTS_MARK not in _read(local.root / "job.sh"):
            # Submitted by an older deployer, whose batch script reports nothing: its
            # workers never started (this is allocate), so a new job replaces it.
            log.info("Slurm job %s of %s reports nothing: submitted again", job, key)
            await self._cancel(job, local.deployment.key)
            job = None
        if job is None:
            for name in ("go", *_REPORTS):  # an earlier job's, which is over
                (local.root / name).unlink(missing_ok=True)
            try:
                self._own_networks[key] = await self._may_share_a_network(local)
            except SlurmError as exc:
                raise StageFailed(
                    f"Slurm does not say which hosts the nodes are on: {exc.message}"
                ) from exc
            script = local.root / "job.sh"
            script.write_text(self._batch_script(local))
            try:
                out = await self._slurm(self.bin["sbatch"], *self._sbatch_args(local), str(script))
            except SlurmError as exc:
                # An error is not always a refusal: slurmctld may have taken the job and
                # its answer got lost (`Socket timed out`, our own timeout).
                await self._cancel_unanswered(local)
                reason = f"Slurm refused the job: {exc.message}"
                raise StageFailed(reason + await self._unknown_nodes(local)) from exc
            job = out.strip().split(";")[0]
        self._jobs[key] = job
        await self._write_state(local, "allocated")
        await self._until_running(local, job)

    async def _unknown_nodes(self, local: _Local) -> str:
        """What to add to a refusal when placed nodes are not Slurm's (`sinfo -N`): which
        ones, and how to fix it; empty when Slurm knows them all (or does not answer).

        sbatch says only "Invalid node name specified" for a node the pool names but
        slurm.conf lacks."""
        placed = list(dict.fromkeys(w.node for w in local.deployment.workers))
        try:
            out = await self._slurm(_program("sinfo"), "-h", "-N", "-o", "%N")
        except SlurmError as exc:
            log.warning("cannot learn which nodes Slurm knows: %s", exc)
            return ""
        known = set(out.split())
        unknown = [node for node in placed if node not in known]
        if not unknown:
            return ""
        names = ", ".join(unknown)
        conf = f" ({self.config.slurm_conf})" if self.config.slurm_conf is not None else ""
        pool = local.deployment.spec.pool
        return (
            f"; node {names} of pool {pool} is not a node of this Slurm cluster (its"
            f" slurm.conf{conf} has no NodeName={unknown[0]}): add the node to slurm.conf and"
            " restart slurmctld, or take it out of the pool's nodes"
            " in pools.yaml"
        )

    async def _cancel_unanswered(self, local: _Local) -> None:
        """Cancel the job of a deployment that sbatch answered with an error, when Slurm
        holds one by the deployment's job name all the same. Were Slurm to take it only
        later, its batch script ends by itself once the deployment's folder is gone."""
        try:
            out = await self._slurm(
                _program("squeue"), "-h", f"--name={_job_name(local)}", "-o", "%i"
            )
        except SlurmError as exc:
            log.warning("cannot learn whether sbatch submitted %s: %s", _job_name(local), exc)
            return
        for job in out.split():
            log.warning(
                "sbatch failed, yet Slurm holds job %s of %s: cancelling it",
                job,
                local.deployment.key,
            )
            await self._cancel(job, local.deployment.key)

    async def _job_of_earlier(self, local: _Local) -> str | None:
        """The job an earlier deployer submitted for this deployment, if it still runs:
        by the id it saved, else by the job's name (it died before saving the id). No
        batch script written (`job.sh`): nothing was submitted, and Slurm is not asked."""
        try:
            raw = json.loads((local.root / "state.json.slurm").read_text())
            job = str(raw["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            if not (local.root / "job.sh").exists():
                return None
            try:
                out = await self._slurm(
                    _program("squeue"), "-h", f"--name={_job_name(local)}", "-o", "%i"
                )
            except SlurmError as exc:
                raise StageFailed(f"Slurm does not answer: {exc}") from exc
            found = out.split()
            return found[0] if found else None
        try:
            state = await self._state_or_wait(job)
        except SlurmError as exc:
            raise StageFailed(f"Slurm does not answer about job {job}: {exc}") from exc
        return job if state is not None and state[0] not in _OVER else None

    def _sbatch_args(self, local: _Local) -> list[str]:
        d = local.deployment
        nodes = list(dict.fromkeys(w.node for w in d.workers))
        gpus: Counter[str] = Counter()
        cpus: Counter[str] = Counter()
        memory: Counter[str] = Counter()
        for w in d.workers:
            gpus[w.node] += len(w.gpus)
            cpus[w.node] += w.cpus or 0
            memory[w.node] += w.memory_gib or 0
        args = [
            "--parsable",
            f"--job-name={_job_name(local)}",
            f"--nodes={len(nodes)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}",
            f"--gres=gpu:{max(gpus.values())}",
        ]
        # The CPUs and memory of the workers' specs (a placement recorded before they
        # were in it: Slurm's defaults), per node as the GPUs: what its workers add up to.
        if all(w.cpus for w in d.workers):
            args.append(f"--cpus-per-task={max(cpus.values())}")
        if all(w.memory_gib for w in d.workers):
            args.append(f"--mem={max(memory.values())}G")
        args += [
            f"--output={local.root / 'job.log'}",
            f"--chdir={local.root}",
            "--export=ALL",
            "--no-requeue",
        ]
        if self.config.partition:
            args.append(f"--partition={self.config.partition}")
        return args

    def _batch_script(self, local: _Local) -> str:
        """Report that the job runs (`started`) and whether the image is on every node
        (`image`), wait for the gate, then one step per worker on its node; wait for them.

        Each report is one line, `<job id> <what>`, written whole (a rename), so the
        deployer reads it instead of asking Slurm, and tells it from an earlier job's."""
        q = shlex.quote
        root = local.root
        lines = [
            "#!/bin/bash",
            f"# Runyard deployment {local.deployment.key}: the workers start when 'go' exists.",
            f"cd {q(str(root))} || exit 1",
            'report() { printf "%s %s\\n" "$SLURM_JOB_ID" "$2" > "$1.tmp" && '
            'mv -f "$1.tmp" "$1"; }',
            *self._network_holder(local),
            f'{_REPORTS_MARK} "$SLURM_JOB_NODELIST"',
            *self._image_check(local),
            # A sleep of bash's own (no process per look at the gate).
            "exec {nap}<> <(:)",
            # A folder gone (the deployment cleaned up without this job): nothing to wait for.
            'while [ ! -e go ]; do [ -e job.sh ] || exit 0; read -t 0.02 -u "$nap" || :; done',
            "exec {nap}<&-",
            "steps=()",
        ]
        for worker in local.workers.values():
            step = [
                self.bin["srun"],
                "--overlap",
                "-N1",
                "-n1",
                f"-w{worker.placement.node}",
                f"--job-name=runyard-w{worker.index}",
                "--input=none",
                *_step_resources(worker.placement),
                self.tools.bash,
                str(worker.scratch / "run.sh"),
            ]
            lines.append(shlex.join(step) + " & steps+=($!)")
        lines.append('wait "${steps[@]}"')
        return "\n".join(lines) + "\n"

    def _own_network(self, local: _Local) -> bool:
        """Whether the deployment's workers get a network and an IPC namespace of their
        own, as local workers do (a loopback shared by them, nothing else: not the
        node's, where the control plane may listen), as decided when its batch script
        was written (`_may_share_a_network`); a job an earlier deployer submitted says
        it by its script."""
        known = self._own_networks.get(local.deployment.key)
        if known is None:
            known = _HOLDER_MARK in _read(local.root / "job.sh").splitlines()
            self._own_networks[local.deployment.key] = known
        return known

    async def _may_share_a_network(self, local: _Local) -> bool:
        """Whether sandboxed workers can have one network of their own: all on one node,
        or on nodes that are one host (Slurm's NodeHostName and NodeAddr the same for
        each, as in a cluster of several slurmd on one machine), where every step can
        enter the namespaces the batch script's holder keeps. Workers on several hosts
        stay in the nodes' network: NCCL and gloo between hosts need it."""
        if self.worker_ids is None:
            return False
        nodes = list(dict.fromkeys(w.node for w in local.deployment.workers))
        if len(nodes) == 1:
            return True
        hosts = {await self._node_host(node) for node in nodes}
        return len(hosts) == 1

    def _join_network(self, local: _Local, status_file: Path) -> list[str]:
        """What a step of a deployment with a network of its own (`_own_network`) runs
        first: `_JOIN_NETWORK`, which enters the holder's namespaces (none: nothing)."""
        if not self._own_network(local):
            return []
        script = _JOIN_NETWORK.replace("NSENTER", shlex.quote(self.tools.nsenter))
        script = script.replace("MV", shlex.quote(self.tools.mv or "mv"))
        netns = str(local.root / "netns")
        return [self.tools.bash, "-c", script, "runyard-join", netns, str(status_file)]

    def _network_holder(self, local: _Local) -> list[str]:
        """The batch script's lines that start the process holding the deployment's
        network and IPC namespaces (`_own_network`), its `lo` up; it writes its pid to
        `netns` and waits until the script ends it as it exits."""
        if not self._own_network(local):
            return []
        q = shlex.quote
        t = self.tools
        inside = (
            f"{shlex.join(loopback_up(t))} || exit 1; "
            f"echo $$ > netns.tmp && {q(t.mv or 'mv')} -f netns.tmp netns || exit 1; "
            'exec {nap}<> <(:); read -u "$nap"'
        )
        return [
            _HOLDER_MARK,
            f"{q(t.unshare)} --net --ipc -- {q(t.bash)} -c {q(inside)} &",
            "holder=$!",
            # However the script ends (a folder gone, a TERM): the holder with it; once
            # the script is gone Slurm's process tracking may not find it.
            """trap 'kill "$holder" 2>/dev/null' EXIT""",
            "trap 'exit 143' TERM",
        ]

    def _image_check(self, local: _Local) -> list[str]:
        """The batch script's lines that report `image`: `ok`, `missing <nodes>` (no
        bin/ there) or `failed <why>`. On one node, the test runs in the batch script
        itself; on several, in one step with a task per node."""
        where = self.config.images.get(local.deployment.spec.image)
        if where is None:
            return []  # not in the catalogue: image_pull fails without asking the nodes
        q = shlex.quote
        nodes = list(dict.fromkeys(w.node for w in local.deployment.workers))
        probe = f'test -d {q(str(where / "bin"))} || echo "$SLURMD_NODENAME"'
        if len(nodes) == 1:  # bash's own test: no process
            found = f'missing=; [ -d {q(str(where / "bin"))} ] || missing="$SLURMD_NODENAME"'
        else:
            n = str(len(nodes))
            step = [self.bin["srun"], "--overlap", f"-N{n}", f"-n{n}", f"-w{','.join(nodes)}"]
            step += ["--quiet", "--input=none", "--job-name=runyard-image"]
            step += [self.tools.bash, "-c", probe]
            found = f"missing=$({shlex.join(step)}) || {{ report image 'failed srun exit '$?; }}"
        return [
            found,
            '[ -e image ] || if [ -z "$missing" ]; then report image ok; '
            'else report image "missing $(echo $missing)"; fi',
        ]

    def _report(self, local: _Local, name: str, job: str) -> str | None:
        """What the batch script of `job` reported in the file `name`, or None."""
        try:
            text = (local.root / name).read_text()
        except OSError:
            return None
        found, _, what = text.strip().partition(" ")
        return what if found == job else None

    async def _until_running(self, local: _Local, job: str) -> None:
        """Wait until the job's batch script runs (its `started` report); StageFailed when
        the job ends first or stays PENDING too long. Slurm is asked only while the report
        is not there (after 2 s, then every 2 s): its reason while PENDING, and whether
        the job ended."""
        timeout = self.config.allocate_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        running_since: float | None = None
        said = ""
        pace = _Pace(ask_after_s=2.0, ask_every_s=2.0)
        while self._report(local, "started", job) is None:
            if local.stopping:  # stopped meanwhile: the job goes, and Slurm says how
                await self._cancel(job, local.deployment.key)
            elif not pace.may_ask():
                await pace.nap()
                continue
            try:
                state = await self._state_or_wait(job)
            except SlurmError as exc:
                raise StageFailed(f"Slurm does not answer about job {job}: {exc}") from exc
            if state is None or state[0] in _OVER:
                if self._report(local, "started", job) is not None:
                    return  # it ran (and ended at once): the next stages say what is missing
                what = "was forgotten by Slurm" if state is None else f"ended {state[0]}"
                why = "" if state is None or state[1] == "None" else f" ({state[1]})"
                raise StageFailed(f"Slurm job {job} {what} before it ran{why}")
            if state[0] == "RUNNING":
                # Allocated; the batch script reports as soon as slurmd starts it.
                running_since = running_since or time.monotonic()
                if time.monotonic() - running_since > _SCRIPT_WITHIN_S:
                    raise StageFailed(
                        f"Slurm job {job} runs, but its batch script did not start within "
                        f"{_SCRIPT_WITHIN_S:.0f} s; see {local.root / 'job.log'}"
                    )
            elif state[1] != said:
                said = state[1]
                log.info("Slurm job %s is %s: %s", job, state[0], said)
            if state[0] != "RUNNING" and deadline is not None and time.monotonic() > deadline:
                with contextlib.suppress(SlurmError):
                    await self._slurm(self.bin["scancel"], job)
                raise StageFailed(f"Slurm job {job} still {state[0]} after {timeout:.0f} s: {said}")
            await pace.nap()

    async def pull_image(self, deployment: Deployment) -> None:
        """The image of the catalogue is on every node: what the batch script found."""
        local = self._get(deployment.key)
        image = deployment.spec.image
        where = self.config.images.get(image)
        if where is None:
            known = ", ".join(sorted(self.config.images)) or "none"
            raise StageFailed(
                f"image {image!r} is not in the Slurm pool's image catalogue "
                f"(known images: {known})"
            )
        found = await self._until_report(local, "image", "checked the image")
        if found != "ok":
            what, _, rest = found.partition(" ")
            where_not = f"on node(s) {rest}" if what == "missing" else f"(the check: {found})"
            raise StageFailed(
                f"image {image!r} maps to {where}, which has no bin/ directory {where_not}"
            )
        local.image_bin = where / "bin"

    async def _until_report(
        self, local: _Local, name: str, what: str, timeout_s: float = 120.0
    ) -> str:
        """Wait for a report of the deployment's batch script; StageFailed when the job
        ends without it (Slurm is asked only while it is not there, as in `allocate`)."""
        job = self._jobs[local.deployment.key]
        deadline = time.monotonic() + timeout_s
        pace = _Pace()
        while (found := self._report(local, name, job)) is None:
            if pace.may_ask() and await self._job_over(job):
                if (found := self._report(local, name, job)) is not None:
                    return found
                raise StageFailed(
                    f"Slurm job {job} ended before its batch script {what}; "
                    f"see {local.root / 'job.log'}"
                )
            if time.monotonic() > deadline:
                raise StageFailed(
                    f"the batch script of Slurm job {job} has not {what} within "
                    f"{timeout_s:.0f} s; see {local.root / 'job.log'}"
                )
            await pace.nap()
        return found

    def _step(self, local: _Local, nodes: list[str], *extra: str) -> list[str]:
        """`srun` of one task per node in the deployment's job, beside its workers."""
        job = self._jobs[local.deployment.key]
        n = str(len(nodes))
        return [
            self.bin["srun"],
            f"--jobid={job}",
            "--overlap",
            f"-N{n}",
            f"-n{n}",
            f"-w{','.join(nodes)}",
            "--quiet",
            *extra,
        ]

    async def init_env(self, deployment: Deployment) -> None:
        await super().init_env(deployment)
        local = self._get(deployment.key)
        if deployment.spec.framework == "pytorch_ddp" and not self._own_network(local):
            first = min(local.workers.values(), key=lambda w: w.index).placement.node
            address = await self.node_address(first)
            for worker in local.workers.values():
                worker.env["MASTER_ADDR"] = address
        for worker in local.workers.values():
            self._write_env(worker, worker.env, "env")
            (worker.scratch / "command").write_text(deployment.spec.command)
            (worker.scratch / "mounts.sh").write_text(self._mounts_script(local, worker))
            (worker.scratch / "run.sh").write_text(self._run_script(local, worker))

    async def node_address(self, node: str) -> str:
        """The address Slurm knows a node by (NodeAddr); every node's is asked at once
        and kept for `_ADDRESSES_FOR_S` (an unknown node asks again)."""
        return (await self._node_seen(node))[1]

    async def _node_host(self, node: str) -> tuple[str, str]:
        """The host a node runs on, as Slurm knows it: (NodeHostName, NodeAddr)."""
        _, address, host = await self._node_seen(node)
        return host, address

    async def _node_seen(self, node: str) -> tuple[float, str, str]:
        seen = self._addresses.get(node)
        if seen is not None and time.monotonic() - seen[0] < _ADDRESSES_FOR_S:
            return seen
        out = await self._slurm(self.bin["scontrol"], "show", "node", "-o")
        now = time.monotonic()
        for line in out.splitlines():
            fields = _fields(line)
            if "NodeName" in fields:
                name = fields["NodeName"]
                address = fields.get("NodeAddr") or name
                self._addresses[name] = (now, address, fields.get("NodeHostName") or name)
        return self._addresses.get(node, (now, node, node))

    def _run_script(self, local: _Local, worker: _Worker) -> str:
        """The worker's step: output to its files, its volumes bound (when it can), then
        the launch command in the wrapper."""
        q = shlex.quote
        w = worker.scratch
        status = worker.status_file
        entry = shlex.join(self._join_network(local, status) + self._entry(local, worker, status))
        return (
            "#!/bin/bash\n"
            f"exec </dev/null >>{q(str(w / 'stdout.log'))} 2>>{q(str(w / 'stderr.log'))}\n"
            # The GPUs Slurm gave the step (`given_gpus`), before the pid that says it runs.
            f'echo "${{SLURM_STEP_GPUS:-${{SLURM_JOB_GPUS:-}}}}" > {q(str(w / "gpus.tmp"))} && '
            f"mv -f {q(str(w / 'gpus.tmp'))} {q(str(w / 'gpus'))}\n"
            # The wrapper keeps this pid (exec): the stacks are those of its descendants.
            f"echo $$ > {q(str(w / 'pid.tmp'))} && mv -f {q(str(w / 'pid.tmp'))} "
            f"{q(str(w / 'pid'))}\n"
            f"exec {entry} {q(self.tools.bash)} -c {q(self._wrapper())} runyard-worker "
            f'"$(cat {q(str(w / "command"))})" {q(str(worker.status_file))} {q(str(w / "env"))}\n'
        )

    def _entry(self, local: _Local, worker: _Worker, status_file: Path) -> list[str]:
        """What runs before the wrapper: a mount and a PID namespace of the worker's own
        (`worker_namespaces`), its volumes bound at their mount paths (`mounts.sh`).

        The wrapper is the PID namespace's first process: when it ends, however it ends
        (even SIGKILL), the kernel ends every process of the worker, also those that left
        their parent (which Slurm's `proctrack/linuxproc` would lose); `--kill-child`
        does the same when `unshare` itself is killed."""
        if not self.worker_namespaces:
            return []
        t = self.tools
        mounts = worker.scratch / "mounts.sh"
        namespace = [t.unshare, "--mount", "--propagation", "private", "--pid", "--fork"]
        namespace += ["--mount-proc", "--kill-child", "--"]
        return [*namespace, t.bash, str(mounts), str(status_file)]

    def _mounts_script(self, local: _Local, worker: _Worker) -> str:
        """Run as root in the worker's mount namespace: every volume bound at its mount
        path (read-only ones remounted read-only), then `exec "$@"` (the wrapper). A
        failure writes 112 as the worker's status (the error is on its stderr).

        With a worker user, the local sandbox's view instead (`LocalRuntime._mount_script`):
        the volumes, the worker's `tmp/` over /tmp and /var/tmp, the deployment's `shm/`
        over /dev/shm, and an empty tmpfs over the scratch and volume roots and the data
        folder, with only this worker's scratch (and the image, Runyard and its
        interpreter, where they lie below those) bound back."""
        q = shlex.quote
        t = self.tools
        lines = [
            "#!/bin/bash",
            'status_file="$1"; shift',
            'fail() { printf "%s %s\\n" 112 "$EPOCHREALTIME" > "$status_file.tmp" && '
            f'{q(t.mv or "mv")} -f "$status_file.tmp" "$status_file"; exit 112; }}',
        ]
        if self.worker_ids is not None:
            lines.append("finish() { fail; }")
            lines += self._node_lines(local, worker)
            lines.append(self._mount_script(local, worker, "slurm").rstrip("\n"))
            lines.append('exec "$@"')
            return "\n".join(lines) + "\n"
        for mount_path, host, read_only in local.mounts:
            lines.append(f"{q(t.mkdir)} -p {q(mount_path)} || fail")
            lines.append(f"{q(t.mount)} --bind {q(str(host))} {q(mount_path)} || fail")
            if read_only:
                lines.append(f"{q(t.mount)} -o remount,bind,ro {q(mount_path)} || fail")
        lines.append('exec "$@"')
        return "\n".join(lines) + "\n"

    def _make_scratch(self, local: _Local, state: dict[str, Any]) -> None:
        """The local runtime's folders; with a system disk, its home, tmp and work made
        in `disk/` (linked at their usual places), from which the node makes the disk."""
        super()._make_scratch(local, state)
        if self.disk_bytes is None:
            return
        for worker in local.workers.values():
            for sub in ("home", "tmp", "work"):
                (worker.scratch / "disk" / sub).mkdir(exist_ok=True)
                self._give(worker.scratch / "disk" / sub)

    def _node_lines(self, local: _Local, worker: _Worker) -> list[str]:
        """What the local runtime makes on its host for a sandboxed worker, made on the
        worker's node, in its mount namespace, before its view (`_mount_script`) is set up.

        The device nodes of the node's GPUs (`gpu_devices`) that Slurm did not give the
        step (`SLURM_STEP_GPUS`, else `SLURM_JOB_GPUS`; the worker's placed GPUs where
        Slurm names none) are covered by the deployment's `nodev`, a file nobody may
        open. The deployment's `shm/` (bound over /dev/shm next) is a tmpfs of
        `worker_shm_bytes`, the worker's own: it goes with the namespace.

        The worker's system disk (`worker_disk_bytes`): an ext4 file system made from
        what its `disk/` holds (its home, tmp and work as the deployer left them: the
        volumes' links), in a sparse file of the deployment's folder named for this
        step, mounted over `disk/` and unlinked at once: what the worker writes there
        takes no more than the disk's size, and the disk goes when the namespace does
        (the loop device with it). The env check's step gets a disk of its own; what the
        host writes in those folders afterwards, the worker does not see."""
        q = shlex.quote
        t = self.tools
        lines = []
        if self.config.gpu_devices:
            prefix, _, suffix = self.config.gpu_devices.partition("{gpu}")
            placed = ",".join(str(g) for g in worker.placement.gpus)
            cover = q(str(local.root / "nodev"))
            lines += [
                f'mine=",${{SLURM_STEP_GPUS:-${{SLURM_JOB_GPUS:-{placed}}}}},"',
                f"for node in {q(prefix)}*{q(suffix)}; do",
                f"  n=${{node#{q(prefix)}}}; n=${{n%{q(suffix)}}}",
                # Character devices only (not a link: a mount follows it), by GPU index.
                '  [[ $n =~ ^[0-9]+$ && -c $node && ! -L $node && $mine != *",$n,"* ]] || continue',
                f'  {q(t.mount)} --bind {cover} "$node" || fail',
                "done",
            ]
        if self.config.worker_shm_bytes is not None:
            uid, gid, _ = self.worker_ids or (0, 0, "")
            size = self.config.worker_shm_bytes
            options = f"size={size},mode=0700,uid={uid},gid={gid},nosuid,nodev"
            shm = q(str(local.root / "shm"))
            lines.append(f"{q(t.mount)} -t tmpfs -o {options} runyard-shm {shm} || fail")
        if self.disk_bytes is not None:
            disk = q(str(worker.scratch / "disk"))
            image = q(str(local.root / f"{worker.scratch.name}.disk")) + '".$$"'
            features = "lazy_itable_init=1,nodiscard,root_owner=0:0"
            mkfs = (
                f"{q(t.mkfs)} -q -F -m 0 -O ^has_journal -E {features} -d {disk}"
                f" {image} {self.disk_bytes // 1024}k"
            )
            options = "loop,nosuid,nodev,noinit_itable,discard"
            lines += [
                f"made=$({mkfs} 2>&1) || {{ printf 'runyard: the system disk could not be"
                ' made: %s\\n\' "$made" >&2; fail; }',
                f"{q(t.mount)} -t ext4 -o {options} {image} {disk} || {{ {q(t.rm)} -f {image};"
                " fail; }",
                f"{q(t.rm)} -f {image}",
            ]
        return lines

    def _wrapper(self) -> str:
        """The local runtime's wrapper: the status file, then the exit. With a worker user,
        the launch command's shell runs as that user with no capabilities and
        `no_new_privs` (setpriv), as in the local sandbox; the wrapper stays root to
        write the status."""
        q = shlex.quote
        t = self.tools
        # Slurm, not the placement, picks which GPUs of a node the job gets: the step's
        # CUDA_VISIBLE_DEVICES (Slurm's, set before the env file is read) wins over the
        # placement's in the env file (the device nodes a worker may open are Slurm's).
        keep_gpus = 'runyard_slurm_gpus="${CUDA_VISIBLE_DEVICES-}"; '
        use_gpus = (
            '{ [ -z "$runyard_slurm_gpus" ] || export CUDA_VISIBLE_DEVICES="$runyard_slurm_gpus"; }'
        )
        user_shell = (
            f'{q(t.bash)} -c \'{keep_gpus}. "$0" && {use_gpus} && '
            f'exec {q(t.bash)} --login -c "$1"\' "$3" "$1"'
        )
        keyless = ""
        if self.worker_ids is not None:
            uid, gid, _ = self.worker_ids
            # No kernel keyring (every task's workers share the worker user, so its user
            # keyring too), no user namespace, no io_uring, at `worker_nice`: the local
            # sandbox's seccomp filter (`_WORKER_FILTER`). It runs on Runyard's
            # interpreter; a node without it at that path runs workers unfiltered.
            keyless = '"${keyless[@]}" '
            user_shell = (
                f"{q(t.setpriv)} --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all "
                f"--bounding-set=-all --no-new-privs -- {keyless}{user_shell}"
            )
            python = q(sys.executable)
            nice = self.config.worker_nice
            keyless = (
                f"keyless=(); [ -x {python} ] && "
                f"keyless=({python} -I -S -c {q(_WORKER_FILTER)} {nice})\n"
            )
        return (
            f"{keyless}"
            'status_file="$2"\n'
            # The stop signals are ignored while the status is written, by `mv` too, as
            # in the local wrapper: a TERM sent again must not leave no status to read.
            "finish() { trap '' TERM INT HUP; "
            'printf "%s %s\\n" "$1" "$EPOCHREALTIME" > "$status_file.tmp" && '
            f'{q(t.mv or "mv")} -f "$status_file.tmp" "$status_file"; exit "$1"; }}\n'
            "trap : TERM INT HUP\n"
            'cd "$(dirname "$2")/work" || finish 111\n'
            "exec 3>&2 2>/dev/null\n"
            f"{user_shell} 2>&3 3>&-\n"
            "finish $?\n"
        )

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
        """A step on the worker's node running `command` in the wrapper (the env check);
        on the node its own interpreter sets the workers' filter (`filtered` is the local
        runtime's)."""
        status = status_file or worker.status_file
        step = self._step(local, [worker.placement.node], f"--job-name={_CHECK_STEP}")
        step += ["--input=none", *self._join_network(local, status)]
        step += self._entry(local, worker, status)
        step += [self.tools.bash, "-c", self._wrapper(), "runyard-worker"]
        step += [command or local.deployment.spec.command]
        step += [str(status), str(env_file)]
        env = [f"{k}={v}" for k, v in self._env().items()]
        return [shutil.which("env") or "/usr/bin/env", *env, *step]

    async def end_env_check(self, key: DeploymentKey) -> None:
        """End the env check's steps (their srun processes here, then the steps in Slurm)."""
        job = self._jobs.get(key)
        local = self._deps.get(key)
        if job is None or local is None or not local.checks:
            return
        out = ""
        with contextlib.suppress(SlurmError):
            out = await self._slurm(_program("squeue"), "-h", "-s", "-j", job, "-o", "%i %j")
        steps = [
            s for s, _, name in (x.partition(" ") for x in out.splitlines()) if name == _CHECK_STEP
        ]
        if steps:
            with contextlib.suppress(SlurmError):
                await self._slurm(self.bin["scancel"], "--signal=KILL", *steps)
        await super().end_env_check(key)

    # -- workers -----------------------------------------------------------------------

    async def start_workers(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        """Open the gate; wait until every worker's wrapper runs; their pids on the node."""
        local = self._get(deployment.key)
        job = self._jobs[deployment.key]
        if (local.root / "go").exists():
            raise RuntimeError(f"workers of {deployment.key} already started")
        for worker in local.workers.values():
            if not (worker.scratch / "run.sh").exists():
                raise RuntimeError(f"worker {worker.index} has no environment (env_init)")
        for worker in local.workers.values():
            # The output files run.sh appends to, made here: with a worker user they are
            # its own, so `echo x > /dev/stderr` works (`LocalRuntime._launch_files`).
            for file in self._launch_files(worker)[1]:
                file.close()
        await self._write_state(local, "starting")
        (local.root / "go").touch()
        now = time.time()
        for worker in local.workers.values():
            worker.started_at = now
        await self._write_state(local, "started")
        try:
            await self._until_spawned(local, job)
        except BaseException:
            await self._cancel(job, deployment.key)
            raise
        self._watch_all(local, on_output, on_exit)
        return self.pids(deployment.key)

    def given_gpus(self, key: DeploymentKey) -> dict[int, tuple[int, ...]]:
        """The GPU indexes Slurm gave each started worker's step on its node, by worker
        index (as its run.sh found them: `SLURM_STEP_GPUS`, else `SLURM_JOB_GPUS`); a
        worker whose step named none is left out."""
        local = self._deps.get(key)
        given: dict[int, tuple[int, ...]] = {}
        for index, worker in local.workers.items() if local else ():
            found = _read(worker.scratch / "gpus").strip()
            if found and all(part.isdigit() for part in found.split(",")):
                given[index] = tuple(int(part) for part in found.split(","))
        return given

    async def _until_spawned(self, local: _Local, job: str, timeout_s: float = 120.0) -> None:
        """Wait until each worker's wrapper has written its pid (or already exited)."""
        deadline = time.monotonic() + timeout_s
        pace = _Pace()
        for worker in local.workers.values():
            while True:
                pid = _read_pid(worker.scratch / "pid")
                if pid is not None or worker.status_file.exists():
                    worker.pid = pid
                    break
                # A job may end while Slurm is asked (a command like `true`): the files
                # are read again after its answer, so only a worker that never ran fails.
                if pace.may_ask() and await self._job_over(job) and not _ran(worker):
                    raise RuntimeError(
                        f"Slurm job {job} ended before worker {worker.index} started; "
                        f"see {local.root / 'job.log'}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"worker {worker.index} did not start within {timeout_s:.0f} s "
                        f"in Slurm job {job}"
                    )
                await pace.nap()

    async def _watch(self, local: _Local, worker: _Worker, on_exit: OnExit) -> None:
        """Follow one worker until its wrapper wrote its status (or the job is over)."""
        key = local.deployment.key
        readers = [
            asyncio.create_task(self._tail(local, worker, "stdout")),
            asyncio.create_task(self._tail(local, worker, "stderr")),
        ]
        local.readers.extend(readers)
        job = self._jobs[key]
        # Slurm is asked only once the worker has run a while (a file on another host:
        # no event to wait for; short looks first, for short commands).
        pace = _Pace(most_s=self.config.poll_s)
        while _read_status(worker.status_file) is None:
            if pace.may_ask() and await self._job_over(job):
                break
            await pace.nap()
        exited_at = datetime.now(UTC)
        status = _read_status(worker.status_file)
        if (status is None or status[0] in _SIGNALLED) and not (
            local.stopping or key in self._killed
        ):
            await self._say_why_slurm_ended(job, worker)
        worker.gone.set()
        await asyncio.gather(*readers, return_exceptions=True)
        status = _read_status(worker.status_file)
        if status is not None:
            code, exited_at = status[0], min(status[1], exited_at)
        else:  # killed with its wrapper: by our stop (SIGKILL), or unknown
            code = 128 + signal.SIGKILL if key in self._killed else UNKNOWN_EXIT_CODE
        worker.exit_code = code
        worker.exited_at = exited_at
        worker.done.set()
        try:
            await on_exit(key, worker.index, code, exited_at)
        except Exception:
            log.exception("exit handler failed for %s worker %s", key, worker.index)

    async def _say_why_slurm_ended(self, job: str, worker: _Worker, within_s: float = 10.0) -> None:
        """A worker signalled, or gone without a status, while the deployer stopped
        nothing: when Slurm ended the job (scancel from outside, a time limit, a node
        lost), one line on the worker's stderr says so, where its logs and its first
        error show it, instead of a bare exit code 143."""
        deadline = time.monotonic() + within_s
        state: tuple[str, str] | None = ("", "")
        while time.monotonic() < deadline:
            try:
                state = await self._cached_state(job, max_age_s=0.5)
            except SlurmError:
                state = ("", "")
            if state is None or state[0] in _OVER:
                break
            await asyncio.sleep(0.5)  # COMPLETING: Slurm is ending what is left
        if state is None or state[0] not in _OVER or state[0] == "COMPLETED":
            return
        why = "" if state[1] in ("", "None") else f" ({state[1]})"
        line = (
            f"error: Slurm ended job {job}: {state[0]}{why}; Runyard did not stop it (an "
            "scancel from outside, the partition's time limit or a node failure ends a job so)"
        )
        with contextlib.suppress(OSError), (worker.scratch / "stderr.log").open("a") as out:
            out.write(line + "\n")

    async def stop(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        """SIGTERM to every step, SIGKILL after the grace period; returns once the job is over."""
        local = self._deps.get(key)
        if local is None:
            return
        local.stopping = True  # an `allocate` still waiting for its job cancels it
        job = self._jobs.get(key)
        if job is None:
            return  # sbatch has not answered: `allocate` cancels the job it gets
        await self.end_env_check(key)
        grace = self.config.grace_s if grace_s is None else grace_s
        live = [w for w in local.workers.values() if local.watchers and not w.done.is_set()]
        if live and not await self._job_over(job):
            with contextlib.suppress(SlurmError):
                await self._slurm(self.bin["scancel"], "--signal=TERM", job)
            deadline = time.monotonic() + grace
            for worker in live:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await worker.done.wait()
        await self._cancel(job, key)
        for worker in live:
            await worker.done.wait()

    async def _cancel(self, job: str, key: DeploymentKey, timeout_s: float = 120.0) -> None:
        """Cancel the job (SIGKILL to what is left) and wait until Slurm says it is over."""
        self._states.pop(job, None)
        try:
            state = await self._state_or_wait(job)
        except SlurmError as exc:
            log.error("Slurm job %s: its state is unknown, cancelling it anyway: %s", job, exc)
            state = ("UNKNOWN", "")
        if state is not None and state[0] not in _OVER:
            self._killed.add(key)
            with contextlib.suppress(SlurmError):
                await self._slurm(self.bin["scancel"], "--signal=KILL", "--full", job)
            with contextlib.suppress(SlurmError):
                await self._slurm(self.bin["scancel"], job)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                state = await self._state_or_wait(job, within_s=5.0)
            except SlurmError:
                state = ("UNKNOWN", "")
            if state is None or state[0] in _OVER:
                self._states[job] = (time.monotonic(), state)
                return
            if time.monotonic() > deadline:
                log.error("Slurm job %s is still %s after scancel", job, state[0])
                return
            await asyncio.sleep(0.2)

    async def cleanup(self, key: DeploymentKey) -> None:
        job = self._jobs.get(key)
        if job is not None and key in self._deps:
            local = self._deps[key]
            if not local.watchers:  # never started (a failed stage): the job goes now
                await self._cancel(job, key)
        await super().cleanup(key)
        self._jobs.pop(key, None)
        self._own_networks.pop(key, None)
        self._killed.discard(key)
        if job is not None:
            self._states.pop(job, None)

    # -- stacks ------------------------------------------------------------------------

    async def capture_stacks(
        self, key: DeploymentKey, *, native: bool = True
    ) -> tuple[WorkerStacks, ...]:
        """py-spy dumps of the Python processes under each worker's wrapper, on its node."""
        local = self._deps.get(key)
        if local is None or key not in self._jobs:
            return ()
        live = [w for w in local.workers.values() if w.pid is not None and not w.done.is_set()]
        dumps = await asyncio.gather(*(self._worker_stacks(local, w, native) for w in live))
        return tuple(
            WorkerStacks(worker=w.index, processes=tuple(d))
            for w, d in zip(live, dumps, strict=True)
        )

    async def _worker_stacks(
        self, local: _Local, worker: _Worker, native: bool
    ) -> list[ProcessStacks]:
        assert worker.pid is not None
        spy = py_spy_binary() or "py-spy"
        script = _STACKS_SCRIPT.replace("@NATIVE@", "--native" if native else "")
        step = self._step(local, [worker.placement.node])
        try:
            out = await self._slurm(
                *step, self.tools.bash, "-c", script, "_", str(worker.pid), spy, timeout_s=30.0
            )
        except SlurmError as exc:
            return [ProcessStacks(pid=worker.pid, error=f"srun: {exc.message}")]
        found = []
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) != 3 or not parts[0].isdigit():
                continue
            pid, rc, data = (
                int(parts[0]),
                parts[1],
                base64.b64decode(parts[2]).decode(errors="replace"),
            )
            if rc == "0":
                try:
                    found.append(parse_dump(pid, data))
                    continue
                except (ValueError, TypeError) as exc:
                    data = f"unreadable py-spy output: {exc}"
            found.append(
                ProcessStacks(
                    pid=pid,
                    error=data.strip().splitlines()[-1] if data.strip() else f"py-spy exit {rc}",
                )
            )
        if not found:
            return [ProcessStacks(pid=worker.pid, error="no Python process in the worker")]
        return found

    # -- after a deployer restart --------------------------------------------------------

    async def _write_state(self, local: _Local, phase: str) -> None:
        job = self._jobs.get(local.deployment.key)
        state = self._state(local, phase)
        if job is not None:
            state["job_id"] = job
            state["workers"] = [
                {"index": w.index, "pid": w.pid, "started_at": w.started_at}
                for w in local.workers.values()
                if w.started_at is not None
            ]
        # The job id alone, kept through `LocalRuntime.allocate` (which rewrites
        # state.json), as soon as sbatch answered.
        alone = job if job is not None and phase == "allocated" else None
        await self._files(local, self._save_slurm_state, local, state, alone)

    def _save_slurm_state(self, local: _Local, state: dict[str, Any], job: str | None) -> None:
        if job is not None:
            (local.root / "state.json.slurm").write_text(json.dumps({"job_id": job}))
        self._save_state(local, state)

    def recover(self) -> dict[DeploymentKey, dict[int, int]]:
        """Deployments whose gate an earlier deployer opened (their workers run in Slurm).

        A deployment whose gate was not opened is left to be deployed again: its
        `allocate` takes the job that is already there."""
        found: dict[DeploymentKey, dict[int, int]] = {}
        for key, raw, state_file in self._saved_states():
            if "job_id" not in raw:
                continue
            if not (state_file.parent / "go").exists():
                continue
            pids = {}
            for w in raw.get("workers", []):
                pid = _read_pid(state_file.parent / f"w{w['index']}" / "pid")
                pids[int(w["index"])] = pid if pid is not None else int(raw["job_id"])
            found[key] = pids
        return found

    async def adopt(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        """Follow the workers of a job an earlier deployer started: output and exits."""
        key = deployment.key
        task, run, attempt = key
        root = self.config.scratch_root / task / f"run{run}-a{attempt}"
        raw = json.loads((root / "state.json").read_text())
        started = {int(w["index"]): w.get("started_at") for w in raw.get("workers", [])}
        workers: dict[int, _Worker] = {}
        for placement in deployment.workers:
            worker = _Worker(placement.index, placement, root / f"w{placement.index}")
            worker.pid = _read_pid(worker.scratch / "pid")
            worker.started_at = started.get(placement.index)
            _load_offsets(worker)
            workers[placement.index] = worker
        local = _Local(deployment, root, workers, adopted=True)
        self._deps[key] = local
        self._jobs[key] = str(raw["job_id"])
        self._watch_all(local, on_output, on_exit)
        return self.pids(key)

    async def discard(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        """End the job of a deployment found on disk that must not go on; remove it."""
        task, run, attempt = key
        root = self.config.scratch_root / task / f"run{run}-a{attempt}"
        try:
            job = str(json.loads((root / "state.json").read_text())["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            job = None
        if job is not None:
            with contextlib.suppress(SlurmError):
                await self._slurm(self.bin["scancel"], "--signal=TERM", job)
            deadline = time.monotonic() + (self.config.grace_s if grace_s is None else grace_s)
            while not await self._job_over(job) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            await self._cancel(job, key)
        await self._salvage(key, root)

    def detach(self) -> None:
        super().detach()
        self._jobs.clear()


#: Run on a worker's node: py-spy for every Python process under the wrapper ($1),
#: one line each: `<pid> <exit code> <base64 of py-spy's output>`.
_STACKS_SCRIPT = r"""
kids() {
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; kids "$c"; done
}
for pid in $(kids "$1"); do
  case "$(readlink /proc/"$pid"/exe 2>/dev/null)" in *python*) ;; *) continue ;; esac
  out=$("$2" dump --pid "$pid" --json @NATIVE@ 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ -n "@NATIVE@" ]; then out=$("$2" dump --pid "$pid" --json 2>&1); rc=$?; fi
  printf '%s %s %s\n' "$pid" "$rc" "$(printf '%s' "$out" | base64 -w0)"
done
"""


@dataclass
class _Pace:
    """The pace of a wait for a file a job writes: looks at it after short naps that grow
    to `most_s`, and Slurm asked about the job only after `ask_after_s`, then at most
    every `ask_every_s` (a client command is a process and a slurmctld call; a look at
    a file is neither)."""

    most_s: float = 0.1
    ask_after_s: float = 1.0
    ask_every_s: float = 1.0
    nap_s: float = 0.01
    ask_at: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.ask_at = time.monotonic() + self.ask_after_s

    def may_ask(self) -> bool:
        """Whether Slurm may be asked now (then not again for `ask_every_s`)."""
        now = time.monotonic()
        if now < self.ask_at:
            return False
        self.ask_at = now + self.ask_every_s
        return True

    async def nap(self) -> None:
        await asyncio.sleep(self.nap_s)
        self.nap_s = min(self.nap_s * 1.5, self.most_s)


def _step_resources(placement: WorkerPlacement) -> list[str]:
    """A worker's step options for the CPUs and memory of its spec (a step gets one CPU
    by default, whatever the job holds)."""
    options = []
    if placement.cpus:
        options.append(f"--cpus-per-task={placement.cpus}")
    if placement.memory_gib:
        options.append(f"--mem={placement.memory_gib}G")
    return options


def _job_name(local: _Local) -> str:
    """The Slurm job name of a deployment: `runyard-<task>-r<run>-a<attempt>`."""
    task, run, attempt = local.deployment.key
    return f"runyard-{task}-r{run}-a{attempt}"


def _program(name: str) -> str:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}") or name


def _fields(text: str) -> dict[str, str]:
    """`Key=Value` pairs of one `scontrol show ... -o` line."""
    found = {}
    for part in text.split():
        key, sep, value = part.partition("=")
        if sep and key not in found:
            found[key] = value
    return found


def _ran(worker: _Worker) -> bool:
    """Whether a worker's wrapper has started (its pid file) or ended (its status)."""
    return (worker.scratch / "pid").exists() or worker.status_file.exists()


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read(path: Path) -> str:
    """A file's text; empty when it cannot be read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
