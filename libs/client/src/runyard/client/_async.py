"""The asyncio client (`AsyncClient`): `runyard.client._sync` with awaits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

import httpx
from runyard.client import _calls as calls
from runyard.client._calls import Body, Call
from runyard.client._errors import ClientError, refusal
from runyard.client._retry import IDEMPOTENT_METHODS, Retry
from runyard.client._transport import DEFAULT_TIMEOUT_S, base_url, headers, unreachable
from runyard.contracts import http as wire

T = TypeVar("T")


class AsyncClient:
    """The gateway's HTTP API, typed: each method sends one call and answers its model
    (`runyard.contracts.http`), or raises the refusal (`runyard.client.ApiError`) or
    `GatewayUnreachable`; retryable failures are sent again as `retry` says.

    `url`: the gateway (default RUNYARD_URL, else http://127.0.0.1:8080); `token`: the
    bearer token (default RUNYARD_TOKEN); `http`: an `httpx.AsyncClient` to send with
    instead (its base URL and headers are used as they are); `on_retry`: called with the
    error and the seconds about to be waited before a call is sent again (to show it)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        retry: Retry | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        http: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_retry: Callable[[ClientError, float], None] | None = None,
    ) -> None:
        self.retry = retry or Retry()
        self._owned = http is None
        self.http = http or httpx.AsyncClient(
            base_url=base_url(url), headers=headers(token), timeout=timeout
        )
        self._sleep = sleep
        self._on_retry = on_retry

    async def aclose(self) -> None:
        if self._owned:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- sending --------------------------------------------------------------------

    async def send(self, call: Call[T]) -> T:
        """The answer of `call`, read as its model."""
        answer = await self._send(call)
        return call.read(answer.json() if answer.content else None)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        idempotent: bool | None = None,
    ) -> Any:
        """Any route's JSON answer (None for an empty one), with the same errors and
        retries as the typed methods; `idempotent`: whether it may be sent twice
        (default: by its method)."""
        ask = calls.call(method, path, calls.raw, params=params, body=json, idempotent=idempotent)
        return await self.send(ask)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        http_timeout: httpx.Timeout | float | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """A streamed answer (a watch, a log follow, a download), its body not read yet;
        a refusal is raised before anything is yielded. `http_timeout`: None waits as long as
        the stream lasts. A failure before the stream starts is retried as any call is (a
        429 `streams.too_many`, refused before it starts; a 503 of a GET); once it has
        started, never: it may have been partly consumed."""
        idempotent = method.upper() in IDEMPOTENT_METHODS
        async with AsyncExitStack() as opened:
            attempt = 1
            while True:
                try:
                    answer = await opened.enter_async_context(
                        self.http.stream(method, path, params=params, timeout=http_timeout)
                    )
                    if answer.status_code < 300:
                        break
                    await answer.aread()
                    raise refusal(answer)
                except httpx.TransportError as exc:
                    error: ClientError = unreachable(exc)
                    cause: BaseException = exc
                except ClientError as exc:
                    error = cause = exc
                await opened.aclose()  # the refused answer's connection
                wait = self.retry.wait_s(error, attempt=attempt, idempotent=idempotent)
                if wait is None:
                    raise error from (None if cause is error else cause)
                if self._on_retry is not None:
                    self._on_retry(error, wait)
                await self._sleep(wait)
                attempt += 1
            try:
                yield answer
            except httpx.TransportError as exc:
                raise unreachable(exc) from exc

    async def _send(self, call: Call[Any]) -> httpx.Response:
        attempt = 1
        while True:
            try:
                return await self._once(call)
            except ClientError as error:
                wait = self.retry.wait_s(error, attempt=attempt, idempotent=call.idempotent)
                if wait is None:
                    raise
                if self._on_retry is not None:
                    self._on_retry(error, wait)
            await self._sleep(wait)
            attempt += 1

    async def _once(self, call: Call[Any]) -> httpx.Response:
        try:
            answer = await self.http.request(
                call.method, call.path, params=call.params, json=call.json
            )
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        if answer.status_code >= 300:
            raise refusal(answer)
        return answer

    # --- tasks ----------------------------------------------------------------------

    async def create_task(self, spec: Body) -> wire.Task:
        """Submit a task spec (a mapping, or a `runyard.contracts.requests.TaskSubmission`);
        the new task, with warnings."""
        return await self.send(calls.create_task(spec))

    async def get_task(self, task_id: str) -> wire.Task:
        return await self.send(calls.get_task(task_id))

    async def list_tasks(self, **filters: Any) -> wire.TaskPage:
        """A page of tasks, newest first: status, name, tag, pool, creator, limit,
        cursor (a `next_cursor`), tenant."""
        return await self.send(calls.list_tasks(**filters))

    async def iter_tasks(self, **filters: Any) -> AsyncIterator[wire.TaskRow]:
        """Every task matching `filters`, page after page."""
        while True:
            page = await self.list_tasks(**filters)
            for row in page.items:
                yield row
            if page.next_cursor is None:
                return
            filters["cursor"] = page.next_cursor

    async def stop_task(self, task_id: str) -> wire.Task:
        return await self.send(calls.stop_task(task_id))

    async def rerun_task(self, task_id: str, changes: Body | None = None) -> wire.Task:
        """Run a finished task again; `changes`: command, worker spec/count, image."""
        return await self.send(calls.rerun_task(task_id, changes))

    async def clone_task(self, task_id: str, overrides: Body | None = None) -> wire.Task:
        return await self.send(calls.clone_task(task_id, overrides))

    async def task_events(self, task_id: str) -> list[wire.TaskEvent]:
        return await self.send(calls.task_events(task_id))

    # --- groups, pools, catalogue ---------------------------------------------------

    async def create_group(self, group: Body) -> wire.Group:
        return await self.send(calls.create_group(group))

    async def get_group(self, group_id: str, *, tenant: str | None = None) -> wire.Group:
        return await self.send(calls.get_group(group_id, tenant=tenant))

    async def list_groups(
        self, *, limit: int | None = None, tenant: str | None = None, cursor: str | None = None
    ) -> wire.GroupPage:
        return await self.send(calls.list_groups(limit=limit, tenant=tenant, cursor=cursor))

    async def stop_group(self, group_id: str) -> wire.Group:
        return await self.send(calls.stop_group(group_id))

    async def rerun_group(self, group_id: str, changes: Body | None = None) -> wire.Group:
        return await self.send(calls.rerun_group(group_id, changes))

    async def pools(self) -> list[wire.Pool]:
        return await self.send(calls.pools())

    async def pool_capacity(self, pool_id: str) -> wire.PoolCapacity:
        return await self.send(calls.pool_capacity(pool_id))

    async def catalogue(self) -> wire.Catalogue:
        return await self.send(calls.catalogue())

    # --- logs, fault tolerance, causation, tokens, alerts ---------------------------

    async def task_logs(self, task_id: str, **query: Any) -> wire.LogPage:
        """A page of the task's log lines: worker, run, since, until, words, phrase,
        regex, ignore_case, order, limit, cursor."""
        return await self.send(calls.task_logs(task_id, **query))

    async def first_error(self, task_id: str, run: int | None = None) -> wire.FirstError:
        return await self.send(calls.first_error(task_id, run))

    async def ft_log(self, task_id: str) -> wire.FaultToleranceLog:
        return await self.send(calls.ft_log(task_id))

    async def task_trace(self, task_id: str, limit: int | None = None) -> wire.Trace:
        return await self.send(calls.task_trace(task_id, limit))

    async def audit_events(self, **query: Any) -> wire.AuditPage:
        return await self.send(calls.audit_events(**query))

    async def create_token(self, request: Body) -> wire.IssuedToken:
        return await self.send(calls.create_token(request))

    async def list_tokens(
        self, *, tenant: str | None = None, include_revoked: bool | None = None
    ) -> wire.TokenPage:
        return await self.send(calls.list_tokens(tenant=tenant, include_revoked=include_revoked))

    async def revoke_token(self, token_id: str) -> wire.TokenInfo:
        return await self.send(calls.revoke_token(token_id))

    async def alert_subscriptions(self) -> wire.AlertSubscriptions:
        return await self.send(calls.alert_subscriptions())

    async def subscribe_alerts(self, subscription: Body) -> wire.AlertSubscription:
        return await self.send(calls.subscribe_alerts(subscription))

    async def unsubscribe_alerts(self, subscription_id: str) -> wire.Deleted:
        return await self.send(calls.unsubscribe_alerts(subscription_id))


__all__ = ["AsyncClient"]
