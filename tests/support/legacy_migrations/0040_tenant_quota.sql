-- 0040: a quota of streams per tenant (docs/security.md, "Tenant isolation").
--
-- tenant_streams counts each tenant's streams. Two statement triggers keep the count
-- exact whoever inserts or deletes a stream (a replica of an older version, a test, an
-- operator's SQL). create_stream is the create of every path (native POST, Durable
-- Streams PUT, the create_stream activity): it locks the tenant's row before it
-- inserts, so concurrent creates on any number of replicas queue on that row, and each
-- sees the count the one before it committed: the quota is never passed. A stream that
-- already exists is found before the lock: creating it again (an idempotent create)
-- never waits on other creates, and answers as ever at the quota.

CREATE TABLE workflow_streams.tenant_streams (
    tenant  text   NOT NULL,
    streams bigint NOT NULL DEFAULT 0,
    CONSTRAINT tenant_streams_pkey PRIMARY KEY (tenant)
);

-- No stream is created or deleted while the count is taken and the triggers made (the
-- lock is held to the end of this migration's transaction).
LOCK TABLE workflow_streams.streams IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO workflow_streams.tenant_streams (tenant, streams)
SELECT tenant, count(*) FROM workflow_streams.streams GROUP BY tenant;

CREATE FUNCTION workflow_streams.count_created_streams() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workflow_streams.tenant_streams AS t (tenant, streams)
    SELECT n.tenant, count(*) FROM created_streams n GROUP BY n.tenant
        ON CONFLICT (tenant) DO UPDATE SET streams = t.streams + excluded.streams;
    RETURN NULL;
END;
$$;

CREATE TRIGGER streams_count_created AFTER INSERT ON workflow_streams.streams
    REFERENCING NEW TABLE AS created_streams
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_streams.count_created_streams();

-- 0034's trigger function, which also takes the deleted streams off their tenants' counts.
CREATE OR REPLACE FUNCTION workflow_streams.delete_stream_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflow_streams.input_deliveries d
     USING deleted_streams g WHERE d.stream_pk = g.stream_pk;
    DELETE FROM workflow_streams.records r
     USING deleted_streams g WHERE r.stream_pk = g.stream_pk;
    DELETE FROM workflow_streams.append_receipts a
     USING deleted_streams g WHERE a.stream_pk = g.stream_pk;
    UPDATE workflow_streams.tenant_streams t
       SET streams = t.streams - g.n
      FROM (SELECT tenant, count(*) AS n FROM deleted_streams GROUP BY tenant) g
     WHERE t.tenant = g.tenant;
    RETURN NULL;
END;
$$;

-- Creates the stream with its consumers, within the tenant's quota ($7 streams).
-- r_outcome: 'created'; 'exists' (the key is taken: r_stream_pk is that stream, whose
-- definition the caller compares); 'tenant_quota' (nothing created, r_stream_pk NULL).
CREATE FUNCTION workflow_streams.create_stream(
    p_tenant      text,
    p_run_id      text,
    p_stream_id   text,
    p_direction   text,
    p_definition  jsonb,
    p_consumers   text[],
    p_max_streams bigint,
    OUT r_stream_pk bigint,
    OUT r_outcome   text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
BEGIN
    SELECT s.stream_pk INTO r_stream_pk FROM workflow_streams.streams s
     WHERE s.tenant = p_tenant AND s.run_id = p_run_id AND s.stream_id = p_stream_id;
    IF FOUND THEN
        r_outcome := 'exists';
        RETURN;
    END IF;

    SELECT t.streams INTO v_count FROM workflow_streams.tenant_streams t
     WHERE t.tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        -- The tenant's first stream: its row, then the lock (a concurrent first create
        -- waits for this insert to commit, then finds the row).
        INSERT INTO workflow_streams.tenant_streams (tenant, streams) VALUES (p_tenant, 0)
            ON CONFLICT (tenant) DO NOTHING;
        SELECT t.streams INTO v_count FROM workflow_streams.tenant_streams t
         WHERE t.tenant = p_tenant FOR UPDATE;
    END IF;

    IF v_count >= p_max_streams THEN
        -- The same stream may have been created while this waited for the lock: its
        -- create again is answered as ever.
        SELECT s.stream_pk INTO r_stream_pk FROM workflow_streams.streams s
         WHERE s.tenant = p_tenant AND s.run_id = p_run_id AND s.stream_id = p_stream_id;
        r_outcome := CASE WHEN FOUND THEN 'exists' ELSE 'tenant_quota' END;
        RETURN;
    END IF;

    -- With consumers, the minimum acknowledgement starts at 0 (everything unread).
    INSERT INTO workflow_streams.streams AS s
           (tenant, run_id, stream_id, direction, definition, min_acked_sequence,
            min_acked_bytes)
    VALUES (p_tenant, p_run_id, p_stream_id, p_direction, p_definition,
            CASE WHEN cardinality(p_consumers) > 0 THEN 0 END,
            CASE WHEN cardinality(p_consumers) > 0 THEN 0 END)
        ON CONFLICT ON CONSTRAINT streams_key DO NOTHING
    RETURNING s.stream_pk INTO r_stream_pk;
    IF NOT FOUND THEN
        SELECT s.stream_pk INTO r_stream_pk FROM workflow_streams.streams s
         WHERE s.tenant = p_tenant AND s.run_id = p_run_id AND s.stream_id = p_stream_id;
        r_outcome := 'exists';
        RETURN;
    END IF;
    INSERT INTO workflow_streams.consumers (stream_pk, consumer_id)
    SELECT r_stream_pk, c FROM unnest(p_consumers) c;
    r_outcome := 'created';
END;
$$;
