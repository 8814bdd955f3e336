-- Failed delivery attempts to one webhook, coalesced per window: one row per
-- (tenant, webhook) while its window is open. When the window closes the
-- service appends one AlertFailed (with the counts) to the task of the
-- window's first failed alert and marks the row recorded.
CREATE TABLE IF NOT EXISTS alert_failures (
    id             bigserial   PRIMARY KEY,
    tenant         text        NOT NULL,
    webhook_url    text        NOT NULL,
    opened_at      timestamptz NOT NULL,
    closes_at      timestamptz NOT NULL,
    task_id        text        NOT NULL,
    alert          text        NOT NULL,
    channel        text        NOT NULL,
    causation_id   text,
    correlation_id text,
    reason         text        NOT NULL,
    code           integer,
    retryable      boolean     NOT NULL,
    failures       integer     NOT NULL,
    tasks          text[]      NOT NULL,
    recorded       boolean     NOT NULL DEFAULT false
);
CREATE UNIQUE INDEX IF NOT EXISTS alert_failures_open
    ON alert_failures (tenant, webhook_url) WHERE NOT recorded;
CREATE INDEX IF NOT EXISTS alert_failures_due ON alert_failures (closes_at) WHERE NOT recorded;
