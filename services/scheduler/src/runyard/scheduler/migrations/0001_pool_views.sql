-- The scheduler's capacity read model: one JSON view per pool, rewritten by the
-- scheduler after each change (see runyard.scheduler.views); the gateway reads it.
CREATE TABLE IF NOT EXISTS scheduler_pool_views (
    pool_id    text        PRIMARY KEY,
    version    bigint      NOT NULL,
    view       jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
