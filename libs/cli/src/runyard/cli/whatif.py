"""SRE replay: `runyard whatif`, a window of the log played again on changed pools.

    runyard whatif --from 2026-12-01T08:00Z --to 2026-12-01T12:00Z --pools bigger.yaml
    runyard whatif --from 4h --to 1h --policy fifo --pool dev-a100 --json

Asks the gateway (`POST /v1/pools/whatif`, roles sre and platform_admin; the
scheduler answers it, reading the log only) and prints, per pool, queue-time
percentiles and utilisation of what really happened beside the simulation,
then the same per worker spec. `--pools` is a YAML or JSON file in the shape
of the scheduler's pools file (infra/config/pools.yaml): for each pool to
change, its `id` and its `nodes`. Without it, every pool is replayed on the
nodes it had at `--from` (a check that the simulation reproduces the log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from runyard.cli.main import (
    JsonOpt,
    TokenOpt,
    UrlOpt,
    app,
    call,
    err,
    load_yaml,
    out,
    show_json,
    table,
)
from runyard.cli.terminal import markup
from runyard.cli.when import parse_when
from runyard.contracts.http import WHATIF_FIGURES

FIGURES = WHATIF_FIGURES


def read_pools(path: Path) -> list[Any]:
    """The `pools` list of a YAML or JSON pools file; exit 2 saying what is wrong."""
    pools = load_yaml(path).get("pools")
    if not isinstance(pools, list):
        err.print(
            f"[red]error:[/red] {markup(path)}: expected `pools:` with a list of"
            " {id, nodes} (the shape of infra/config/pools.yaml)"
        )
        raise typer.Exit(2)
    return pools


@app.command("whatif")
def whatif(
    start: Annotated[
        str, typer.Option("--from", help="window start: 30m, 1h, 2d ago, or ISO 8601")
    ],
    end: Annotated[str, typer.Option("--to", help="window end (same forms, or now)")],
    pools: Annotated[
        Path | None,
        typer.Option("--pools", help="changed pools: YAML/JSON {pools: [{id, nodes}]}"),
    ] = None,
    policy: Annotated[
        str, typer.Option(help="queue policy: backfill (the scheduler's) or fifo")
    ] = "backfill",
    pool: Annotated[str | None, typer.Option(help="this pool only")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What-if scheduling: a window replayed on other nodes or another queue policy.

    For sre and platform_admin. The submissions, stops and node changes of the
    window go through the scheduler's rules on other nodes or with another queue
    policy, and queue times and utilisation are compared with what happened.
    Changes nothing.

    Twice the nodes for dev-a100 over the morning:
    runyard whatif --from 2026-12-01T06:00Z --to 2026-12-01T12:00Z --pools double.yaml
    """
    body: dict[str, Any] = {"from": parse_when(start), "to": parse_when(end), "policy": policy}
    if pools is not None:
        body["pools"] = read_pools(pools)
    if pool is not None:
        body["pool"] = pool
    answer = call(url, token, "POST", "/v1/pools/whatif", json=body)
    if as_json:
        show_json(answer)
        return
    out.print(
        f"what-if {markup(answer['from'])} .. {markup(answer['to'])},"
        f" policy {markup(answer['policy'])}; {answer['events_read']} events read"
    )
    for view in answer["pools"]:
        print_pool(view)


def print_pool(view: dict[str, Any]) -> None:
    """One pool: its nodes, the figures side by side, then per worker spec."""
    nodes, gpus = view["nodes"], view["gpus"]
    out.print(
        f"[bold]{markup(view['pool_id'])}[/bold]  nodes {nodes['real']} -> {nodes['simulated']}"
        f"  (GPUs {gpus['real']} -> {gpus['simulated']});"
        f" node changes {view['node_changes']} (skipped {view['node_changes_skipped']}),"
        f" displaced {view['displaced']}, runs left out {view['runs_skipped']}"
    )
    table(
        f"{view['pool_id']}: real vs what-if",
        ["", "real", "what-if"],
        [
            [name, _shown(view["real"][key]), _shown(view["simulated"][key])]
            for key, name in FIGURES
        ],
    )
    table(
        f"{view['pool_id']}: by worker spec",
        [
            "spec",
            "runs",
            "p50 real",
            "p50 what-if",
            "p90 real",
            "p90 what-if",
            "p99 real",
            "p99 what-if",
            "GPU h real",
            "GPU h what-if",
        ],
        [_spec_row(s) for s in view["specs"]],
    )


def _spec_row(spec: dict[str, Any]) -> list[Any]:
    real, sim = spec["real"], spec["simulated"]
    return [
        spec["spec"],
        real["runs"],
        *(_shown(side[key]) for key in ("p50_s", "p90_s", "p99_s") for side in (real, sim)),
        _shown(real["gpu_hours"]),
        _shown(sim["gpu_hours"]),
    ]


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    return str(value)
