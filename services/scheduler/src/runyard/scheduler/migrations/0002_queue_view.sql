-- The scheduler's queue read model: one row per waiting task, written by the
-- scheduler in the transaction of the event it reacted to (see runyard.scheduler.views).
-- A task's position is not stored: readers count the rows ahead of it in queue order
-- (rank, neg_priority, submitted_at, task_id), so a task leaving the queue rewrites
-- nothing behind it. task_id sorts bytewise ("C"), as the scheduler orders ids.
CREATE TABLE IF NOT EXISTS scheduler_queue (
    task_id      text COLLATE "C" PRIMARY KEY,
    pool_id      text        NOT NULL,
    run          integer     NOT NULL,
    rank         smallint    NOT NULL,
    neg_priority integer     NOT NULL,
    submitted_at timestamptz NOT NULL,
    queued_at    timestamptz NOT NULL,
    why          text        NOT NULL,
    blocked      boolean     NOT NULL,
    gpus_needed  integer     NOT NULL,
    launchable   integer     NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS scheduler_queue_order
    ON scheduler_queue (pool_id, rank, neg_priority, submitted_at, task_id);
