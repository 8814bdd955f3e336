-- Log service: every worker's output lines, partitioned by day (UTC), and exports.

CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE SEQUENCE IF NOT EXISTS log_lines_id_seq;

-- One row per line a worker wrote. `dedupe` makes a redelivered line a no-op
-- (see runyard.logs.records.dedupe_key); the unique index must include `at`,
-- the partition key. `id` orders lines with the same `at` in arrival order.
CREATE TABLE IF NOT EXISTS log_lines (
    at       timestamptz NOT NULL,
    id       bigint      NOT NULL DEFAULT nextval('log_lines_id_seq'),
    task_id  text        NOT NULL,
    run      integer     NOT NULL,
    attempt  integer     NOT NULL,
    worker   integer     NOT NULL,
    stream   text        NOT NULL,
    seq      bigint,
    dedupe   uuid        NOT NULL,
    line     text        NOT NULL
) PARTITION BY RANGE (at);

CREATE UNIQUE INDEX IF NOT EXISTS log_lines_dedupe ON log_lines (at, dedupe);
CREATE INDEX IF NOT EXISTS log_lines_task_time ON log_lines (task_id, at, id);
CREATE INDEX IF NOT EXISTS log_lines_task_worker_time ON log_lines (task_id, worker, at, id);
-- Words: a text search index ('simple': no stemming, no stop words) over the
-- line split at every non-word character, so that `checkpoint` is a word of
-- `torch.utils.checkpoint:` and of `/ckpt/checkpoint-3.pt` as it is for grep -w
-- (the default parser would keep paths and dotted names whole).
CREATE FUNCTION log_words(line text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN to_tsvector('simple', regexp_replace(line, '[^[:alnum:]_]+', ' ', 'g'));
CREATE FUNCTION log_words_query(words text) RETURNS tsquery
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN plainto_tsquery('simple', regexp_replace(words, '[^[:alnum:]_]+', ' ', 'g'));
CREATE INDEX IF NOT EXISTS log_lines_words ON log_lines USING gin (log_words(line));
-- Regular expressions and substrings (exact phrases): trigrams.
CREATE INDEX IF NOT EXISTS log_lines_trigrams ON log_lines USING gin (line gin_trgm_ops);

-- Background exports (R-41): the last 5 per user are kept.
CREATE TABLE IF NOT EXISTS log_exports (
    export_id   text        PRIMARY KEY,
    tenant      text        NOT NULL,
    user_name   text        NOT NULL,
    task_id     text        NOT NULL,
    query       jsonb       NOT NULL,
    format      text        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    lines_done  bigint      NOT NULL DEFAULT 0,
    lines_total bigint,
    path        text,
    error       text,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS log_exports_user ON log_exports (tenant, user_name, created_at DESC);
