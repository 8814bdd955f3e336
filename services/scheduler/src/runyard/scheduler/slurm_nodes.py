"""Node truth from Slurm: a node Slurm takes out of service is faulty in its pool.

For every pool that `runtime.yaml` runs on Slurm (`pools: <id>: {runtime:
slurm, slurm_conf, partition}`), the active scheduler looks at Slurm's nodes
(`sinfo -N`) every few seconds and turns what Slurm says into pool events
through the same admin decisions an operator uses (`runyard.scheduler.admin`),
so the placement rules never place on a node Slurm would not run:

- DOWN, FAIL, FAILING, not responding (`*`), DRAIN, DRAINING, DRAINED, INVAL:
  `NodeMarkedFaulty`, reason `Slurm: node <n> is <STATE> (<Slurm's reason>)`;
- back in service (idle, mixed, allocated, completing): `NodeMarkedHealthy`,
  only for a fault whose reason starts with `Slurm:`.

Each such event is the root of its audit chain (R-62): its causation and
correlation id are `slurm:<pool>/<node>/<faulty|healthy>/<uuid>`, what Slurm
said. A fault an operator marked is never healed here, and a node Slurm lists
that is not in the pool is left alone. A pool node Slurm does not list (a name
missing from slurm.conf, or from the pool's partition) is faulty, reason
`Slurm: node <n> is not in <where>: <the fix>`, and healed once Slurm lists it
in service. The decision is
`slurm_node_changes` (pure); `SlurmNodeWatch` reads sinfo and the pool stream
and appends. A DRAIN counts as a fault, not a cordon: a fault carries a reason
(so a restarted scheduler still knows which faults came from Slurm), and fault
tolerance moves the workers off the node before Slurm's drain completes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runyard.eventstore import EventStore
from runyard.scheduler import admin
from runyard.scheduler.config import pool_stream
from runyard.scheduler.domain import fold_pool
from runyard.scheduler.domain.pool import NodeState

log = logging.getLogger("runyard.scheduler.slurm")

ACTOR = "service:scheduler"
#: What a fault marked from Slurm's word starts with (only those are healed here).
PREFIX = "Slurm: "
#: Slurm base states that take a node out of service.
OUT_OF_SERVICE = {
    "DOWN",
    "FAIL",
    "FAILING",
    "DRAIN",
    "DRAINING",
    "DRAINED",
    "INVAL",
    "NOT_RESPONDING",
}
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as `sinfo -N -o '%N|%T|%E'` says it."""

    name: str
    #: Slurm's long state, e.g. `idle`, `mixed`, `drained`, `down*`, `draining`.
    state: str
    reason: str = ""

    @property
    def base(self) -> str:
        """The state without Slurm's flag characters, upper case (`down*` -> `DOWN`)."""
        core = self.state.upper().rstrip("*~#!%$@^-+")
        return "NOT_RESPONDING" if self.state.endswith("*") and core in ("IDLE", "") else core

    @property
    def in_service(self) -> bool:
        return self.base not in OUT_OF_SERVICE and not self.state.endswith("*")


@dataclass(frozen=True, slots=True)
class NodeChange:
    """A pool event to decide: `faulty` with its reason, or `healthy`."""

    node: str
    to: str
    reason: str = ""


def slurm_node_changes(
    nodes: Mapping[str, NodeState], slurm: Mapping[str, SlurmNode], partition: str | None = None
) -> list[NodeChange]:
    """What the pool must record so its nodes' health matches what Slurm says.

    A pool node Slurm does not list (in `partition`, when the pool names one) is
    faulty too: every job placed there would fail at `sbatch`. An empty listing is
    taken as no answer, not as every node gone."""
    changes = []
    for name, node in sorted(nodes.items()):
        seen = slurm.get(name)
        if seen is None:
            if slurm and node.fault is None:
                where = f"partition {partition}" if partition else "Slurm's configuration"
                fix = (
                    f"add it to {where} (slurm.conf) and restart slurmctld, or remove it"
                    " from the pool (runyard admin node remove)"
                )
                changes.append(
                    NodeChange(name, "faulty", f"{PREFIX}node {name} is not in {where}: {fix}")
                )
            continue
        if not seen.in_service:
            if node.fault is None:
                why = f" ({seen.reason})" if seen.reason and seen.reason != "none" else ""
                state = seen.base.replace("_", " ")  # `idle*` is NOT RESPONDING
                changes.append(NodeChange(name, "faulty", f"{PREFIX}node {name} is {state}{why}"))
        elif node.fault is not None and node.fault.startswith(PREFIX):
            changes.append(NodeChange(name, "healthy"))
    return changes


def slurm_pools(runtime_yaml: Mapping[str, Any]) -> dict[str, tuple[Path | None, str | None]]:
    """(slurm.conf, partition) of each pool runtime.yaml runs on Slurm."""
    found: dict[str, tuple[Path | None, str | None]] = {}
    for pool, raw in (runtime_yaml.get("pools") or {}).items():
        settings = raw or {}
        if settings.get("runtime") == "slurm":
            conf = settings.get("slurm_conf")
            found[str(pool)] = (Path(str(conf)) if conf else None, settings.get("partition"))
    return found


class SlurmNodeWatch:
    """Keeps one pool's node health in line with Slurm (module docstring)."""

    def __init__(
        self,
        store: EventStore,
        pool_id: str,
        *,
        slurm_conf: Path | None = None,
        partition: str | None = None,
        interval_s: float = 5.0,
    ) -> None:
        self.store = store
        self.pool_id = pool_id
        self.slurm_conf = slurm_conf
        self.partition = partition
        self.interval_s = interval_s
        self.sinfo = shutil.which("sinfo", path=f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}")

    async def nodes(self) -> dict[str, SlurmNode]:
        """Every node of the partition as Slurm says it now."""
        if self.sinfo is None:
            raise RuntimeError("sinfo not found: install Slurm's client commands")
        args = [self.sinfo, "-h", "-N", "-o", "%N|%T|%E"]
        if self.partition:
            args += ["-p", self.partition]
        env = {"PATH": _SYSTEM_PATH, "LANG": "C.UTF-8"}
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        proc = await asyncio.create_subprocess_exec(
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"sinfo failed: {err.decode(errors='replace').strip()}")
        found = {}
        for line in out.decode(errors="replace").splitlines():
            name, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            found[name.strip()] = SlurmNode(name.strip(), state.strip(), reason.strip())
        return found

    async def check(self) -> list[NodeChange]:
        """Look once; append what changed; the changes made."""
        slurm = await self.nodes()
        recorded = await self.store.read_stream(pool_stream(self.pool_id))
        if not recorded:
            return []
        state = fold_pool(r.event for r in recorded)
        changes = slurm_node_changes(state.nodes, slurm, self.partition)
        for change in changes:
            # The root of the event's audit chain: what Slurm said, once.
            said = f"slurm:{self.pool_id}/{change.node}/{change.to}/{uuid.uuid4()}"
            if change.to == "faulty":
                await admin.mark_node_faulty(
                    self.store,
                    self.pool_id,
                    change.node,
                    change.reason,
                    actor=ACTOR,
                    request_id=said,
                )
            else:
                await admin.mark_node_healthy(
                    self.store, self.pool_id, change.node, actor=ACTOR, request_id=said
                )
            log.info("pool %s: node %s %s per Slurm", self.pool_id, change.node, change.to)
        return changes

    async def run(self) -> None:
        """Check every `interval_s` until cancelled; a failed look is logged and retried."""
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool %s: looking at Slurm's nodes failed", self.pool_id)
            await asyncio.sleep(self.interval_s)
