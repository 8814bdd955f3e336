"""`runyard admin`: pool nodes and spot capacity (platform_admin role) and API tokens
(tenant_admin or platform_admin), over the gateway's admin API.

    runyard admin node add POOL NODE [--gpus 8]
    runyard admin node remove|cordon|uncordon|heal POOL NODE
    runyard admin node fault POOL NODE [--reason TEXT]     (fault injection in tests)
    runyard admin spot POOL --remove N | --add NAME[,NAME...] [--reason TEXT]
    runyard admin tokens create TENANT USER [--role member] [--ttl 30d] [--description TEXT]
    runyard admin tokens list [--tenant T] [--all]
    runyard admin tokens revoke TOKEN_ID

Every command prints what was appended to the pool's stream, or the tokens
(or the API's JSON with `--json`); a refusal prints its code, message and
hint and exits 1 (3 without the role it needs), like the other commands.
"""

from __future__ import annotations

from types import ModuleType
from typing import Annotated, Any

import typer
from runyard.cli.terminal import clean, remember_json
from runyard.contracts.requests import TokenRequest

admin_app = typer.Typer(
    help="Admin: pool nodes, spot capacity (platform_admin) and API tokens (tenant_admin).",
    no_args_is_help=True,
)
node_app = typer.Typer(
    help="Nodes of a pool: add, remove, cordon, mark faulty or healthy.", no_args_is_help=True
)
tokens_app = typer.Typer(
    help="API tokens: create (shown once), list, revoke.", no_args_is_help=True
)
admin_app.add_typer(node_app, name="node")
admin_app.add_typer(tokens_app, name="tokens")

UrlOpt = Annotated[str | None, typer.Option("--url", help="Gateway URL (RUNYARD_URL).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (RUNYARD_TOKEN).")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON.", callback=remember_json)
]
Pool = Annotated[str, typer.Argument(help="Pool id.")]
Node = Annotated[str, typer.Argument(help="Node name.")]


def _cli() -> ModuleType:
    """The main CLI module (imported late: it registers this sub-app)."""
    from runyard.cli import main

    return main


def _segment(value: str) -> str:
    segment: str = _cli().segment(value)
    return segment


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
    line = (
        f"{what}pool {result['pool_id']}: {', '.join(result['events'])}"
        f" (pool version {result['version']})"
    )
    cli.out.print(clean(line), markup=False, highlight=False)
    if result.get("removed_nodes"):
        given_back = clean(", ".join(result["removed_nodes"]))
        cli.out.print(f"nodes given back: {given_back}", markup=False, highlight=False)
    if result.get("added_nodes"):
        added = clean(", ".join(result["added_nodes"]))
        cli.out.print(f"nodes added: {added}", markup=False, highlight=False)
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
    _admin_call(url, token, "POST", f"{_segment(pool)}/nodes", as_json, json=body)


@node_app.command("remove")
def node_remove(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Remove an idle node (refused while workers run on it)."""
    _admin_call(url, token, "DELETE", f"{_segment(pool)}/nodes/{_segment(node)}", as_json)


@node_app.command("cordon")
def node_cordon(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """No new workers go to the node; running ones stay."""
    _admin_call(url, token, "POST", f"{_segment(pool)}/nodes/{_segment(node)}/cordon", as_json)


@node_app.command("uncordon")
def node_uncordon(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """The node takes new workers again."""
    _admin_call(url, token, "POST", f"{_segment(pool)}/nodes/{_segment(node)}/uncordon", as_json)


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
    _admin_call(
        url, token, "POST", f"{_segment(pool)}/nodes/{_segment(node)}/fault", as_json, json=body
    )


@node_app.command("heal")
def node_heal(
    pool: Pool, node: Node, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Mark a repaired node healthy again."""
    _admin_call(url, token, "POST", f"{_segment(pool)}/nodes/{_segment(node)}/heal", as_json)


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
    _admin_call(url, token, "POST", f"{_segment(pool)}/spot-capacity", as_json, json=body)


# --- tokens ---------------------------------------------------------------------------

TOKEN_COLUMNS = ["id", "tenant", "user", "role", "state", "expires", "created by", "description"]


def _token_row(t: dict[str, Any]) -> list[Any]:
    return [
        t["token_id"],
        t["tenant"],
        t["user"],
        t["role"],
        t["state"],
        t["expires_at"],
        t["created_by"],
        t["description"],
    ]


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Argument(help="Tenant of the token.")],
    user: Annotated[str, typer.Argument(help="User (or service account) name.")],
    role: Annotated[
        str,
        typer.Option(help="platform_admin, tenant_admin, member, service or sre."),
    ] = "member",
    ttl: Annotated[
        str | None, typer.Option(help="Lifetime: 30d, 12h, 30m, 45s (default 30d, max 365d).")
    ] = None,
    description: Annotated[str | None, typer.Option(help="What the token is for.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Mint a token; it is printed once and stored only hashed."""
    cli = _cli()
    # Not checked here: the gateway refuses a bad value naming the field and the fix.
    given = cli.given(tenant=tenant, user=user, role=role, ttl=ttl, description=description)
    request = TokenRequest.model_construct(**given)
    result = cli.call(url, token, "POST", "/v1/admin/tokens", json=request.as_json())
    if as_json:
        cli.show_json(result)
        return
    cli.table("token", TOKEN_COLUMNS, [_token_row(result)])
    cli.out.print(f"token (shown once): {result['token']}")


@tokens_app.command("list")
def tokens_list(
    tenant: Annotated[
        str | None, typer.Option(help="Only this tenant (platform admins; default all).")
    ] = None,
    include_revoked: Annotated[bool, typer.Option("--all", help="Also revoked tokens.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Tokens you may manage, newest first (never their secrets)."""
    cli = _cli()
    params: dict[str, Any] = {**cli.given(tenant=tenant), "include_revoked": include_revoked}
    result = cli.call(url, token, "GET", "/v1/admin/tokens", params=params)
    if as_json:
        cli.show_json(result)
        return
    cli.table("tokens", TOKEN_COLUMNS, [_token_row(t) for t in result["items"]])
    if result.get("truncated"):
        cli.err.print(
            f"(the newest {len(result['items'])} are shown: give --tenant, or leave --all out)",
            markup=False,
        )


tokens_app.command("ls", hidden=True)(tokens_list)  # as `group ls`, `alerts ls`


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="Token id (tok_...), from `tokens list`.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a token: refused from its next request on."""
    cli = _cli()
    result = cli.call(url, token, "DELETE", f"/v1/admin/tokens/{cli.segment(token_id)}")
    if as_json:
        cli.show_json(result)
        return
    cli.out.print(
        f"token {result['token_id']} of {result['tenant']}/{result['user']}: {result['state']}"
    )
