"""Environment variables of a task (R-12): parsing, checks and creator-only masking.

The web/API form is `A=x;B=y;RUN_ID=exp-001`. Pairs are split on `;`, each
pair on its first `=` (so a value may contain `=` but not `;`; use the
structured `env` list of the API for such values). Blank pairs, such as a
trailing `;`, are ignored.

Precedence when a name is set in several places: training code > launch
command > web/API variables. The platform only sets the last.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from runyard.contracts.spec import EnvVar, Framework, TaskSpec
from runyard.submission.errors import EnvError, ErrorCode

#: What every API answer shows instead of a creator-only value.
MASK = "******"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Variables the platform injects per framework (R-15); a user value would be wrong.
#: MASTER_PORT is not here: a user value replaces the default 29500.
FRAMEWORK_ENV: dict[Framework, frozenset[str]] = {
    "single": frozenset(),
    "pytorch_ddp": frozenset({"MASTER_ADDR", "WORLD_SIZE", "RANK"}),
    "mpi": frozenset(),
    "ray": frozenset(),
}

_NAME_HINT = "names start with a letter or _ and contain only letters, digits and _"


def parse_env(text: str, *, creator_only: Collection[str] = ()) -> tuple[EnvVar, ...]:
    """Parse `A=x;B=y` into variables; names in `creator_only` are marked creator-only.

    Raises `EnvError` naming the offending pair: `env.malformed_pair` (no `=`
    or no name), `env.invalid_name`, `env.duplicate`, `env.invalid_value`, or
    `env.creator_only_unknown` for a creator-only name that is not set.
    """
    variables = tuple(_parse_pair(pair) for pair in _pairs(text))
    _check_unique(v.name for v in variables)
    _check_creator_only_known(creator_only, {v.name for v in variables})
    return tuple(
        v.model_copy(update={"creator_only": True}) if v.name in creator_only else v
        for v in variables
    )


def _pairs(text: str) -> list[str]:
    return [pair.strip() for pair in text.split(";") if pair.strip()]


def _parse_pair(pair: str) -> EnvVar:
    name, sep, value = pair.partition("=")
    name = name.strip()
    if not sep or not name:
        raise EnvError(
            ErrorCode.ENV_MALFORMED_PAIR,
            "env",
            f"`{pair}` is not a NAME=value pair",
            "write variables as NAME=value pairs separated by `;`, e.g. A=x;B=y",
        )
    check_name(name, "env")
    check_value(name, value, "env")
    return EnvVar(name=name, value=value)


def check_name(name: str, field: str) -> None:
    """Refuse a variable name that a shell cannot export (`env.invalid_name`)."""
    if not _NAME.fullmatch(name):
        raise EnvError(
            ErrorCode.ENV_INVALID_NAME,
            field,
            f"`{name}` is not a valid environment variable name",
            _NAME_HINT,
        )


def check_value(name: str, value: str, field: str) -> None:
    """Refuse a value that no process environment can hold (a NUL byte)."""
    if "\x00" in value:
        raise EnvError(
            ErrorCode.ENV_INVALID_VALUE,
            field,
            f"the value of `{name}` contains a NUL character",
            f"remove the NUL character from the value of {name}",
        )


def _check_unique(names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise EnvError(
                ErrorCode.ENV_DUPLICATE,
                "env",
                f"`{name}` is set more than once",
                f"keep one value for {name}",
            )
        seen.add(name)


def _check_creator_only_known(creator_only: Collection[str], names: set[str]) -> None:
    unknown = sorted(set(creator_only) - names)
    if unknown:
        raise EnvError(
            ErrorCode.ENV_CREATOR_ONLY_UNKNOWN,
            "env",
            f"creator-only variable(s) {', '.join(unknown)} are not set",
            "mark only variables that are set as creator-only",
        )


def check_env(spec: TaskSpec) -> None:
    """R-12 on a structured spec: valid, unique, reserved-free names, and a value for each."""
    _check_unique(v.name for v in spec.env)
    reserved = FRAMEWORK_ENV[spec.framework]
    for i, var in enumerate(spec.env):
        field = f"env[{i}]"
        check_name(var.name, f"{field}.name")
        _check_not_reserved(var.name, reserved, spec.framework, f"{field}.name")
        _check_has_value(var, f"{field}.value")


def _check_not_reserved(name: str, reserved: frozenset[str], framework: str, field: str) -> None:
    if name in reserved:
        raise EnvError(
            ErrorCode.ENV_RESERVED_NAME,
            field,
            f"`{name}` is injected by the platform for {framework} tasks",
            f"remove {name}: the platform sets MASTER_ADDR, WORLD_SIZE and RANK for each worker",
        )


def _check_has_value(var: EnvVar, field: str) -> None:
    if var.value is None and var.secret_ref is None:
        raise EnvError(
            ErrorCode.ENV_MISSING_VALUE,
            field,
            f"`{var.name}` has no value",
            f"set a value for {var.name} (a clone by another user does not copy "
            "creator-only values)",
        )
    if var.value is not None:
        check_value(var.name, var.value, field)


def mask_spec(spec: TaskSpec, viewer_is_creator: bool) -> TaskSpec:
    """The spec as `viewer` may see it: creator-only values shown as `******` to others.

    Every API answer that carries a spec goes through this.
    """
    if viewer_is_creator or not any(v.creator_only for v in spec.env):
        return spec
    return spec.model_copy(update={"env": mask_env(spec.env)})


def mask_env(env: tuple[EnvVar, ...]) -> tuple[EnvVar, ...]:
    """Variables with creator-only values (and their secret references) hidden."""
    return tuple(
        v.model_copy(update={"value": MASK, "secret_ref": None}) if v.creator_only else v
        for v in env
    )
