"""A local HTTP server that behaves like Feishu's custom-bot webhook endpoint.

`POST /open-apis/bot/v2/hook/{token}` with a JSON body, as Feishu takes it:

- a bot made with `secret` checks `timestamp` (seconds, within `window_s` of
  now) and `sign` (HMAC-SHA256 keyed by `timestamp + "\\n" + secret` over an
  empty message, base64): a mismatch answers code 19021;
- more than `per_second` requests in any `second_s`, or `per_minute` in any
  `minute_s`, to one bot answer code 11232 (the request is not taken);
- a body over 20 KB, not JSON, or not a valid text or interactive card
  message answers HTTP 400 with code 9499;
- anything else is accepted: `{"code": 0, "msg": "success"}`.

Every request is recorded (`received`), with its answer code. With `hold` (an
unset event), the answers wait until it is set: the bot has taken a card, and
its caller has not heard so yet (a caller killed meanwhile never hears); `holds` does
so for some bots only (a slow bot beside quick ones). `start()` and
`stop()` bring the server up and down on the same port, so tests can show a
bot that is unreachable for a while.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from runyard.stack.ports import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

MAX_BODY_BYTES = 20 * 1024


@dataclass
class Received:
    """One request the fake got, and the Feishu code it answered."""

    token: str
    at: float
    size: int
    body: dict[str, Any] | None
    code: int

    @property
    def accepted(self) -> bool:
        return self.code == 0

    @property
    def title(self) -> str:
        if self.body is None:
            return ""
        if self.body.get("msg_type") == "interactive":
            return str(self.body["card"]["header"]["title"]["content"])
        return str(self.body.get("content", {}).get("text", "")).split("\n")[0]

    @property
    def text(self) -> str:
        """Everything readable in the message, for assertions."""
        return json.dumps(self.body, ensure_ascii=False)


@dataclass
class FeishuFake:
    """The fake endpoint; `bots` maps a hook token to its secret (None: unsigned bot)."""

    bots: dict[str, str | None] = field(default_factory=dict)
    per_second: int = 5
    per_minute: int = 100
    second_s: float = 1.0
    minute_s: float = 60.0
    window_s: float = 3600.0
    #: Answer HTTP 503 to the next `fail_next` requests (a bot having a bad moment).
    fail_next: int = 0
    #: While this event is unset, answers wait for it (requests are recorded first).
    hold: asyncio.Event | None = None
    #: Answers to these bots (hook tokens) wait for their event: a bot that is slow.
    holds: dict[str, asyncio.Event] = field(default_factory=dict)
    port: int = field(default_factory=lambda: free_port())
    received: list[Received] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    def url(self, token: str) -> str:
        return f"http://127.0.0.1:{self.port}/open-apis/bot/v2/hook/{token}"

    def accepted(self, token: str | None = None) -> list[Received]:
        return [r for r in self.received if r.accepted and token in (None, r.token)]

    async def start(self) -> None:
        app = Starlette(
            routes=[Route("/open-apis/bot/v2/hook/{token}", self._hook, methods=["POST"])]
        )
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                await self._task  # raises why it could not start
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None

    async def _hook(self, request: Request) -> JSONResponse:
        token = request.path_params["token"]
        raw = await request.body()
        now = time.time()
        body = _json(raw)
        status, code, message = self._judge(token, raw, body, now)
        self.received.append(Received(token, now, len(raw), body, code))
        if self.hold is not None:
            await self.hold.wait()
        if (slow := self.holds.get(token)) is not None:
            await slow.wait()
        answer = {"code": code, "msg": message, "data": {}}
        if code == 0:
            answer |= {"StatusCode": 0, "StatusMessage": "success"}
        return JSONResponse(answer, status_code=status)

    def _judge(
        self, token: str, raw: bytes, body: dict[str, Any] | None, now: float
    ) -> tuple[int, int, str]:
        if self.fail_next > 0:
            self.fail_next -= 1
            return 503, -1, "service unavailable"
        if token not in self.bots:
            return 404, 19001, "param invalid: incoming webhook access token invalid"
        if len(raw) > MAX_BODY_BYTES:
            return 400, 9499, "Bad Request: request body too large"
        if body is None or not _valid_message(body):
            return 400, 9499, "Bad Request"
        secret = self.bots[token]
        if secret is not None and not _signed(body, secret, now, self.window_s):
            return (
                200,
                19021,
                "sign match fail or timestamp is not within one hour from current time",
            )
        if self._too_fast(token, now):
            return 200, 11232, "frequency limited psm[lark.oapi.app_platform_runtime]appID[-1]"
        return 200, 0, "success"

    def _too_fast(self, token: str, now: float) -> bool:
        taken = [r.at for r in self.received if r.token == token and r.accepted]
        in_second = sum(1 for at in taken if now - at < self.second_s)
        in_minute = sum(1 for at in taken if now - at < self.minute_s)
        return in_second >= self.per_second or in_minute >= self.per_minute

    def rate_limited(self, token: str | None = None) -> int:
        """Requests answered 11232: a sender that keeps Feishu's limits gets none."""
        return sum(1 for r in self.received if r.code == 11232 and token in (None, r.token))


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _signed(body: dict[str, Any], secret: str, now: float, window_s: float) -> bool:
    try:
        timestamp = int(body["timestamp"])
    except (KeyError, TypeError, ValueError):
        return False
    if abs(now - timestamp) > window_s:
        return False
    key = f"{timestamp}\n{secret}".encode()
    expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    return hmac.compare_digest(expected, str(body.get("sign", "")))


def _valid_message(body: dict[str, Any]) -> bool:
    kind = body.get("msg_type")
    if kind == "text":
        content = body.get("content")
        return isinstance(content, dict) and isinstance(content.get("text"), str)
    if kind == "interactive":
        return _valid_card(body.get("card"))
    return False


def _valid_card(card: Any) -> bool:
    if not isinstance(card, dict):
        return False
    title = card.get("header", {}).get("title", {})
    if not isinstance(title, dict) or not isinstance(title.get("content"), str):
        return False
    elements = card.get("elements")
    if not isinstance(elements, list) or not elements:
        return False
    return all(isinstance(e, dict) and isinstance(e.get("tag"), str) for e in elements)
