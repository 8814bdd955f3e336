"""The boundary contract: services never import each other, libraries never
import services, the pure domain imports no I/O library.

The contracts live in pyproject.toml (`[tool.importlinter]`) and are checked
by import-linter. Import-linter reads the package from its folders, and the
`runyard` namespace is spread over libs/ and services/ by setuptools'
`package-dir` (docs/adr/0001-layout-and-packaging.md), so this builds the tree
the import names describe (`build/import-tree/runyard/<name>` linked to its
folder) and runs the check on it.

    python tools/boundaries.py [--root DIR]     exit 0: kept; 1: broken (printed)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_tree(root: Path, target: Path) -> Path:
    """`target/runyard/...` linked to the folders pyproject.toml maps the
    `runyard.*` packages to (nested packages follow their parent's link)."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(target, ignore_errors=True)
    base = target / "runyard"
    base.mkdir(parents=True)
    for package, folder in sorted(mapping.items()):
        source = root / folder
        if package == "runyard":
            for entry in source.iterdir():
                if entry.suffix == ".py":
                    (base / entry.name).symlink_to(entry)
            continue
        (base / package.removeprefix("runyard.")).symlink_to(source, target_is_directory=True)
    return target


def check(root: Path = ROOT) -> int:
    """Run the contracts of `root`'s pyproject.toml on its import tree."""
    from importlinter.cli import lint_imports

    tree = import_tree(root, root / "build" / "import-tree")
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
