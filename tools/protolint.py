"""The proto style check: the public gRPC API follows Google's API design guide.

protoc (grpcio-tools) compiles the files to descriptors with their comments,
and every message, field, enum, service and method is checked:

    message and enum names      PascalCase
    field names                 lower_snake_case; none is `json` or ends in `_json`
                                (typed messages, never JSON text in strings)
    enum values                 UPPER_SNAKE_CASE, prefixed with the enum's name in
                                UPPER_SNAKE (`TaskStatus` -> `TASK_STATUS_`); the zero
                                value is `<PREFIX>UNSPECIFIED`
    service and method names    PascalCase
    a method's request          `<Method>Request`
    a method's response         `<Method>Response`, or a resource: a message whose
                                leading comment starts with `Resource:` (standard
                                methods answer the resource itself: GetTask -> Task)

    python tools/protolint.py [--root DIR] [FILE.proto ...]
                                     exit 0: clean; 1: findings (printed)

Without files it checks proto/runyard/v1/*.proto, the public API; `--root` is
the folder the files import from (proto/).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PUBLIC = ("runyard/v1",)
RESOURCE_MARK = "Resource:"

PASCAL = re.compile(r"^[A-Z][a-zA-Z0-9]*$")
LOWER_SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
UPPER_SNAKE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")

#: The path of a top-level message in SourceCodeInfo (FileDescriptorProto.message_type).
_FILE_MESSAGES = 4


@dataclass(frozen=True)
class Finding:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def upper_snake(name: str) -> str:
    """`TaskStatus` -> `TASK_STATUS`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def compile_files(files: list[Path], root: Path = PROTO_ROOT) -> descriptor_pb2.FileDescriptorSet:
    """The descriptors of `files` (relative to `root`), with their comments."""
    well_known = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "set.pb"
        args = [
            "protoc",
            f"-I{root}",
            f"-I{well_known}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *(str(f.relative_to(root)) for f in files),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc could not compile {', '.join(map(str, files))}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def resources_of(file: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """Top-level messages whose leading comment marks them as resources."""
    marked = set()
    for location in file.source_code_info.location:
        path = list(location.path)
        top_message = len(path) == 2 and path[0] == _FILE_MESSAGES
        if top_message and location.leading_comments.strip().startswith(RESOURCE_MARK):
            marked.add(file.message_type[path[1]].name)
    return marked


def check_file(file: descriptor_pb2.FileDescriptorProto) -> Iterator[Finding]:
    """Every finding of one file."""
    for message in file.message_type:
        yield from _message(file.name, message, message.name)
    for enum in file.enum_type:
        yield from _enum(file.name, enum, enum.name)
    resources = resources_of(file)
    for service in file.service:
        where = f"{file.name}: service {service.name}"
        if not PASCAL.match(service.name):
            yield Finding(where, "service names are PascalCase")
        for method in service.method:
            yield from _method(f"{where}.{method.name}", method, resources)


def _message(file: str, message: descriptor_pb2.DescriptorProto, name: str) -> Iterator[Finding]:
    where = f"{file}: message {name}"
    if not message.options.map_entry and not PASCAL.match(message.name):
        yield Finding(where, "message names are PascalCase")
    for field in message.field:
        if not LOWER_SNAKE.match(field.name):
            yield Finding(f"{where}.{field.name}", "field names are lower_snake_case")
        if field.name == "json" or field.name.endswith("_json"):
            yield Finding(f"{where}.{field.name}", "JSON text in a string: give it a message")
    for nested in message.nested_type:
        yield from _message(file, nested, f"{name}.{nested.name}")
    for enum in message.enum_type:
        yield from _enum(file, enum, f"{name}.{enum.name}")


def _enum(file: str, enum: descriptor_pb2.EnumDescriptorProto, name: str) -> Iterator[Finding]:
    where = f"{file}: enum {name}"
    if not PASCAL.match(enum.name):
        yield Finding(where, "enum names are PascalCase")
    prefix = upper_snake(enum.name) + "_"
    for value in enum.value:
        if not UPPER_SNAKE.match(value.name):
            yield Finding(f"{where}.{value.name}", "enum values are UPPER_SNAKE_CASE")
        if not value.name.startswith(prefix):
            yield Finding(f"{where}.{value.name}", f"enum values start with {prefix}")
        if value.number == 0 and value.name != prefix + "UNSPECIFIED":
            yield Finding(f"{where}.{value.name}", f"the zero value is {prefix}UNSPECIFIED")


def _method(
    where: str, method: descriptor_pb2.MethodDescriptorProto, resources: set[str]
) -> Iterator[Finding]:
    if not PASCAL.match(method.name):
        yield Finding(where, "method names are PascalCase")
    request = method.input_type.rsplit(".", 1)[-1]
    response = method.output_type.rsplit(".", 1)[-1]
    if request != f"{method.name}Request":
        yield Finding(where, f"takes {request}: a method takes {method.name}Request")
    if response != f"{method.name}Response" and response not in resources:
        yield Finding(
            where,
            f"answers {response}: a method answers {method.name}Response or a resource"
            f" (a message whose comment starts with {RESOURCE_MARK!r})",
        )


def lint(files: list[Path], root: Path = PROTO_ROOT) -> list[Finding]:
    """Every finding in `files` (the files they import are not checked)."""
    names = {str(f.relative_to(root)) for f in files}
    compiled = compile_files(files, root)
    return [f for file in compiled.file if file.name in names for f in check_file(file)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--root", type=Path, default=PROTO_ROOT)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    files = [f.resolve() for f in args.files] or sorted(
        f for folder in PUBLIC for f in (root / folder).glob("*.proto")
    )
    findings = lint(files, root)
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
