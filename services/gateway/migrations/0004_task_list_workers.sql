-- The task list shows each task's workers and restarts (the web console's list).
-- The projection's checkpoint is dropped so every row is projected again with them
-- (rows are upserted: the same events give the same rows).
ALTER TABLE task_list
    ADD COLUMN IF NOT EXISTS workers  integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS restarts integer NOT NULL DEFAULT 0;

DELETE FROM checkpoints WHERE name = 'task_list';
