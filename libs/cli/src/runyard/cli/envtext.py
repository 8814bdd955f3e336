"""An environment variable's value is text: in a task file or a `--set`, one written as a
number or a boolean (`value: 3`, `value: 1.50`, `value: true`) is read as the text it is
written as ("3", "1.50", "true"), not as the number or boolean YAML would make of it
(which the gateway refuses: `env.0.value: Input should be a valid string`). Only the
`value` of an item of a list under an `env` key is read so, at any depth (a task
file's `env`, a group's `template.env` and each item's); every other field keeps
YAML's types (`runyard.contracts.yamlcore`: YAML 1.2's booleans and numbers)."""

from __future__ import annotations

from typing import Any

import yaml
from runyard.contracts.yamlcore import CoreLoader

__all__ = ["EnvListLoader", "EnvTextLoader", "load_env"]

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_TYPED = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float"))


class EnvTextLoader(CoreLoader):
    """`CoreLoader`, with each env variable's value read as text (see the module)."""

    def construct_document(self, node: yaml.Node) -> Any:
        _find_env(node, set())
        return super().construct_document(node)


class EnvListLoader(EnvTextLoader):
    """`EnvTextLoader` for a document that is itself an `env` list (`--set env=[...]`)."""

    def construct_document(self, node: yaml.Node) -> Any:
        _values_as_text(node)
        return super().construct_document(node)


def load_env(text: str) -> Any:
    """`text`, the value of `--set env=...`, as YAML with its values as text."""
    return yaml.load(text, Loader=EnvListLoader)  # a SafeLoader


def _find_env(node: yaml.Node, seen: set[int]) -> None:
    """Mark the values under each `env` key of `node` as text (a node an alias repeats
    is looked at once)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag == _STR and key.value == "env":
                _values_as_text(value)
            _find_env(value, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _find_env(item, seen)


def _values_as_text(node: yaml.Node) -> None:
    """In a list of {name, value}, each `value` written as a number or boolean: text."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _item_value_as_text(item, depth=0)


def _item_value_as_text(item: yaml.Node, depth: int) -> None:
    if depth > 8:  # merges of merges: far past any task file
        return
    if isinstance(item, yaml.SequenceNode):  # `<<: [*a, *b]`
        for each in item.value:
            _item_value_as_text(each, depth + 1)
    if not isinstance(item, yaml.MappingNode):
        return
    for key, value in item.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        if key.tag == _MERGE:
            _item_value_as_text(value, depth + 1)
        elif key.value == "value" and isinstance(value, yaml.ScalarNode) and value.tag in _TYPED:
            value.tag = _STR
