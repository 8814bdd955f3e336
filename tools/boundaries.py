"""The boundary contract: services never import each other, libraries never
import services, the pure domain imports no I/O library.

The contracts live in pyproject.toml (`[tool.importlinter]`) and are checked
by import-linter. Every lib and service is a member with its code under
`src/runyard/` (libs/<name>/src/runyard/<name>, services/<name>/src/runyard/<name>,
libs/errors/src/runyard/errors.py), and `runyard` is a namespace package over
them (docs/adr/0008-members-and-namespace.md). This joins the members' portions
into one tree (`build/import-tree/runyard/<name>` linked to its folder), checks
that no two members provide the same module and that none owns `runyard` itself,
and runs the check on it.

    python tools/boundaries.py [--root DIR]     exit 0: kept; 1: broken (printed)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where the members live, relative to the root.
MEMBER_FOLDERS = ("libs", "services")


class LayoutError(Exception):
    """The members' `src/runyard/` portions do not make one namespace."""


def portions(root: Path) -> dict[str, Path]:
    """Each top module of the `runyard` namespace (`eventstore`, `errors.py`) -> its path."""
    found: dict[str, Path] = {}
    for folder in MEMBER_FOLDERS:
        for namespace in sorted((root / folder).glob("*/src/runyard")):
            if (namespace / "__init__.py").exists():
                raise LayoutError(f"{namespace}/__init__.py: `runyard` is a namespace, no member's")
            for entry in sorted(namespace.iterdir()):
                module = entry.is_dir() or entry.suffix == ".py"
                if entry.name == "__pycache__" or not module:
                    continue
                if entry.name in found:
                    raise LayoutError(f"runyard.{entry.stem} is in {found[entry.name]} and {entry}")
                found[entry.name] = entry
    return found


def import_tree(root: Path, target: Path) -> Path:
    """`target/runyard/...` linked to the members' modules, with an `__init__.py` of
    its own (import-linter takes a regular package as its root)."""
    shutil.rmtree(target, ignore_errors=True)
    base = target / "runyard"
    base.mkdir(parents=True)
    (base / "__init__.py").write_text("")
    for name, source in portions(root).items():
        (base / name).symlink_to(source, target_is_directory=source.is_dir())
    return target


def check(root: Path = ROOT) -> int:
    """Run the contracts of `root`'s pyproject.toml on its import tree."""
    from importlinter.cli import lint_imports

    try:
        tree = import_tree(root, root / "build" / "import-tree")
    except LayoutError as e:
        print(f"Layout BROKEN: {e}")
        return 1
    sys.path.insert(0, str(tree))
    # The installed (editable) `runyard` must not shadow the tree being checked.
    for name in [m for m in sys.modules if m == "runyard" or m.startswith("runyard.")]:
        del sys.modules[name]
    previous = Path.cwd()
    os.chdir(root)
    try:
        return lint_imports(
            config_filename=str(root / "pyproject.toml"), no_cache=True, no_logo=True
        )
    finally:
        os.chdir(previous)
        sys.path.remove(str(tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the project to check")
    sys.exit(check(parser.parse_args().root.resolve()))


if __name__ == "__main__":
    main()
