-- The causation view (`runyard trace`, libs/eventstore/trace.py): the events of one
-- chain of reactions by correlation id, and the events an event caused by causation
-- id, each an index range instead of a scan of the log's metadata.
CREATE INDEX IF NOT EXISTS events_correlation_idx
    ON events ((metadata->>'correlation_id'), global_position);
CREATE INDEX IF NOT EXISTS events_causation_idx
    ON events ((metadata->>'causation_id'), global_position);
