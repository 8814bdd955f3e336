-- Stack reports of hung (or inspected) tasks (R-33): the aggregated report with the
-- raw per-thread stacks, one row per capture; StacksCaptured names the report_id.
CREATE TABLE IF NOT EXISTS ft_stack_reports (
    report_id   text PRIMARY KEY,
    task_id     text NOT NULL,
    run         integer NOT NULL,
    attempt     integer NOT NULL,
    captured_at timestamptz NOT NULL,
    summary     text NOT NULL,
    report      jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS ft_stack_reports_task ON ft_stack_reports (task_id, captured_at);
