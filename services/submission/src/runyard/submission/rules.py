"""The submission rules: does Runyard accept this task spec, and with which warnings?

`check_spec` runs every rule of R-09 to R-15 on a spec, in a fixed order, and
raises the first refusal as a typed `SubmissionError`; what it accepts comes
back with a list of `SubmissionWarning`s. Nothing here does I/O or reads a
clock: the catalogue and the pool (from the scheduler's read model) are
passed in. Reruns, clones and task groups (R-16, R-17) are in
`runyard.submission.changes`; environment variables (R-12) in
`runyard.submission.env`; storage (R-13) in `runyard.submission.storage`;
launch command warnings (R-14) in `runyard.domain.launch_command`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from urllib.parse import urlparse

import re2
from runyard.contracts.resources import TRAINING_SERVICE, Catalogue, PoolView
from runyard.contracts.spec import ALERT_KINDS, FaultToleranceOptions, TaskSpec, is_masked_webhook
from runyard.domain.launch_command import command_warnings
from runyard.submission.env import check_env
from runyard.submission.errors import ErrorCode, ImageError, RdmaError, SpecError
from runyard.submission.launch_paths import launch_path_warnings
from runyard.submission.storage import check_storage, output_path_warnings
from runyard.submission.warnings import SubmissionWarning, WarningCode

#: Training networks on which RDMA can be enabled (R-09).
RDMA_NETWORKS = frozenset({"roce", "ib"})
#: The largest task spec, JSON-encoded as the task's events carry it (docs/limits.md).
MAX_SPEC_BYTES = 256 * 1024
#: RE2's memory budget for a user's pattern (the same as fault tolerance compiles it with).
RE2_MAX_MEM = 8 << 20
_RDMA_HINT = "RDMA needs 8-GPU workers on a RoCE/IB pool: turn RDMA off, or choose such a spec"


#: Why alerts may not go to a webhook URL and what would be accepted, None when
#: they may: the notification service's allow-list, passed in by the gateway.
WebhookRule = Callable[[str], tuple[str, str] | None]


def check_spec(
    spec: TaskSpec,
    catalogue: Catalogue,
    pool: PoolView | None,
    *,
    webhooks: WebhookRule | None = None,
) -> list[SubmissionWarning]:
    """Accept `spec` for `pool` (None: the pool does not exist) or raise why not.

    Order of the rules: pool and resource type, spot options, worker spec and
    count (R-02/R-04), framework (R-15), RDMA (R-09), image (R-11), env
    (R-12), storage (R-13), then the remaining spec fields. Warnings: uneven
    custom workers (R-04), a restart limit with auto restart off (R-32), local
    output paths (R-13), launch command (R-14), files the command reads from where
    workers cannot see them (`launch_paths`).
    """
    check_size(spec)
    checked = _require_pool(spec, pool)
    check_resources(spec, checked)
    check_image(spec.image, catalogue, checked)
    check_env(spec)
    check_storage(spec, catalogue, checked)
    check_other_fields(spec, webhooks)
    return [
        *worker_warnings(spec),
        *restart_warnings(spec),
        *output_path_warnings(spec),
        *command_warnings(spec.command),
        *launch_path_warnings(spec),
    ]


def check_size(spec: TaskSpec) -> None:
    """The spec as its events carry it stays well under the event store's size limit
    (every field has its own bound; escaped text can still add up)."""
    size = len(spec.model_dump_json().encode())
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            ErrorCode.SPEC_TOO_LARGE,
            "spec",
            f"the task spec takes {size} bytes encoded, at most {MAX_SPEC_BYTES} are allowed",
            "shorten the launch command (run a script from the image or a volume) "
            "and the variables (pass large values as files)",
        )


def _require_pool(spec: TaskSpec, pool: PoolView | None) -> PoolView:
    if pool is None:
        raise SpecError(
            ErrorCode.POOL_NOT_FOUND,
            "pool",
            f"pool {spec.pool} does not exist or is not visible to you",
            "choose a pool listed by `runyard pools`",
        )
    if pool.pool_id != spec.pool:
        raise ValueError(f"checked spec of pool {spec.pool} against pool {pool.pool_id}")
    return pool


def check_resources(spec: TaskSpec, pool: PoolView) -> None:
    """Resource type, spot options, worker spec and count, framework and RDMA against the pool."""
    _check_resource_type(spec, pool)
    _check_spot_options(spec)
    workers = worker_gpus(spec, pool)
    _check_fits_pool(spec, pool, workers)
    _check_framework(spec, workers)
    _check_rdma(spec, pool, workers)


def _check_resource_type(spec: TaskSpec, pool: PoolView) -> None:
    if spec.resource_type != pool.resource_type:
        raise SpecError(
            ErrorCode.POOL_RESOURCE_TYPE_MISMATCH,
            "resource_type",
            f"pool {pool.pool_id} is a {pool.resource_type} pool, the task asks for "
            f"{spec.resource_type} resources",
            f"choose a {spec.resource_type} pool, or set the resource type to {pool.resource_type}",
        )


def _check_spot_options(spec: TaskSpec) -> None:
    if spec.spot is not None and spec.resource_type != "spot":
        raise SpecError(
            ErrorCode.SPOT_OPTIONS_NOT_SPOT,
            "spot",
            "spot options (max queue duration, max requeues) are set on a "
            f"{spec.resource_type} task",
            "remove the spot options, or set the resource type to spot",
        )


def worker_gpus(spec: TaskSpec, pool: PoolView) -> tuple[int, ...]:
    """GPUs of each worker (R-02, R-04), after checking the spec or custom count is valid."""
    if spec.custom_gpus is None and spec.worker_spec is None:
        raise SpecError(
            ErrorCode.SPEC_MISSING,
            "worker_spec",
            "the task has neither a worker spec nor a custom GPU count",
            f"choose a worker spec of pool {pool.pool_id} ({_spec_names(pool)}) "
            "or set a custom GPU count",
        )
    if spec.custom_gpus is not None:
        return _custom_worker_gpus(spec)
    gpus: tuple[int, ...] = spec.worker_gpus(_spec_gpus(spec, pool))
    return gpus


def _custom_worker_gpus(spec: TaskSpec) -> tuple[int, ...]:
    if spec.worker_spec is not None:
        raise SpecError(
            ErrorCode.SPEC_CONFLICT,
            "custom_gpus",
            f"the task has both worker spec {spec.worker_spec} and a custom GPU count",
            "choose either a worker spec with a worker count, or a custom GPU count",
        )
    if spec.worker_count != 1:
        raise SpecError(
            ErrorCode.WORKERS_CUSTOM_COUNT_CONFLICT,
            "worker_count",
            f"worker count {spec.worker_count} is set with a custom GPU count",
            "leave the worker count at 1: a custom GPU count makes 8-GPU workers "
            "plus one worker with the rest",
        )
    gpus: tuple[int, ...] = spec.worker_gpus()
    return gpus


def _spec_gpus(spec: TaskSpec, pool: PoolView) -> int:
    gpus: int | None = pool.specs.get(spec.worker_spec or "")
    if gpus is None:
        raise SpecError(
            ErrorCode.SPEC_UNKNOWN,
            "worker_spec",
            f"pool {pool.pool_id} has no worker spec {spec.worker_spec}",
            f"choose one of pool {pool.pool_id}'s worker specs: {_spec_names(pool)}",
        )
    return gpus


def _spec_names(pool: PoolView) -> str:
    return ", ".join(sorted(pool.specs)) or "none"


def _count_field(spec: TaskSpec) -> str:
    return "custom_gpus" if spec.custom_gpus is not None else "worker_count"


def _check_fits_pool(spec: TaskSpec, pool: PoolView, workers: tuple[int, ...]) -> None:
    if pool.total_gpus is not None and sum(workers) > pool.total_gpus:
        raise SpecError(
            ErrorCode.WORKERS_EXCEED_POOL,
            _count_field(spec),
            f"the task needs {sum(workers)} GPUs, pool {pool.pool_id} has "
            f"{pool.total_gpus} in all: it could never start",
            "lower the worker count or worker spec, or clone the task to a larger pool",
        )


def _check_framework(spec: TaskSpec, workers: tuple[int, ...]) -> None:
    if spec.framework == "single" and len(workers) != 1:
        raise SpecError(
            ErrorCode.FRAMEWORK_SINGLE_WORKER,
            _count_field(spec),
            f"framework single runs one worker, the task has {len(workers)}",
            "set the worker count to 1 (custom GPU count at most 8), "
            "or choose pytorch_ddp, mpi or ray",
        )


def _check_rdma(spec: TaskSpec, pool: PoolView, workers: tuple[int, ...]) -> None:
    if not spec.rdma:
        return
    if pool.network not in RDMA_NETWORKS:
        reason = f"pool {pool.pool_id}'s training network is {pool.network}"
        raise RdmaError(ErrorCode.RDMA_NOT_ALLOWED, "rdma", f"RDMA: {reason}", _RDMA_HINT)
    if any(gpus != 8 for gpus in workers):
        sizes = ", ".join(str(g) for g in sorted(set(workers)))
        reason = f"workers have {sizes} GPUs, not 8"
        raise RdmaError(ErrorCode.RDMA_NOT_ALLOWED, "rdma", f"RDMA: {reason}", _RDMA_HINT)


#: How many images an `image.not_found` hint names at most.
IMAGES_NAMED = 3


def closest_images(
    name: str, catalogue: Catalogue, zone: str, most: int = IMAGES_NAMED
) -> list[str]:
    """The training images of `zone` whose names are closest to `name`, closest first
    (at most `most`; name order between equally close ones)."""
    usable = sorted(
        i.name for i in catalogue.images if zone in i.zones and TRAINING_SERVICE in i.services
    )

    def closeness(candidate: str) -> float:
        return difflib.SequenceMatcher(None, name, candidate, autojunk=False).ratio()

    return sorted(usable, key=lambda c: -closeness(c))[:most]


def check_image(name: str, catalogue: Catalogue, pool: PoolView) -> None:
    """R-11: the image exists, lists training among its services, and is in the pool's zone."""
    image = catalogue.image(name)
    if image is None:
        near = closest_images(name, catalogue, pool.zone)
        offer = f"images of zone {pool.zone} closest to it: {', '.join(near)}; " if near else ""
        raise ImageError(
            ErrorCode.IMAGE_NOT_FOUND,
            "image",
            f"image {name} does not exist",
            f"{offer}check the image name and tag, or import the image to zone {pool.zone};"
            f" `runyard images --zone {pool.zone}` lists them all",
        )
    if TRAINING_SERVICE not in image.services:
        services = ", ".join(image.services) or "none"
        raise ImageError(
            ErrorCode.IMAGE_SERVICE_MISSING,
            "image",
            f"image {name} is not available to training tasks (its services: {services})",
            f"edit the available services of image {name} to include training",
        )
    if pool.zone not in image.zones:
        zones = ", ".join(image.zones) or "none"
        raise ImageError(
            ErrorCode.IMAGE_WRONG_ZONE,
            "image",
            f"image {name} is in zone(s) {zones}, not in zone {pool.zone} of pool {pool.pool_id}",
            f"import or migrate the image to zone {pool.zone}",
        )


def check_name(spec: TaskSpec) -> None:
    """The task has a name that is not only blanks."""
    if not spec.name.strip():
        raise SpecError(ErrorCode.NAME_BLANK, "name", "the task name is blank", "give a name")


def check_other_fields(spec: TaskSpec, webhooks: WebhookRule | None = None) -> None:
    """Name, fault-tolerance resume pattern and alert webhooks (where alerts may go)."""
    check_name(spec)
    _check_resume_pattern(spec.fault_tolerance.resume_pattern)
    for i, alert in enumerate(spec.alerts):
        _check_webhook(alert.webhook_url, f"alerts[{i}].webhook_url", webhooks)
        _check_alert_kinds(alert.alerts, f"alerts[{i}].alerts")


def _check_alert_kinds(alerts: tuple[str, ...], field: str) -> None:
    """Every alert names a kind the notification service sends (a kind it does not know
    would never be sent: the task's owner would wait for an alert that never comes)."""
    for alert in alerts:
        kind, colon, seconds = alert.partition(":")
        if kind in ALERT_KINDS and (not colon or (kind == "queued" and _seconds(seconds))):
            continue
        close = difflib.get_close_matches(kind, ALERT_KINDS, n=1)
        raise SpecError(
            ErrorCode.ALERT_UNKNOWN_KIND,
            field,
            f"alert {alert!r} is not one Runyard sends"
            + (f": did you mean {close[0]}?" if close else ""),
            f"one of {', '.join(ALERT_KINDS)}; `queued:<seconds>` sets its own threshold,"
            " e.g. [failed, queued:1800]",
        )


def _seconds(text: str) -> bool:
    """A positive, finite number of seconds (`queued:1800`)."""
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


def _check_resume_pattern(pattern: str | None) -> None:
    """The pattern runs on every line the workers print, with RE2 (linear time): refuse
    what RE2 cannot compile (backreferences, lookaround) here rather than at run time."""
    if pattern is None:
        return
    try:
        re2.compile(pattern, _re2_options())
    except re2.error as e:
        raise SpecError(
            ErrorCode.FAULT_TOLERANCE_INVALID_PATTERN,
            "fault_tolerance.resume_pattern",
            f"the resume pattern is not a valid RE2 regular expression: {_re2_reason(e)}",
            "patterns run with RE2 (linear time): no backreferences (\\1) and no "
            "lookahead/lookbehind; e.g. `loading checkpoint .* at step (\\d+)`",
        ) from None


def _re2_reason(error: Exception) -> str:
    reason = error.args[0] if error.args else error
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the refusal says why
    options.max_mem = RE2_MAX_MEM
    return options


def _check_webhook(url: str, field: str, webhooks: WebhookRule | None) -> None:
    try:
        parts = urlparse(url)
    except ValueError as exc:  # e.g. `https://[::1`: an IPv6 host left open
        parts, problem = None, f": {exc}"
    else:
        problem = ""
    if is_masked_webhook(url):
        raise SpecError(
            ErrorCode.ALERT_INVALID_WEBHOOK,
            field,
            f"`{url}` is a masked webhook: its token is shown to the task's creator only, "
            "and a clone by another user does not copy it",
            "give your own Feishu bot's webhook, e.g. "
            "https://open.feishu.cn/open-apis/bot/v2/hook/..., or `alerts: []` for none",
        )
    if parts is None or parts.scheme not in ("https", "http") or not parts.netloc:
        raise SpecError(
            ErrorCode.ALERT_INVALID_WEBHOOK,
            field,
            f"`{url}` is not a webhook URL{problem}",
            "paste the Feishu custom bot webhook, "
            "e.g. https://open.feishu.cn/open-apis/bot/v2/hook/...",
        )
    refused = webhooks(url) if webhooks is not None else None
    if refused is not None:
        reason, hint = refused
        raise SpecError(ErrorCode.ALERT_INVALID_WEBHOOK, field, reason, hint)


#: The restart limit a spec gets when it names none.
_DEFAULT_MAX_RESTARTS = FaultToleranceOptions.model_fields["max_restarts"].default


def restart_warnings(spec: TaskSpec) -> list[SubmissionWarning]:
    """R-32: a restart limit changed from its default while auto restart is off. The
    limit then counts only the restarts after hardware faults: a worker that crashes or
    hangs fails the task at once, which the limit's author rarely means."""
    ft = spec.fault_tolerance
    if ft.auto_restart or ft.max_restarts in (0, _DEFAULT_MAX_RESTARTS):
        return []
    return [
        SubmissionWarning(
            code=WarningCode.RESTARTS_WITHOUT_AUTO_RESTART,
            field="fault_tolerance.max_restarts",
            message=(
                f"max_restarts is {ft.max_restarts} but auto_restart is off: a worker that "
                "crashes or hangs fails the task without a restart (the limit counts only "
                "restarts after hardware faults); set fault_tolerance.auto_restart: true "
                "to restart on failures"
            ),
        )
    ]


def worker_warnings(spec: TaskSpec) -> list[SubmissionWarning]:
    """R-04: a custom GPU count over 8 that leaves one worker with fewer GPUs than the others."""
    if spec.custom_gpus is None or spec.custom_gpus <= 8 or spec.custom_gpus % 8 == 0:
        return []
    sizes = " + ".join(str(g) for g in spec.worker_gpus())
    return [
        SubmissionWarning(
            code=WarningCode.WORKERS_UNEVEN_GPUS,
            field="custom_gpus",
            message=(
                f"custom GPU count {spec.custom_gpus} makes workers of {sizes} GPUs: "
                "make sure the training code handles workers with different GPU counts"
            ),
        )
    ]
