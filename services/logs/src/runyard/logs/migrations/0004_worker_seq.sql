-- Which numbered lines of one worker's stream are stored (`LogStore.missing`): the
-- deployer asks before it removes a finished worker's output files, and after the
-- broker lost its memory, to publish again only what never arrived. Partial:
-- unnumbered lines are never asked about.
CREATE INDEX IF NOT EXISTS log_lines_worker_seq
    ON log_lines (task_id, run, attempt, worker, stream, seq) WHERE seq IS NOT NULL;
