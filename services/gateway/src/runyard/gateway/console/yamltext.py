"""Text a person typed as YAML in the console (a task group, a task's whole spec, a
what-if's pools), read in the gateway: what cannot be read is a 400 with the page's
code, never a 500 (text nested past Python's recursion, a number of thousands of
digits), and what is more than the API takes is a 413, its aliases written out (`*name`
repeats what it names: a few lines could stand for gigabytes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from runyard.api.errors import BadRequest, PayloadTooLarge
from runyard.api.inputs import MAX_BODY_BYTES
from runyard.contracts import yamlcore


def load(
    text: str,
    *,
    code: str,
    what: str,
    hint: str,
    field: str,
    loader: Callable[[str], Any] = yamlcore.load,
) -> Any:
    """`text` read by `loader` (a safe loader: no `!!python/...` tags); 400 `code` when it
    cannot be read, 413 `request.too_large` when it is over `MAX_BODY_BYTES` as JSON."""
    try:
        loaded = loader(text)
    except yaml.YAMLError as exc:
        raise BadRequest(code, f"{what} is not YAML: {exc}", hint, field) from exc
    except RecursionError as exc:
        raise BadRequest(code, f"{what} is nested too deeply to read", hint, field) from exc
    except ValueError as exc:  # a number of thousands of digits
        raise BadRequest(
            code, f"{what} has a value that cannot be read: {exc}", hint, field
        ) from exc
    if over(loaded, MAX_BODY_BYTES):
        raise PayloadTooLarge(
            "request.too_large",
            f"{what} is over {MAX_BODY_BYTES} bytes as the API takes it (JSON),"
            " with every alias (*name) written out",
            "keep to what the API takes: long commands in a script on a volume or in the"
            " image, fewer items (see docs/limits.md)",
            field,
        )
    return loaded


def load_mapping(text: str, *, code: str, what: str, hint: str, field: str, shape: str) -> Any:
    """`load`, and a 400 `code` unless it read a mapping (`shape` says which fields, e.g.
    "`template:` and `items:`")."""
    loaded = load(text, code=code, what=what, hint=hint, field=field)
    if not isinstance(loaded, dict):
        raise BadRequest(
            code,
            f"{what} must be a mapping of fields: {shape}",
            "start from the text the page opened with",
            field,
        )
    return loaded


def over(data: Any, limit: int) -> bool:
    """Whether `data` (YAML read into lists, mappings and scalars) is over `limit` bytes
    as JSON, an alias counted each time it is used; it stops counting at the limit, so
    an alias of an alias of ... costs no more than the limit to count."""
    size, stack = 0, [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            size += 2 + 2 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set):
            size += 2 + len(item)
            stack.extend(item)
        elif isinstance(item, str | bytes):
            size += 2 + len(item.encode() if isinstance(item, str) else item)
        elif isinstance(item, int):
            size += item.bit_length() // 3 + 2
        else:
            size += 32  # a float, a date, None
        if size > limit:
            return True
    return False
