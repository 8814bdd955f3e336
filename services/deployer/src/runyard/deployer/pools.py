"""One runtime per pool: `PoolRuntimes` routes each deployment by its task's pool.

`runtime.yaml`'s `pools:` section names the pools whose workers run elsewhere
than on this machine (today: `runtime: slurm`, with the pool's partition and
slurm.conf); every other pool uses the local runtime. `PoolRuntimes` is itself
a `Runtime` (and has every optional method the deployer and the output keeper
use), so the deployer drives it exactly as it drives one runtime:

- a deployment goes to the runtime of `deployment.spec.pool` (`allocate`,
  `adopt`, ...), which is remembered by its key;
- a call by key alone (`stop`, `cleanup`, `capture_stacks`, `discard`) goes
  to the runtime that holds the key (or found it in `recover`);
- lists (`deployments`, `recover`, `kept`, `live_streams`) are the union.

Each runtime keeps its deployments under a scratch root of its own, so one
never finds (and ends) what another started.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from runyard.contracts.stacks import WorkerStacks
from runyard.deployer.outputs import KeptOutput, OutputStream
from runyard.deployer.runtime import (
    Deployment,
    DeploymentKey,
    LocalRuntime,
    LocalRuntimeConfig,
    OnExit,
    OnOutput,
    Runtime,
)
from runyard.deployer.slurm import SlurmRuntime, SlurmRuntimeConfig
from runyard.deployer.turns import FairTurns

#: The runtimes a pool may name in runtime.yaml (`pools.<id>.runtime`).
RUNTIMES = ("local", "slurm")


class RuntimeConfigError(ValueError):
    """runtime.yaml's `pools:` section names something the deployer cannot build."""


def build_runtimes(
    raw: Mapping[str, Any], *, data_dir: Path, base_dir: Path, keep_output: bool
) -> LocalRuntime | PoolRuntimes:
    """The runtime of `runtime.yaml`: the local one alone, or one per pool when some
    pool names another runtime (`pools.<id>.runtime`)."""
    local_raw = raw.get("local") or {}
    config = LocalRuntimeConfig.from_mapping(local_raw, data_dir=data_dir, base_dir=base_dir)
    local = LocalRuntime(dataclasses.replace(config, keep_output=keep_output))
    by_pool: dict[str, Runtime] = {}
    for pool, settings in (raw.get("pools") or {}).items():
        kind = str((settings or {}).get("runtime", "local"))
        if kind not in RUNTIMES:
            raise RuntimeConfigError(
                f"runtime.yaml: pool {pool!r} names runtime {kind!r}; known: {', '.join(RUNTIMES)}"
            )
        if kind == "local":
            continue
        # The local catalogue unless the pool has its own; a scratch root of its own.
        merged = {"images": local_raw.get("images"), **settings}
        merged.setdefault("scratch_root", str(data_dir / "slurm" / str(pool)))
        slurm = SlurmRuntimeConfig.from_mapping(merged, data_dir=data_dir, base_dir=base_dir)
        by_pool[str(pool)] = SlurmRuntime(dataclasses.replace(slurm, keep_output=keep_output))
    return PoolRuntimes(local, by_pool) if by_pool else local


class PoolRuntimes:
    """A runtime per pool behind the `Runtime` interface; see the module docstring.

    The runtimes of the pools are any `Runtime`; their optional methods (`wait`,
    `recover`, `adopt`, the env check, the kept output, ...) are used when they have
    them, as the deployer does with a single runtime."""

    def __init__(self, default: LocalRuntime, by_pool: Mapping[str, Runtime]) -> None:
        self.default = default
        self.by_pool = dict(by_pool)
        self._where: dict[DeploymentKey, Runtime] = {}

    @property
    def config(self) -> LocalRuntimeConfig:
        """The default (local) runtime's settings: where the deployer keeps its own files."""
        return self.default.config

    @property
    def namespaces(self) -> bool:
        """Whether the local runtime sandboxes its workers."""
        return self.default.namespaces

    def all(self) -> list[Runtime]:
        return [self.default, *self.by_pool.values()]

    def of(self, deployment: Deployment) -> Runtime:
        runtime = self.by_pool.get(deployment.spec.pool, self.default)
        self._where[deployment.key] = runtime
        return runtime

    def at(self, key: DeploymentKey) -> Runtime | None:
        """The runtime that holds (or last held) the deployment."""
        if key in self._where:
            return self._where[key]
        for runtime in self.all():
            if key in runtime.deployments():
                return runtime
        return None

    def _optional(self, runtime: Runtime | None, name: str) -> Any:
        """`runtime.<name>` when the runtime has that optional method, else None."""
        return getattr(runtime, name, None) if runtime is not None else None

    # -- the Runtime protocol ------------------------------------------------------------

    def stage_slots(self, deployment: Deployment) -> FairTurns | None:
        slots = self._optional(self.of(deployment), "stage_slots")
        return slots(deployment) if slots is not None else None

    async def allocate(self, deployment: Deployment) -> None:
        await self.of(deployment).allocate(deployment)

    async def pull_image(self, deployment: Deployment) -> None:
        await self.of(deployment).pull_image(deployment)

    async def mount_storage(self, deployment: Deployment) -> None:
        await self.of(deployment).mount_storage(deployment)

    async def init_env(self, deployment: Deployment) -> None:
        await self.of(deployment).init_env(deployment)

    async def start_workers(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        return await self.of(deployment).start_workers(deployment, on_output, on_exit)

    async def stop(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        if runtime := self.at(key):
            await runtime.stop(key, grace_s)

    async def capture_stacks(
        self, key: DeploymentKey, *, native: bool = True
    ) -> tuple[WorkerStacks, ...]:
        runtime = self.at(key)
        return await runtime.capture_stacks(key, native=native) if runtime else ()

    async def cleanup(self, key: DeploymentKey) -> None:
        if runtime := self.at(key):
            await runtime.cleanup(key)
            if key not in runtime.deployments():
                self._where.pop(key, None)

    def deployments(self) -> list[DeploymentKey]:
        return [key for runtime in self.all() for key in runtime.deployments()]

    # -- optional methods the deployer uses when present -----------------------------------

    async def wait(self, key: DeploymentKey) -> dict[int, int]:
        wait = self._optional(self.at(key), "wait")
        return dict(await wait(key)) if wait else {}

    def start_times(self, key: DeploymentKey) -> dict[int, datetime]:
        start_times = self._optional(self.at(key), "start_times")
        return dict(start_times(key)) if start_times else {}

    def given_gpus(self, key: DeploymentKey) -> dict[int, tuple[int, ...]]:
        given_gpus = self._optional(self.at(key), "given_gpus")
        return dict(given_gpus(key)) if given_gpus else {}

    async def start_env_check(
        self, deployment: Deployment, on_output: OnOutput, *, port: int
    ) -> dict[int, int]:
        start = self._optional(self.of(deployment), "start_env_check")
        if start is None:
            raise RuntimeError(f"the runtime of pool {deployment.spec.pool} has no env check")
        return dict(await start(deployment, on_output, port=port))

    async def wait_env_check(self, key: DeploymentKey) -> dict[int, int]:
        wait = self._optional(self.at(key), "wait_env_check")
        return dict(await wait(key)) if wait else {}

    async def end_env_check(self, key: DeploymentKey) -> None:
        if end := self._optional(self.at(key), "end_env_check"):
            await end(key)

    def recover(self) -> dict[DeploymentKey, dict[int, int]]:
        found: dict[DeploymentKey, dict[int, int]] = {}
        for runtime in self.all():
            recover = self._optional(runtime, "recover")
            for key, pids in (recover() if recover else {}).items():
                found[key] = pids
                self._where[key] = runtime
        return found

    async def adopt(
        self, deployment: Deployment, on_output: OnOutput, on_exit: OnExit
    ) -> dict[int, int]:
        runtime = self._where.get(deployment.key) or self.of(deployment)
        self._where[deployment.key] = runtime
        adopt = self._optional(runtime, "adopt")
        if adopt is None:
            raise RuntimeError(f"the runtime of pool {deployment.spec.pool} cannot adopt")
        return dict(await adopt(deployment, on_output, on_exit))

    async def discard(self, key: DeploymentKey, grace_s: float | None = None) -> None:
        runtime = self._where.pop(key, None) or self.default
        if discard := self._optional(runtime, "discard"):
            await discard(key, grace_s)

    def detach(self) -> None:
        for runtime in self.all():
            if detach := self._optional(runtime, "detach"):
                detach()
        self._where.clear()

    # -- output kept until stored (runyard.deployer.keeper) --------------------------------

    def kept(self) -> dict[DeploymentKey, KeptOutput]:
        found: dict[DeploymentKey, KeptOutput] = {}
        for runtime in self.all():
            if kept := self._optional(runtime, "kept"):
                found.update(kept())
        return found

    async def forget(self, key: DeploymentKey) -> None:
        for runtime in self.all():
            kept, forget = self._optional(runtime, "kept"), self._optional(runtime, "forget")
            if kept is not None and forget is not None and key in kept():
                await forget(key)

    def live_streams(self) -> list[OutputStream]:
        found: list[OutputStream] = []
        for runtime in self.all():
            if live := self._optional(runtime, "live_streams"):
                found.extend(live())
        return found
