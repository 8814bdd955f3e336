-- Events a consumer has processed, written in the same transaction as the
-- consumer's effects: Kafka delivers at least once, the inbox makes it once.
CREATE TABLE IF NOT EXISTS inbox (
    consumer        text        NOT NULL,
    event_id        uuid        NOT NULL,
    global_position bigint      NOT NULL,
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
