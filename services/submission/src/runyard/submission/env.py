"""Environment variables of a task (R-12): parsing and checks.

Masking creator-only values is the spec's own (`runyard.contracts.spec.mask_spec`):
every service that answers a spec needs it.

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

from runyard.contracts.spec import MAX_ENV_BYTES, EnvVar, TaskSpec
from runyard.submission.errors import EnvError, ErrorCode

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Variables the platform sets in every worker (R-15, docs/submission-rules.md). A user
#: value would replace the platform's: point a worker at the wrong GPUs or rank, name
#: another task, or break the wrapper that starts the launch command (`PATH=x` leaves
#: no shell to run it). MASTER_PORT is not here: a user value replaces the default 29500.
RESERVED_ENV: dict[str, str] = {
    **dict.fromkeys(
        ("MASTER_ADDR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE"),
        "the platform sets the distributed training variables for each worker",
    ),
    **dict.fromkeys(
        ("OMPI_MCA_orte_default_hostfile", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "RAY_ADDRESS"),
        "the platform sets the MPI and Ray variables for each worker",
    ),
    **dict.fromkeys(
        ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
        "the platform sets the visible GPUs to the ones placed for each worker",
    ),
    **dict.fromkeys(
        ("PATH", "HOME", "TMPDIR", "PWD", "USER", "SHELL", "VIRTUAL_ENV"),
        "the platform sets it for the worker; change it inside the launch command "
        "instead, e.g. `export PATH=/my/bin:$PATH; python train.py`",
    ),
    **dict.fromkeys(
        ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PS4", "PROMPT_COMMAND"),
        "it changes how the platform's shell starts the launch command; "
        "put what it should do at the top of the launch command instead",
    ),
    **dict.fromkeys(
        ("LD_PRELOAD", "LD_AUDIT", "PYTHONSTARTUP", "PYTHONHOME"),
        "it changes the platform's own processes in the worker; "
        "set it inside the launch command for your program only",
    ),
}
#: Name prefixes the platform keeps for itself.
RESERVED_ENV_PREFIXES: dict[str, str] = {
    "RUNYARD_": "RUNYARD_ variables are set by the platform (task id, run, worker, mounts)",
    "OMPI_COMM_WORLD_": "the MPI launcher sets the OMPI_COMM_WORLD_ variables for each rank",
    "BASH_FUNC_": "exported shell functions change how the platform's shell runs",
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
    """Refuse a value that no process environment can hold (a NUL byte, or text that
    is not Unicode: a lone surrogate such as `\\ud800` from JSON)."""
    if "\x00" in value:
        raise EnvError(
            ErrorCode.ENV_INVALID_VALUE,
            field,
            f"the value of `{name}` contains a NUL character",
            f"remove the NUL character from the value of {name}",
        )
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise EnvError(
            ErrorCode.ENV_INVALID_VALUE,
            field,
            f"the value of `{name}` holds a lone surrogate at character {exc.start}",
            f"send the value of {name} as valid UTF-8 text",
        ) from exc


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
    for i, var in enumerate(spec.env):
        field = f"env[{i}]"
        check_name(var.name, f"{field}.name")
        check_not_reserved(var.name, f"{field}.name")
        _check_has_value(var, f"{field}.value")
    _check_total_size(spec.env)


def reserved_reason(name: str) -> str | None:
    """Why the platform keeps `name` for itself, or None when a task may set it."""
    if name in RESERVED_ENV:
        return RESERVED_ENV[name]
    return next((why for p, why in RESERVED_ENV_PREFIXES.items() if name.startswith(p)), None)


def check_not_reserved(name: str, field: str) -> None:
    """Refuse a variable the platform sets in every worker (`env.reserved_name`)."""
    reason = reserved_reason(name)
    if reason is not None:
        raise EnvError(
            ErrorCode.ENV_RESERVED_NAME,
            field,
            f"`{name}` is set by the platform and cannot be a task variable",
            f"remove {name}: {reason}",
        )


def _check_total_size(env: tuple[EnvVar, ...]) -> None:
    size = sum(len(v.name.encode()) + len((v.value or "").encode()) for v in env)
    if size > MAX_ENV_BYTES:
        raise EnvError(
            ErrorCode.ENV_TOO_LARGE,
            "env",
            f"the task's variables take {size} bytes, at most {MAX_ENV_BYTES} are allowed",
            "pass large values as files on a mounted volume, and their paths as variables",
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
