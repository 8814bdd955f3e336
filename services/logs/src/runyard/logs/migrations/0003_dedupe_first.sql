-- A line that a new deployer reads again (its worker's file from the last saved
-- offset) has the identity it had (`dedupe`, from its seq) but a later `at`. The
-- ingest looks for that identity within a few days (`LogStore.ingest`): an index
-- that leads with `dedupe` answers that lookup. It keeps the unique pair, so a
-- redelivered message (same `at`) still conflicts as before.
CREATE UNIQUE INDEX IF NOT EXISTS log_lines_dedupe_at ON log_lines (dedupe, at);
DROP INDEX IF EXISTS log_lines_dedupe;
