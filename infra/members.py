"""Which members (libs/<name>, services/<name>) a Runyard service needs installed.

Each member's pyproject.toml names the members it depends on (`runyard-<name>`);
this follows them from the service, adds libs/cli (its containers run
`runyard serve <name>`), and prints the folders, dependencies first. The
Dockerfile installs these for its SERVICE build argument; `all` is every member
and the root distribution (the whole platform, `runyard up`).

    python infra/members.py gateway      libs/errors libs/contracts ... services/gateway
    python infra/members.py all          every member, then .
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "runyard-"


def folders(root: Path = ROOT) -> dict[str, str]:
    """Member name (`gateway`) -> its folder relative to the root (`services/gateway`)."""
    found = {}
    for group in ("libs", "services"):
        for pyproject in sorted(root.glob(f"{group}/*/pyproject.toml")):
            found[pyproject.parent.name] = str(pyproject.parent.relative_to(root))
    return found


def requires(root: Path, folder: str) -> list[str]:
    """The members that the member in `folder` depends on (names without the prefix)."""
    project = tomllib.loads((root / folder / "pyproject.toml").read_text())["project"]
    names = (dep.split(";")[0].split("[")[0].strip() for dep in project.get("dependencies", []))
    return [name.removeprefix(PREFIX) for name in names if name.startswith(PREFIX)]


def members(service: str, root: Path = ROOT) -> list[str]:
    """The folders to install for `service` (or `all`), each after what it needs."""
    known = folders(root)
    if service == "all":
        return [*(known[name] for name in order(root, known, list(known))), "."]
    if known.get(service, "").split("/")[0] != "services":
        raise SystemExit(f"no service {service!r}; services: {services(known)}")
    return [known[name] for name in order(root, known, ["cli", service])]


def order(root: Path, known: dict[str, str], wanted: list[str]) -> list[str]:
    """`wanted` and every member they need, each after the members it needs."""
    done: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in done or name in visiting:
            return
        visiting.add(name)
        for needed in requires(root, known[name]):
            visit(needed)
        done.append(name)

    for name in wanted:
        visit(name)
    return done


def services(known: dict[str, str]) -> list[str]:
    """The names of the services among the members."""
    return sorted(name for name, folder in known.items() if folder.startswith("services/"))


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(" ".join(members(sys.argv[1])))


if __name__ == "__main__":
    main()
