-- Audit queries over the whole log (docs/adr/0005-audit-facets.md).
--
-- Filters on the envelope use indexes of `events`: type (events_type_idx, from
-- 0001), time (events_occurred_idx), actor (events_actor_idx), task (the
-- stream's unique key). Filters on values inside payloads (tenant, pool, node,
-- and the task a pool event names) use `audit_facets`: one row per (kind,
-- value, event), written by a statement trigger in the transaction of the
-- append, so a filter is an index range scan in position order, never a scan
-- of payloads.

CREATE INDEX IF NOT EXISTS events_occurred_idx ON events (occurred_at);
-- text_pattern_ops: serves `actor = x` and the prefix match `actor LIKE 'user:%'`.
CREATE INDEX IF NOT EXISTS events_actor_idx
    ON events ((metadata->>'actor') text_pattern_ops, global_position);

-- The tenant and pool of each task, from its TaskSubmitted: later events of the
-- stream do not repeat them.
CREATE TABLE IF NOT EXISTS audit_tasks (
    stream_id text PRIMARY KEY,
    tenant    text NOT NULL,
    pool      text NOT NULL
);

CREATE TABLE IF NOT EXISTS audit_facets (
    kind            text   NOT NULL,  -- tenant, pool, node, task
    value           text   NOT NULL,
    global_position bigint NOT NULL,
    PRIMARY KEY (kind, value, global_position)
);

-- The facets of the events with positions in [p_lo, p_hi].
CREATE OR REPLACE FUNCTION runyard_audit_facets(p_lo bigint, p_hi bigint)
RETURNS TABLE (kind text, value text, global_position bigint)
LANGUAGE sql STABLE AS $$
    WITH e AS (
        SELECT ev.global_position AS pos, ev.stream_id, ev.data
        FROM events ev WHERE ev.global_position BETWEEN p_lo AND p_hi
    )
    -- tenant and pool of task events, from the task's row
    SELECT 'tenant', t.tenant, e.pos FROM e JOIN audit_tasks t USING (stream_id)
    UNION ALL SELECT 'pool', t.pool, e.pos FROM e JOIN audit_tasks t USING (stream_id)
    -- the pool of pool events is their stream
    UNION ALL SELECT 'pool', substr(e.stream_id, 6), e.pos FROM e WHERE e.stream_id LIKE 'pool-%'
    -- access events (tokens) name their tenant
    UNION ALL SELECT 'tenant', e.data->>'tenant', e.pos FROM e
        WHERE e.stream_id LIKE 'access-%' AND e.data ? 'tenant'
    -- pool events about one task: that task, and its tenant
    UNION ALL SELECT 'task', e.data->>'task_id', e.pos FROM e
        WHERE e.stream_id LIKE 'pool-%' AND e.data ? 'task_id'
    UNION ALL SELECT 'tenant', t.tenant, e.pos FROM e
        JOIN audit_tasks t ON t.stream_id = 'task-' || (e.data->>'task_id')
        WHERE e.stream_id LIKE 'pool-%'
    -- nodes: named once, in a list of workers, or in lists of node names
    UNION ALL SELECT 'node', e.data->>'node', e.pos FROM e
        WHERE jsonb_typeof(e.data->'node') = 'string'
    UNION ALL SELECT 'node', w->>'node', e.pos FROM e,
        jsonb_array_elements(CASE WHEN jsonb_typeof(e.data->'workers') = 'array'
                                  THEN e.data->'workers' ELSE '[]' END) w
        WHERE jsonb_typeof(w->'node') = 'string'
    UNION ALL SELECT 'node', n.value, e.pos FROM e,
        LATERAL (SELECT jsonb_array_elements_text(CASE WHEN jsonb_typeof(e.data->k) = 'array'
                                                       THEN e.data->k ELSE '[]' END) AS value
                 FROM unnest(ARRAY['faulty_nodes', 'removed', 'added']) k) n
$$;

-- Index what one append wrote. An AFTER trigger sees its rows in `events`; the
-- range may also hold rows others committed meanwhile, which they indexed
-- already (ON CONFLICT DO NOTHING).
CREATE OR REPLACE FUNCTION runyard_audit_index() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    lo bigint;
    hi bigint;
BEGIN
    INSERT INTO audit_tasks (stream_id, tenant, pool)
    SELECT n.stream_id, n.data->>'tenant', n.data#>>'{spec,pool}'
    FROM new_events n
    WHERE n.event_type = 'TaskSubmitted' AND n.data ? 'tenant'
    ON CONFLICT (stream_id) DO NOTHING;
    SELECT min(n.global_position), max(n.global_position) INTO lo, hi FROM new_events n;
    IF lo IS NOT NULL THEN
        INSERT INTO audit_facets (kind, value, global_position)
        SELECT f.kind, f.value, f.global_position FROM runyard_audit_facets(lo, hi) f
        WHERE f.value IS NOT NULL
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS events_audit_index ON events;
CREATE TRIGGER events_audit_index AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION runyard_audit_index();

-- Events appended before this migration, in slices.
DO $$
DECLARE
    lo bigint := 0;
    hi bigint := (SELECT coalesce(max(global_position), 0) FROM events);
BEGIN
    INSERT INTO audit_tasks (stream_id, tenant, pool)
    SELECT stream_id, data->>'tenant', data#>>'{spec,pool}' FROM events
    WHERE event_type = 'TaskSubmitted' AND data ? 'tenant'
    ON CONFLICT (stream_id) DO NOTHING;
    WHILE lo < hi LOOP
        INSERT INTO audit_facets (kind, value, global_position)
        SELECT f.kind, f.value, f.global_position FROM runyard_audit_facets(lo + 1, lo + 50000) f
        WHERE f.value IS NOT NULL
        ON CONFLICT DO NOTHING;
        lo := lo + 50000;
    END LOOP;
END
$$;
