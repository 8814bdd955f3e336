"""`runyard ps`: the services a running `runyard up` supervises, and how each does.

    runyard ps [--home .runyard] [--json]

Reads `.runyard/run/services.json` (written by the supervisor) and asks each
service's HTTP face: /healthz (alive), /readyz (connected and caught up; what
it waits for otherwise) and /metrics (consumer lag: the sum of the
`runyard_consumer_lag` samples, "-" when the service has none).

Exit codes: 0 every service runs and answers /healthz; 1 one or more does not;
4 no `runyard up` runs on this home.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from runyard.cli.main import EXIT_REFUSED, EXIT_UNREACHABLE, JsonOpt, app, err, show_json, table
from runyard.stack.supervisor import read_state, recorded

LAG_METRIC = "runyard_consumer_lag"
PROBE_TIMEOUT_S = 2.0


def consumer_lag(metrics_text: str) -> float | None:
    """The sum of the `runyard_consumer_lag` samples in Prometheus text (None: no sample)."""
    total, found = 0.0, False
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0 or line[:name_end] != LAG_METRIC:
            continue
        value = line.rpartition("}")[2].split() if "{" in line else line.split()[1:]
        try:
            sample = float(value[0])
        except (IndexError, ValueError):
            continue
        if not math.isnan(sample):
            total, found = total + sample, True
    return total if found else None


async def _get(http: httpx.AsyncClient, url: str) -> httpx.Response | None:
    try:
        return await http.get(url)
    except httpx.HTTPError:
        return None


async def probe(http: httpx.AsyncClient, service: dict[str, Any], boot: str) -> dict[str, Any]:
    """One service as `runyard ps` shows it."""
    identity = recorded(service, boot)
    running = identity is not None and identity.running()
    url = str(service.get("url") or "")
    row: dict[str, Any] = {
        "name": service.get("name"),
        "pid": identity.pid if running and identity else None,
        "uptime_s": _uptime(service.get("started_at")) if running else None,
        "restarts": service.get("restarts", 0),
        "healthy": False,
        "ready": False,
        "waiting": {},
        "consumer_lag": None,
        "url": url,
        "last_exit": service.get("last_exit"),
    }
    if not running or not url.startswith("http"):
        return row
    health, ready, metrics = await asyncio.gather(
        _get(http, f"{url}/healthz"), _get(http, f"{url}/readyz"), _get(http, f"{url}/metrics")
    )
    row["healthy"] = health is not None and health.status_code == 200
    row["ready"] = ready is not None and ready.status_code == 200
    if ready is not None and ready.status_code == 503:
        row["waiting"] = _json(ready).get("waiting", {})
    if metrics is not None and metrics.status_code == 200:
        row["consumer_lag"] = consumer_lag(metrics.text)
    return row


def _json(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _uptime(started_at: object) -> float | None:
    if not isinstance(started_at, str):
        return None
    return max(0.0, time.time() - datetime.fromisoformat(started_at).timestamp())


async def probe_all(state: dict[str, Any]) -> list[dict[str, Any]]:
    boot = str((state.get("supervisor") or {}).get("boot_id", ""))
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as http:
        return list(
            await asyncio.gather(*(probe(http, s, boot) for s in state.get("services") or []))
        )


def supervisor_running(state: dict[str, Any]) -> bool:
    """Whether the `runyard up` that wrote `state` still runs."""
    about = state.get("supervisor") or {}
    identity = recorded(about, str(about.get("boot_id", "")))
    return identity is not None and identity.running()


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@app.command("ps")
def ps(
    home: Annotated[Path, typer.Option(help="The home `runyard up` runs on.")] = Path(".runyard"),
    as_json: JsonOpt = False,
) -> None:
    """The services `runyard up` runs: pid, uptime, restarts, health, readiness, consumer lag.

    Exit codes: 0 every service runs and answers /healthz; 1 one or more does
    not; 4 no `runyard up` runs on this home.
    """
    state = read_state(home / "run" / "services.json")
    if state is None or not supervisor_running(state):
        err.print(f"[red]error:[/red] no `runyard up` runs on {home.resolve()}")
        err.print("hint: start it with `runyard up` (or pass --home)")
        raise typer.Exit(EXIT_UNREACHABLE)
    rows = asyncio.run(probe_all(state))
    if as_json:
        show_json(rows)
    else:
        table(
            "Services",
            ["SERVICE", "PID", "UPTIME", "RESTARTS", "HEALTH", "READY", "LAG", "URL", "LAST EXIT"],
            [
                [
                    r["name"],
                    _cell(r["pid"]),
                    human_duration(r["uptime_s"]),
                    r["restarts"],
                    "ok" if r["healthy"] else ("down" if r["pid"] else "not running"),
                    "yes" if r["ready"] else _waiting(r["waiting"]),
                    _cell(r["consumer_lag"]),
                    r["url"] or "-",
                    _cell(r["last_exit"]),
                ]
                for r in rows
            ],
        )
    if not all(r["healthy"] for r in rows):
        raise typer.Exit(EXIT_REFUSED)


def _waiting(waiting: dict[str, Any]) -> str:
    return f"no ({', '.join(sorted(waiting))})" if waiting else "no"
