-- The submission service's tables.

-- Each call of the gateway that wrote something, by the gateway's call id: a retry
-- of a call whose answer was lost gets the same answer, and writes nothing twice.
CREATE TABLE IF NOT EXISTS submission_calls (
    call_id    text        PRIMARY KEY,
    tenant     text        NOT NULL,
    answer     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS submission_calls_created_idx ON submission_calls (created_at);

-- What the service writes besides: creator-only values (R-12) and the catalogue's
-- admin changes. Created here too (as the gateway's migrations did first, same
-- shape) so that the service starts on its own on an empty database.
CREATE TABLE IF NOT EXISTS secrets (
    tenant     text        NOT NULL,
    ref        text        NOT NULL,
    value      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ref)
);

CREATE TABLE IF NOT EXISTS catalogue_entries (
    kind       text        NOT NULL CHECK (kind IN ('image', 'volume', 'public_data')),
    key        text        NOT NULL,
    body       jsonb       NOT NULL,
    updated_by text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);
