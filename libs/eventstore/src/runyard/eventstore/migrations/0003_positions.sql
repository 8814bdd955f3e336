-- What reached the broker and what consumers confirmed, per topic partition: after
-- the broker loses its memory, the relay publishes again only what some consumer
-- group had not handled yet (docs/adr/0003-broker-memory-loss.md).

-- The highest global position the relay published to each partition (written with
-- its checkpoint).
CREATE TABLE IF NOT EXISTS relay_partitions (
    topic      text    NOT NULL,
    partition  integer NOT NULL,
    position   bigint  NOT NULL,
    PRIMARY KEY (topic, partition)
);

-- The highest global position each consumer group has handled (or skipped) in each
-- partition, written in the transaction of the batch that handled it.
CREATE TABLE IF NOT EXISTS consumer_positions (
    consumer   text        NOT NULL,
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    position   bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);
