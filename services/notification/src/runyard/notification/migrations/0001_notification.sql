-- Notification service: subscriptions, the alert outbox, and the queue waits read model.

-- The secret store (owned by the gateway's 0001 migration, same shape): created
-- here too so that the notification service can start before the gateway.
CREATE TABLE IF NOT EXISTS secrets (
    tenant     text        NOT NULL,
    ref        text        NOT NULL,
    value      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ref)
);

-- Tenant (team) subscriptions made through the API. The signing secret is in
-- `secrets`; only its reference is here.
CREATE TABLE IF NOT EXISTS alert_subscriptions (
    id             text        PRIMARY KEY,
    tenant         text        NOT NULL,
    webhook_url    text        NOT NULL,
    alerts         text[]      NOT NULL,
    secret_ref     text,
    queued_after_s double precision,
    text_only      boolean     NOT NULL DEFAULT false,
    created_by     text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS alert_subscriptions_tenant ON alert_subscriptions (tenant, created_at);

-- One row per alert for one subscription: written in the consumer's inbox
-- transaction (or by the queue timer), then delivered, retried, recorded.
-- `dedupe_key` makes a replayed event or a re-fired timer a no-op.
CREATE TABLE IF NOT EXISTS alert_outbox (
    id              bigserial   PRIMARY KEY,
    dedupe_key      text        NOT NULL UNIQUE,
    tenant          text        NOT NULL,
    task_id         text        NOT NULL,
    run             integer     NOT NULL,
    kind            text        NOT NULL,
    alert           text        NOT NULL,
    subscription_id text        NOT NULL,
    webhook_url     text        NOT NULL,
    secret_ref      text,
    text_only       boolean     NOT NULL DEFAULT false,
    facts           jsonb       NOT NULL,
    causation_id    text,
    correlation_id  text,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'failed', 'suppressed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    last_error      text
);
CREATE INDEX IF NOT EXISTS alert_outbox_pending ON alert_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS alert_outbox_repeat ON alert_outbox (subscription_id, task_id, run, kind);

-- Tasks waiting in a queue now, with when the wait began (a read model of the
-- task streams, kept in the inbox transaction): the `queued` timer's memory,
-- which a restart of the service finds again.
CREATE TABLE IF NOT EXISTS queue_waits (
    task_id        text        PRIMARY KEY,
    tenant         text        NOT NULL,
    run            integer     NOT NULL,
    queued_at      timestamptz NOT NULL,
    facts          jsonb       NOT NULL,
    subscriptions  jsonb       NOT NULL,
    causation_id   text,
    correlation_id text
);
