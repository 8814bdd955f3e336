-- Which process runs an export, and when it last said so: an export left
-- `running` by a process that stopped (its heartbeat is old) is marked failed
-- by the next one that starts (`Exports.recover`).
ALTER TABLE log_exports ADD COLUMN IF NOT EXISTS owner text;
ALTER TABLE log_exports ADD COLUMN IF NOT EXISTS heartbeat_at timestamptz;
