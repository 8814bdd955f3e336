-- Catalogue changes made through the admin API (images, volumes, public data).
-- At start the gateway loads catalogue.yaml, then overlays these rows, oldest first,
-- so admin changes survive a restart.
CREATE TABLE IF NOT EXISTS catalogue_entries (
    kind       text        NOT NULL CHECK (kind IN ('image', 'volume', 'public_data')),
    key        text        NOT NULL,
    body       jsonb       NOT NULL,
    updated_by text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);
