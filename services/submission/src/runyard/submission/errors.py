"""Why the submission rules refuse a task spec.

Every refusal is a typed error with a stable machine `code` (what scripts and
tests match on), the `field` of the task spec it concerns (`image`,
`env`, `mounts[1].mount_path`, ...), a `message` for a person, and a `hint`
that says how to fix it. A `SubmissionError` is a `RunyardError`
(runyard.errors) of status 400: every edge answers it as HTTP 400 (gRPC
INVALID_ARGUMENT), and nothing is written.

    RunyardError, ValueError
    └── SubmissionError            code, field, message, hint
        ├── SpecError              pool.*, spec.*, workers.*, framework.*, spot.*,
        │                          fault_tolerance.*, alert.*, name.*
        ├── ImageError             image.not_found / image.service_missing / image.wrong_zone
        ├── EnvError               env.*
        ├── RdmaError              rdma.not_allowed
        ├── StorageError           volume.*, mount.*, public_data.*
        ├── ChangeError            rerun.*, clone.*: a change a rerun or clone cannot make
        └── GroupItemError         group.*, or an item's error with its index (`item`)
"""

from __future__ import annotations

from enum import StrEnum

from runyard.errors import RunyardError


class ErrorCode(StrEnum):
    """Stable machine codes of refusals; never rename one, only add."""

    POOL_NOT_FOUND = "pool.not_found"
    POOL_RESOURCE_TYPE_MISMATCH = "pool.resource_type_mismatch"
    SPEC_MISSING = "spec.missing"
    SPEC_CONFLICT = "spec.conflict"
    SPEC_UNKNOWN = "spec.unknown"
    SPEC_INVALID = "spec.invalid"
    SPEC_UNKNOWN_FIELD = "spec.unknown_field"
    SPEC_TOO_LARGE = "spec.too_large"
    NAME_BLANK = "name.blank"
    WORKERS_CUSTOM_COUNT_CONFLICT = "workers.custom_count_conflict"
    WORKERS_EXCEED_POOL = "workers.exceed_pool"
    FRAMEWORK_SINGLE_WORKER = "framework.single_worker"
    SPOT_OPTIONS_NOT_SPOT = "spot.options_not_spot"
    FAULT_TOLERANCE_INVALID_PATTERN = "fault_tolerance.invalid_pattern"
    ALERT_INVALID_WEBHOOK = "alert.invalid_webhook"
    ALERT_UNKNOWN_KIND = "alert.unknown_kind"
    IMAGE_NOT_FOUND = "image.not_found"
    IMAGE_SERVICE_MISSING = "image.service_missing"
    IMAGE_WRONG_ZONE = "image.wrong_zone"
    ENV_INVALID_NAME = "env.invalid_name"
    ENV_DUPLICATE = "env.duplicate"
    ENV_MALFORMED_PAIR = "env.malformed_pair"
    ENV_INVALID_VALUE = "env.invalid_value"
    ENV_MISSING_VALUE = "env.missing_value"
    ENV_RESERVED_NAME = "env.reserved_name"
    ENV_CREATOR_ONLY_UNKNOWN = "env.creator_only_unknown"
    ENV_TOO_LARGE = "env.too_large"
    RDMA_NOT_ALLOWED = "rdma.not_allowed"
    VOLUME_NOT_FOUND = "volume.not_found"
    VOLUME_WRONG_ZONE = "volume.wrong_zone"
    MOUNT_INVALID_PATH = "mount.invalid_path"
    MOUNT_RESERVED_PATH = "mount.reserved_path"
    MOUNT_PATH_OVERLAP = "mount.path_overlap"
    PUBLIC_DATA_UNAVAILABLE = "public_data.unavailable"
    RERUN_FIELD_NOT_CHANGEABLE = "rerun.field_not_changeable"
    GROUP_EMPTY = "group.empty"
    GROUP_TOO_LARGE = "group.too_large"


class SubmissionError(RunyardError, ValueError):
    """A task spec the submission rules refuse: which rule, which field, how to fix it."""

    code: ErrorCode
    http_status = 400

    def __init__(self, code: ErrorCode, field: str, message: str, hint: str) -> None:
        super().__init__(message, code=code, hint=hint, field=field, detail=f"{code}: {message}")


class SpecError(SubmissionError):
    """Pool, worker spec and count, framework, spot and other spec-level rules."""


class ImageError(SubmissionError):
    """R-11: the image is unknown, not for training tasks, or not in the pool's zone."""


class EnvError(SubmissionError):
    """R-12: environment variable syntax, duplicates, values."""


class RdmaError(SubmissionError):
    """R-09: RDMA asked for on a pool or worker spec that cannot have it."""


class StorageError(SubmissionError):
    """R-13: volumes, mount paths and public data."""


class ChangeError(SubmissionError):
    """R-16: a rerun with changes that touches a field only a clone may change."""


class GroupItemError(SubmissionError):
    """R-17: a task group refused; `item` is the index of the failing item, if any."""

    def __init__(
        self, code: ErrorCode, field: str, message: str, hint: str, item: int | None = None
    ) -> None:
        super().__init__(code, field, message, hint)
        self.item = item
        if item is not None:
            self.extra = {"item": item}

    @classmethod
    def wrap(cls, item: int, error: SubmissionError) -> GroupItemError:
        """Item `item`'s error: same code and hint, the index in field and message."""
        wrapped = cls(
            error.code,
            f"items[{item}].{error.field}",
            f"item {item}: {error.message}",
            error.hint,
            item,
        )
        wrapped.__cause__ = error
        return wrapped
