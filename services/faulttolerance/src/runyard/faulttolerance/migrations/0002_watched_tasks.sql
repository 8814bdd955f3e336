-- The tasks fault tolerance watches (not finished yet), so that an instance that takes
-- a task's partition over (at start, in a rebalance) sets its watches up at once: a
-- hung task prints nothing more and may get no event for a long time.
CREATE TABLE IF NOT EXISTS ft_watched_tasks (
    task_id  text PRIMARY KEY,
    since    timestamptz NOT NULL DEFAULT now()
);
