-- Scoped roles and a token lifecycle: an id, who made it, an expiry, revocation.
-- Tokens stored before keep working: `admin` becomes `platform_admin`, each gets
-- an id from its hash and expires 30 days after this migration.

ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_role_check;
UPDATE api_tokens SET role = 'platform_admin' WHERE role = 'admin';
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_role_check
    CHECK (role IN ('platform_admin', 'tenant_admin', 'member', 'service', 'sre'));

ALTER TABLE api_tokens
    ADD COLUMN IF NOT EXISTS token_id    text,
    ADD COLUMN IF NOT EXISTS description text NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS created_by  text NOT NULL DEFAULT 'migration',
    ADD COLUMN IF NOT EXISTS expires_at  timestamptz,
    ADD COLUMN IF NOT EXISTS revoked_at  timestamptz,
    ADD COLUMN IF NOT EXISTS revoked_by  text;

UPDATE api_tokens SET token_id = 'tok_' || substr(token_sha256, 1, 16) WHERE token_id IS NULL;
UPDATE api_tokens SET expires_at = now() + interval '30 days' WHERE expires_at IS NULL;
ALTER TABLE api_tokens ALTER COLUMN token_id SET NOT NULL;
ALTER TABLE api_tokens ALTER COLUMN expires_at SET NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS api_tokens_id_idx ON api_tokens (token_id);
CREATE INDEX IF NOT EXISTS api_tokens_tenant_idx ON api_tokens (tenant, created_at DESC);
