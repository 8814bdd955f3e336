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
-- stream do not repeat them. Nullable: an odd payload must never fail an append.
CREATE TABLE IF NOT EXISTS audit_tasks (
    stream_id text PRIMARY KEY,
    tenant    text,
    pool      text
);

CREATE TABLE IF NOT EXISTS audit_facets (
    kind            text   NOT NULL,  -- tenant, pool, node, task
    value           text   NOT NULL,
    global_position bigint NOT NULL,
    PRIMARY KEY (kind, value, global_position)
);

-- The facets of a set of events, given as parallel arrays: the tenant and pool
-- of a task's events from its audit_tasks row; the pool of a pool event from
-- its stream, the task it names and that task's tenant; the tenant of an access
-- event; and every node an event names (`node`, `workers[].node`,
-- `faulty_nodes`, `removed`, `added`).
CREATE OR REPLACE FUNCTION runyard_audit_facets(p_pos bigint[], p_stream text[], p_data jsonb[])
RETURNS TABLE (kind text, value text, global_position bigint)
LANGUAGE sql STABLE AS $$
    SELECT f.kind, f.value, e.pos
    FROM unnest(p_pos, p_stream, p_data) AS e(pos, stream_id, data)
    LEFT JOIN audit_tasks t ON t.stream_id = CASE
        WHEN e.stream_id LIKE 'task-%' THEN e.stream_id
        WHEN e.stream_id LIKE 'pool-%' AND e.data ? 'task_id' THEN 'task-' || (e.data->>'task_id')
    END
    CROSS JOIN LATERAL (
        SELECT 'tenant' AS kind, t.tenant AS value
        UNION ALL SELECT 'pool', t.pool WHERE e.stream_id LIKE 'task-%'
        UNION ALL SELECT 'pool', substr(e.stream_id, 6) WHERE e.stream_id LIKE 'pool-%'
        UNION ALL SELECT 'task', e.data->>'task_id' WHERE e.stream_id LIKE 'pool-%'
        UNION ALL SELECT 'tenant', e.data->>'tenant' WHERE e.stream_id LIKE 'access-%'
        UNION ALL SELECT 'node', e.data->>'node' WHERE jsonb_typeof(e.data->'node') = 'string'
        UNION ALL SELECT 'node', w->>'node'
            FROM jsonb_array_elements(CASE WHEN jsonb_typeof(e.data->'workers') = 'array'
                                           THEN e.data->'workers' ELSE '[]' END) w
        UNION ALL SELECT 'node', x
            FROM unnest(ARRAY['faulty_nodes', 'removed', 'added']) k,
                 jsonb_array_elements_text(CASE WHEN jsonb_typeof(e.data->k) = 'array'
                                                THEN e.data->k ELSE '[]' END) x
    ) f
    WHERE f.value IS NOT NULL
$$;
-- Index what one append wrote, in the append's transaction: one statement for
-- all its events (a statement trigger with a transition table).
CREATE OR REPLACE FUNCTION runyard_audit_index() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_tasks (stream_id, tenant, pool)
    SELECT n.stream_id, n.data->>'tenant', n.data#>>'{spec,pool}'
    FROM new_events n
    WHERE n.event_type = 'TaskSubmitted' AND n.data ? 'tenant'
    ON CONFLICT (stream_id) DO NOTHING;
    INSERT INTO audit_facets (kind, value, global_position)
    SELECT f.kind, f.value, f.global_position
    FROM (SELECT array_agg(n.global_position) p, array_agg(n.stream_id) s, array_agg(n.data) d
          FROM new_events n) a,
         runyard_audit_facets(a.p, a.s, a.d) f
    ON CONFLICT DO NOTHING;
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
        SELECT f.kind, f.value, f.global_position
        FROM (SELECT array_agg(global_position) p, array_agg(stream_id) s, array_agg(data) d
              FROM events WHERE global_position > lo AND global_position <= lo + 50000) a,
             runyard_audit_facets(a.p, a.s, a.d) f
        ON CONFLICT DO NOTHING;
        lo := lo + 50000;
    END LOOP;
END
$$;
