"""The notification service's application layer: rules, the queue timer, delivery, audit.

Three steps, each safe to repeat and to restart:

1. `handle(event, conn)` (the IdempotentConsumer's handler, in its inbox
   transaction): a task event that raises an alert puts one row per
   interested subscription in the outbox (`alert_outbox`); a repeat of the same
   alert of the same run within `repeat_interval_s` is kept as `suppressed`.
   Queue events keep `queue_waits` (the tasks waiting now and since when).
2. `tick()`: the "queued too long" timer. It reads `queue_waits` (so a restart
   finds every wait again, with the time the log gives) and puts a `queued`
   alert in the outbox once per wait and subscription: the row's dedupe key
   names the wait, so firing again is a no-op.
3. `deliver()`: one delivery pass over due outbox rows, per bot (webhook).
   A bot's rows wait `group_window_s` after the first of them so that one
   task's alerts go in one card; more than `burst_threshold` tasks at once go
   as summary cards naming every task. Each request needs a token of the
   bot's limits (5/s, 100/min), counted in Postgres for all instances
   (`ratelimit.SharedLimiter`); what does not get one waits for the next
   pass. A delivery is appended to the task's stream (`AlertDelivered`,
   through the task domain's `Record`) in the same transaction as the row's
   new status. Failed attempts to one webhook are coalesced: they are counted
   per webhook in a window of `failure_window_s` (`alert_failures`, in the
   same transaction), and when the window closes one `AlertFailed` with the
   counts goes to the task of its first failure (0: one event per attempt).
   Network errors, 5xx and 11232 ("too fast") make the bot back off
   (`alert_bots`, shared by all instances: `backoff_s` doubling, at most
   `backoff_max_s`): its alerts wait behind the one that failed, in order,
   and go when it answers again, for up to `retry_for_s` after each was
   raised; then they are given up (failed, `AlertFailed` with "gave up", a
   warning in the log). A bot that is down costs one request per backoff,
   and other bots' alerts never wait for it. Other refusals (19021
   signature, 9499 bad request, a redirect) are final at once. Only
   webhooks the `WebhookPolicy` allows are called (checked again before
   each request); redirects are not followed, at most `max_answer_bytes`
   of an answer are read, and only its code is kept.
   The card of a `failed` or `abnormal` alert carries the run's first error
   when the log service knows it (looked up then, never failing the alert).

`EVENT_TYPES` are the task events `handle` reacts to, derived from the rules'
table and the queue events; the consumer is given them as its filter, so it
skips every other event before any database work.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final

import asyncpg
import httpx
from runyard.api.internal import read_at_most
from runyard.api.tasks import TaskStates
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.envelope import utcnow
from runyard.contracts.task_events import (
    AlertDelivered,
    AlertFailed,
    TaskPlaced,
    TaskQueued,
    TaskRequeued,
)
from runyard.contracts.webhooks import WebhookPolicy
from runyard.domain import Record, TaskState, decide, fold
from runyard.eventstore import ConcurrencyError, PostgresEventStore
from runyard.notification import feishu, firsterror, store
from runyard.notification.feishu import MAX_BODY_BYTES, AlertFacts, FirstErrorFact, Outcome
from runyard.notification.ratelimit import Limits, SharedLimiter
from runyard.notification.redaction import NOTHING, Redactor, task_redactor
from runyard.notification.rules import (
    ALERT_EVENTS,
    FIRST_ERROR_KINDS,
    Subscription,
    alert_kind,
    queue_due,
    queued_reason,
    reason,
    spec_words,
    task_subscriptions,
)
from runyard.notification.store import Cause, Db, FailureWindow, PendingAlert, QueueWait

log = logging.getLogger("runyard.notification")

ACTOR = "service:notification"
#: Events that start, change or end a queue wait besides the alert events (which
#: `handle` looks at too: a failed, stopped or abnormal task waits no more).
QUEUE_EVENTS: Final = (TaskQueued, TaskRequeued, TaskPlaced)
#: Every task event type `handle` reacts to: the alert events of the rules' table
#: and the queue events. The consumer skips all others before any database work.
#: (`TaskPreempted` starts a wait too, but the same decision always appends
#: `TaskRequeued` or `TaskMarkedAbnormal` after it; tests/integration/
#: test_notification_events.py checks over random task histories that skipping
#: the other types never leaves the queue waits behind.)
_HANDLED: Final[tuple[type[Event], ...]] = (*ALERT_EVENTS, *QUEUE_EVENTS)
EVENT_TYPES: Final = frozenset(t.type_name() for t in _HANDLED)
_APPEND_RETRIES = 5


@dataclass(frozen=True, slots=True)
class NotificationConfig:
    """Knobs of the service; tests shrink the times so that they run in seconds.

    `from_settings` ignores unknown names (`max_attempts` of older settings among
    them: retries are bounded by `retry_for_s`)."""

    gateway_url: str = "http://127.0.0.1:8080"
    #: Default threshold of the `queued` alert.
    queued_after_s: float = 1800.0
    #: A bot's alerts wait this long after the first one, so one task's alerts
    #: (and a burst across tasks) go out together.
    group_window_s: float = 5.0
    #: The same alert of the same run to the same subscription at most once in this time.
    repeat_interval_s: float = 3600.0
    #: More tasks than this for one bot in one pass go as summary cards.
    burst_threshold: int = 3
    summary_per_card: int = 40
    max_body_bytes: int = MAX_BODY_BYTES
    limits: Limits = field(default_factory=Limits)
    #: A bot that failed retryably is tried again after this, doubling, at most `backoff_max_s`.
    backoff_s: float = 2.0
    backoff_max_s: float = 300.0
    #: An alert whose bot keeps failing is retried this long after it was raised,
    #: then given up (an outage of Feishu of some hours loses nothing).
    retry_for_s: float = 6 * 3600.0
    http_timeout_s: float = 10.0
    #: How often the service runs the timer and a delivery pass.
    poll_s: float = 0.5
    #: How long a delivery pass holds the rows it took. A crash gives them back at
    #: once when the instance has a presence (`NotificationApp.claimer`), else then.
    claim_s: float = 300.0
    #: Longest wait for the log service's first error of a run (then the card goes without).
    first_error_timeout_s: float = 5.0
    #: Where alerts may go (Feishu's bot endpoints; `webhook_origins` in notification.yaml).
    webhooks: WebhookPolicy = field(default_factory=WebhookPolicy)
    #: Failed attempts to one webhook within this long are one `AlertFailed` (0: one each).
    failure_window_s: float = 60.0
    #: The most of a webhook's answer that is read (Feishu's is a few dozen bytes).
    max_answer_bytes: int = 16 * 1024
    #: Bots a delivery pass sends to at the same time (each bot's requests in order).
    bots_at_once: int = 16

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> NotificationConfig:
        """The config from `notification_<field>` settings (unknown ones ignored)."""
        given = {
            name: settings[f"notification_{name}"]
            for name in cls.__dataclass_fields__
            if f"notification_{name}" in settings
        }
        return cls(**given)


@dataclass
class PassStats:
    """What delivery passes did so far (for tests and logs)."""

    requests: int = 0
    delivered: int = 0
    failed: int = 0
    retried: int = 0
    waited_for_tokens: int = 0
    given_up: int = 0


@dataclass
class NotificationApp:
    """Alerts for task events over the event store; see the module docstring."""

    store: PostgresEventStore
    config: NotificationConfig = NotificationConfig()
    clock: Callable[[], datetime] = utcnow
    http: httpx.AsyncClient | None = None
    #: Where the first error of a failed run is asked (None: cards go without it).
    logs: firsterror.LogService | None = None
    #: This instance's presence key (`runyard.stack.leader.Presence`): its claims are
    #: marked with it, so another instance takes them back as soon as it dies.
    claimer: int | None = None
    stats: PassStats = field(default_factory=PassStats)
    #: After the last pass: bots failing with alerts waiting, and those alerts (the
    #: service's gauges `runyard_alert_bots_failing` and `runyard_alerts_waiting`).
    failing: tuple[int, int] = (0, 0)
    _fired: set[str] = field(default_factory=set)
    #: The bots' sends under way (one task per bot; `deliver`), per webhook URL.
    _sending: dict[str, asyncio.Task[int]] = field(default_factory=dict)
    _bots_at_once: asyncio.Semaphore | None = None
    #: First errors looked up in this delivery pass, per (task, run).
    _first_errors: dict[tuple[str, int], FirstErrorFact | None] = field(default_factory=dict)
    #: Alerts given up in a bot's send, per bot (for one line in the log).
    _given_up: defaultdict[str, list[PendingAlert]] = field(
        default_factory=lambda: defaultdict(list)
    )
    _limiter: SharedLimiter | None = None
    _tasks: TaskStates | None = None

    @property
    def db(self) -> asyncpg.Pool:
        return self.store.pool

    @property
    def limiter(self) -> SharedLimiter:
        if self._limiter is None:
            self._limiter = SharedLimiter(self.db, self.config.limits)
        return self._limiter

    async def start(self) -> None:
        """Create the tables; the outbox and queue waits already hold what a restart needs."""
        await store.migrate(self.db)
        if self.http is None:
            self.http = httpx.AsyncClient(
                timeout=self.config.http_timeout_s, follow_redirects=False
            )

    @property
    def _at_once(self) -> asyncio.Semaphore:
        if self._bots_at_once is None:
            self._bots_at_once = asyncio.Semaphore(self.config.bots_at_once)
        return self._bots_at_once

    async def close(self) -> None:
        """Stop the bots' sends under way (their rows are given back) and the clients."""
        for sending in self._sending.values():
            sending.cancel()
        if self._sending:
            await asyncio.wait(list(self._sending.values()))
        self._sending.clear()
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self.logs is not None:
            await self.logs.aclose()

    async def step(self, *, wait: bool = True) -> None:
        """One round of the service loop: the queue timer, then a delivery pass
        (`wait` False: not waiting for the bots' sends; see `deliver`)."""
        await self.tick()
        await self.deliver(wait=wait)

    # --- 1. rules ---------------------------------------------------------------

    async def handle(
        self, event: RecordedEvent[Event], conn: asyncpg.Connection | None = None
    ) -> None:
        """React to one task event (the IdempotentConsumer's handler)."""
        payload = event.event
        if not event.stream_id.startswith("task-") or payload.type_name() not in EVENT_TYPES:
            return
        kind = alert_kind(payload)
        state = await self._state_at(event)
        db: Db = conn if conn is not None else self.db
        wanted: list[Subscription] = []
        if kind is not None and (wanted := await self._wanted(db, state, kind)):
            # Someone is to be told: only of an event the log holds, about the task as
            # the log has it (and so to whom the log's task says).
            if not await self._recorded(event):
                return
            state = await self._state_at(event)
            wanted = await self._wanted(db, state, kind)
        cause = Cause(str(event.event_id), event.metadata.correlation_id or str(event.event_id))
        await self._track_queue(db, state, cause)
        if kind is not None and wanted:
            facts = self._facts(state, kind, reason(payload, state))
            facts = (await task_redactor(db, state.tenant, state.spec)).facts(facts)
            label = f"{kind}: {payload.type_name()} of run {state.run}"
            key = str(event.event_id)
            for sub in wanted:
                await self._add(db, sub, facts, label, f"{sub.id}|{key}", cause)

    async def _recorded(self, event: RecordedEvent[Event]) -> bool:
        """Whether the log holds `event` as the broker delivered it (id and payload at its
        stream and version). An alert goes out only then, about the task as the log has
        it: what was kept of the task is read again, since a message folded on earlier
        (to save a read) may not have been the log's. One read or two per alert."""
        if not await self.store.holds_or_says(event, log):
            return False
        if self._tasks is not None:
            self._tasks.states.forget(event.stream_id.removeprefix("task-"))
        return True

    async def _state_at(self, event: RecordedEvent[Event]) -> TaskState:
        """The task as of `event` (later events are not looked at, so a replay agrees),
        from the tasks folded last (only what lies after the kept state is read)."""
        if self._tasks is None:
            self._tasks = TaskStates(self.store)
        return await self._tasks.at(event)

    def _facts(self, state: TaskState, kind: str, why: str) -> AlertFacts:
        return AlertFacts(
            task_id=state.task_id,
            task_name=state.spec.name,
            kind=kind,
            state=state.status,
            pool=state.spec.pool,
            spec=spec_words(state.spec),
            run=state.run,
            reason=why,
            link=f"{self.config.gateway_url.rstrip('/')}/console/tasks/{state.task_id}",
            tenant=state.tenant,
        )

    async def _subscriptions(
        self, db: Db, tenant: str, own: Sequence[Subscription]
    ) -> list[Subscription]:
        return [*own, *await store.tenant_subscriptions(db, tenant)]

    async def _wanted(self, db: Db, state: TaskState, kind: str) -> list[Subscription]:
        """The subscriptions an alert of `kind` about the task goes to, one per bot."""
        own = task_subscriptions(state.task_id, state.tenant, state.spec)
        return one_per_bot(await self._subscriptions(db, state.tenant, own), kind)

    async def _add(
        self,
        db: Db,
        sub: Subscription,
        facts: AlertFacts,
        label: str,
        dedupe_key: str,
        cause: Cause,
    ) -> bool:
        now = self.clock()
        since = now - timedelta(seconds=self.config.repeat_interval_s)
        repeat = await store.sent_recently(db, sub.id, facts.task_id, facts.run, facts.kind, since)
        return await store.add_alert(
            db,
            dedupe_key=dedupe_key,
            sub=sub,
            facts=facts,
            alert=label,
            cause=cause,
            now=now,
            suppressed=repeat,
        )

    async def _track_queue(self, db: Db, state: TaskState, cause: Cause) -> None:
        wait = self.queue_wait(state, cause)
        if wait is None:
            await store.end_queue_wait(db, state.task_id)
        else:
            await store.put_queue_wait(db, wait)

    def queue_wait(self, state: TaskState, cause: Cause) -> QueueWait | None:
        """The task's row of `queue_waits` as of `state`: None when it is not waiting."""
        if state.status != "queued" or state.queued_at is None:
            return None
        own = task_subscriptions(state.task_id, state.tenant, state.spec)
        facts = self._facts(state, "queued", state.queue_reason or "waiting for resources")
        return QueueWait(
            state.task_id, state.tenant, state.run, state.queued_at, facts, tuple(own), cause
        )

    # --- 2. the queue timer -------------------------------------------------------

    async def tick(self) -> int:
        """Raise `queued` alerts for waits past their thresholds; how many were raised.

        The keys of the alerts raised are remembered only while their waits last (a
        key of a wait that ended can never come again), so the memory of fired
        alerts never grows with the number of tasks that waited."""
        now, raised = self.clock(), 0
        tenants: dict[str, list[Subscription]] = {}
        waiting: set[str] = set()
        for wait in await store.queue_waits(self.db):
            if wait.tenant not in tenants:
                tenants[wait.tenant] = await store.tenant_subscriptions(self.db, wait.tenant)
            for sub in one_per_bot([*wait.subscriptions, *tenants[wait.tenant]], "queued"):
                raised += await self._queue_alert(wait, sub, now, waiting)
        self._fired &= waiting
        return raised

    async def _queue_alert(
        self, wait: QueueWait, sub: Subscription, now: datetime, waiting: set[str]
    ) -> int:
        """Raise `sub`'s queued alert for `wait` once it is due; its key goes to `waiting`."""
        if not sub.wants("queued"):
            return 0
        threshold = sub.queue_threshold_s(self.config.queued_after_s)
        key = f"{sub.id}|queued|{wait.task_id}|{wait.run}|{wait.queued_at.isoformat()}"
        waiting.add(key)
        if key in self._fired or not queue_due(wait.queued_at, threshold, now):
            return 0
        waited = (now - wait.queued_at).total_seconds()
        facts = replace(wait.facts, reason=queued_reason(wait.facts.reason, waited, threshold))
        label = f"queued: over {threshold:.0f} s in the queue, run {wait.run}"
        added = await self._add(self.db, sub, facts, label, key, wait.cause)
        self._fired.add(key)
        return int(added)

    # --- 3. delivery ----------------------------------------------------------------

    async def deliver(self, *, wait: bool = True) -> int:
        """One delivery pass; the number of requests made by the bots' sends that
        ended in it (`wait` False: those that ended since the last pass).

        Each bot's due alerts are sent by a task of their own: with `wait` False
        (the service's loop) the pass does not wait for them, so a bot that answers
        slowly (or not until `http_timeout_s`) delays only its own alerts, never the
        next pass and other bots' new ones. A bot still sending is left out of the
        passes' claims until its task ends (its alerts go in order, one send at a
        time). With `wait` True the pass waits for every send, and one that failed
        raises here.

        The due rows are claimed for `claim_s` (another instance skips them; a
        crash mid-pass gives them back as soon as the instance's presence ends, a
        send that failed gives them to the instance's next pass, or else `claim_s`
        later); what a bot's send did not attempt is given back when it ends.
        Passes of one instance must not overlap (`deliver_forever` runs them one
        after another).
        """
        requests = self._reap(raising=wait)
        now = self.clock()
        until = now + timedelta(seconds=self.config.claim_s)
        due = await store.claim_due(self.db, now, until, self.claimer, busy=list(self._sending))
        by_bot: dict[str, list[PendingAlert]] = defaultdict(list)
        for alert in due:
            by_bot[alert.webhook_url].append(alert)
        self._first_errors = {}
        waiting = [a.id for a in due if self._still_gathering(by_bot[a.webhook_url], now)]
        await store.release(self.db, waiting, now)
        for bot, alerts in by_bot.items():
            if not self._still_gathering(alerts, now):
                self._sending[bot] = asyncio.create_task(
                    self._send_to(bot, alerts, now), name=f"alerts to {alerts[0].channel}"
                )
        if wait and self._sending:
            await asyncio.wait(list(self._sending.values()))
            requests += self._reap(raising=True)
        await self.record_closed_windows()
        self.failing = await store.failing_bots(self.db)
        return requests

    def _reap(self, *, raising: bool) -> int:
        """Forget the bots' sends that ended; the requests they made. A send that
        failed is raised (`raising`) or logged (its rows were given back)."""
        requests, failed = 0, None
        for bot, sending in list(self._sending.items()):
            if not sending.done():
                continue
            del self._sending[bot]
            if sending.cancelled():
                continue
            if (problem := sending.exception()) is not None:
                if raising:
                    failed = failed or problem
                else:
                    # The task's name, not the URL (it holds the bot's token).
                    log.error("%s failed", sending.get_name(), exc_info=problem)
                continue
            requests += sending.result()
        if failed is not None:
            raise failed
        return requests

    async def _send_to(self, bot: str, alerts: list[PendingAlert], claimed_at: datetime) -> int:
        """One bot's send (its own task): at most `bots_at_once` bots at a time; the
        rows it did not attempt are given back at its end, due at `claimed_at`."""
        sent: set[int] = set()
        try:
            async with self._at_once:
                return await self._deliver_to(bot, alerts, sent)
        finally:
            unsent = [a.id for a in alerts if a.id not in sent]
            await store.release(self.db, unsent, claimed_at)

    def _still_gathering(self, alerts: Sequence[PendingAlert], now: datetime) -> bool:
        """New alerts of a bot wait out the group window; retries do not wait again."""
        if any(a.attempts > 0 for a in alerts):
            return False
        oldest = min(a.created_at for a in alerts)
        return (now - oldest).total_seconds() < self.config.group_window_s

    async def _deliver_to(self, bot: str, alerts: Sequence[PendingAlert], sent: set[int]) -> int:
        """Send `bot`'s due alerts in order, until one finds the bot failing (the rest
        wait behind it for the bot's backoff) or its limits leave no token; the ids of
        the alerts attempted or settled go to `sent`. A failing bot whose alerts were
        all given up is forgotten (its next alert starts afresh, with no backoff)."""
        requests = 0
        for build, members in self._messages(alerts):
            token = await self.limiter.try_acquire(bot)
            if token is None:
                self.stats.waited_for_tokens += 1
                break  # the rest waits for the next pass: delayed, never dropped
            requests += 1
            failing = await self._attempt(bot, await build(), members, token, sent)
            if failing is not None:
                behind = [a for a in alerts if a.id not in sent]
                await self._give_up_late(behind, failing, sent)
                if given_up := self._given_up.pop(bot, []):
                    self._log_given_up(given_up, failing)
                    await store.forget_bot_if_idle(self.db, bot)
                break
        return requests

    def _messages(self, alerts: Sequence[PendingAlert]) -> list[tuple[_Build, list[PendingAlert]]]:
        """The requests for one bot's due alerts (per task, or summaries of a burst),
        in the order of their oldest alerts, each built only once it has a token
        (a task card looks up the first error)."""
        groups: dict[tuple[str, str | None, bool], list[PendingAlert]] = defaultdict(list)
        for alert in alerts:
            groups[(alert.tenant, alert.secret_ref, alert.text_only)].append(alert)
        messages: list[tuple[_Build, list[PendingAlert]]] = []
        for (_, _, text_only), members in groups.items():
            messages += self._group_messages(members, text_only)
        return sorted(messages, key=lambda m: min((a.created_at, a.id) for a in m[1]))

    def _group_messages(
        self, alerts: Sequence[PendingAlert], text_only: bool
    ) -> list[tuple[_Build, list[PendingAlert]]]:
        by_task: dict[str, list[PendingAlert]] = defaultdict(list)
        for alert in alerts:
            by_task[alert.task_id].append(alert)
        limit = self.config.max_body_bytes
        if len(by_task) <= self.config.burst_threshold:
            render: Callable[..., dict[str, Any]] = (
                feishu.task_text if text_only else feishu.task_card
            )

            def task_message(rows: list[PendingAlert]) -> _Build:
                async def build() -> dict[str, Any]:
                    return render(await self._with_first_error(rows), limit=limit)

                return build

            return [(task_message(rows), rows) for rows in by_task.values()]
        latest = {rows[-1].facts.task_id: rows for rows in by_task.values()}
        cards = feishu.summary_cards(
            [rows[-1].facts for rows in by_task.values()],
            per_card=self.config.summary_per_card,
            limit=limit,
        )
        return [
            (_ready(card), [a for f in named for a in latest[f.task_id]]) for card, named in cards
        ]

    async def _with_first_error(self, rows: Sequence[PendingAlert]) -> list[AlertFacts]:
        """The rows' facts, those of `failed`/`abnormal` alerts with the run's first error
        when the log service knows it."""
        facts = []
        for row in rows:
            fact = row.facts
            if fact.kind in FIRST_ERROR_KINDS and fact.first_error is None:
                fact = replace(fact, first_error=await self._first_error(fact.task_id, fact.run))
            facts.append(fact)
        return facts

    async def _first_error(self, task_id: str, run: int) -> FirstErrorFact | None:
        key = (task_id, run)
        if key not in self._first_errors:
            found = None if self.logs is None else await self.logs.lookup(task_id, run)
            if found is not None:  # a worker may have printed a secret of the task
                found = (await self._redactor(task_id)).first_error(found)
            self._first_errors[key] = found
        return self._first_errors[key]

    async def _redactor(self, task_id: str) -> Redactor:
        """The task's secrets, to be kept out of what its cards quote (its spec's
        creator-only variables and signing secrets: a rerun changes neither)."""
        first = await self.store.read_stream(f"task-{task_id}", 1, limit=1)
        if not first:
            return NOTHING
        state = fold(first, task_id=task_id)
        return await task_redactor(self.db, state.tenant, state.spec)

    async def _attempt(
        self,
        bot: str,
        message: dict[str, Any],
        members: list[PendingAlert],
        token: int,
        sent: set[int],
    ) -> _Failing | None:
        """Send one message and record its outcome; how the bot fails when it failed
        retryably (its alerts then wait for its backoff), else None."""
        sent.update(a.id for a in members)
        first = members[0]
        secret: str | None = None
        if first.secret_ref:
            secret = await store.secret(self.db, first.tenant, first.secret_ref)
            if secret is None:
                missing = f"signing secret {first.secret_ref!r} is not in the secret store"
                await self._record(members, Outcome(False, False, missing, None))
                return None
        body = feishu.encode(message, secret=secret, timestamp=int(self.clock().timestamp()))
        self.stats.requests += 1
        outcome = await self._post(bot, body)
        await self.limiter.answered(token)
        if outcome.delivered or not outcome.retryable:
            await store.bot_answered(self.db, bot)
            await self._record(members, outcome)
            return None
        # Down, 5xx or "too fast" (11232): the bot backs off, for every instance.
        retry_at, since = await store.bot_failed(
            self.db, bot, self.clock(), self.config.backoff_s, self.config.backoff_max_s
        )
        failing = _Failing(outcome, retry_at, since)
        await self._record(members, outcome, failing)
        return failing

    async def _give_up_late(
        self, alerts: Sequence[PendingAlert], failing: _Failing, sent: set[int]
    ) -> None:
        """Of the alerts waiting behind one that found their bot failing, give up
        those past `retry_for_s` now, without a request each (the rest wait on)."""
        now = self.clock()
        late = [a for a in alerts if not self._retrying(a, now)]
        if late:
            sent.update(a.id for a in late)
            await self._record(late, failing.outcome, failing, tried=False)

    def _retrying(self, row: PendingAlert, now: datetime) -> bool:
        """Whether `row` is still retried at `now` (within `retry_for_s` of being raised)."""
        return now < row.created_at + timedelta(seconds=self.config.retry_for_s)

    async def _post(self, bot: str, body: bytes) -> Outcome:
        assert self.http is not None, "start() first"
        if (refused := self.config.webhooks.problem(bot)) is not None:
            return Outcome(False, False, f"webhook not allowed: {refused}", None)
        try:
            async with self.http.stream(
                "POST", bot, content=body, headers={"Content-Type": "application/json"}
            ) as answer:
                head = await read_at_most(answer, self.config.max_answer_bytes)
        except httpx.HTTPError as exc:
            # Only the kind of error: its text may hold the URL (the bot's token) or
            # words of the remote end, and it goes into the task's timeline.
            return Outcome(False, True, f"network error: {type(exc).__name__}", None)
        return feishu.outcome(answer.status_code, head)

    async def _record(
        self,
        members: list[PendingAlert],
        outcome: Outcome,
        failing: _Failing | None = None,
        *,
        tried: bool = True,
    ) -> None:
        """Append each alert's attempt outcome to its task and settle its outbox row
        (`tried` False: given up behind another without a request of its own)."""
        by_task: dict[str, list[PendingAlert]] = defaultdict(list)
        for alert in members:
            by_task[alert.task_id].append(alert)
        now = self.clock()
        verdicts = {a.id: self._verdict(a, outcome, now, failing, tried) for a in members}
        for alert in members:
            if verdicts[alert.id][1] == "failed" and outcome.retryable:
                self._given_up[alert.webhook_url].append(alert)
        for task_id, rows in by_task.items():
            await self._record_task(task_id, [(r, *verdicts[r.id]) for r in rows], outcome, tried)

    def _log_given_up(self, rows: list[PendingAlert], failing: _Failing) -> None:
        """Say in the log which alerts of a bot were given up (no webhook URL: it
        holds the bot's token)."""
        since = f", failing since {failing.since.isoformat()}"
        outcome = failing.outcome
        self.stats.given_up += len(rows)
        log.warning(
            "alerts given up on %s after %s without delivery%s: %d alert(s) of %d task(s) "
            "(%s; last error: %s)",
            rows[0].channel,
            _span(self.config.retry_for_s),
            since,
            len(rows),
            len({r.task_id for r in rows}),
            ", ".join(sorted({r.task_id for r in rows})[:10]),
            outcome.reason,
        )

    async def _record_task(
        self,
        task_id: str,
        verdicts: list[tuple[PendingAlert, AlertDelivered | AlertFailed, str, datetime]],
        outcome: Outcome,
        tried: bool,
    ) -> None:
        now = self.clock()
        window_s = self.config.failure_window_s
        for _ in range(_APPEND_RETRIES):
            # Folded before the transaction, which then holds the pass's only connection:
            # bots are sent to side by side, and a pass holding one connection while it
            # waits for another could wait on the pool forever. The append's expected
            # version still refuses a task that changed meanwhile.
            state = fold(await self.store.read_stream(f"task-{task_id}"), task_id=task_id)
            try:
                async with self.store.transaction() as conn:
                    new: list[NewEvent[Event]] = []
                    for row, event, status, next_at in verdicts:
                        if isinstance(event, AlertFailed) and window_s > 0:
                            await store.count_failure(
                                conn,
                                row,
                                reason=event.reason,
                                code=event.code,
                                retryable=event.retryable,
                                now=now,
                                window_s=window_s,
                            )
                        else:
                            decided = decide(state, Record(task_id, event), now=now, ids=_no_ids)
                            new += [NewEvent(e, _meta(row.cause), now) for e in decided]
                        attempts = row.attempts + 1 if tried else row.attempts
                        await store.settle(
                            conn, [row.id], status, attempts, next_at, _error(outcome)
                        )
                    if new:
                        await self.store.append_in(conn, f"task-{task_id}", new, state.version)
                return
            except ConcurrencyError:
                continue  # another service appended to the task meanwhile: fold again
        log.warning("could not record alert outcome on task %s: it kept changing", task_id)

    async def record_closed_windows(self) -> int:
        """One `AlertFailed` per closed window of coalesced failures, on the task of its
        first failure, in the transaction that marks it recorded; how many were."""
        recorded = 0
        while await self._record_one_window():
            recorded += 1
        return recorded

    async def _record_one_window(self) -> bool:
        for _ in range(_APPEND_RETRIES):
            try:
                async with self.store.transaction() as conn:
                    window = await store.take_closed_window(conn, self.clock())
                    if window is None:
                        return False
                    await self._append_window(conn, window)
                    await store.mark_recorded(conn, window.id)
                return True
            except ConcurrencyError:
                continue  # the task changed meanwhile: fold again
        log.warning("could not record coalesced alert failures: the task kept changing")
        return False

    async def _append_window(self, conn: asyncpg.Connection, window: FailureWindow) -> None:
        now = self.clock()
        stream = f"task-{window.task_id}"
        state = fold(await self.store.read_stream(stream), task_id=window.task_id)
        failed = AlertFailed(
            alert=window.alert,
            channel=window.channel,
            reason=window.reason,
            code=window.code,
            retryable=window.retryable,
            count=window.failures,
            tasks=window.tasks,
        )
        decided = decide(state, Record(window.task_id, failed), now=now, ids=_no_ids)
        new = [NewEvent(e, _meta(window.cause), now) for e in decided]
        await self.store.append_in(conn, stream, new, state.version)

    def _verdict(
        self,
        row: PendingAlert,
        outcome: Outcome,
        now: datetime,
        failing: _Failing | None,
        tried: bool,
    ) -> tuple[AlertDelivered | AlertFailed, str, datetime]:
        attempt = row.attempts + 1 if tried else row.attempts
        if outcome.delivered:
            self.stats.delivered += 1
            delivered = AlertDelivered(alert=row.alert, channel=row.channel, attempt=attempt)
            return delivered, "delivered", now
        again = outcome.retryable and failing is not None and self._retrying(row, now)
        why = outcome.reason
        if outcome.retryable and not again:
            why = (
                f"{why} (gave up: not delivered within {_span(self.config.retry_for_s)}"
                f" of the alert, {attempt} attempt{'s' if attempt != 1 else ''})"
            )
        failed = AlertFailed(
            alert=row.alert, channel=row.channel, reason=why, code=outcome.code, retryable=again
        )
        if again:
            assert failing is not None
            self.stats.retried += 1
            return failed, "pending", failing.retry_at
        self.stats.failed += 1
        return failed, "failed", now


@dataclass(frozen=True, slots=True)
class _Failing:
    """A bot that failed retryably: the outcome, when it may be tried again, since when."""

    outcome: Outcome
    retry_at: datetime
    since: datetime


def _span(seconds: float) -> str:
    """`seconds` in words for a log or a reason: `6 h`, `90 min`, `2 s`."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def one_per_bot(subs: Sequence[Subscription], kind: str) -> list[Subscription]:
    """The subscriptions of `subs` that want `kind`, one per bot (webhook URL): a bot in
    the task's spec and in a tenant subscription too gets each alert once, through the
    first of them (the spec's)."""
    chosen: dict[str, Subscription] = {}
    for sub in subs:
        if sub.wants(kind):
            chosen.setdefault(sub.webhook_url, sub)
    return list(chosen.values())


#: Builds one request's message when it is about to be sent.
_Build = Callable[[], Awaitable[dict[str, Any]]]


def _ready(message: dict[str, Any]) -> _Build:
    async def build() -> dict[str, Any]:
        return message

    return build


def _meta(cause: Cause) -> Metadata:
    return Metadata(
        actor=ACTOR, causation_id=cause.causation_id, correlation_id=cause.correlation_id
    )


def _error(outcome: Outcome) -> str | None:
    return None if outcome.delivered else outcome.reason


def _no_ids() -> str:
    raise RuntimeError("alert decisions never create ids")
