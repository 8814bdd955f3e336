"""Which webhook URLs alerts may go to: Feishu's custom-bot endpoints, nothing else.

The notification service makes HTTP requests to URLs that users give, from
inside the platform's network: left open, a webhook is a way to reach the
platform's own services (`http://127.0.0.1:...`), the cloud's metadata
service (`http://169.254.169.254/...`) or anything else the service can
reach. So a webhook must be

- an allowed *origin* (`scheme://host[:port]`): by default only
  `https://open.feishu.cn` and `https://open.larksuite.com`; a self-hosted
  Feishu is added in the config folder's `notification.yaml`
  (`webhook_origins`), which replaces the default list;
- a custom bot's hook path: `/open-apis/bot/v2/hook/<token>`;
- without user info, query or fragment (`https://open.feishu.cn@evil/`).

The policy is checked when a subscription is made (a tenant subscription by
the notification service, a task spec's `alerts` by the submission rules,
refused with the field and the allowed origins) and again before every
request (so a subscription made under an older, wider policy cannot be used
to reach anything else); both services read it, so it lives here. Pure but `policy_of`, which
reads `notification.yaml` (again when the file changes, so operators change
the list without a restart).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

#: Feishu's and Lark's public bot endpoints (https only).
DEFAULT_ORIGINS = ("https://open.feishu.cn", "https://open.larksuite.com")
#: The path of a custom bot's webhook; the token follows.
HOOK_PATH = "/open-apis/bot/v2/hook/"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")
_DEFAULT_PORTS = {"https": 443, "http": 80}
EXAMPLE = "https://open.feishu.cn/open-apis/bot/v2/hook/<token>"


class WebhookRefused(ValueError):
    """A webhook URL the policy does not allow: why, and what would be accepted."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


def origin(url: str) -> str | None:
    """`scheme://host:port` of `url` (port always written), or None when it has none."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower().rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}"


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """The origins alerts may go to (see the module docstring)."""

    origins: tuple[str, ...] = DEFAULT_ORIGINS

    def __post_init__(self) -> None:
        for given in self.origins:
            if origin(given) is None:
                raise ValueError(
                    f"webhook origin {given!r} is not scheme://host[:port] (http or https)"
                )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> WebhookPolicy:
        """From `notification.yaml`: `webhook_origins` (absent: the default)."""
        given = config.get("webhook_origins")
        if given is None:
            return cls()
        if isinstance(given, str) or not isinstance(given, Iterable):
            raise ValueError("notification.yaml: webhook_origins must be a list of origins")
        return cls(tuple(str(o) for o in given))

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(o for o in (origin(g) for g in self.origins) if o is not None)

    def check(self, url: str) -> None:
        """Raise `WebhookRefused` unless alerts may go to `url`."""
        try:
            parts = urlsplit(url.strip())
        except ValueError as exc:
            hint = f"paste the bot's webhook, {EXAMPLE}"
            raise WebhookRefused(f"not a URL: {exc}", hint) from exc
        where = origin(url)
        if where is None or where not in self.allowed:
            shown = f"{parts.scheme}://{parts.hostname or ''}" if parts.scheme else "no origin"
            raise WebhookRefused(
                f"webhooks may only go to Feishu's bot endpoints; {shown} is not allowed",
                f"use {EXAMPLE} (allowed: {', '.join(self.origins)}); a self-hosted Feishu"
                " is added by the platform's operators (webhook_origins in notification.yaml)",
            )
        if parts.username is not None or parts.password is not None:
            raise WebhookRefused(
                "a webhook URL must not carry a user name or password", f"use {EXAMPLE}"
            )
        token = parts.path[len(HOOK_PATH) :] if parts.path.startswith(HOOK_PATH) else ""
        if not _TOKEN.fullmatch(token) or parts.query or parts.fragment:
            raise WebhookRefused(
                "not a custom bot's webhook (path /open-apis/bot/v2/hook/<token>, no query)",
                f"copy the webhook from the bot's settings in the group chat, {EXAMPLE}",
            )

    def problem(self, url: str) -> str | None:
        """Why alerts may not go to `url` (None: they may)."""
        refused = self.refusal(url)
        return None if refused is None else refused[0]

    def refusal(self, url: str) -> tuple[str, str] | None:
        """Why alerts may not go to `url` and what would be accepted (None: they may)."""
        try:
            self.check(url)
        except WebhookRefused as exc:
            return exc.reason, exc.hint
        return None


_LOADED: dict[Path, tuple[int | None, WebhookPolicy]] = {}


def policy_of(config_dir: Path) -> WebhookPolicy:
    """The policy of `notification.yaml` in `config_dir` (absent: the default), read
    again only when the file changed."""
    path = config_dir / "notification.yaml"
    try:
        changed: int | None = path.stat().st_mtime_ns
    except FileNotFoundError:
        changed = None
    known = _LOADED.get(path)
    if known is not None and known[0] == changed:
        return known[1]
    loaded = yaml.safe_load(path.read_text()) if changed is not None else None
    if loaded is not None and not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    policy = WebhookPolicy.from_config(loaded or {})
    _LOADED[path] = (changed, policy)
    return policy
