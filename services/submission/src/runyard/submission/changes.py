"""New specs from old ones: rerun with changes, clone, task groups (R-16, R-17).

These only build the new spec; run `check_spec` on it before accepting it
(a changed image is checked again: editing the launch command or the image
never bypasses R-11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from runyard.contracts.requests import FIELD_LABELS
from runyard.contracts.resources import Catalogue, PoolView
from runyard.contracts.spec import (
    MASK,
    MAX_GROUP_SIZE,
    EnvVar,
    TaskSpec,
    mask_alerts,
    mask_env,
)
from runyard.domain import RERUN_CHANGEABLE
from runyard.submission.env import parse_env
from runyard.submission.errors import (
    ChangeError,
    ErrorCode,
    GroupItemError,
    SpecError,
    SubmissionError,
)
from runyard.submission.rules import WebhookRule, check_name, check_size, check_spec
from runyard.submission.warnings import SubmissionWarning

#: All the specs of one task group together, JSON-encoded (they are written in one
#: transaction, one event each).
MAX_GROUP_BYTES = 16 * 1024 * 1024


def rerun_with_changes(original: TaskSpec, changes: Mapping[str, Any]) -> TaskSpec:
    """The spec of a rerun with changes: only command, worker spec/count and image may differ.

    A field sent with its current value (or, for `env`, its masked value) is
    not a change. Anything else raises `ChangeError` naming the field, with
    the hint to use clone.
    """
    for field, value in changes.items():
        _require_known(field)
        if field not in RERUN_CHANGEABLE and not _unchanged(original, field, value):
            label = FIELD_LABELS.get(field, field.replace("_", " "))
            raise ChangeError(
                ErrorCode.RERUN_FIELD_NOT_CHANGEABLE,
                field,
                f"a rerun with changes cannot change the {label}",
                f"use clone to change the {label}",
            )
    allowed = {k: v for k, v in changes.items() if k in RERUN_CHANGEABLE}
    return _apply(original, allowed)


def clone_spec(
    spec: TaskSpec, overrides: Mapping[str, Any], *, by_creator: bool = False
) -> TaskSpec:
    """A new task's spec copied from `spec`, where any field may be overridden, the pool too.

    `env` may be given as `A=x;B=y` text. Creator-only values are copied only
    when the one cloning is their creator (`by_creator`); otherwise they are
    left empty and `check_spec` asks for a value (`env.missing_value`). A
    masked value (`******`) sent back stands for the value it hides.
    """
    for field in overrides:
        _require_known(field)
    source = spec if by_creator else _without_creator_only_values(spec)
    updates = dict(overrides)
    if "env" in updates:
        updates["env"] = _unmask(_env_override(updates["env"]), source.env)
    return _apply(source, updates)


def expand_group(template: TaskSpec, overrides_list: Sequence[Mapping[str, Any]]) -> list[TaskSpec]:
    """R-17: one spec per item, each the template with that item's overrides.

    The template comes from the submitter, so its creator-only values are
    kept. Raises `GroupItemError` for an empty or oversized group, or for the
    first item whose overrides are refused (its `item` is the index).
    """
    _check_group_size(len(overrides_list))
    specs: list[TaskSpec] = []
    for i, overrides in enumerate(overrides_list):
        try:
            specs.append(clone_spec(template, overrides, by_creator=True))
        except SubmissionError as e:
            raise GroupItemError.wrap(i, e) from e
    return specs


def check_group(
    specs: Sequence[TaskSpec],
    catalogue: Catalogue,
    pools: Mapping[str, PoolView],
    *,
    webhooks: WebhookRule | None = None,
) -> list[list[SubmissionWarning]]:
    """`check_spec` on every item of a group; the first refusal names its item index.

    Items usually differ only in name, description or tags, which no rule but
    `name.blank` and the size check reads: the rules run once per distinct rest
    of the spec, so a long launch command shared by 1000 items is checked once,
    not 1000 times. The group's specs together are bounded (`MAX_GROUP_BYTES`).
    """
    _check_group_bytes(specs)
    warnings: list[list[SubmissionWarning]] = []
    checked: dict[str, list[SubmissionWarning]] = {}
    for i, spec in enumerate(specs):
        key = _rules_key(spec)
        try:
            if key not in checked:
                pool = pools.get(spec.pool)
                checked[key] = check_spec(spec, catalogue, pool, webhooks=webhooks)
            else:
                check_size(spec)
                check_name(spec)
        except SubmissionError as e:
            raise GroupItemError.wrap(i, e) from e
        warnings.append(list(checked[key]))
    return warnings


def _rules_key(spec: TaskSpec) -> str:
    """The spec without the fields only `name.blank` and the size check read."""
    return spec.model_copy(update={"name": "-", "description": "", "tags": ()}).model_dump_json()


def _check_group_bytes(specs: Sequence[TaskSpec]) -> None:
    size = sum(len(spec.model_dump_json()) for spec in specs)
    if size > MAX_GROUP_BYTES:
        raise GroupItemError(
            ErrorCode.GROUP_TOO_LARGE,
            "items",
            f"the task group's specs take {size} bytes in all, at most {MAX_GROUP_BYTES} "
            "are allowed",
            "put a long launch command in a script on a volume or in the image, or split the group",
        )


def _check_group_size(size: int) -> None:
    if size == 0:
        raise GroupItemError(
            ErrorCode.GROUP_EMPTY,
            "items",
            "the task group has no items",
            "give at least one item of overrides (an empty item {} is the template itself)",
        )
    if size > MAX_GROUP_SIZE:
        raise GroupItemError(
            ErrorCode.GROUP_TOO_LARGE,
            "items",
            f"the task group has {size} items, at most {MAX_GROUP_SIZE} are allowed",
            f"split the group into groups of at most {MAX_GROUP_SIZE} items",
        )


def _require_known(field: str) -> None:
    if field not in TaskSpec.model_fields:
        raise ChangeError(
            ErrorCode.SPEC_UNKNOWN_FIELD,
            field,
            f"a task spec has no field `{field}`",
            "check the field name against the task spec",
        )


def _unchanged(original: TaskSpec, field: str, value: Any) -> bool:
    try:
        candidate = getattr(_apply(original, {field: value}), field)
    except SubmissionError:
        return False
    current = getattr(original, field)
    return bool(candidate == current or (field == "env" and candidate == mask_env(current)))


def _apply(spec: TaskSpec, updates: Mapping[str, Any]) -> TaskSpec:
    """Validate `spec` with `updates`; switching to/from a custom GPU count clears the other."""
    data: dict[str, Any] = {**spec.model_dump(), **_switch_mode(updates)}
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as e:
        raise _invalid(e) from e


def _switch_mode(updates: Mapping[str, Any]) -> dict[str, Any]:
    switched = dict(updates)
    if switched.get("worker_spec") is not None and "custom_gpus" not in switched:
        switched["custom_gpus"] = None
    if switched.get("custom_gpus") is not None and "worker_spec" not in switched:
        switched["worker_spec"] = None
        switched.setdefault("worker_count", 1)
    return switched


def _invalid(error: ValidationError) -> SpecError:
    first = error.errors()[0]
    field = _field_path(first["loc"])
    return SpecError(
        ErrorCode.SPEC_INVALID,
        field,
        f"{field}: {first['msg']}",
        f"fix {field} and try again",
    )


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.lstrip(".") or "spec"


def _env_override(value: Any) -> Any:
    return parse_env(value) if isinstance(value, str) else value


def _without_creator_only_values(spec: TaskSpec) -> TaskSpec:
    """`spec` as another user clones it: no creator-only value, and the alerts' webhooks
    masked (their tokens are the creator's), so that the rules ask for new ones."""
    env = tuple(
        v.model_copy(update={"value": None, "secret_ref": None}) if v.creator_only else v
        for v in spec.env
    )
    return spec.model_copy(update={"env": env, "alerts": mask_alerts(spec.alerts)})


def _unmask(env: Any, source: tuple[EnvVar, ...]) -> Any:
    """Replace masked creator-only values sent back by the value (or gap) in `source`;
    a new value for a variable that is creator-only in `source` stays creator-only (a
    clone that gives its own key keeps it out of the spec that every member reads)."""
    if not isinstance(env, list | tuple):
        return env
    hidden = {v.name: v for v in source if v.creator_only}
    return [_unmask_one(item, hidden) for item in env]


def _unmask_one(item: Any, hidden: Mapping[str, EnvVar]) -> Any:
    data = item.model_dump() if isinstance(item, EnvVar) else item
    if not isinstance(data, Mapping):
        return item
    original = hidden.get(str(data.get("name")))
    if original is None:
        return item
    if data.get("value") != MASK:
        return {**data, "creator_only": True}
    return {
        **data,
        "value": original.value,
        "secret_ref": original.secret_ref,
        "creator_only": True,
    }
