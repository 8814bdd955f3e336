"""The notification service's tables: subscriptions, secrets, the alert outbox, queue waits,
and the failed attempts per webhook being coalesced (`alert_failures`).

Every function takes a connection or pool, so the consumer can write in its
inbox transaction and the API on the gateway's pool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final, TypeAlias

import asyncpg
from runyard.eventstore import Migration, apply_migrations, load_migrations
from runyard.notification.feishu import AlertFacts
from runyard.notification.rules import Subscription
from runyard.stack.leader import held_sql

Db: TypeAlias = asyncpg.Connection | asyncpg.Pool


def notification_migrations() -> list[Migration]:
    folder = Path(str(resources.files("runyard.notification") / "migrations"))
    return load_migrations("notification", folder)


async def migrate(db: Db) -> None:
    """Create the tables (idempotent, under the migrations' lock)."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            await apply_migrations(conn, notification_migrations())
    else:
        await apply_migrations(db, notification_migrations())


# --- subscriptions and secrets ---------------------------------------------------


async def insert_subscription(db: Db, sub: Subscription, created_by: str) -> None:
    await db.execute(
        """INSERT INTO alert_subscriptions
               (id, tenant, webhook_url, alerts, secret_ref, queued_after_s, text_only, created_by)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
        sub.id,
        sub.tenant,
        sub.webhook_url,
        list(sub.alerts),
        sub.secret_ref,
        sub.queued_after_s,
        sub.text_only,
        created_by,
    )


async def tenant_subscriptions(db: Db, tenant: str) -> list[Subscription]:
    rows = await db.fetch(
        "SELECT * FROM alert_subscriptions WHERE tenant = $1 ORDER BY created_at, id", tenant
    )
    return [_subscription(r) for r in rows]


async def delete_subscription(db: Db, tenant: str, sub_id: str) -> str | None:
    """Delete one subscription of `tenant`; its secret reference, or None when none was."""
    row = await db.fetchrow(
        "DELETE FROM alert_subscriptions WHERE tenant = $1 AND id = $2 RETURNING secret_ref",
        tenant,
        sub_id,
    )
    return None if row is None else (row["secret_ref"] or "")


def _subscription(row: asyncpg.Record) -> Subscription:
    return Subscription(
        id=row["id"],
        tenant=row["tenant"],
        webhook_url=row["webhook_url"],
        alerts=tuple(row["alerts"]),
        secret_ref=row["secret_ref"],
        queued_after_s=row["queued_after_s"],
        text_only=row["text_only"],
    )


async def put_secret(db: Db, tenant: str, ref: str, value: str) -> None:
    await db.execute(
        "INSERT INTO secrets (tenant, ref, value) VALUES ($1, $2, $3)", tenant, ref, value
    )


async def delete_secret(db: Db, tenant: str, ref: str) -> None:
    await db.execute("DELETE FROM secrets WHERE tenant = $1 AND ref = $2", tenant, ref)


async def secret(db: Db, tenant: str, ref: str) -> str | None:
    value: str | None = await db.fetchval(
        "SELECT value FROM secrets WHERE tenant = $1 AND ref = $2", tenant, ref
    )
    return value


# --- the outbox ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """The event an alert reports: its id and correlation id go into the audit events."""

    causation_id: str | None
    correlation_id: str | None


@dataclass(frozen=True, slots=True)
class PendingAlert:
    """One outbox row: one alert for one subscription, waiting or being retried."""

    id: int
    tenant: str
    task_id: str
    run: int
    kind: str
    alert: str
    channel: str
    webhook_url: str
    secret_ref: str | None
    text_only: bool
    facts: AlertFacts
    cause: Cause
    attempts: int
    created_at: datetime


async def add_alert(
    db: Db,
    *,
    dedupe_key: str,
    sub: Subscription,
    facts: AlertFacts,
    alert: str,
    cause: Cause,
    now: datetime,
    suppressed: bool,
) -> bool:
    """Put an alert in the outbox; False when the same alert is there already."""
    added = await db.fetchval(
        """INSERT INTO alert_outbox
               (dedupe_key, tenant, task_id, run, kind, alert, subscription_id, webhook_url,
                secret_ref, text_only, facts, causation_id, correlation_id, status,
                next_attempt_at, created_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14, $15, $15)
           ON CONFLICT (dedupe_key) DO NOTHING RETURNING true""",
        dedupe_key,
        sub.tenant,
        facts.task_id,
        facts.run,
        facts.kind,
        alert,
        sub.id,
        sub.webhook_url,
        sub.secret_ref,
        sub.text_only,
        json.dumps(asdict(facts)),
        cause.causation_id,
        cause.correlation_id,
        "suppressed" if suppressed else "pending",
        now,
    )
    return bool(added)


async def sent_recently(
    db: Db, sub_id: str, task_id: str, run: int, kind: str, since: datetime
) -> bool:
    """Whether the same alert of the same run went to `sub_id` (or waits) since `since`."""
    found = await db.fetchval(
        """SELECT true FROM alert_outbox
           WHERE subscription_id = $1 AND task_id = $2 AND run = $3 AND kind = $4
             AND status IN ('pending', 'delivered') AND created_at >= $5
           LIMIT 1""",
        sub_id,
        task_id,
        run,
        kind,
        since,
    )
    return bool(found)


async def claim_due(
    pool: asyncpg.Pool,
    now: datetime,
    until: datetime,
    claimer: int | None = None,
    limit: int = 2000,
    busy: Sequence[str] = (),
) -> list[PendingAlert]:
    """Take the pending alerts due at `now` until `until` for `claimer`, oldest first.

    First, claimed rows left over are due again at once, not only when their claim
    runs out: those of an instance whose presence has ended (it died mid-pass:
    `runyard.stack.leader.Presence`), and the claimer's own (its passes never
    overlap, so a row it still holds is left from a pass that failed, e.g. in an
    outage, after it claimed). Rows claimed without a presence (`claimer` None)
    wait for `until`.

    A bot's alerts go in order, so they are taken by one instance at a time and
    only when the bot may be tried: rows of a bot that another instance's pass
    holds rows of, or that is backing off (`alert_bots.retry_at` after `now`), are
    left, and so are the bots in `busy` (the claimer is still sending to them: their
    rows it holds stay held). Claims of all instances go one at a time (an advisory
    lock), so two passes never split one bot's alerts."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('alert_outbox:claim'))")
        await conn.execute(
            f"""UPDATE alert_outbox SET next_attempt_at = $1, claimed_by = NULL
                WHERE status = 'pending' AND claimed_by IS NOT NULL AND next_attempt_at > $1
                  AND (claimed_by = $2 OR NOT {held_sql("claimed_by")})
                  AND NOT webhook_url = ANY($3::text[])""",
            now,
            claimer,
            list(busy),
        )
        rows = await conn.fetch(
            """UPDATE alert_outbox SET next_attempt_at = $2, claimed_by = $4
               WHERE id IN (
                   SELECT o.id FROM alert_outbox o
                   WHERE o.status = 'pending' AND o.next_attempt_at <= $1
                     AND NOT EXISTS (SELECT 1 FROM alert_bots b
                                     WHERE b.webhook_url = o.webhook_url AND b.retry_at > $1)
                     AND NOT EXISTS (SELECT 1 FROM alert_outbox c
                                     WHERE c.webhook_url = o.webhook_url
                                       AND c.status = 'pending' AND c.claimed_by IS NOT NULL
                                       AND c.claimed_by IS DISTINCT FROM $4)
                     AND NOT o.webhook_url = ANY($5::text[])
                   ORDER BY o.created_at, o.id LIMIT $3 FOR UPDATE SKIP LOCKED)
               RETURNING *""",
            now,
            until,
            limit,
            claimer,
            list(busy),
        )
    return sorted((_pending(r) for r in rows), key=lambda a: (a.created_at, a.id))


async def release(db: Db, ids: list[int], at: datetime) -> None:
    """Give claimed rows that were not attempted back, due at `at`."""
    if ids:
        await db.execute(
            """UPDATE alert_outbox SET next_attempt_at = $2, claimed_by = NULL
               WHERE id = ANY($1) AND status = 'pending'""",
            ids,
            at,
        )


def _pending(row: asyncpg.Record) -> PendingAlert:
    facts = row["facts"]
    facts = json.loads(facts) if isinstance(facts, str) else dict(facts)
    return PendingAlert(
        id=row["id"],
        tenant=row["tenant"],
        task_id=row["task_id"],
        run=row["run"],
        kind=row["kind"],
        alert=row["alert"],
        channel=f"feishu:{row['subscription_id']}",
        webhook_url=row["webhook_url"],
        secret_ref=row["secret_ref"],
        text_only=row["text_only"],
        facts=replace(AlertFacts.from_json(facts), raised_at=row["created_at"].isoformat()),
        cause=Cause(row["causation_id"], row["correlation_id"]),
        attempts=row["attempts"],
        created_at=row["created_at"],
    )


async def settle(
    db: Db, ids: list[int], status: str, attempts: int, next_at: datetime, error: str | None
) -> None:
    """Write one attempt's outcome on its outbox rows."""
    await db.execute(
        """UPDATE alert_outbox SET status = $2, attempts = $3, next_attempt_at = $4,
                  last_error = $5, claimed_by = NULL
           WHERE id = ANY($1)""",
        ids,
        status,
        attempts,
        next_at,
        error,
    )


async def outbox(db: Db, task_id: str | None = None) -> list[dict[str, Any]]:
    """Outbox rows (for tests and operators), oldest first."""
    rows = await db.fetch(
        """SELECT id, task_id, run, kind, subscription_id, status, attempts, last_error
           FROM alert_outbox WHERE $1::text IS NULL OR task_id = $1 ORDER BY id""",
        task_id,
    )
    return [dict(r) for r in rows]


# --- bots that failed: backoff shared by every instance --------------------------------


async def bot_failed(
    db: Db, webhook_url: str, now: datetime, backoff_s: float, backoff_max_s: float
) -> tuple[datetime, datetime]:
    """One more attempt to the bot failed (retryably): when it may be tried again
    (`backoff_s` doubling per failure in a row, at most `backoff_max_s`) and since
    when it fails."""
    row = await db.fetchrow(
        """INSERT INTO alert_bots (webhook_url, failures, down_since, retry_at)
           VALUES ($1, 1, $2::timestamptz,
                   $2::timestamptz + make_interval(secs => least($3::float8, $4::float8)))
           ON CONFLICT (webhook_url) DO UPDATE SET
               failures = alert_bots.failures + 1,
               retry_at = $2::timestamptz + make_interval(secs => least(
                   $3::float8 * power(2, least(alert_bots.failures, 62)), $4::float8))
           RETURNING retry_at, down_since""",
        webhook_url,
        now,
        backoff_s,
        backoff_max_s,
    )
    assert row is not None
    return row["retry_at"], row["down_since"]


async def bot_answered(db: Db, webhook_url: str) -> None:
    """The bot answered (taken or refused for good): it is not backing off."""
    await db.execute("DELETE FROM alert_bots WHERE webhook_url = $1", webhook_url)


async def forget_bot_if_idle(db: Db, webhook_url: str) -> None:
    """Forget that the bot failed once no alert waits on it (all were given up): its
    next alert is tried at once and counts its failures afresh."""
    await db.execute(
        """DELETE FROM alert_bots b WHERE b.webhook_url = $1
           AND NOT EXISTS (SELECT 1 FROM alert_outbox o
                           WHERE o.webhook_url = $1 AND o.status = 'pending')""",
        webhook_url,
    )


async def failing_bots(db: Db) -> tuple[int, int]:
    """Bots whose last attempt failed retryably and that have alerts waiting, and how
    many alerts wait on them (a bot that failed and has nothing to send is left out)."""
    row = await db.fetchrow(
        """SELECT count(DISTINCT b.webhook_url) AS bots, count(o.id) AS alerts
           FROM alert_bots b
           JOIN alert_outbox o ON o.webhook_url = b.webhook_url AND o.status = 'pending'"""
    )
    assert row is not None
    return int(row["bots"]), int(row["alerts"])


# --- failed attempts, coalesced per webhook ----------------------------------------------


@dataclass(frozen=True, slots=True)
class FailureWindow:
    """Failed attempts to one webhook of a tenant in one window: one AlertFailed when it closes.

    Task, alert, channel and cause are those of the window's first failure;
    reason, code and retryable those of its latest."""

    id: int
    tenant: str
    task_id: str
    alert: str
    channel: str
    cause: Cause
    reason: str
    code: int | None
    retryable: bool
    failures: int
    tasks: int


async def count_failure(
    db: Db,
    alert: PendingAlert,
    *,
    reason: str,
    code: int | None,
    retryable: bool,
    now: datetime,
    window_s: float,
) -> None:
    """Count one failed attempt in its webhook's open window (opening one if none is)."""
    await db.execute(
        """INSERT INTO alert_failures
               (tenant, webhook_url, opened_at, closes_at, task_id, alert, channel,
                causation_id, correlation_id, reason, code, retryable, failures, tasks)
           VALUES ($1, $2, $3::timestamptz, $3::timestamptz + make_interval(secs => $4::float8),
                   $5, $6, $7, $8, $9, $10, $11,
                   $12, 1, ARRAY[$5])
           ON CONFLICT (tenant, webhook_url) WHERE NOT recorded DO UPDATE SET
               failures = alert_failures.failures + 1,
               tasks = CASE WHEN $5 = ANY(alert_failures.tasks) THEN alert_failures.tasks
                            ELSE alert_failures.tasks || $5 END,
               reason = $10, code = $11, retryable = $12""",
        alert.tenant,
        alert.webhook_url,
        now,
        window_s,
        alert.task_id,
        alert.alert,
        alert.channel,
        alert.cause.causation_id,
        alert.cause.correlation_id,
        reason,
        code,
        retryable,
    )


async def take_closed_window(conn: asyncpg.Connection, now: datetime) -> FailureWindow | None:
    """A window closed by `now` and not recorded yet, locked for this transaction
    (another instance skips it)."""
    row = await conn.fetchrow(
        """SELECT * FROM alert_failures WHERE NOT recorded AND closes_at <= $1
           ORDER BY closes_at, id LIMIT 1 FOR UPDATE SKIP LOCKED""",
        now,
    )
    if row is None:
        return None
    return FailureWindow(
        id=row["id"],
        tenant=row["tenant"],
        task_id=row["task_id"],
        alert=row["alert"],
        channel=row["channel"],
        cause=Cause(row["causation_id"], row["correlation_id"]),
        reason=row["reason"],
        code=row["code"],
        retryable=row["retryable"],
        failures=row["failures"],
        tasks=len(row["tasks"]),
    )


async def mark_recorded(db: Db, window_id: int) -> None:
    await db.execute("UPDATE alert_failures SET recorded = true WHERE id = $1", window_id)


async def count_subscriptions(db: Db, tenant: str) -> int:
    return int(
        await db.fetchval("SELECT count(*) FROM alert_subscriptions WHERE tenant = $1", tenant)
    )


async def lock_tenant_subscriptions(conn: asyncpg.Connection, tenant: str) -> None:
    """Serialise subscription changes of one tenant (for the count limit), until commit."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('alert_subscriptions:' || $1))", tenant
    )


# --- queue waits ----------------------------------------------------------------------

#: The read model of the tasks waiting now (`runyard rebuild queue_waits`).
QUEUE_WAITS: Final = "queue_waits"


@dataclass(frozen=True, slots=True)
class QueueWait:
    """A task waiting in its pool's queue since `queued_at` (its current wait)."""

    task_id: str
    tenant: str
    run: int
    queued_at: datetime
    facts: AlertFacts
    subscriptions: tuple[Subscription, ...]
    cause: Cause


async def put_queue_wait(db: Db, wait: QueueWait, *, table: str = QUEUE_WAITS) -> None:
    """Start or change the task's wait (in `table`: the live one, or a rebuild's shadow)."""
    await db.execute(
        f"""INSERT INTO {table}
               (task_id, tenant, run, queued_at, facts, subscriptions, causation_id, correlation_id)
           VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8)
           ON CONFLICT (task_id) DO UPDATE SET run = $3, queued_at = $4, facts = $5::jsonb,
               subscriptions = $6::jsonb, causation_id = $7, correlation_id = $8""",
        wait.task_id,
        wait.tenant,
        wait.run,
        wait.queued_at,
        json.dumps(asdict(wait.facts)),
        json.dumps([asdict(s) for s in wait.subscriptions]),
        wait.cause.causation_id,
        wait.cause.correlation_id,
    )


async def end_queue_wait(db: Db, task_id: str) -> None:
    await db.execute("DELETE FROM queue_waits WHERE task_id = $1", task_id)


async def queue_waits(db: Db) -> list[QueueWait]:
    rows = await db.fetch("SELECT * FROM queue_waits ORDER BY queued_at, task_id")
    return [_wait(r) for r in rows]


def _wait(row: asyncpg.Record) -> QueueWait:
    facts, subs = row["facts"], row["subscriptions"]
    facts = json.loads(facts) if isinstance(facts, str) else facts
    subs = json.loads(subs) if isinstance(subs, str) else subs
    return QueueWait(
        task_id=row["task_id"],
        tenant=row["tenant"],
        run=row["run"],
        queued_at=row["queued_at"],
        facts=AlertFacts.from_json(facts),
        subscriptions=tuple(Subscription(**{**s, "alerts": tuple(s["alerts"])}) for s in subs),
        cause=Cause(row["causation_id"], row["correlation_id"]),
    )
