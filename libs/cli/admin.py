"""`runyard admin`: pool nodes and spot capacity (admin role), over the gateway's admin API.

    runyard admin node add POOL NODE [--gpus 8]
    runyard admin node remove|cordon|uncordon|heal POOL NODE
    runyard admin node fault POOL NODE [--reason TEXT]     (fault injection in tests)
    runyard admin spot POOL --remove N | --add NAME[,NAME...] [--reason TEXT]

Every command prints what was appended to the pool's stream (or the API's
JSON with `--json`); a refusal prints its code, message and hint and exits 1
(3 without the admin role), like the other commands.
"""

from __future__ import annotations

from types import ModuleType
from typing import Annotated, Any

import typer

admin_app = typer.Typer(
    help="Admin: pool nodes and spot capacity (needs the admin role).", no_args_is_help=True
)
node_app = typer.Typer(
    help="Nodes of a pool: add, remove, cordon, mark faulty or healthy.", no_args_is_help=True
)
admin_app.add_typer(node_app, name="node")

UrlOpt = Annotated[str | None, typer.Option("--url", help="Gateway URL (RUNYARD_URL).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (RUNYARD_TOKEN).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]
Pool = Annotated[str, typer.Argument(help="Pool id.")]
Node = Annotated[str, typer.Argument(help="Node name.")]


def _cli() -> ModuleType:
    """The main CLI module (imported late: it registers this sub-app)."""
    from runyard.cli import main

    return main


def _admin_call(
    url: str | None, token: str | None, method: str, path: str, as_json: bool, **kw: Any
) -> None:
    cli = _cli()
    result = cli.call(url, token, method, f"/v1/admin/pools/{path}", **kw)
    if as_json:
        cli.show_json(result)
    else:
        print_result(result)


def print_result(result: dict[str, Any]) -> None:
    """One line per change: the pool, its new version, the events, preempted tasks."""
    cli = _cli()
    what = f"node {result['node']} of " if result.get("node") else ""
    cli.out.print(
        f"{what}pool {result['pool_id']}: {', '.join(result['events'])}"
        f" (pool version {result['version']})"
    )
    if result.get("removed_nodes"):
        cli.out.print(f"nodes given back: {', '.join(result['removed_nodes'])}")
    if result.get("added_nodes"):
        cli.out.print(f"nodes added: {', '.join(result['added_nodes'])}")
    if result.get("preempted"):
        cli.table(
            "preempted",
            ["task", "outcome", "nodes"],
            [[p["task_id"], p["outcome"], ", ".join(p["nodes"])] for p in result["preempted"]],
        )


# --- nodes ----------------------------------------------------------------------


@node_app.command("add")
def node_add(
    pool: Pool,
    node: Node,
    gpus: Annotated[int, typer.Option(help="GPUs of the node.")] = 8,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a healthy node with every GPU free."""
    body = {"node": node, "gpus": gpus}
    _admin_call(url, token, "POST", f"{pool}/nodes", as_json, json=body)


@node_app.command("remove")
def node_remove(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Remove an idle node (refused while workers run on it)."""
    _admin_call(url, token, "DELETE", f"{pool}/nodes/{node}", as_json)


@node_app.command("cordon")
def node_cordon(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """No new workers go to the node; running ones stay."""
    _admin_call(url, token, "POST", f"{pool}/nodes/{node}/cordon", as_json)


@node_app.command("uncordon")
def node_uncordon(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """The node takes new workers again."""
    _admin_call(url, token, "POST", f"{pool}/nodes/{node}/uncordon", as_json)


@node_app.command("fault")
def node_fault(
    pool: Pool,
    node: Node,
    reason: Annotated[str, typer.Option(help="What is wrong with the node.")] = (
        "marked faulty by an admin"
    ),
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark a node faulty: nothing new goes there, its tasks get rescheduled (fault injection)."""
    body = {"reason": reason}
    _admin_call(url, token, "POST", f"{pool}/nodes/{node}/fault", as_json, json=body)


@node_app.command("heal")
def node_heal(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Mark a repaired node healthy again."""
    _admin_call(url, token, "POST", f"{pool}/nodes/{node}/heal", as_json)


# --- spot capacity -------------------------------------------------------------------


@admin_app.command("spot")
def spot(
    pool: Pool,
    remove: Annotated[
        int | None, typer.Option("--remove", help="Give back N nodes (preempts spot tasks).")
    ] = None,
    add: Annotated[
        str | None, typer.Option("--add", help="Add nodes: comma-separated names.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs of each added node.")] = 8,
    reason: Annotated[str, typer.Option(help="Why capacity changes.")] = (
        "spot capacity changed by an admin"
    ),
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a spot pool's capacity: --remove N nodes, or --add NAME[,NAME...]."""
    names = [n.strip() for n in (add or "").split(",") if n.strip()]
    if (remove is None) == (add is None) or (add is not None and not names):
        err = _cli().err
        err.print("[red]error:[/red] give exactly one of --remove N and --add NAME[,NAME...]")
        err.print(f"hint: e.g. `runyard admin spot {pool} --remove 2`")
        raise typer.Exit(2)
    body: dict[str, Any] = {"reason": reason}
    if remove is not None:
        body["remove"] = remove
    else:
        body.update(add=names, gpus_per_node=gpus)
    _admin_call(url, token, "POST", f"{pool}/spot-capacity", as_json, json=body)
