"""The notification service on a real Postgres, delivering to a fake Feishu server.

Tests append task events as the other services would (through the task
domain's `decide`), hand each stored event to `NotificationApp.handle` in a
transaction as the Kafka consumer would, and run the service's loop step by
step (`app.step()`: the queue timer, then a delivery pass) until what they
wait for is in the task's stream. The Feishu side is a real HTTP server
(`tests/feishu_fake.py`) that checks signatures, rate limits and body size.
Times are shrunk (group window, backoff, thresholds) so each test takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from runyard.api.service import service_app
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import AlertSubscription, EnvVar, FaultToleranceOptions, TaskSpec
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    AlertDelivered,
    AlertFailed,
    WorkerPlacement,
)
from runyard.contracts.webhooks import WebhookPolicy
from runyard.domain import (
    Command,
    CompleteStage,
    ExitWorker,
    Fail,
    MarkAbnormal,
    Place,
    Preempt,
    Queue,
    RequestStop,
    StartStage,
    StartWorker,
    Submit,
    decide,
    fold,
)
from runyard.eventstore import PostgresEventStore
from runyard.logs import LogStore
from runyard.messaging import KafkaSettings
from runyard.notification import firsterror
from runyard.notification import store as tables
from runyard.notification.app import NotificationApp, NotificationConfig
from runyard.notification.main import register_gauges
from runyard.notification.ratelimit import Limits
from runyard.notification.rules import Subscription
from runyard.stack.leader import Presence
from runyard.telemetry import setup_metrics

from tests.feishu_fake import FeishuFake
from tests.integration.test_gateway_routing import SERVICE_TOKEN, closed_port_url, log_service
from tests.integration.test_metrics import scrape, value
from tests.log_records import log_record

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-signing-key"
FAST = NotificationConfig(
    gateway_url="http://gw.test",
    group_window_s=0.2,
    backoff_s=0.05,
    backoff_max_s=0.4,
    poll_s=0.05,
    # One AlertFailed per attempt, to follow retries; coalescing has its own tests.
    failure_window_s=0.0,
)


def allowing(config: NotificationConfig, fake: FeishuFake) -> NotificationConfig:
    """`config` with the fake Feishu's origin as the only allowed one (as an operator
    adds a self-hosted Feishu in notification.yaml)."""
    return replace(config, webhooks=WebhookPolicy((f"http://127.0.0.1:{fake.port}",)))


class Clock:
    """Wall-clock time plus an offset the test moves (Feishu checks timestamps)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


def spec(name: str, *alerts: AlertSubscription) -> TaskSpec:
    return TaskSpec(
        name=name,
        pool="pool-a",
        worker_spec="8gpu",
        worker_count=2,
        image="pytorch:2.3",
        command="python train.py",
        alerts=alerts,
    )


@dataclass
class Harness:
    store: PostgresEventStore
    fake: FeishuFake
    clock: Clock
    config: NotificationConfig
    apps: list[NotificationApp] = field(default_factory=list)
    #: Where the apps find the log service (`logs`: none until a test starts one).
    endpoints: dict[str, str] = field(default_factory=dict)

    async def new_app(self, config: NotificationConfig | None = None) -> NotificationApp:
        """A fresh service instance (as after a restart): nothing kept in memory."""
        if config is not None and config.webhooks == WebhookPolicy():
            config = allowing(config, self.fake)
        config = config or self.config
        logs = firsterror.LogService(
            self.endpoints, SERVICE_TOKEN, timeout_s=config.first_error_timeout_s
        )
        app = NotificationApp(self.store, config, clock=self.clock, logs=logs)
        await app.start()
        self.apps.append(app)
        return app

    @property
    def app(self) -> NotificationApp:
        return self.apps[-1]

    async def command(self, task_id: str, command: Command) -> list[RecordedEvent[Event]]:
        """Decide and append as the owning service would; hand the events to the app."""
        stream = f"task-{task_id}"
        events = await self.store.read_stream(stream)
        state = fold(events) if events else None
        new = decide(state, command, now=self.clock(), ids=lambda: "x")
        meta = Metadata(actor="service:test", correlation_id=f"corr-{task_id}")
        await self.store.append(
            stream, [NewEvent(e, meta, self.clock()) for e in new], len(events) if events else 0
        )
        recorded = await self.store.read_stream(stream, len(events) + 1)
        await self.deliver(recorded)
        return recorded

    async def deliver(self, events: list[RecordedEvent[Event]]) -> None:
        """What the IdempotentConsumer does: the handler inside a transaction."""
        for event in events:
            async with self.store.transaction() as conn:
                await self.app.handle(event, conn)

    async def submit(self, task_id: str, task_spec: TaskSpec, tenant: str = "t1") -> None:
        await self.command(task_id, Submit(task_id, tenant, "alice", task_spec))

    async def alerts(self, task_id: str) -> list[AlertDelivered | AlertFailed]:
        events = await self.store.read_stream(f"task-{task_id}")
        return [e.event for e in events if isinstance(e.event, AlertDelivered | AlertFailed)]

    async def run_until(self, done: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
        """Run the service loop until `done()` (or fail after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while not await done():
            assert time.monotonic() < deadline, "timed out waiting for the notification service"
            await self.app.step()
            await asyncio.sleep(self.config.poll_s)

    async def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await self.app.step()
            await asyncio.sleep(self.config.poll_s)

    async def tenant_subscription(self, webhook_url: str, *alerts: str, **kw: Any) -> Subscription:
        sub = Subscription(
            id=f"sub-{len(webhook_url)}-{len(alerts)}",
            tenant="t1",
            webhook_url=webhook_url,
            alerts=alerts,
            **kw,
        )
        await tables.insert_subscription(self.store.pool, sub, "user:t1/alice")
        return sub


@contextlib.asynccontextmanager
async def harness(
    dsn: str, config: NotificationConfig = FAST, *, serve: bool = True, **fake: Any
) -> AsyncIterator[Harness]:
    feishu = FeishuFake(bots={"bot-signed": SECRET, "bot-plain": None}, **fake)
    if serve:
        await feishu.start()
    store = await PostgresEventStore.connect(dsn, default_mapper())
    h = Harness(store, feishu, Clock(), allowing(config, feishu))
    await h.new_app()
    try:
        yield h
    finally:
        for app in h.apps:
            await app.close()
        await store.close()
        await feishu.stop()


async def signed_task_subscription(h: Harness, *alerts: str) -> AlertSubscription:
    """A spec subscription to the signed bot; its secret is in the secret store."""
    await tables.put_secret(h.store.pool, "t1", "secret-bot", SECRET)
    return AlertSubscription(
        webhook_url=h.fake.url("bot-signed"),
        alerts=alerts or ("failed",),
        secret_ref="secret-bot",
    )


# --- one failed task --------------------------------------------------------------


async def test_a_failed_task_alerts_once_with_a_signed_card(dsn: str) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "failed", "restarted")
        await h.submit("t-1", spec("llama-7b", sub))
        failed = await h.command("t-1", Fail("t-1", "worker 1 exited with status 137 (OOM)"))
        await h.deliver(failed)  # a redelivery changes nothing

        await h.run_until(lambda: _has_delivered(h, "t-1"))
        await h.run_for(0.5)  # later passes send nothing more

        assert [r.code for r in h.fake.received] == [0]
        card = h.fake.received[0]
        assert card.body is not None and card.body["msg_type"] == "interactive"
        assert card.title == "llama-7b · failed"
        for fact in (
            "**Task**\\nt-1",
            "**Tenant**\\nt1",
            "pool-a",
            "2 x 8gpu",
            "**Run**\\n1",
            "status 137 (OOM)",
            "/console/tasks/t-1",
        ):
            assert fact in card.text
        assert "sign" in card.body and SECRET not in card.text
        [delivered] = await h.alerts("t-1")
        assert isinstance(delivered, AlertDelivered)
        assert delivered.channel == "feishu:task:t-1:0" and delivered.attempt == 1
        assert delivered.alert.startswith("failed: TaskFailed")
        events = await h.store.read_stream("task-t-1")
        assert events[-1].metadata.actor == "service:notification"
        assert events[-1].metadata.causation_id == str(failed[0].event_id)
        assert events[-1].metadata.correlation_id == "corr-t-1"


async def test_a_message_the_log_does_not_hold_sends_no_alert(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An alert goes out only for an event the log holds as delivered: a forged message
    (a new id), or the stored event's id with another payload, sends nothing, and what
    it would have folded into the kept task is not what the real alert reads."""
    import uuid

    from runyard.contracts.task_events import TaskFailed

    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "failed")
        await h.submit("t-f", spec("real-name", sub))
        version = len(await h.store.read_stream("task-t-f"))
        meta = Metadata(actor="service:test", correlation_id="corr-t-f")
        forged = TaskFailed(run=1, attempt=1, reason="forged: send money to mallory")
        await h.deliver(
            [RecordedEvent(uuid.uuid4(), "task-t-f", version + 1, 10**9, utc_now(), forged, meta)]
        )
        (stored,) = await h.command("t-f", Fail("t-f", "worker 0 exited with status 1"))
        altered = RecordedEvent(
            stored.event_id, stored.stream_id, stored.stream_version, stored.global_position,
            stored.occurred_at, forged, stored.metadata,
        )  # fmt: skip
        await h.deliver([altered])
        await h.run_until(lambda: _has_delivered(h, "t-f"))
        await h.run_for(0.5)
        assert len(h.fake.received) == 1
        assert "status 1" in h.fake.received[0].text and "mallory" not in h.fake.received[0].text
        assert caplog.text.count("that the log does not hold was ignored") == 2


def utc_now() -> datetime:
    return datetime.now(UTC)


async def test_a_task_without_interest_sends_nothing(dsn: str) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "hang")
        await h.submit("t-2", spec("quiet", sub))
        await h.command("t-2", Fail("t-2", "boom"))
        await h.run_for(0.5)
        assert h.fake.received == [] and await h.alerts("t-2") == []


# --- bursts -------------------------------------------------------------------------


async def test_a_burst_of_100_failures_is_summarised_within_limits_and_nothing_lost(
    dsn: str,
) -> None:
    async with harness(dsn) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        ids = [f"b-{i:03d}" for i in range(100)]
        for task_id in ids:
            await h.submit(task_id, spec(f"sweep-{task_id}"))
        for task_id in ids:
            await h.command(task_id, Fail(task_id, "pool lost capacity: node a-3 went away"))

        async def all_delivered() -> bool:
            return all([await _has_delivered(h, t) for t in ids])

        await h.run_until(all_delivered, timeout_s=60)

        accepted = h.fake.accepted("bot-plain")
        assert 1 <= len(accepted) <= 5, "a burst goes as a few summary cards"
        assert h.fake.rate_limited() == 0
        named = " ".join(r.text for r in accepted)
        assert all(f"sweep-{t}" in named for t in ids), "every task is named in a summary"
        assert all(r.size <= 20 * 1024 for r in accepted)
        for task_id in ids:
            assert [type(a) for a in await h.alerts(task_id)] == [AlertDelivered]


async def failed(h: Harness, ids: list[str], prefix: str = "") -> list[str]:
    """Submit each task (named `prefix` + its id) and fail it: a `failed` alert each."""
    for task_id in ids:
        await h.submit(task_id, spec(prefix + task_id))
        await h.command(task_id, Fail(task_id, "boom"))
    return ids


async def until_delivered(
    h: Harness, ids: list[str], step: Callable[[], Awaitable[None]], poll_s: float, within_s: float
) -> None:
    """Run `step` every `poll_s` until every task of `ids` has its alert delivered."""
    deadline = time.monotonic() + within_s
    while not all([await _has_delivered(h, t) for t in ids]):
        assert time.monotonic() < deadline, "timed out waiting for the notification service"
        await step()
        await asyncio.sleep(poll_s)


async def test_without_summaries_the_token_buckets_pace_a_burst(dsn: str) -> None:
    # Feishu's limits scaled down (2 per 0.5 s, 4 per 2 s): slow enough that a send,
    # even on a loaded machine, takes far less than a token's refill, so the burst
    # must wait for tokens whatever the machine's speed.
    limits: dict[str, Any] = {"per_second": 2, "second_s": 0.5, "per_minute": 4, "minute_s": 2}
    config = replace(FAST, burst_threshold=1000, limits=Limits(**limits))
    async with harness(dsn, config, **limits) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        ids = await failed(h, [f"p-{i:02d}" for i in range(10)], "paced-")

        async def all_delivered() -> bool:
            return all([await _has_delivered(h, t) for t in ids])

        await h.run_until(all_delivered, timeout_s=60)

        assert len(h.fake.accepted("bot-plain")) == 10
        assert h.fake.rate_limited() == 0
        assert h.app.stats.waited_for_tokens > 0, "some were delayed, none dropped"


async def test_two_instances_never_send_the_same_alert_twice(dsn: str) -> None:
    config = replace(FAST, burst_threshold=1000)
    async with harness(dsn, config, per_second=100, per_minute=1000) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        ids = await failed(h, [f"d-{i:02d}" for i in range(12)], "dup-")
        first, second = h.app, await h.new_app(config)

        async def together() -> None:
            await asyncio.gather(first.step(), second.step())

        await until_delivered(h, ids, together, config.poll_s, within_s=20)

        titles = [r.title for r in h.fake.accepted()]
        assert sorted(titles) == sorted(f"dup-{t} · failed" for t in ids)
        for task_id in ids:
            assert len(await h.alerts(task_id)) == 1


async def test_two_instances_together_keep_one_bots_limits(dsn: str) -> None:
    """Feishu counts a bot's requests whoever sends them: two instances delivering a
    30-alert burst to one bot stay within its limits together (no 11232)."""
    # Feishu's limits scaled down (3 per 0.5 s, 10 per 2 s): a pass runs out of tokens
    # long before it could send the burst, also on a loaded machine.
    limits: dict[str, Any] = {"per_second": 3, "second_s": 0.5, "per_minute": 10, "minute_s": 2}
    config = replace(FAST, burst_threshold=1000, limits=Limits(**limits))
    async with harness(dsn, config, **limits) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        ids = await failed(h, [f"two-{i:02d}" for i in range(30)], "two-")
        first, second = h.app, await h.new_app(config)

        async def one_after_the_other() -> None:
            # The second takes what the first left for want of tokens, while the
            # first's requests are in the window.
            await first.step()
            await second.step()

        await until_delivered(h, ids, one_after_the_other, config.poll_s, within_s=60)

        assert len(h.fake.accepted("bot-plain")) == 30
        assert h.fake.rate_limited() == 0
        assert second.stats.requests + second.stats.waited_for_tokens > 0, "both took part"


async def test_too_fast_from_feishu_makes_every_instance_back_off(dsn: str) -> None:
    """A bot that answers 11232 ("too fast": its limits are lower than ours, or
    someone else sends to it too) gets nothing more from any instance until its
    backoff has passed; then the alerts go, in order."""
    config = replace(FAST, burst_threshold=1000, backoff_s=30.0, backoff_max_s=60.0)
    async with harness(dsn, config, per_second=1, second_s=0.2) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        ids = [f"fast-{i}" for i in range(4)]
        for task_id in ids:
            await h.submit(task_id, spec(task_id))
            await h.command(task_id, Fail(task_id, "boom"))
            h.clock.offset += timedelta(seconds=1)
        first, second = h.app, await h.new_app(config)

        async def all_delivered() -> bool:
            return all([await _has_delivered(h, t) for t in ids])

        backoffs = 0
        deadline = time.monotonic() + 60
        while not await all_delivered():
            assert time.monotonic() < deadline
            await asyncio.gather(first.step(), second.step())
            if await h.store.pool.fetchval("SELECT count(*) FROM alert_bots"):
                seen = len(h.fake.received)
                assert h.fake.received[-1].code == 11232
                for _ in range(6):  # neither instance sends while the bot backs off
                    await asyncio.gather(first.step(), second.step())
                    await asyncio.sleep(config.poll_s)
                assert len(h.fake.received) == seen, "a request went during the backoff"
                h.clock.offset += timedelta(seconds=61)
                backoffs += 1
            await asyncio.sleep(config.poll_s)

        assert backoffs >= 1 and h.fake.rate_limited() == backoffs
        assert [r.title for r in h.fake.accepted()] == [f"{t} · failed" for t in ids]


async def test_the_claims_of_an_instance_that_died_are_taken_back_at_once(dsn: str) -> None:
    """An instance killed mid-pass leaves its rows claimed for `claim_s` (300 s); once
    its presence has ended, the next instance sends them at its next pass."""
    async with harness(dsn) as h:
        await _failed_and_due(h, "t-orphan", "orphaned")
        async with Presence(dsn, "notification") as alive:
            h.app.claimer = alive.key
            async with Presence(dsn, "notification") as dying:
                assert await _claim(h, dying.key) == ["t-orphan"]
                await h.run_for(0.5)
                assert h.fake.received == [], "a living instance's claim is left alone"
            # Its session has ended, as a killed process's does (the kernel closes it).
            await h.run_until(lambda: _has_delivered(h, "t-orphan"), timeout_s=5)

        assert [r.title for r in h.fake.accepted()] == ["orphaned · failed"]
        assert len(await h.alerts("t-orphan")) == 1
        [row] = await tables.outbox(h.store.pool, "t-orphan")
        assert row["status"] == "delivered"
        assert await h.store.pool.fetchval("SELECT claimed_by FROM alert_outbox") is None


async def test_a_bots_alerts_go_from_one_instance_at_a_time_in_order(dsn: str) -> None:
    """While another living instance holds a bot's older alert (its pass is sending
    it), a newer alert to the same bot waits for it: it never overtakes."""
    async with harness(dsn) as h:
        await _failed_and_due(h, "t-older", "older")
        async with Presence(dsn, "notification") as alive:
            h.app.claimer = alive.key
            async with Presence(dsn, "notification") as other:
                assert await _claim(h, other.key) == ["t-older"]
                await h.submit("t-newer", spec("newer"))
                await h.command("t-newer", Fail("t-newer", "boom"))
                h.clock.offset += timedelta(seconds=1)  # past the group window
                await h.run_for(0.5)
                assert h.fake.received == [], "the newer alert overtook the older one"
            await h.run_until(lambda: _has_delivered(h, "t-newer"), timeout_s=10)

        assert [r.title for r in h.fake.accepted()] == ["older · failed", "newer · failed"]


async def test_rows_a_failed_pass_left_claimed_go_out_at_the_next_pass(dsn: str) -> None:
    """A pass that claimed rows and then failed (Postgres went away before it could
    give them back) leaves them claimed for `claim_s`: the same instance's next pass
    takes them back (its passes never overlap)."""
    async with harness(dsn) as h:
        await _failed_and_due(h, "t-left", "left-over")
        async with Presence(dsn, "notification") as me:
            h.app.claimer = me.key
            assert await _claim(h, me.key) == ["t-left"]
            await h.run_until(lambda: _has_delivered(h, "t-left"), timeout_s=5)

        assert [r.title for r in h.fake.accepted()] == ["left-over · failed"]
        assert len(await h.alerts("t-left")) == 1


async def _failed_and_due(h: Harness, task_id: str, name: str) -> None:
    """A failed task whose alert to the tenant's bot is due (past the group window)."""
    await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
    await h.submit(task_id, spec(name))
    await h.command(task_id, Fail(task_id, "boom"))
    h.clock.offset = timedelta(seconds=1)


async def _claim(h: Harness, claimer: int) -> list[str]:
    """Claim the due rows for `claimer`, as a pass does first; their tasks."""
    now = h.clock()
    until = now + timedelta(seconds=h.config.claim_s)
    return [a.task_id for a in await tables.claim_due(h.store.pool, now, until, claimer)]


# --- failures -----------------------------------------------------------------------


async def test_a_wrong_secret_is_recorded_as_failed_without_a_retry_loop(dsn: str) -> None:
    async with harness(dsn) as h:
        await tables.put_secret(h.store.pool, "t1", "secret-wrong", "not-the-secret")
        sub = AlertSubscription(
            webhook_url=h.fake.url("bot-signed"), alerts=("failed",), secret_ref="secret-wrong"
        )
        await h.submit("t-3", spec("mis-signed", sub))
        await h.command("t-3", Fail("t-3", "boom"))

        await h.run_until(lambda: _has_alert(h, "t-3"))
        await h.run_for(1.0)  # well past several backoffs

        assert [r.code for r in h.fake.received] == [19021]
        [failed] = await h.alerts("t-3")
        assert isinstance(failed, AlertFailed)
        assert failed.code == 19021 and not failed.retryable
        assert "sign match fail" in failed.reason
        assert "not-the-secret" not in failed.reason
        [row] = await tables.outbox(h.store.pool, "t-3")
        assert row["status"] == "failed" and row["attempts"] == 1


async def test_a_bot_down_then_up_gets_the_alert_after_retries(dsn: str) -> None:
    async with harness(dsn, serve=False) as h:
        sub = await signed_task_subscription(h, "failed")
        await h.submit("t-4", spec("flaky-bot", sub))
        await h.command("t-4", Fail("t-4", "boom"))

        async def two_failures() -> bool:
            return len(await h.alerts("t-4")) >= 2

        await h.run_until(two_failures)
        await h.fake.start()
        await h.run_until(lambda: _has_delivered(h, "t-4"))

        outcomes = await h.alerts("t-4")
        *failures, delivered = outcomes
        assert all(isinstance(f, AlertFailed) and f.retryable for f in failures)
        assert all("network error" in f.reason for f in failures if isinstance(f, AlertFailed))
        assert isinstance(delivered, AlertDelivered)
        assert delivered.attempt == len(failures) + 1
        assert [r.code for r in h.fake.received] == [0]


async def test_5xx_and_rate_limit_answers_are_retried(dsn: str) -> None:
    async with harness(dsn, fail_next=2) as h:
        sub = await signed_task_subscription(h, "failed")
        await h.submit("t-5", spec("retried", sub))
        await h.command("t-5", Fail("t-5", "boom"))
        await h.run_until(lambda: _has_delivered(h, "t-5"))
        outcomes = await h.alerts("t-5")
        assert [type(o).__name__ for o in outcomes] == [
            "AlertFailed",
            "AlertFailed",
            "AlertDelivered",
        ]
        assert all(o.retryable for o in outcomes if isinstance(o, AlertFailed))


async def test_alerts_are_given_up_only_after_retry_for_s_and_leave_a_record(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bot down for longer than `retry_for_s` (1 h here): its alerts are retried
    until then, then given up, each with a final AlertFailed that says so, and the
    service says so in its log; the bot back later gets nothing of them."""
    config = replace(FAST, retry_for_s=3600.0, burst_threshold=1000)
    async with harness(dsn, config, serve=False) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        for task_id in ("gu-1", "gu-2"):
            await h.submit(task_id, spec(task_id))
            await h.command(task_id, Fail(task_id, "boom"))

        await h.run_until(lambda: _attempts_at_least(h, "gu-1", 3))
        assert [r["status"] for r in await tables.outbox(h.store.pool)] == ["pending"] * 2
        h.clock.offset += timedelta(hours=2)  # the bot stays down past retry_for_s
        with caplog.at_level("WARNING", logger="runyard.notification"):
            await h.run_until(lambda: _all_settled(h))

        rows = await tables.outbox(h.store.pool)
        assert [r["status"] for r in rows] == ["failed", "failed"]
        assert rows[1]["attempts"] == 0, "it waited behind the first: no request of its own"
        for task_id in ("gu-1", "gu-2"):
            last = (await h.alerts(task_id))[-1]
            assert isinstance(last, AlertFailed) and not last.retryable
            assert "network error" in last.reason
            assert "gave up: not delivered within 1 h of the alert" in last.reason
        [given_up] = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
        assert "2 alert(s) of 2 task(s)" in given_up and "gu-1, gu-2" in given_up
        assert "feishu:sub-" in given_up and "bot-plain" not in given_up  # no bot token
        assert await h.store.pool.fetchval("SELECT count(*) FROM alert_bots") == 0, (
            "a bot with nothing left to send is forgotten: no backoff, no old outage"
        )
        await h.fake.start()
        await h.run_for(0.5)
        assert h.fake.received == []


async def test_a_feishu_outage_loses_no_alert_and_they_arrive_in_order(dsn: str) -> None:
    """Feishu down for longer than the old 8 attempts, with a restart of the service
    in between and an alert raised during the outage: when Feishu is back, every
    alert arrives, in the order they were raised."""
    config = replace(FAST, burst_threshold=1000)
    async with harness(dsn, config, serve=False) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed")
        ids = ["out-1", "out-2", "out-3", "out-4"]
        for task_id in ids[:3]:
            await h.submit(task_id, spec(task_id))
            await h.command(task_id, Fail(task_id, "boom"))
            h.clock.offset += timedelta(seconds=1)  # raised one after the other

        await h.run_until(lambda: _attempts_at_least(h, "out-1", 5))
        await h.new_app(config)  # the service restarts, Feishu still down
        await h.submit(ids[3], spec(ids[3]))
        await h.command(ids[3], Fail(ids[3], "boom"))
        await h.run_until(lambda: _attempts_at_least(h, "out-1", 10), timeout_s=60)
        rows = await tables.outbox(h.store.pool)
        assert [r["attempts"] for r in rows[1:]] == [0, 0, 0], "the others wait in line"
        assert h.app.failing == (1, 4), "one bot failing, four alerts waiting on it"
        setup_metrics("notification")
        unregister = register_gauges(h.app)
        try:  # what an SRE's dashboard reads on the service's /metrics
            text = await scrape(service_app("notification"))
            assert value(text, "runyard_alert_bots_failing") == 1
            assert value(text, "runyard_alerts_waiting") == 4
        finally:
            for gone in unregister:
                gone()

        await h.fake.start()

        async def all_delivered() -> bool:
            return all([await _has_delivered(h, t) for t in ids])

        await h.run_until(all_delivered)
        assert [r.title for r in h.fake.received] == [f"{t} · failed" for t in ids]
        assert h.app.failing == (0, 0)
        raised = await h.store.pool.fetchval(
            "SELECT created_at FROM alert_outbox WHERE task_id = 'out-1'"
        )
        when = raised.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        assert f"**Raised**\\n{when}" in h.fake.received[0].text, "a late card says when"
        failures = [a for a in await h.alerts("out-1") if isinstance(a, AlertFailed)]
        assert len(failures) >= 10 and all(f.retryable for f in failures)


async def test_a_dead_bot_holds_up_no_other_bots_alerts(dsn: str) -> None:
    """One team's bot is unreachable for good; another team's alerts, raised after
    the dead bot's, go at once, and the dead bot gets one request per backoff."""
    dead = FeishuFake(bots={"bot-dead": None})  # never started: nothing listens
    async with harness(dsn, replace(FAST, burst_threshold=1000)) as h:
        origins = (f"http://127.0.0.1:{h.fake.port}", f"http://127.0.0.1:{dead.port}")
        await h.new_app(replace(h.config, webhooks=WebhookPolicy(origins)))
        for n in range(5):
            sub = AlertSubscription(webhook_url=dead.url("bot-dead"), alerts=("failed",))
            await h.submit(f"dead-{n}", spec(f"dead-{n}", sub))
            await h.command(f"dead-{n}", Fail(f"dead-{n}", "boom"))
        await h.run_until(lambda: _attempts_at_least(h, "dead-0", 2))
        live = AlertSubscription(webhook_url=h.fake.url("bot-plain"), alerts=("failed",))
        await h.submit("live-1", spec("live-1", live))
        await h.command("live-1", Fail("live-1", "boom"))

        await h.run_until(lambda: _has_delivered(h, "live-1"))
        await h.run_until(lambda: _attempts_at_least(h, "dead-0", 4))
        assert [r.title for r in h.fake.received] == ["live-1 · failed"]
        behind = [r for r in await tables.outbox(h.store.pool) if r["task_id"] != "dead-0"]
        assert [(r["task_id"], r["attempts"]) for r in behind if r["attempts"] > 0] == [
            ("live-1", 1)
        ]


async def _attempts_at_least(h: Harness, task_id: str, n: int) -> bool:
    rows = await tables.outbox(h.store.pool, task_id)
    return bool(rows) and rows[0]["attempts"] >= n


async def _all_settled(h: Harness) -> bool:
    return all(r["status"] != "pending" for r in await tables.outbox(h.store.pool))


async def test_a_slow_bot_delays_only_its_own_alerts(dsn: str) -> None:
    """A team's bot that takes its time (here: until the test lets it answer) does not
    hold up another team's alert in the same pass."""
    async with harness(dsn, replace(FAST, http_timeout_s=120.0)) as h:
        h.fake.bots["bot-slow"] = None
        slow = h.fake.holds["bot-slow"] = asyncio.Event()
        for task_id, bot in (("slow-1", "bot-slow"), ("quick-1", "bot-plain")):
            sub = AlertSubscription(webhook_url=h.fake.url(bot), alerts=("failed",))
            await h.submit(task_id, spec(task_id, sub))
            await h.command(task_id, Fail(task_id, "worker 0 exited with status 1"))
        h.clock.offset += timedelta(seconds=1)  # both past the group window
        passing = asyncio.create_task(h.app.deliver())
        try:
            deadline = time.monotonic() + 20
            while not await _has_delivered(h, "quick-1"):
                assert time.monotonic() < deadline, "the quick bot waited for the slow one"
                await asyncio.sleep(0.05)
            assert not passing.done()  # the slow bot has still not answered
            assert [r.token for r in h.fake.received if r.token == "bot-slow"] == ["bot-slow"]
        finally:
            slow.set()
        await passing
        assert await _has_delivered(h, "slow-1")
        assert sorted(r.title for r in h.fake.accepted()) == ["quick-1 · failed", "slow-1 · failed"]


async def test_a_hanging_bot_holds_up_no_later_pass_and_keeps_its_order(dsn: str) -> None:
    """The service's loop does not wait for a bot that hangs: another team's alert,
    raised while it hangs, goes out at the next passes; the hanging bot's own later
    alert waits behind its first (no second request to it meanwhile), and both go
    in order once it answers."""
    async with harness(dsn, replace(FAST, http_timeout_s=120.0)) as h:
        h.fake.bots["bot-slow"] = None
        slow = h.fake.holds["bot-slow"] = asyncio.Event()
        hanging = AlertSubscription(webhook_url=h.fake.url("bot-slow"), alerts=("failed",))
        await h.submit("hang-1", spec("hang-1", hanging))
        await h.command("hang-1", Fail("hang-1", "boom"))
        h.clock.offset += timedelta(seconds=1)  # past the group window

        async def passes_until(done: Callable[[], Awaitable[bool]]) -> None:
            deadline = time.monotonic() + 30
            while not await done():
                assert time.monotonic() < deadline, "a pass waited for the hanging bot"
                async with asyncio.timeout(30):
                    await h.app.step(wait=False)  # as the service's loop runs it
                await asyncio.sleep(h.config.poll_s)

        async def slow_asked() -> bool:
            return any(r.token == "bot-slow" for r in h.fake.received)

        try:
            await passes_until(slow_asked)
            quick = AlertSubscription(webhook_url=h.fake.url("bot-plain"), alerts=("failed",))
            for task_id, sub in (("quick-1", quick), ("hang-2", hanging)):
                await h.submit(task_id, spec(task_id, sub))
                await h.command(task_id, Fail(task_id, "boom"))
            h.clock.offset += timedelta(seconds=1)
            await passes_until(lambda: _has_delivered(h, "quick-1"))
            await h.app.step(wait=False)
            assert [r.title for r in h.fake.received if r.token == "bot-slow"] == [
                "hang-1 · failed"
            ], "the hanging bot's next alert waits behind its first"
            assert not await _has_delivered(h, "hang-1")
        finally:
            slow.set()

        async def both() -> bool:
            return await _has_delivered(h, "hang-1") and await _has_delivered(h, "hang-2")

        await passes_until(both)
        slow_titles = [r.title for r in h.fake.accepted("bot-slow")]
        assert slow_titles == ["hang-1 · failed", "hang-2 · failed"]


async def test_many_bots_answering_at_once_never_stall_the_pass(dsn: str) -> None:
    """Twelve teams' bots, sent to side by side, all answering at the same moment: each
    outcome is recorded (the database pool, ten connections, is never waited on by a
    pass that holds one already), and the pass ends."""
    async with harness(dsn) as h:
        release = asyncio.Event()
        bots = [f"bot-{n}" for n in range(12)]
        for bot in bots:
            h.fake.bots[bot] = None
            h.fake.holds[bot] = release
            sub = AlertSubscription(webhook_url=h.fake.url(bot), alerts=("failed",))
            await h.submit(f"many-{bot}", spec(bot, sub))
            await h.command(f"many-{bot}", Fail(f"many-{bot}", "worker 0 exited with status 1"))
        h.clock.offset += timedelta(seconds=1)  # past the group window
        passing = asyncio.create_task(h.app.deliver())
        try:
            deadline = time.monotonic() + 20
            while len(h.fake.received) < len(bots):  # every request is in, none answered
                assert time.monotonic() < deadline, "the bots were not all sent to"
                await asyncio.sleep(0.05)
        finally:
            release.set()
        async with asyncio.timeout(30):
            await passing
        for bot in bots:
            assert await _has_delivered(h, f"many-{bot}"), bot


# --- storms of one task ---------------------------------------------------------------


async def test_one_tasks_alerts_in_a_window_go_as_one_card(dsn: str) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "failed", "stopped", "queued:600")
        await h.submit("t-7", spec("grouped", sub))
        await h.command("t-7", Queue("t-7", "needs 2 x 8-GPU workers", 0, 16, 0))
        await h.command("t-7", Fail("t-7", "first"))
        from runyard.contracts.task_events import TaskStopped

        # A made-up second alert of the same task within the window.
        await h.deliver(await _append(h, "t-7", TaskStopped(run=1)))
        await h.run_until(lambda: _count_delivered(h, "t-7", 2))
        assert len(h.fake.accepted()) == 1
        assert "Also in this window" in h.fake.accepted()[0].text


async def test_a_bot_subscribed_twice_gets_one_card_per_alert(dsn: str) -> None:
    """The team's bot in the task's spec and in a tenant subscription too: one card for
    the failure (and for the queue wait), not one per subscription."""
    async with harness(dsn, replace(FAST, queued_after_s=0.1)) as h:
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed", "queued", "stopped")
        own = AlertSubscription(webhook_url=h.fake.url("bot-plain"), alerts=("failed", "queued"))
        await h.submit("t-9", spec("twice", own))
        await h.command("t-9", Queue("t-9", "needs 2 x 8-GPU workers", 0, 16, 0))
        await h.run_until(lambda: _has_delivered(h, "t-9"))
        await h.command("t-9", Fail("t-9", "worker 0 exited with status 1"))
        await h.run_until(lambda: _count_delivered(h, "t-9", 2))
        await h.run_for(0.5)
        assert [r.title for r in h.fake.accepted("bot-plain")] == [
            "twice · queued · queued too long",
            "twice · failed",
        ]
        assert "Also in this window" not in h.fake.accepted("bot-plain")[1].text


async def test_a_repeat_of_the_same_alert_in_a_run_is_suppressed(dsn: str) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "failed")
        await h.submit("t-8", spec("repeated", sub))
        await h.command("t-8", Fail("t-8", "first"))
        await h.run_until(lambda: _has_delivered(h, "t-8"))
        from runyard.contracts.task_events import TaskFailed

        # The same alert again for the same run (e.g. a second writer's report).
        await h.deliver(await _append(h, "t-8", TaskFailed(run=1, attempt=0, reason="again")))
        await h.run_for(0.5)
        assert len(h.fake.accepted()) == 1
        statuses = [r["status"] for r in await tables.outbox(h.store.pool, "t-8")]
        assert statuses == ["delivered", "suppressed"]


async def test_a_requeued_tasks_card_says_why_it_was_preempted(dsn: str) -> None:
    """The reader of a `requeued` card learns why the task lost its GPUs, not only
    that it did."""
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "requeued")
        await h.submit("t-12", spec("spotty", sub).model_copy(update={"resource_type": "spot"}))
        workers = tuple(WorkerPlacement(index=i, node="n-0", gpus=(i,)) for i in range(2))
        await h.command("t-12", Place("t-12", "pool-a", workers))
        await h.command("t-12", Preempt("t-12", "spot capacity reclaimed: zone drained"))
        await h.run_until(lambda: _has_delivered(h, "t-12"))
        [card] = h.fake.accepted()
        assert card.title == "spotty · queued · requeued after preemption"
        assert "preempted (spot capacity reclaimed: zone drained) and requeued" in card.text


async def test_a_stopped_tasks_card_says_who_stopped_it(dsn: str) -> None:
    """A bot read by a team: the card of a stop names who asked, and in what role."""
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "stopped")
        await h.submit("t-13", spec("halted", sub))
        await h.command("t-13", RequestStop("t-13", by="bob", role="member"))
        await h.run_until(lambda: _has_delivered(h, "t-13"))
        [card] = h.fake.accepted()
        assert card.title == "halted · stopped"
        assert "stopped by bob (member)" in card.text


async def test_a_restarted_tasks_card_says_what_the_attempt_died_of(dsn: str) -> None:
    """A `restarted` card after a crash names the worker and its exit code, as the
    `failed` card of a task without restarts does, not only 'failure'."""
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "restarted")
        options = FaultToleranceOptions(auto_restart=True, max_restarts=2)
        await h.submit("t-14", spec("crashy", sub).model_copy(update={"fault_tolerance": options}))
        workers = tuple(WorkerPlacement(index=i, node="n-0", gpus=(i,)) for i in range(2))
        await h.command("t-14", Place("t-14", "pool-a", workers))
        for stage in DEPLOY_STAGES:
            await h.command("t-14", StartStage("t-14", stage))
            await h.command("t-14", CompleteStage("t-14", stage))
        for worker in range(2):
            await h.command("t-14", StartWorker("t-14", 1, 1, worker))
        await h.command("t-14", ExitWorker("t-14", 1, 1, 1, 3))
        await h.run_until(lambda: _has_delivered(h, "t-14"))
        [card] = h.fake.accepted()
        assert card.title == "crashy · restarting · restart scheduled"
        assert "failure (worker 1 exited with code 3): attempt 2 starts in" in card.text


# --- queued too long ---------------------------------------------------------------------


async def test_a_restart_during_a_long_queue_still_fires_queued_too_long_once(dsn: str) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "queued:1800")
        await h.submit("t-9", spec("waiting", sub))
        await h.command("t-9", Queue("t-9", "needs 2 x 8-GPU workers, pool can start 1", 3, 16, 1))
        h.clock.offset = timedelta(minutes=20)  # the queue moved: no event (a read model's)
        await h.run_for(0.3)
        assert h.fake.received == []  # 20 min < 30 min

        await h.app.close()  # the service stops...
        h.clock.offset = timedelta(minutes=45)  # ...while the task keeps waiting
        await h.new_app()  # and starts again with an empty memory

        await h.run_until(lambda: _has_delivered(h, "t-9"))
        await h.new_app()  # another restart after it fired
        await h.run_for(0.5)

        [card] = h.fake.received
        assert card.title == "waiting · queued · queued too long"
        assert "queued for 45 min" in card.text and "pool can start 1" in card.text
        assert len(await h.alerts("t-9")) == 1


async def test_what_fired_for_a_wait_is_forgotten_once_the_wait_ended(dsn: str) -> None:
    """The service remembers a fired queued alert only while its wait lasts: a long
    running service must not hold one key per task that ever waited."""
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "queued:60")
        await h.submit("t-12", spec("waited", sub))
        await h.command("t-12", Queue("t-12", "waiting", 0, 16, 0))
        h.clock.offset = timedelta(minutes=5)
        await h.run_until(lambda: _has_delivered(h, "t-12"))
        assert len(h.app._fired) == 1
        await h.command("t-12", Fail("t-12", "ends the wait"))

        async def forgotten() -> bool:
            return not h.app._fired

        await h.run_until(forgotten)
        assert await tables.queue_waits(h.store.pool) == []
        assert len(await h.alerts("t-12")) == 1


async def test_a_task_placed_before_the_threshold_never_fires(dsn: str) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "queued:60")
        await h.submit("t-10", spec("placed", sub))
        await h.command("t-10", Queue("t-10", "waiting", 0, 16, 0))
        await h.command("t-10", Fail("t-10", "ends the wait"))  # any end of the wait will do
        h.clock.offset = timedelta(minutes=5)
        await h.run_for(0.4)
        assert h.fake.received == []
        assert await tables.queue_waits(h.store.pool) == []


# --- the first error on the card -----------------------------------------------------

#: A run's output: boot lines that mention errors harmlessly, then worker 1's traceback.
TRACEBACK_LOGS = [
    (0, "NCCL INFO Bootstrap : Using eth0:10.0.0.12<0>"),
    (0, "epoch 0 step 10 loss=4.12 errors=0"),
    (1, "epoch 0 step 20 loss=3.98"),
    (1, "Traceback (most recent call last):"),
    (1, '  File "/workspace/train.py", line 88, in <module>'),
    (1, "    for batch in loader:"),
    (1, '  File "/workspace/data.py", line 41, in collate_fn'),
    (1, "    return torch.stack([x['input_ids'] for x in items])"),
    (1, "KeyError: 'input_ids'"),
    (0, "[rank0]: Traceback (most recent call last):"),  # a later error of another worker
    (0, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
]


async def write_logs(h: Harness, task_id: str, lines: list[tuple[int, str]], run: int = 1) -> None:
    """A run's lines in the log service's tables, as its ingester stores them."""
    logs = LogStore(h.store.pool)
    t0 = h.clock() - timedelta(minutes=5)
    await logs.ingest(
        [
            log_record(
                t0 + timedelta(milliseconds=100 * i),
                task_id,
                text,
                run=run,
                worker=worker,
                stream="stderr",
            )
            for i, (worker, text) in enumerate(lines)
        ]
    )


async def test_a_failed_tasks_card_shows_the_first_error_its_worker_and_layer(
    dsn: str, tmp_path: Path
) -> None:
    async with harness(dsn) as h, log_service(dsn, tmp_path, h.endpoints):
        sub = await signed_task_subscription(h, "failed")
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed", text_only=True)
        await h.submit("fe-1", spec("collator", sub))
        await write_logs(h, "fe-1", TRACEBACK_LOGS)
        await h.command("fe-1", Fail("fe-1", "worker 1 exited with status 1"))
        await h.run_until(lambda: _count_delivered(h, "fe-1", 2))

        [card] = h.fake.accepted("bot-signed")
        assert card.body is not None and card.body["msg_type"] == "interactive"
        contents = [e["text"]["content"] for e in card.body["card"]["elements"] if "text" in e]
        at = next(i for i, c in enumerate(contents) if c.startswith("**First error**"))
        heading, line, layer = contents[at : at + 3]
        assert heading == "**First error** · worker 1 · attempt 1"
        assert line == "Traceback (most recent call last):\n…\nKeyError: 'input_ids'"
        assert layer.startswith("**Likely layer** training_code (rule training.data)")
        assert "data pipeline" in layer
        assert "status 1" in card.text  # the reason is still there
        [text] = h.fake.accepted("bot-plain")
        assert text.body is not None and text.body["msg_type"] == "text"
        words = text.body["content"]["text"]
        assert "first error (worker 1, attempt 1): Traceback (most recent call last): … " in words
        assert "KeyError: 'input_ids'" in words
        assert "likely layer: training_code (rule training.data)" in words


async def test_a_secret_the_worker_printed_never_reaches_a_card(dsn: str, tmp_path: Path) -> None:
    """A creator-only variable's value that a worker printed in its first error (or that
    a reason quotes) is `[redacted]` on the card and the text, and in the outbox."""
    password = "pg-pass-7f3a9c21"
    inline = "inline-token-55d0e2"
    async with harness(dsn) as h, log_service(dsn, tmp_path, h.endpoints):
        sub = await signed_task_subscription(h, "failed")
        await h.tenant_subscription(h.fake.url("bot-plain"), "failed", text_only=True)
        await tables.put_secret(h.store.pool, "t1", "db-pass", password)
        env = (
            EnvVar(name="DB_PASSWORD", creator_only=True, secret_ref="db-pass"),
            EnvVar(name="HUB_TOKEN", creator_only=True, value=inline),
        )
        await h.submit("se-1", spec("secretive", sub).model_copy(update={"env": env}))
        await write_logs(
            h,
            "se-1",
            [
                (0, f"HUB_TOKEN={inline} ok"),
                (0, f"Error: could not connect to postgres://app:{password}@db:5432/train"),
            ],
        )
        await h.command("se-1", Fail("se-1", f"worker 0 exited (dsn app:{password}@db)"))
        await h.run_until(lambda: _count_delivered(h, "se-1", 2))

        [card] = h.fake.accepted("bot-signed")
        [text] = h.fake.accepted("bot-plain")
        for message in (card, text):
            assert message.body is not None
            raw = json.dumps(message.body)
            assert password not in raw and inline not in raw
            assert "postgres://app:[redacted]@db:5432/train" in raw  # the line, redacted
            # the reason too (in a card's Markdown, its brackets are Feishu's entities)
            assert "(dsn app:[redacted]@db)" in raw or "(dsn app:&#91;redacted&#93;@db)" in raw
        rows = await h.store.pool.fetch("SELECT facts::text AS f FROM alert_outbox")
        assert rows and all(password not in r["f"] for r in rows)


async def test_a_failed_task_without_logs_still_alerts_without_a_first_error(
    dsn: str, tmp_path: Path
) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "failed")
        # No log service on this platform: no endpoint to ask.
        await h.submit("fe-2", spec("no-log-service", sub))
        await h.command("fe-2", Fail("fe-2", "worker 0 exited with status 1"))
        await h.run_until(lambda: _has_delivered(h, "fe-2"))
        async with log_service(dsn, tmp_path, h.endpoints):
            # The log service runs, but this task wrote nothing (another one did).
            await write_logs(h, "someone-else", TRACEBACK_LOGS)
            await h.submit("fe-3", spec("no-logs", sub))
            await h.command("fe-3", Fail("fe-3", "image pull failed"))
            await h.run_until(lambda: _has_delivered(h, "fe-3"))
            # Logs, but no error among them (a calm run stopped by the platform).
            await write_logs(h, "fe-4", TRACEBACK_LOGS[:3])
            await h.submit("fe-4", spec("calm-logs", sub))
            await h.command("fe-4", Fail("fe-4", "node lost"))
            await h.run_until(lambda: _has_delivered(h, "fe-4"))

        cards = h.fake.accepted()
        assert [c.title for c in cards] == [
            "no-log-service · failed",
            "no-logs · failed",
            "calm-logs · failed",
        ]
        for card in cards:
            assert "First error" not in card.text and "Likely layer" not in card.text


async def test_a_log_service_down_or_refusing_never_fails_the_alert(
    dsn: str, tmp_path: Path
) -> None:
    async with harness(dsn) as h:
        sub = await signed_task_subscription(h, "failed")
        # The log service is down: nothing listens where it should answer.
        h.endpoints["logs"] = closed_port_url()
        await h.submit("fe-5", spec("logs-down", sub))
        await write_logs_when_served(h, dsn, tmp_path, "fe-5")
        await h.command("fe-5", Fail("fe-5", "boom"))
        await h.run_until(lambda: _has_delivered(h, "fe-5"))
        # It answers, but not to this credential: a 401, and the card still goes.
        own, other = h.app.logs, firsterror.LogService(h.endpoints, "not-the-credential")
        assert own is not None
        async with log_service(dsn, tmp_path, h.endpoints):
            assert await other.lookup("fe-5", 1) is None
            h.app.logs = other
            await h.submit("fe-7", spec("logs-refusing", sub))
            await write_logs(h, "fe-7", TRACEBACK_LOGS)
            await h.command("fe-7", Fail("fe-7", "boom"))
            await h.run_until(lambda: _has_delivered(h, "fe-7"))
            # With the credential, the same service gives the error the cards went without.
            known = await own.lookup("fe-7", 1)
            assert known is not None and known.exception == "KeyError: 'input_ids'"
        h.app.logs = own
        await other.aclose()
        cards = h.fake.accepted()
        assert [c.title for c in cards] == ["logs-down · failed", "logs-refusing · failed"]
        assert all("First error" not in card.text for card in cards)


async def write_logs_when_served(h: Harness, dsn: str, tmp_path: Path, task_id: str) -> None:
    """The task's traceback stored by a log service that is then gone again."""
    async with log_service(dsn, tmp_path, {}):
        await write_logs(h, task_id, TRACEBACK_LOGS)


async def test_an_abnormal_tasks_huge_first_error_line_is_cut_and_the_card_fits(
    dsn: str, tmp_path: Path
) -> None:
    async with harness(dsn) as h, log_service(dsn, tmp_path, h.endpoints):
        sub = await signed_task_subscription(h, "abnormal")
        # near the longest line the log store can hold (a worker's output is cut at 64 KiB)
        huge = "RuntimeError: shapes \x1b[31mdo not match\x1b[0m " + "[1024, 4096] " * 5_000
        await h.submit("fe-6", spec("huge-line", sub))
        await write_logs(h, "fe-6", [(2, "step 1"), (2, huge)])
        reason = "needs a person: " + "the loss went NaN again " * 2_000
        await h.command("fe-6", MarkAbnormal("fe-6", reason))
        await h.run_until(lambda: _has_delivered(h, "fe-6"))

        [card] = h.fake.received
        assert card.accepted and card.size <= 20 * 1024
        assert card.body is not None and card.body["msg_type"] == "interactive"
        assert "**First error** · worker 2 · attempt 1" in card.text
        assert "RuntimeError: shapes do not match [1024, 4096]" in card.text
        assert "\\u001b" not in card.text and "[31m" not in card.text  # no terminal colours
        assert "training_code (rule training.exception)" in card.text
        assert "…" in card.text


# --- helpers ------------------------------------------------------------------------------


async def _append(h: Harness, task_id: str, event: Event) -> list[RecordedEvent[Event]]:
    stream = f"task-{task_id}"
    version = await h.store.stream_version(stream)
    await h.store.append(
        stream, [NewEvent(event, Metadata(actor="service:test"), h.clock())], version
    )
    return await h.store.read_stream(stream, version + 1)


async def _has_alert(h: Harness, task_id: str) -> bool:
    return bool(await h.alerts(task_id))


async def append_decided(
    store: PostgresEventStore, task_id: str, clock: Callable[[], datetime], *commands: Command
) -> None:
    """Decide each of `commands` on the task's stream and append what it gives, as the
    owning services would (not handed to any app: a consumer reads them)."""
    for command in commands:
        events = await store.read_stream(f"task-{task_id}")
        new = decide(fold(events) if events else None, command, now=clock(), ids=str)
        meta = Metadata(actor="service:test")
        await store.append(
            f"task-{task_id}", [NewEvent(e, meta, clock()) for e in new], len(events)
        )


async def _has_delivered(h: Harness, task_id: str) -> bool:
    return await _count_delivered(h, task_id, 1)


async def _count_delivered(h: Harness, task_id: str, n: int) -> bool:
    return sum(isinstance(a, AlertDelivered) for a in await h.alerts(task_id)) >= n


# --- the whole path -------------------------------------------------------------------------


@pytest.mark.slow
async def test_through_kafka_a_failed_task_is_delivered_by_the_running_service(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    from runyard.notification.main import run
    from runyard.relay import OutboxRelay
    from runyard.stack.context import ServiceContext

    settings = {"notification_group_window_s": 0.1, "notification_poll_s": 0.05}
    ctx = ServiceContext(dsn, kafka, tmp_path, tmp_path, settings=dict(settings))
    store = await PostgresEventStore.connect(dsn, default_mapper())
    fake = FeishuFake(bots={"bot-signed": SECRET})
    await fake.start()
    # The fake is a self-hosted Feishu to the service: allowed in its config folder.
    (tmp_path / "notification.yaml").write_text(
        f"webhook_origins: ['http://127.0.0.1:{fake.port}']\n"
    )
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    tasks = [asyncio.create_task(relay.run()), asyncio.create_task(run(ctx))]
    try:
        await asyncio.wait_for(relay.ready.wait(), 30)
        h = Harness(store, fake, Clock(), FAST)
        await tables.migrate(store.pool)  # the service may still be starting
        await tables.put_secret(store.pool, "t1", "secret-bot", SECRET)
        sub = AlertSubscription(
            webhook_url=fake.url("bot-signed"), alerts=("failed",), secret_ref="secret-bot"
        )
        submit = Submit("k-1", "t1", "alice", spec("via-kafka", sub))
        await append_decided(store, "k-1", h.clock, submit, Fail("k-1", "boom"))
        deadline = time.monotonic() + 60
        while not await _has_delivered(h, "k-1"):
            assert time.monotonic() < deadline, "no AlertDelivered through Kafka"
            await asyncio.sleep(0.1)
        assert [r.code for r in fake.received] == [0]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await store.close()
        await fake.stop()
