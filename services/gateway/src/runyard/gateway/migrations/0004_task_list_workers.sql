-- The task list shows each task's workers and restarts (the web console's list).
-- The projection's checkpoint is dropped so every row is projected again with them
-- (rows are upserted: the same events give the same rows).
ALTER TABLE task_list
    ADD COLUMN IF NOT EXISTS workers  integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS restarts integer NOT NULL DEFAULT 0;

-- (The checkpoints table is the event store's: absent when only these migrations run.)
DO $$
BEGIN
    IF to_regclass('checkpoints') IS NOT NULL THEN
        DELETE FROM checkpoints WHERE name = 'task_list';
    END IF;
END
$$;

-- The list's filters by status and by pool page in index order too (the console's
-- filters, `GET /v1/tasks?status=&pool=`), however many tasks the tenant has.
CREATE INDEX IF NOT EXISTS task_list_status_idx
    ON task_list (tenant, status, created_at DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS task_list_pool_idx
    ON task_list (tenant, pool, created_at DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS task_list_tags_idx ON task_list USING gin (tags);
