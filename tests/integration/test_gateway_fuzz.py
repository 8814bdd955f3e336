"""A bounded schemathesis run over /openapi.json against the ASGI app.

Schemathesis generates requests (valid and invalid) for every operation of the
gateway's OpenAPI document; each is sent with a valid token (a platform admin's,
then a member's) to the ASGI app (httpx.ASGITransport) over a real Postgres.
The gateway runs on its own event loop in a thread, because Hypothesis drives
this test synchronously.

Two properties: no answer is a 5xx, and no request the document calls valid
(schemathesis' positive mode) is refused for its shape (413, or a 400 whose
code is a shape refusal): the document publishes every limit (docs/limits.md).
A request that is well formed but names a pool, image or volume that does not
exist is still refused by the submission rules with their own code; that is
not a shape refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runyard.api.auth import create_token
from runyard.api.security import TokenAuthenticator
from runyard.api.service import service_app
from runyard.contracts import default_mapper
from runyard.eventstore import PostgresEventStore
from runyard.faulttolerance.app import FaultToleranceApp
from runyard.faulttolerance.http import faulttolerance_router
from runyard.faulttolerance.reports import StackReportStore
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.scheduler.http import http_app as scheduler_app
from schemathesis import GenerationMode

from tests.integration.test_gateway import BASE, config_dir
from tests.integration.test_gateway_routing import log_service, notification_service, serving

T = TypeVar("T")
# In all, over every operation; RUNYARD_FUZZ_EXAMPLES runs a longer search.
MAX_EXAMPLES = int(os.environ.get("RUNYARD_FUZZ_EXAMPLES", "100"))


class LoopThread:
    """An event loop in a thread: run coroutines on it from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Target:
    """The ASGI app over a real gateway, and an admin's bearer token."""

    def __init__(self, dsn: str, folder: Path, role: str) -> None:
        self.runner = LoopThread()
        self.gateway, self.token = self.runner.run(self._start(dsn, folder, role))
        self.ids: dict[str, str] = {}
        self.app = create_app(self.gateway, self.endpoints)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gw", timeout=30
        )

    async def _start(self, dsn: str, folder: Path, role: str) -> tuple[Gateway, str]:
        """The gateway, with every service whose routes it routes answering beside it
        (a down owner is a 503 by design, not what this test looks for)."""
        self.owners = contextlib.AsyncExitStack()
        self.endpoints: dict[str, str] = {}
        store = await PostgresEventStore.connect(dsn, default_mapper())
        self.owners.push_async_callback(store.close)
        reports = StackReportStore(store.pool)
        await reports.migrate()
        ft = FaultToleranceApp(store, reports=reports)
        faces = {
            "scheduler": scheduler_app(store, role=lambda: "active"),
            "faulttolerance": service_app(
                "faulttolerance",
                routers=[faulttolerance_router(ft, reports, TokenAuthenticator(store.pool))],
            ),
        }
        await self.owners.enter_async_context(
            log_service(dsn, folder.parent / "exports", self.endpoints)
        )
        await self.owners.enter_async_context(notification_service(dsn, folder, self.endpoints))
        for name, face in faces.items():
            await self.owners.enter_async_context(serving(name, face, self.endpoints))
        gateway = await Gateway.connect(dsn, folder, endpoints=self.endpoints)
        token = await create_token(gateway.db, "t1", "root", role)
        return gateway, token

    def send(self, kwargs: dict[str, Any]) -> httpx.Response:
        return self.runner.run(self._send(kwargs))

    async def _send(self, kwargs: dict[str, Any]) -> httpx.Response:
        method, url = kwargs.pop("method"), kwargs.pop("url")
        generated = kwargs.pop("headers", None) or {}
        headers = {k: v for k, v in generated.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {self.token}"
        request: dict[str, Any] = {"headers": headers, "params": kwargs.pop("params", None)}
        if "json" in kwargs:
            request["json"] = kwargs.pop("json")
        elif kwargs.get("data") is not None:
            request["content"] = kwargs.pop("data")
        if path := url.removeprefix("http://gw"):
            if "/watch" in path:  # a stream: only its status line matters here
                async with self.client.stream(method, path, **request) as answer:
                    return answer
            return await self.client.request(method, path, **request)
        raise AssertionError(url)  # pragma: no cover

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.run(self.app.state.owners.aclose())  # its connections to the owners
        self.runner.run(self.gateway.close())
        self.runner.run(self.owners.aclose())
        self.runner.close()


#: Near-valid spec changes: with the seeded ids they reach the rules and the store.
SPEC_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=20),
        "command": st.text(max_size=40),
        "pool": st.sampled_from(["pool-a", "pool-east", "pool-spot", "nope"]),
        "worker_spec": st.sampled_from(["1gpu", "4gpu", "8gpu", "3gpu"]),
        "worker_count": st.integers(-1, 12),
        "image": st.sampled_from(["pytorch:2.3-cuda12", "bash-only", "nope:1"]),
        "env": st.text(max_size=30),
        "tags": st.lists(st.text(max_size=8), max_size=3),
        "framework": st.sampled_from(["pytorch_ddp", "none", "x"]),
        "rdma": st.booleans(),
    },
)


#: 400 codes that refuse a request for its shape: the document must have said so.
SHAPE_CODES = frozenset({"request.invalid", "spec.invalid", "spec.unknown_field"})


def shape_refusal(answer: httpx.Response) -> bool:
    """Whether the answer refuses the request for its shape (not for what it names)."""
    if answer.status_code in (413, 422):
        return True
    if answer.status_code != 400:
        return False
    try:
        code = answer.json().get("code")
    except ValueError:
        return True
    return code in SHAPE_CODES


@pytest.fixture(params=["platform_admin", "member"])
def target(request: pytest.FixtureRequest, dsn: str, tmp_path: Path) -> Iterator[Target]:
    made = Target(dsn, config_dir(tmp_path), request.param)
    seeded = made.send({"method": "POST", "url": "http://gw/v1/tasks", "json": BASE})
    assert seeded.status_code == 201, seeded.text
    group = {"template": BASE, "items": [{"name": "a"}]}
    grouped = made.send({"method": "POST", "url": "http://gw/v1/groups", "json": group})
    assert grouped.status_code == 201, grouped.text
    made.ids = {
        "task_id": seeded.json()["task_id"],
        "group_id": grouped.json()["group_id"],
        "pool_id": "pool-a",
    }
    try:
        yield made
    finally:
        made.close()


@pytest.mark.slow
def test_openapi_fuzz_finds_no_server_error(target: Target) -> None:
    schema = schemathesis.openapi.from_dict(target.app.openapi())
    # The gateway refuses NUL in any text (Postgres cannot store it; docs/limits.md):
    # a request with one is not a valid request, whatever the document's types say.
    schema.config.generation.update(allow_x00=False)
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE)
    )

    seen: Counter[tuple[str, str, int]] = Counter()

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases, real_ids=st.booleans(), changes=SPEC_CHANGES)
    def no_5xx(case: Any, real_ids: bool, changes: dict[str, Any]) -> None:
        positive = case.meta is not None and case.meta.generation.mode.is_positive
        # The seeded task / group, and a near-valid body where one is taken; not for a
        # watch: it streams until the task ends, and ASGITransport waits for the whole body.
        if real_ids and not case.operation.path.endswith("/watch"):
            for name in case.path_parameters or {}:
                case.path_parameters[name] = target.ids.get(name, case.path_parameters[name])
            path = case.operation.path
            if path in ("/v1/tasks", "/v1/groups") and case.method.upper() == "POST":
                spec = {**BASE, **changes}
                case.body = spec if path == "/v1/tasks" else {"template": spec, "items": [{}]}
                positive = False  # the near-valid changes need not follow the document
            elif path.endswith(("/rerun", "/clone")):
                case.body = changes
                positive = False
        kwargs = case.as_transport_kwargs(base_url="http://gw")
        answer = target.send(dict(kwargs))
        seen[(case.method, case.operation.path, answer.status_code)] += 1
        assert answer.status_code < 500, (case.method, case.formatted_path, kwargs, answer.text)
        assert not (positive and shape_refusal(answer)), (
            "schema-valid request rejected",
            case.method,
            case.formatted_path,
            kwargs,
            answer.text,
        )

    no_5xx()
    print("\n".join(f"{n:4} {m} {p} -> {s}" for (m, p, s), n in sorted(seen.items())))
    assert len({(m, p) for m, p, _ in seen}) > 10  # the search reached most operations
