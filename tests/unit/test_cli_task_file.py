"""Reading a task file (`runyard submit -f`, `clone -f`, `group create -f`): what a
file that is not a task spec is answered with, before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from runyard.cli.main import app, load_yaml
from typer.testing import CliRunner

SPEC = "name: x\npool: dev-a100\nworker_spec: 1gpu\nimage: pytorch:2.3\n"


def submit(tmp_path: Path, text: str, name: str = "task.yaml") -> tuple[int, str]:
    path = tmp_path / name
    path.write_text(text)
    # No gateway listens there: a file refused here never reaches one.
    done = CliRunner().invoke(app, ["submit", "-f", str(path), "--url", "http://127.0.0.1:9"])
    return done.exit_code, " ".join(done.output.split())


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            SPEC + "command: sleep 1\ncommand: echo hi\n",
            "line 6, column 1: 'command' is given twice (first at line 5): keep one"
            " (in the mapping from line 1, column 1)",
        ),
        (
            SPEC + "fault_tolerance: {env_check: true, env_check: false}\n",
            "line 5, column 36: 'env_check' is given twice (first at line 5): keep one",
        ),
        (
            "name: [x\n",
            "line 2, column 1: expected ',' or ']', but got '<stream end>'"
            " (while parsing a flow sequence from line 1, column 7)",
        ),
        ("name: x\n  pool: y\n", "line 2, column 7: mapping values are not allowed here"),
    ],
)
def test_a_file_that_is_not_yaml_is_refused_saying_where(
    tmp_path: Path, text: str, says: str
) -> None:
    code, output = submit(tmp_path, text)
    assert code == 2, output
    assert "task.yaml is not valid YAML: " + says in output
    assert "hint: fix it there" in output
    assert "\\n" not in output  # one readable line, not an escaped repr


def test_json_is_named_json(tmp_path: Path) -> None:
    code, output = submit(tmp_path, '{"name": "a", "name": "b"}', "task.json")
    assert code == 2 and "task.json is not valid JSON: line 1, column 15: 'name'" in output


def test_a_merge_may_give_a_key_again(tmp_path: Path) -> None:
    path = tmp_path / "merged.yaml"
    path.write_text("base: &b {pool: a, name: from-base}\nmerged:\n  <<: *b\n  name: own\n")
    assert load_yaml(path)["merged"] == {"pool": "a", "name": "own"}


def test_a_file_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    (tmp_path / "bytes.yaml").write_bytes(b"\xff\xfe")
    for name in ("missing.yaml", "bytes.yaml"):
        done = CliRunner().invoke(app, ["submit", "-f", str(tmp_path / name)])
        assert done.exit_code == 2 and "cannot read" in done.output, done.output
    code, output = submit(tmp_path, "")
    assert code == 2 and "expected a mapping of task spec fields" in output


def test_a_group_file_given_to_submit_and_a_spec_to_group_create_name_the_command(
    tmp_path: Path,
) -> None:
    group = tmp_path / "group.yaml"
    group.write_text("template:\n  name: x\n  pool: dev-a100\nitems:\n  - {name: a}\n")
    code, said = submit(tmp_path, group.read_text(), "group.yaml")
    assert code == 2
    assert "holds a task group (template and items)" in said
    assert f"hint: runyard group create -f {group}" in said

    spec = tmp_path / "task.yaml"
    spec.write_text(SPEC + "command: echo hi\n")
    url = ["--url", "http://127.0.0.1:9"]
    done = CliRunner().invoke(app, ["group", "create", "-f", str(spec), *url])
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and "holds one task's spec" in said
    assert f"hint: runyard submit -f {spec}, or put the spec under template:" in said


BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n"
    for prev, name in zip("abcdefg", "bcdefgh", strict=True)
)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # YAML aliases: 10**8 copies of "x" once built into JSON (gigabytes, minutes)
        ('a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + BOMB, "is more than"),
        ("name: " + "[" * 5000 + "]" * 5000 + "\n", "is nested deeper than 32 levels"),
        ("name: " + "[" * 40 + "]" * 40 + "\n", "is nested deeper than 32 levels"),
        (SPEC + "description: " + "d" * (1024 * 1024) + "\n", "is more than 1048576 bytes"),
    ],
)
def test_a_file_over_a_request_bodys_bounds_is_refused_before_it_is_built(
    tmp_path: Path, text: str, says: str
) -> None:
    """Found by hand: the alias file took 1.4 GB and 30 s to be refused by the gateway;
    a file nested 5000 deep was a RecursionError traceback."""
    code, output = submit(tmp_path, text)
    assert code == 2, output[-300:]
    assert "task.yaml " + says in output, output[-300:]
    assert "hint: the gateway takes at most 1048576 bytes of JSON" in output
    assert "Traceback" not in output
