"""`--set FIELD=VALUE`: change a task spec's field on the command line.

    runyard submit -f hello.yaml --set worker_count=2 --set framework=pytorch_ddp
    runyard clone ID --set pool=dev-spot --set resource_type=spot
    runyard clone ID --set fault_tolerance.auto_restart=true

A nested field is named by its path (`fault_tolerance.max_restarts`); the other
fields of that object are kept (from the file, or from the cloned task's spec).
The value is read as YAML when it is a number, `true`/`false`, `null`, or a
flow list or mapping (`[a, b]`, `{x: 1}`); anything else is text as given, so
`--set command=echo a: b` sets that command. A list (`env`, `tags`, ...) is set
whole (`--set 'env=A=1;B=2'`, `--set 'env=[{name: A, value: 3}]'`, its values text);
a path into one is refused. The gateway checks the
result as it checks any spec, and names a field it does not know.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from runyard.cli.envtext import load_env
from runyard.contracts.yamlcore import load

__all__ = ["SettingError", "apply_settings", "sets_nested"]

#: The most `--set` options one command takes, and the deepest path.
MAX_SETTINGS = 100
MAX_DEPTH = 8


class SettingError(ValueError):
    """A `--set` the CLI cannot apply: `hint` says what to write instead."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def apply_settings(
    base: Mapping[str, Any], settings: Sequence[str], current: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`base` (a task file's fields, or a clone's overrides) with each `FIELD=VALUE` of
    `settings` applied in order. A nested field starts from `base`'s object, else from
    `current`'s (the spec being cloned), so its other fields stay as they were."""
    if len(settings) > MAX_SETTINGS:
        raise SettingError(
            f"{len(settings)} --set options, at most {MAX_SETTINGS}", "put the fields in a file"
        )
    result = copy.deepcopy(dict(base))
    for setting in settings:
        path, value = _parse(setting)
        top = path[0]
        if len(path) > 1:
            _require_object(setting, top, result.get(top, (current or {}).get(top)))
        if len(path) > 1 and not isinstance(result.get(top), dict):
            start = (current or {}).get(top)
            result[top] = copy.deepcopy(dict(start)) if isinstance(start, Mapping) else {}
        target = result
        for depth, key in enumerate(path[:-1]):
            inner = target.get(key)
            if not isinstance(inner, dict):
                if inner is not None and depth > 0:
                    shown = ".".join(path[: depth + 1])
                    raise SettingError(
                        f"--set {_clip(setting)}: {shown} is not an object",
                        f"set {shown} itself",
                    )
                inner = target[key] = {}
            target = inner
        target[path[-1]] = value
    return result


#: The spec's fields that hold a list (or the `A=x;B=y` text of `env`), not an object.
LIST_FIELDS = frozenset({"env", "creator_only", "tags", "mounts", "output_dirs", "alerts"})


def _require_object(setting: str, top: str, value: Any) -> None:
    """Refuse a path into a field that holds a list or text: it has no fields to set (the
    gateway would refuse the object made of it, or the list would be lost)."""
    if top not in LIST_FIELDS and not isinstance(value, list | tuple | str):
        return
    example = "'env=A=1;B=2'" if top == "env" else f"'{top}=[...]'"
    kind = "text" if isinstance(value, str) and top not in LIST_FIELDS else "a list"
    raise SettingError(
        f"--set {_clip(setting)}: {top} is {kind}, not an object with fields",
        f"set {top} whole, e.g. --set {example} (it replaces the list), or in the file",
    )


def sets_nested(settings: Sequence[str]) -> bool:
    """Whether any of `settings` names a nested field (its object's other fields are
    then needed: `apply_settings`'s `current`)."""
    return any("." in setting.partition("=")[0] for setting in settings)


def _parse(setting: str) -> tuple[list[str], Any]:
    name, sep, raw = setting.partition("=")
    path = name.strip().split(".")
    if not sep or not all(part.strip() for part in path):
        raise SettingError(
            f"--set {_clip(setting)}: expected FIELD=VALUE",
            "e.g. --set worker_count=2 or --set fault_tolerance.auto_restart=true",
        )
    if len(path) > MAX_DEPTH:
        raise SettingError(
            f"--set {_clip(setting)}: a path of {len(path)} fields, at most {MAX_DEPTH}",
            "name the field by its path from the spec's top",
        )
    fields = [part.strip() for part in path]
    return fields, _value(raw, env=fields == ["env"])


def _value(raw: str, *, env: bool = False) -> Any:
    """A number, a boolean (`true`, `false`), null, or a flow list or mapping as YAML
    (1.2: `no`, `off` are text, `runyard.contracts.yamlcore`); else the text. `env`: the
    values of an env list are text (`value: 3` is "3", `runyard.cli.envtext`)."""
    try:
        value = load_env(raw) if env else load(raw)
    except yaml.YAMLError:
        return raw
    stripped = raw.strip()
    if isinstance(value, (list, dict)) and not stripped.startswith(("[", "{")):
        return raw  # `echo a: b` is a command, not a mapping
    if isinstance(value, (bool, int, float, list, dict)) or (value is None and stripped in _NULLS):
        return value
    return raw


_NULLS = ("null", "~", "Null", "NULL")


def _clip(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
