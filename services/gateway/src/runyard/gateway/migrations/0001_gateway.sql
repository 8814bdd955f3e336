-- Gateway tables: API tokens, creator-only secrets, and the task list read model.

-- Bearer tokens: only the sha256 of a token is stored.
CREATE TABLE IF NOT EXISTS api_tokens (
    token_sha256 text        PRIMARY KEY,
    tenant       text        NOT NULL,
    user_name    text        NOT NULL,
    role         text        NOT NULL CHECK (role IN ('admin', 'member')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Creator-only environment values (R-12): events carry only `secret_ref`.
CREATE TABLE IF NOT EXISTS secrets (
    tenant     text        NOT NULL,
    ref        text        NOT NULL,
    value      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ref)
);

-- The task list: a projection of the task streams, rebuildable from position 0.
CREATE TABLE IF NOT EXISTS task_list (
    task_id     text        PRIMARY KEY,
    tenant      text        NOT NULL,
    creator     text        NOT NULL,
    name        text        NOT NULL,
    status      text        NOT NULL,
    stage       text,
    pool        text        NOT NULL,
    tags        text[]      NOT NULL DEFAULT '{}',
    group_id    text,
    cloned_from text,
    run         integer     NOT NULL,
    version     bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS task_list_tenant_idx ON task_list (tenant, created_at DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS task_list_group_idx ON task_list (group_id);
