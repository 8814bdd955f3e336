"""kill -9 of the notification service between Feishu's taking a card and its
recording the delivery.

The relay and the notification service run as `python -m runyard.stack.serve
<name>`, with nothing in common but Postgres and the broker. Feishu (the fake)
takes the card of a failed task and holds its answer; the service is killed
meanwhile, so the card is taken but its delivery is not recorded, and the
outbox row stays claimed by the dead process for `claim_s` (300 s). A new
service process sends it again at once (alerts are at least once) and records
one `AlertDelivered`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import httpx
import pytest
from runyard.contracts import default_mapper
from runyard.contracts.spec import AlertSubscription, TaskSpec
from runyard.contracts.task_events import AlertDelivered
from runyard.domain import Fail, Submit
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.notification import store as tables
from runyard.stack.context import ServiceContext
from runyard.stack.ports import free_port
from runyard.stack.serve import migrate_service
from runyard.stack.supervisor import ChildSpec, service_specs

from tests.e2e.conftest import copy_config
from tests.feishu_fake import FeishuFake
from tests.integration.test_faulttolerance_apart import stop_children
from tests.integration.test_notification import append_decided

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICES = ("relay", "notification")
BOT = "bot-kill"
TASK = "notify-kill-1"


class Services:
    """The children, each started from its spec; restartable by name."""

    def __init__(self, specs: list[ChildSpec], logs: Path) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.logs = logs
        self.children: dict[str, asyncio.subprocess.Process] = {}
        self.starts = 0

    async def start(self, name: str) -> None:
        spec = self.specs[name]
        self.starts += 1
        with (self.logs / f"{name}.{self.starts}.log").open("wb") as out:
            self.children[name] = await asyncio.create_subprocess_exec(
                *spec.argv, env=spec.env, stdout=out, stderr=out, start_new_session=True
            )

    async def kill(self, name: str) -> None:
        child = self.children[name]
        os.killpg(child.pid, signal.SIGKILL)
        await child.wait()

    async def ready(self, name: str) -> bool:
        child = self.children[name]
        assert child.returncode is None, f"{name} exited with {child.returncode}"
        async with httpx.AsyncClient(timeout=5) as client:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"{self.specs[name].url}/readyz")
                return answer.status_code == 200
        return False

    async def stop(self) -> None:
        await stop_children(self.children)


async def until(what: str, within: float, done: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + within
    while not await done():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(0.1)


@pytest.fixture
async def feishu() -> AsyncIterator[FeishuFake]:
    fake = FeishuFake(bots={BOT: None}, hold=asyncio.Event())
    await fake.start()
    try:
        yield fake
    finally:
        assert fake.hold is not None
        fake.hold.set()
        await fake.stop()


async def test_a_card_taken_before_the_kill_is_sent_again_at_once_and_recorded_once(
    dsn: str, kafka: KafkaSettings, tmp_path: Path, feishu: FeishuFake
) -> None:
    assert feishu.hold is not None
    config = copy_config(tmp_path / "config")
    # The fake is a self-hosted Feishu to the service: allowed in its config folder.
    (config / "notification.yaml").write_text(
        f"webhook_origins: ['http://127.0.0.1:{feishu.port}']\n"
    )
    ctx = ServiceContext(
        dsn=dsn,
        kafka=kafka,
        data_dir=tmp_path / "home",
        config_dir=config,
        settings={"notification_group_window_s": 0.1, "notification_poll_s": 0.1},
        endpoints={name: f"http://127.0.0.1:{free_port()}" for name in SERVICES},
    )
    await migrate_service("notification", dsn, grants=False)
    store = await PostgresEventStore.connect(dsn, default_mapper())
    (tmp_path / "logs").mkdir()
    services = Services(service_specs(ctx, SERVICES), tmp_path / "logs")
    try:
        for name in SERVICES:
            await services.start(name)
        for name in SERVICES:
            await until(f"{name} ready", 60, partial(services.ready, name))

        await _fail_a_task_that_alerts(store, feishu.url(BOT))
        await until("Feishu took the card", 60, lambda: _true(len(feishu.received) == 1))
        await services.kill("notification")
        feishu.hold.set()  # its answer has nobody to go to now
        [row] = await tables.outbox(store.pool, TASK)
        assert row["status"] == "pending", "the killed service recorded nothing"

        await services.start("notification")
        # Its claim runs 300 s: a delivery within 60 s is the claim taken back.
        await until("AlertDelivered after the restart", 60, lambda: _delivered(store))

        cards = [card for card in feishu.accepted(BOT) if TASK in card.text]
        assert len(cards) == 2, "sent again after the kill (at least once)"
        events = await store.read_stream(f"task-{TASK}")
        assert sum(isinstance(e.event, AlertDelivered) for e in events) == 1
        [row] = await tables.outbox(store.pool, TASK)
        assert row["status"] == "delivered"
    finally:
        await services.stop()
        await store.close()
        for log in sorted((tmp_path / "logs").iterdir()):
            tail = log.read_text(errors="replace")[-3000:]
            if tail.strip():
                print(f"--- {log.name}\n{tail}")


async def _fail_a_task_that_alerts(store: PostgresEventStore, webhook_url: str) -> None:
    """The task's submission and failure, as the gateway and the deployer append them."""
    spec = TaskSpec(
        name="killed-mid-delivery",
        pool="pool-a",
        worker_spec="8gpu",
        worker_count=1,
        image="pytorch:2.3",
        command="python train.py",
        alerts=(AlertSubscription(webhook_url=webhook_url, alerts=("failed",)),),
    )
    now = partial(datetime.now, UTC)
    await append_decided(store, TASK, now, Submit(TASK, "t1", "alice", spec), Fail(TASK, "boom"))


async def _delivered(store: PostgresEventStore) -> bool:
    events = await store.read_stream(f"task-{TASK}")
    return any(isinstance(e.event, AlertDelivered) for e in events)


async def _true(value: bool) -> bool:
    return value
