"""`--set FIELD=VALUE` on the command line (runyard.cli.settings)."""

from __future__ import annotations

from typing import Any

import pytest
from runyard.cli.settings import MAX_SETTINGS, SettingError, apply_settings


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("worker_count=2", 2),
        ("priority=-1", -1),
        ("rdma=true", True),
        ("tags=[a, b]", ["a", "b"]),
        ("alerts={}", {}),
        ("hang=null", None),
        ("name=123abc", "123abc"),
        ("command=echo a: b", "echo a: b"),  # text, not a mapping
        ("command=- x", "- x"),  # text, not a list
        ("env=A=1;B=2", "A=1;B=2"),  # the first = ends the field's name
        ("description=", ""),
        ("image=pytorch:2.3-cuda12", "pytorch:2.3-cuda12"),
        ("start=2026-01-01", "2026-01-01"),  # a date stays text
        ("command=[unclosed", "[unclosed"),  # not YAML: text
    ],
)
def test_values_are_yaml_scalars_and_flow_collections_else_text(setting: str, value: Any) -> None:
    field = setting.partition("=")[0]
    assert apply_settings({}, [setting]) == {field: value}


def test_a_nested_field_keeps_its_objects_other_fields() -> None:
    current: dict[str, Any] = {
        "fault_tolerance": {"auto_restart": False, "max_restarts": 3},
        "pool": "p",
    }
    got = apply_settings({}, ["fault_tolerance.auto_restart=true"], current)
    assert got == {"fault_tolerance": {"auto_restart": True, "max_restarts": 3}}
    assert current["fault_tolerance"]["auto_restart"] is False  # not changed in place

    from_file = {"fault_tolerance": {"max_restarts": 1}, "name": "n"}
    got = apply_settings(from_file, ["fault_tolerance.auto_restart=true", "name=m"], current)
    assert got == {"fault_tolerance": {"max_restarts": 1, "auto_restart": True}, "name": "m"}
    assert from_file == {"fault_tolerance": {"max_restarts": 1}, "name": "n"}


def test_later_settings_win_and_deeper_paths_are_made() -> None:
    got = apply_settings({"a": 1}, ["a=2", "a=3", "x.y.z=1"])
    assert got == {"a": 3, "x": {"y": {"z": 1}}}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["pool"], "--set pool: expected FIELD=VALUE"),
        (["=x"], "expected FIELD=VALUE"),
        (["a..b=1"], "expected FIELD=VALUE"),
        (["a.b=1", "a.b.c=2"], "a.b is not an object"),
        (["env.API_KEY=x"], "env is a list, not an object with fields"),
        (["tags.0=x"], "tags is a list, not an object with fields"),
        (["cmd=[a, b]", "cmd.x=1"], "cmd is a list, not an object with fields"),
        ([".".join("abcdefghi") + "=1"], "a path of 9 fields, at most 8"),
        (["a=1"] * (MAX_SETTINGS + 1), f"at most {MAX_SETTINGS}"),
    ],
)
def test_a_setting_that_cannot_apply_says_why(settings: list[str], message: str) -> None:
    with pytest.raises(SettingError, match=message.replace(".", r"\.")) as caught:
        apply_settings({}, settings)
    assert caught.value.hint


def test_a_field_into_a_list_of_the_file_or_the_cloned_spec_is_refused() -> None:
    """The file's variables (text or list) or the cloned task's are not lost to an object
    made of `env.NAME=value`: the setting is refused with how to set the list whole."""
    for base, current in (({"env": "A=1"}, None), ({}, {"env": [{"name": "A", "value": "1"}]})):
        with pytest.raises(SettingError, match="env is a list") as caught:
            apply_settings(base, ["env.B=2"], current)
        assert "--set 'env=A=1;B=2'" in caught.value.hint
