"""The task spec: what a user asks Runyard to run (SPEC R-10).

This is the shape only. The rules that accept or reject a spec (image checks,
environment variable syntax, RDMA, storage, launch command warnings) live in
the submission rules, in one place; this model just refuses what is
structurally impossible so that an event can never carry it.

Every string, list and number has a bound (docs/limits.md). The bounds are
published in the OpenAPI schema through the field constraints below, and they
keep the largest possible task event well under the event store's size limit,
which is itself well under the broker's message size.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

TaskType = Literal["training", "data_processing"]
ResourceType = Literal["subscription", "spot"]
Framework = Literal["single", "pytorch_ddp", "mpi", "ray"]


#: Bounds of the spec's fields (docs/limits.md is the table of every limit).
MAX_NAME = 200
MAX_DESCRIPTION = 4096
MAX_TAGS = 32
MAX_TAG = 64
MAX_ID = 128
MAX_IMAGE = 512
#: The launch command; anything longer belongs in a script of the image or a volume.
MAX_COMMAND = 65536
MAX_ENV_VARS = 256
MAX_ENV_NAME = 128
MAX_ENV_VALUE = 16384
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_MOUNTS = 16
MAX_PATH = 1024
MAX_OUTPUT_DIRS = 16
MAX_ALERTS = 8
MAX_URL = 2048
MAX_PATTERN = 1024
MAX_WORKERS = 1024
MAX_CUSTOM_GPUS = 8192
MAX_PRIORITY = 1000
MAX_HANG_TIMEOUT_S = 7 * 24 * 3600
MAX_QUEUE_DURATION_S = 30 * 24 * 3600
#: Bounds of the whole environment of a task (every name and value together).
MAX_ENV_BYTES = 65536
#: Most tasks one task group may create (R-17).
MAX_GROUP_SIZE = 1000
#: What every API answer shows instead of a creator-only value (R-12).
MASK = "******"
#: Spec fields a rerun may change (R-16); anything else needs a clone.
RERUN_CHANGEABLE: frozenset[str] = frozenset(
    {"command", "worker_spec", "worker_count", "custom_gpus", "image"}
)

#: A short identifier-like text: a pool, a worker spec, a file system, a volume.
ShortText = Annotated[str, Field(max_length=MAX_ID)]
PathText = Annotated[str, Field(max_length=MAX_PATH)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnvVar(_Frozen):
    """One user environment variable.

    A creator-only variable never carries its value in events or API answers:
    the value is kept in the secret store and `secret_ref` points at it; only
    the runtime resolves it when it starts the workers (R-12).
    """

    #: The pattern is published for clients; the submission rules refuse other names
    #: with their own hint (env.invalid_name).
    name: str = Field(max_length=MAX_ENV_NAME, json_schema_extra={"pattern": ENV_NAME_PATTERN})
    value: str | None = Field(default=None, max_length=MAX_ENV_VALUE)
    creator_only: bool = False
    secret_ref: ShortText | None = None


class VolumeMount(_Frozen):
    """A high-performance volume of the pool's zone, seen at `mount_path` (R-13)."""

    file_system: ShortText
    volume: ShortText
    mount_path: PathText
    read_only: bool = False


class FaultToleranceOptions(_Frozen):
    """What the platform does when a task breaks (R-30 to R-34)."""

    env_check: bool = False
    auto_restart: bool = False
    max_restarts: int = Field(default=3, ge=0, le=100)
    hang_timeout_s: int | None = Field(default=None, ge=10, le=MAX_HANG_TIMEOUT_S)
    slowdown_detection: bool = False
    #: Extra regular expression that marks a checkpoint-load line in the logs.
    resume_pattern: str | None = Field(default=None, max_length=MAX_PATTERN)


class SpotOptions(_Frozen):
    """Limits for a spot task before it needs a person (R-08)."""

    max_queue_duration_s: int = Field(default=6 * 3600, ge=1, le=MAX_QUEUE_DURATION_S)
    max_requeues: int = Field(default=3, ge=0, le=100)


#: What a subscription's `alerts` may name, the notification service's alert kinds
#: (`queued` also as `queued:<seconds>`, its own threshold).
ALERT_KINDS = (
    "failed",
    "abnormal",
    "queued",
    "hang",
    "slowdown",
    "restarted",
    "rescheduled",
    "requeued",
    "succeeded",
    "stopped",
)


class AlertSubscription(_Frozen):
    """A per-task Feishu subscription; the signing secret lives in the secret store."""

    webhook_url: str = Field(max_length=MAX_URL)
    alerts: tuple[Annotated[str, Field(max_length=32)], ...] = Field(
        default=("failed", "abnormal", "hang", "slowdown", "restarted"), max_length=16
    )
    secret_ref: ShortText | None = None


class TaskSpec(_Frozen):
    """Everything needed to run a task; a rerun reuses it, a clone copies it."""

    name: str = Field(min_length=1, max_length=MAX_NAME)
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    tags: tuple[Annotated[str, Field(max_length=MAX_TAG)], ...] = Field(
        default=(), max_length=MAX_TAGS
    )
    task_type: TaskType = "training"
    resource_type: ResourceType = "subscription"
    pool: ShortText
    #: A predefined worker spec of the pool (e.g. `8gpu`); None when custom_gpus is used.
    worker_spec: ShortText | None = None
    worker_count: int = Field(default=1, ge=1, le=MAX_WORKERS)
    #: Custom GPU count (R-04): 1-8 is one worker, more is n//8 x 8 GPUs + one n%8 worker.
    custom_gpus: int | None = Field(default=None, ge=1, le=MAX_CUSTOM_GPUS)
    rdma: bool = False
    image: str = Field(max_length=MAX_IMAGE)
    framework: Framework = "single"
    command: str = Field(min_length=1, max_length=MAX_COMMAND)
    env: tuple[EnvVar, ...] = Field(default=(), max_length=MAX_ENV_VARS)
    mounts: tuple[VolumeMount, ...] = Field(default=(), max_length=MAX_MOUNTS)
    public_data: bool = False
    tensorboard_dir: PathText | None = None
    #: Where the training code writes outputs and checkpoints (checked for R-13 warnings).
    output_dirs: tuple[PathText, ...] = Field(default=(), max_length=MAX_OUTPUT_DIRS)
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    fault_tolerance: FaultToleranceOptions = FaultToleranceOptions()
    spot: SpotOptions | None = None
    alerts: tuple[AlertSubscription, ...] = Field(default=(), max_length=MAX_ALERTS)

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


def mask_spec(spec: TaskSpec, viewer_is_creator: bool) -> TaskSpec:
    """The spec as `viewer` may see it: creator-only values shown as `******` to others,
    and alert webhooks with only their scheme and host (the rest of a Feishu bot's URL is
    the token that lets anyone post to its chat).

    Every API answer that carries a spec goes through this, whichever service
    answers it, so the masking lives beside the spec and not in a service.
    """
    if viewer_is_creator:
        return spec
    updates: dict[str, object] = {}
    if any(v.creator_only for v in spec.env):
        updates["env"] = mask_env(spec.env)
    if spec.alerts:
        updates["alerts"] = mask_alerts(spec.alerts)
    return spec.model_copy(update=updates) if updates else spec


def mask_alerts(alerts: tuple[AlertSubscription, ...]) -> tuple[AlertSubscription, ...]:
    """Alert subscriptions with their webhook masked and no secret reference."""
    return tuple(
        a.model_copy(update={"webhook_url": mask_webhook(a.webhook_url), "secret_ref": None})
        for a in alerts
    )


def mask_webhook(url: str) -> str:
    """A webhook URL as others see it: `https://open.feishu.cn/******`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return MASK
    return f"{parts.scheme}://{host}/{MASK}" if host else MASK


def is_masked_webhook(url: str) -> bool:
    """`url` is a masked webhook (`mask_webhook`), not one that can be called."""
    return url == MASK or url.endswith(f"/{MASK}")


def mask_env(env: tuple[EnvVar, ...]) -> tuple[EnvVar, ...]:
    """Variables with creator-only values (and their secret references) hidden."""
    return tuple(
        v.model_copy(update={"value": MASK, "secret_ref": None}) if v.creator_only else v
        for v in env
    )
