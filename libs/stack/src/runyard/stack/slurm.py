"""A real Slurm cluster on this host, for tests and development stacks.

`SlurmCluster(root)` writes a private `slurm.conf` under `root` and starts
`munged` (when no munge daemon runs on the host yet: it is shared by every
cluster here), one `slurmctld` and one `slurmd` per node. All nodes are this
host (`NodeHostname=localhost NodeAddr=127.0.0.1`), each slurmd on a port of
its own; GPUs are generic resources whose device files are symlinks to
/dev/null (Slurm drops GPUs without a device file), and each node is said to
have the CPUs and memory of a GPU node (`cpus_per_node`, `memory_mib_per_node`). The partition
oversubscribes (`OverSubscribe=FORCE`) so many small jobs share few cores, and
the scheduler runs at every submission (`SchedulerParameters` below) so a job
runs about a second after `sbatch`.

Client commands find the cluster through `SLURM_CONF` (`cluster.env()`);
nothing under /etc/slurm is read or written. `stop()` ends the daemons it
started by the pids in their pid files (never munged, which other clusters
may use).

    cluster = SlurmCluster(tmp / "slurm", nodes=("n1", "n2"), gpus_per_node=8)
    cluster.start()          # returns once every node is idle
    ...
    cluster.stop()

`slurm_missing()` says what is missing for it on this host (None: nothing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from runyard.stack.ports import free_port

__all__ = ["SLURM_PROGRAMS", "SlurmCluster", "SlurmError", "slurm_missing"]

#: The programs a cluster on this host needs (daemons and client commands).
SLURM_PROGRAMS = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "squeue",
    "sinfo",
    "scontrol",
    "scancel",
)
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MUNGE_KEY = Path("/etc/munge/munge.key")


class SlurmError(RuntimeError):
    """The cluster could not be started (the message says which daemon and why)."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}")


def slurm_missing() -> str | None:
    """Why a Slurm cluster cannot run on this host (None: it can)."""
    missing = [p for p in SLURM_PROGRAMS if _which(p) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} not found): "
            "apt-get install -y slurm-wlm munge"
        )
    if os.geteuid() != 0:
        return "a Slurm cluster on this host needs root (its daemons run as SlurmUser=root)"
    if not _MUNGE_KEY.exists():
        return f"munge has no key ({_MUNGE_KEY} is missing): reinstall munge"
    return None


def _free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports nothing listens on now (`runyard.stack.ports`)."""
    return [free_port() for _ in range(count)]


@dataclass
class SlurmCluster:
    """A slurmctld and `len(nodes)` slurmd on this host; see the module docstring."""

    root: Path
    nodes: Sequence[str] = ("n1", "n2")
    gpus_per_node: int = 8
    #: What each node is said to have (`SlurmdParameters=config_overrides`: slurmd takes
    #: slurm.conf's word for it), so that jobs asking for a pool spec's CPUs and memory
    #: (12 CPUs and 120 GiB a GPU in the example pools) fit on this host's nodes.
    cpus_per_node: int = 96
    memory_mib_per_node: int = 1024 * 1024
    partition: str = "gpu"
    #: Seconds `start` waits for every node to be idle.
    start_timeout_s: float = 60.0
    pids: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = self.root.absolute()

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        """The environment of a client command (sbatch, squeue, ...) for this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> str:
        """Run a client command against this cluster; its stdout."""
        done = subprocess.run(
            list(args), env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    # -- start -------------------------------------------------------------------

    def write_config(self) -> None:
        """slurm.conf and gres.conf under `root`, with fake GPU device files."""
        for sub in ("state", "fakedev", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for n in range(self.gpus_per_node):
            dev = self.root / "fakedev" / f"nvidia{n}"
            if not dev.is_symlink():
                dev.symlink_to("/dev/null")
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        r = self.root
        lines = [
            "ClusterName=runyard",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CryptoType=crypto/munge",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "KillWait=5",
            "MinJobAge=2",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,"
            "default_queue_depth=1000,defer",
            "GresTypes=gpu",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdSpoolDir={r / 'spool-%n'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
        ]
        for name, port in zip(self.nodes, node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus_per_node} RealMemory={self.memory_mib_per_node} "
                f"Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP OverSubscribe=FORCE:64"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        last = self.gpus_per_node - 1
        gres = [
            f"NodeName={name} Name=gpu File={r / 'fakedev'}/nvidia[0-{last}]\n"
            for name in self.nodes
        ]
        (self.root / "gres.conf").write_text("".join(gres))

    def start(self) -> None:
        """Start munged (if needed), slurmctld and every slurmd; wait until nodes are idle."""
        if why := slurm_missing():
            raise SlurmError(why)
        self.write_config()
        _ensure_munged()
        try:
            self._daemon("slurmctld", [self._bin("slurmctld"), "-f", str(self.conf)])
            for node in self.nodes:
                args = [self._bin("slurmd"), "-f", str(self.conf), "-N", node]
                self._daemon(f"slurmd-{node}", args)
            self.wait_idle()
        except BaseException:
            self.stop()
            raise

    def _bin(self, name: str) -> str:
        found = _which(name)
        if found is None:
            raise SlurmError(f"{name} not found")
        return found

    def _daemon(self, name: str, args: list[str]) -> None:
        """Start one daemon (it forks into the background and writes its pid file)."""
        done = subprocess.run(
            args, env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise SlurmError(f"{name} did not start: {done.stderr.strip()}")
        pid_file = self.root / f"{name}.pid"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                self.pids[name] = int(pid_file.read_text().strip())
                return
            except (OSError, ValueError):
                time.sleep(0.1)
        raise SlurmError(f"{name} wrote no pid file ({pid_file}); see {self.root / 'log'}")

    def add_pool(self, config: Path, pool: str, *, grace_s: float = 2) -> None:
        """Add to the Runyard config folder `config` a pool `pool` whose nodes are this
        cluster's (one 1-GPU spec), run by the Slurm runtime on this cluster."""
        pools = yaml.safe_load((config / "pools.yaml").read_text())
        pools["pools"].append(
            {
                "id": pool,
                "zone": "cn-north-1",
                "gpu_model": "A100-80G",
                "specs": [{"name": "1gpu", "gpus": 1, "cpus": 1, "memory_gib": 8}],
                "nodes": [{"name": n, "gpus": self.gpus_per_node} for n in self.nodes],
            }
        )
        (config / "pools.yaml").write_text(yaml.safe_dump(pools))
        runtime = yaml.safe_load((config / "runtime.yaml").read_text())
        runtime["pools"] = {
            **(runtime.get("pools") or {}),
            pool: {
                "runtime": "slurm",
                "partition": self.partition,
                "slurm_conf": str(self.conf),
                "grace_s": grace_s,
            },
        }
        (config / "runtime.yaml").write_text(yaml.safe_dump(runtime))

    def node_states(self) -> dict[str, str]:
        """Slurm's state of every node (`idle`, `mixed`, `down*`, `drained`, ...)."""
        out = self.run(self._bin("sinfo"), "-h", "-N", "-o", "%N %t", check=False)
        states = {}
        for line in out.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def wait_idle(self) -> None:
        """Wait until every node is idle (registered and schedulable)."""
        deadline = time.monotonic() + self.start_timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.3)
        raise SlurmError(
            f"nodes not idle after {self.start_timeout_s:.0f} s: {states}; "
            f"see the logs in {self.root / 'log'}"
        )

    # -- stop --------------------------------------------------------------------

    def stop(self) -> None:
        """End the daemons this cluster started (by their pid files), jobs with them."""
        names = [f"slurmd-{n}" for n in self.nodes] + ["slurmctld"]
        for name in names:
            pid = self._pid(name)
            if pid is not None:
                _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name in names:
            pid = self._pid(name)
            while pid is not None and _exists(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid is not None and _exists(pid):
                _kill(pid, signal.SIGKILL)
        self.pids.clear()

    def _pid(self, name: str) -> int | None:
        if name in self.pids:
            return self.pids[name]
        try:
            return int((self.root / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ensure_munged() -> None:
    """Start munged unless one runs on this host already (it is shared by every cluster)."""
    check = subprocess.run(
        [_which("munge") or "munge", "-n"], capture_output=True, timeout=10, check=False
    )
    if check.returncode == 0:
        return
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [_which("munged") or "munged", "--force"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise SlurmError(f"munged did not start: {done.stderr.strip()}")


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return bool(fields) and fields[0] not in ("Z", "X")
