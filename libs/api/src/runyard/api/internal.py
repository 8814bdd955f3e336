"""Calling another service's internal HTTP routes, and reading an answer within a bound.

A service asks the owner of some data over the owner's API (the notification
service asks the log service for a run's first error, the deployer asks it
which output lines it has stored). `ServiceClient` is that call: the owner's
URL is looked up in the platform's endpoints at each call (a service that
starts later, or moves, is found), the platform's service credential goes in
`x-runyard-service-token` (`runyard.contracts.rpc.credential`), redirects are
not followed, and an answer is read up to `max_answer_bytes` and refused past
it, so a wrong or hostile answer cannot fill the caller's memory.

`read_at_most` is the bounded read on its own, for answers from outside the
platform whose head is enough (a webhook's reply).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from runyard.contracts.rpc import credential

#: The most of an internal answer read by default (a first error with its context,
#: the missing ranges of 256 streams).
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class AnswerTooLarge(ValueError):
    """An answer longer than the caller reads."""


async def read_at_most(answer: httpx.Response, limit: int, *, refuse: bool = False) -> bytes:
    """The first `limit` bytes of an answer's body (the rest is not read); with
    `refuse`, an answer longer than `limit` raises `AnswerTooLarge` instead."""
    head = bytearray()
    async for chunk in answer.aiter_bytes():
        if refuse and len(head) + len(chunk) > limit:
            raise AnswerTooLarge(f"the answer is over {limit} bytes")
        head += chunk[: limit - len(head)]
        if len(head) >= limit:
            break
    return bytes(head)


@dataclass
class ServiceClient:
    """The internal routes of service `name`, at `endpoints[name]`."""

    endpoints: Mapping[str, str]
    name: str
    token: str
    timeout_s: float = 30.0
    max_answer_bytes: int = MAX_ANSWER_BYTES
    _client: httpx.AsyncClient | None = field(default=None, repr=False)

    @property
    def known(self) -> bool:
        """Whether the platform has this service (its URL is in the endpoints)."""
        return bool(self.endpoints.get(self.name))

    async def get(self, path: str) -> dict[str, Any]:
        return await self._call("GET", path)

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        return await self._call("POST", path, body)

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """The JSON object the route answers; raises when the service is not known,
        cannot be reached, refuses (`httpx.HTTPStatusError`) or answers something else."""
        base = self.endpoints.get(self.name)
        if not base:
            raise LookupError(f"no {self.name} service on this platform")
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, timeout=self.timeout_s)
        headers = {credential.METADATA_KEY: self.token}
        content = None if body is None else json.dumps(body).encode()
        if content is not None:
            headers["Content-Type"] = "application/json"
        async with self._client.stream(
            method, f"{base}{path}", content=content, headers=headers
        ) as answer:
            answer.raise_for_status()
            data = await read_at_most(answer, self.max_answer_bytes, refuse=True)
        parsed = json.loads(data)
        if not isinstance(parsed, dict):
            raise ValueError(f"the {self.name} service's answer is not a JSON object")
        return parsed

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
