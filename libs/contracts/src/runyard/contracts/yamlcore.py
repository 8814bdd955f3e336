"""YAML read as a task file means it: `true` and `false` are its only booleans.

PyYAML reads YAML 1.1, where `yes`, `no`, `on` and `off` (in three cases) are
booleans as well, `010` is the octal number 8 and `1:30` the base-60 number 90.
In a task file these are text more often than not: `value: no` of an env
variable, a tag `on`, a description `off`, a key `on:`. Read as YAML 1.1 the
gateway refused them (`env.0.value: Input should be a valid string`) or named a
field `True`. `CoreLoader` is `yaml.SafeLoader` with the YAML 1.2 core schema's
forms of booleans and numbers: these stay text. A boolean field given `yes`,
`no`, `on` or `off` as text still gets its boolean (the API reads those words
as booleans), and a number field given `010` the number 10.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import yaml

_BOOL, _INT, _FLOAT = (f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float"))
#: YAML 1.2's core schema: no octal `0NN` (`0o` is not YAML 1.1's either), no base 60.
_CORE = {
    _BOOL: (re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF"),
    _INT: (
        re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
        "-+0123456789",
    ),
    _FLOAT: (
        re.compile(
            r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?"
            r"|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        "-+0123456789.",
    ),
}


class CoreLoader(yaml.SafeLoader):  # type: ignore[misc]
    """`yaml.SafeLoader` with YAML 1.2's booleans and numbers (see the module)."""

    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _CORE]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


for _tag, (_regexp, _first) in _CORE.items():
    CoreLoader.add_implicit_resolver(_tag, _regexp, list(_first))


def load(text: str) -> Any:
    """`text` as YAML with `CoreLoader` (a safe loader)."""
    return yaml.load(text, Loader=CoreLoader)  # a SafeLoader
