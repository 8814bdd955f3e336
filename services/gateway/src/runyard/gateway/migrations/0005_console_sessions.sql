-- The web console's sessions, shared by every gateway over this database: a browser
-- may be answered by any of them, and signing out ends its session on all at once.
-- The key is the SHA-256 of the cookie's session id; the API token is sealed with
-- keys derived from that id (runyard.gateway.console.sessions): without the cookie a
-- row is of no use. Expired rows are deleted as new sessions are opened.
CREATE TABLE IF NOT EXISTS console_sessions (
    session_key  text PRIMARY KEY,
    sealed_token bytea NOT NULL,
    expires_at   timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS console_sessions_expiry_idx ON console_sessions (expires_at);
