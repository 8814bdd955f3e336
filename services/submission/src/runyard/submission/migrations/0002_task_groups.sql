-- How many tasks each task group of a tenant holds (R-17). The submission service
-- adds a group's new tasks here in the transaction that appends them: the row's
-- lock orders two calls that add to one group, so the second sees the first's
-- tasks and together they never pass the limit of a group.
CREATE TABLE IF NOT EXISTS task_groups (
    tenant   text    NOT NULL,
    group_id text    NOT NULL,
    tasks    integer NOT NULL CHECK (tasks >= 0),
    PRIMARY KEY (tenant, group_id)
);

-- The groups of tasks submitted before this table existed.
INSERT INTO task_groups (tenant, group_id, tasks)
SELECT data->>'tenant', data->>'group_id', count(*)
FROM events
WHERE event_type = 'TaskSubmitted' AND data ? 'tenant'
  AND data->>'group_id' IS NOT NULL
GROUP BY data->>'tenant', data->>'group_id'
ON CONFLICT (tenant, group_id) DO NOTHING;
