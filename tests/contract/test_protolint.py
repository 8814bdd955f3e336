"""The proto style check (tools/protolint.py, run by `make lint`) passes on the
public API and names what breaks Google's API design guide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, str(REPO / "tools" / "protolint.py")]

GOOD = """
syntax = "proto3";
package demo.v1;

service Boxes {
  rpc GetBox(GetBoxRequest) returns (Box);
  rpc ListBoxes(ListBoxesRequest) returns (ListBoxesResponse);
}

enum BoxColour {
  BOX_COLOUR_UNSPECIFIED = 0;
  BOX_COLOUR_RED = 1;
}

// Resource: a box.
message Box {
  string box_id = 1;
  BoxColour colour = 2;
}

message GetBoxRequest {
  string box_id = 1;
}

message ListBoxesRequest {}

message ListBoxesResponse {
  repeated Box boxes = 1;
}
"""


def run_check(root: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CHECK, "--root", str(root), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _write(tmp_path: Path, text: str) -> Path:
    proto = tmp_path / "demo" / "v1" / "boxes.proto"
    proto.parent.mkdir(parents=True, exist_ok=True)
    proto.write_text(text)
    return proto


def test_the_public_api_follows_the_guide() -> None:
    result = subprocess.run(CHECK, capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_a_proto_that_follows_the_guide_passes(tmp_path: Path) -> None:
    result = run_check(tmp_path, _write(tmp_path, GOOD))
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_each_rule_names_what_breaks_it(tmp_path: Path) -> None:
    bad = (
        GOOD.replace("BOX_COLOUR_UNSPECIFIED", "BOX_COLOUR_NONE")
        .replace("BOX_COLOUR_RED", "RED")
        .replace("string box_id = 1;\n  BoxColour", "string boxId = 1;\n  BoxColour")
        .replace(
            "message ListBoxesResponse {", "message ListBoxesResponse {\n  string box_json = 2;"
        )
        .replace("rpc GetBox(GetBoxRequest) returns (Box);", "rpc GetBox(BoxRef) returns (Reply);")
        .replace(
            "message GetBoxRequest",
            "message BoxRef {\n  string box_id = 1;\n}\n\nmessage Reply {}\n\n"
            "message GetBoxRequest",
        )
    )
    result = run_check(tmp_path, _write(tmp_path, bad))
    assert result.returncode == 1
    findings = result.stdout
    for expected in (
        "enum BoxColour.BOX_COLOUR_NONE: the zero value is BOX_COLOUR_UNSPECIFIED",
        "enum BoxColour.RED: enum values start with BOX_COLOUR_",
        "message Box.boxId: field names are lower_snake_case",
        "message ListBoxesResponse.box_json: JSON text in a string: give it a message",
        "service Boxes.GetBox: takes BoxRef: a method takes GetBoxRequest",
        "service Boxes.GetBox: answers Reply: a method answers GetBoxResponse or a resource",
    ):
        assert expected in findings, findings
