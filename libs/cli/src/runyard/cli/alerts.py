"""`runyard alerts`: the tenant's Feishu alert subscriptions, over the gateway's API.

    runyard alerts add WEBHOOK_URL [--alert failed --alert queued:1800 ...]
                       [--secret-env VAR | --ask-secret] [--queued-after S] [--text]
    runyard alerts ls
    runyard alerts rm SUBSCRIPTION_ID

The signing secret is never an argument (it would stay in the shell's history
and the process list): it is read from an environment variable or asked for
without echo. Answers never show it; the webhook's token is shown masked.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Annotated, Any

import typer
from runyard.cli.terminal import remember_json

alerts_app = typer.Typer(
    help="Feishu alert subscriptions of your tenant (task failed, hang, queued too long...).",
    no_args_is_help=True,
)

UrlOpt = Annotated[str | None, typer.Option("--url", help="Gateway URL (RUNYARD_URL).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (RUNYARD_TOKEN).")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON.", callback=remember_json)
]
PATH = "/v1/alert-subscriptions"


def _cli() -> ModuleType:
    """The main CLI module (imported late: it registers this sub-app)."""
    from runyard.cli import main

    return main


@alerts_app.command("add")
def add(
    webhook_url: Annotated[str, typer.Argument(help="The Feishu custom bot's webhook URL.")],
    alert: Annotated[
        list[str] | None,
        typer.Option(
            "--alert",
            help="An alert to send (repeat, or a comma list): failed, abnormal,"
            " queued[:SECONDS], hang, slowdown, restarted, rescheduled, requeued, succeeded,"
            " stopped. Default: the usual ones.",
        ),
    ] = None,
    secret_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the bot's signing secret.")
    ] = None,
    ask_secret: Annotated[
        bool, typer.Option("--ask-secret", help="Ask for the signing secret (no echo).")
    ] = False,
    queued_after: Annotated[
        float | None, typer.Option(help="Seconds in the queue before a `queued` alert.")
    ] = None,
    text: Annotated[bool, typer.Option("--text", help="Plain text instead of cards.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Subscribe a Feishu bot to the tenant's task alerts."""
    cli = _cli()
    body: dict[str, Any] = {"webhook_url": webhook_url, "text_only": text}
    kinds = [kind.strip() for given in alert or () for kind in given.split(",") if kind.strip()]
    body |= cli.given(alerts=kinds or None, queued_after_s=queued_after)
    secret = _secret(secret_env, ask_secret)
    if secret:
        body["secret"] = secret
    created = cli.call(url, token, "POST", PATH, json=body)
    if as_json:
        cli.show_json(created)
    else:
        _table([created])


@alerts_app.command("ls")
def list_subscriptions(
    url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """The tenant's alert subscriptions."""
    cli = _cli()
    answer = cli.call(url, token, "GET", PATH)
    if as_json:
        cli.show_json(answer)
    else:
        _table(answer["items"])


alerts_app.command("list", hidden=True)(list_subscriptions)  # as `admin tokens list`


@alerts_app.command("rm")
def remove(
    subscription_id: Annotated[str, typer.Argument(help="The subscription's id (sub-...).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a subscription and its stored secret."""
    cli = _cli()
    cli.call(url, token, "DELETE", f"{PATH}/{cli.segment(subscription_id)}")
    cli.out.print(f"deleted {subscription_id}")


def _secret(env: str | None, ask: bool) -> str | None:
    if env is not None:
        value = os.environ.get(env)
        if not value:
            _cli().err.print(f"[red]error:[/red] environment variable {env} is not set")
            raise typer.Exit(2)
        return value
    if ask:
        return str(typer.prompt("signing secret", hide_input=True))
    return None


def _table(items: list[dict[str, Any]]) -> None:
    _cli().table(
        "alert subscriptions",
        ["id", "webhook", "alerts", "signed", "queued after (s)", "format"],
        [
            [
                s["id"],
                s["webhook_url"],
                ", ".join(s["alerts"]),
                "yes" if s["signed"] else "no",
                s["queued_after_s"],
                "text" if s["text_only"] else "card",
            ]
            for s in items
        ],
    )
