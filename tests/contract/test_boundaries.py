"""The boundary contract (tools/boundaries.py, run by `make lint`) holds on this
tree, and it would catch a service importing another one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, str(REPO / "tools" / "boundaries.py")]


def run_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CHECK, "--root", str(root)], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_tree_keeps_every_boundary() -> None:
    result = run_check(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout
    assert "Services never import each other KEPT" in result.stdout


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("libs", "services"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    return root


def test_a_service_importing_another_breaks_the_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    shortcut = root / "services/logs/src/runyard/logs/shortcut.py"
    shortcut.write_text("from runyard.scheduler import views\n")
    result = run_check(root)
    assert result.returncode != 0
    assert "Services never import each other BROKEN" in result.stdout
    assert "runyard.logs.shortcut -> runyard.scheduler.views" in result.stdout


def test_io_in_the_domain_breaks_the_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "libs/domain/src/runyard/domain/shortcut.py").write_text("import asyncpg\n")
    result = run_check(root)
    assert result.returncode != 0
    assert "The domain is pure: no I/O library BROKEN" in result.stdout


def test_a_member_owning_the_namespace_breaks_the_layout(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "libs/domain/src/runyard/__init__.py").write_text("")
    result = run_check(root)
    assert result.returncode != 0
    assert "Layout BROKEN" in result.stdout


def test_the_client_reaching_into_the_platform_breaks_the_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "libs/client/src/runyard/client/shortcut.py").write_text(
        "from runyard.api import errors\n"
    )
    result = run_check(root)
    assert result.returncode != 0
    assert "The client needs only the contracts BROKEN" in result.stdout
