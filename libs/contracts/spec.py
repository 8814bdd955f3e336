"""The task spec: what a user asks Runyard to run (SPEC R-10).

This is the shape only. The rules that accept or reject a spec (image checks,
environment variable syntax, RDMA, storage, launch command warnings) live in
the submission rules, in one place; this model just refuses what is
structurally impossible so that an event can never carry it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TaskType = Literal["training", "data_processing"]
ResourceType = Literal["subscription", "spot"]
Framework = Literal["single", "pytorch_ddp", "mpi", "ray"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnvVar(_Frozen):
    """One user environment variable.

    A creator-only variable never carries its value in events or API answers:
    the value is kept in the secret store and `secret_ref` points at it; only
    the runtime resolves it when it starts the workers (R-12).
    """

    name: str
    value: str | None = None
    creator_only: bool = False
    secret_ref: str | None = None


class VolumeMount(_Frozen):
    """A high-performance volume of the pool's zone, seen at `mount_path` (R-13)."""

    file_system: str
    volume: str
    mount_path: str
    read_only: bool = False


class FaultToleranceOptions(_Frozen):
    """What the platform does when a task breaks (R-30 to R-34)."""

    env_check: bool = False
    auto_restart: bool = False
    max_restarts: int = Field(default=3, ge=0, le=100)
    hang_timeout_s: int | None = Field(default=None, ge=10)
    slowdown_detection: bool = False
    #: Extra regular expression that marks a checkpoint-load line in the logs.
    resume_pattern: str | None = None


class SpotOptions(_Frozen):
    """Limits for a spot task before it needs a person (R-08)."""

    max_queue_duration_s: int = Field(default=6 * 3600, ge=1)
    max_requeues: int = Field(default=3, ge=0)


class AlertSubscription(_Frozen):
    """A per-task Feishu subscription; the signing secret lives in the secret store."""

    webhook_url: str
    alerts: tuple[str, ...] = ("failed", "abnormal", "hang", "slowdown", "restarted")
    secret_ref: str | None = None


class TaskSpec(_Frozen):
    """Everything needed to run a task; a rerun reuses it, a clone copies it."""

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    tags: tuple[str, ...] = ()
    task_type: TaskType = "training"
    resource_type: ResourceType = "subscription"
    pool: str
    #: A predefined worker spec of the pool (e.g. `8gpu`); None when custom_gpus is used.
    worker_spec: str | None = None
    worker_count: int = Field(default=1, ge=1)
    #: Custom GPU count (R-04): 1-8 is one worker, more is n//8 x 8 GPUs + one n%8 worker.
    custom_gpus: int | None = Field(default=None, ge=1)
    rdma: bool = False
    image: str
    framework: Framework = "single"
    command: str = Field(min_length=1)
    env: tuple[EnvVar, ...] = ()
    mounts: tuple[VolumeMount, ...] = ()
    public_data: bool = False
    tensorboard_dir: str | None = None
    #: Where the training code writes outputs and checkpoints (checked for R-13 warnings).
    output_dirs: tuple[str, ...] = ()
    priority: int = 0
    fault_tolerance: FaultToleranceOptions = FaultToleranceOptions()
    spot: SpotOptions | None = None
    alerts: tuple[AlertSubscription, ...] = ()

    def worker_gpus(self, spec_gpus: int | None = None) -> tuple[int, ...]:
        """GPUs of each worker, in worker-index order.

        With a predefined spec, every worker has `spec_gpus` (the spec's GPU
        count, looked up in the pool); with a custom count, R-04 applies.
        """
        if self.custom_gpus is not None:
            return split_custom_gpus(self.custom_gpus)
        if spec_gpus is None:
            raise ValueError("spec_gpus is required when the task uses a predefined worker spec")
        return (spec_gpus,) * self.worker_count


def split_custom_gpus(n: int) -> tuple[int, ...]:
    """R-04: 1-8 -> one worker; n > 8 -> n//8 full 8-GPU workers and one n%8 worker."""
    if n < 1:
        raise ValueError("custom GPU count must be at least 1")
    if n <= 8:
        return (n,)
    full, rest = divmod(n, 8)
    return (8,) * full + ((rest,) if rest else ())
