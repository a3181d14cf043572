-- 0001: the baseline. The whole workflow_streams schema as it stands: every table,
-- index, view, function and trigger, each written once. It replaces the numbered
-- history that built the schema during development; a database that ran all of that
-- history is recognised as being at this baseline (schema/migrate.py), and a later
-- change to the schema is a new numbered migration on top of this file.
--
-- The runner has already created the schema and workflow_streams.schema_migrations.
-- schema/schema.sql is the same schema read back from a migrated database (`make
-- schema`); tests/foundation/test_schema.py keeps the two equal.
--
-- Function bodies are exactly what the old chain left, so that a database it made holds
-- the same text as one made from this file; the few comments inside them that cite a
-- four-digit number ("(0011)") name files of that chain (tests/support/legacy_migrations/).

-- ---------------------------------------------------------------------------------
-- Tables
-- ---------------------------------------------------------------------------------

-- One stream of one workflow run. The counters are kept under the stream's row lock by
-- the append and ack functions below, so that credit is decided in O(1). The table is
-- half-filled (fillfactor 50) so that an append's UPDATE of the row stays on its page.
CREATE TABLE workflow_streams.streams (
    stream_pk          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant             text        NOT NULL,
    run_id             text        NOT NULL,
    stream_id          text        NOT NULL,
    direction          text        NOT NULL CHECK (direction IN ('input', 'output')),
    definition         jsonb       NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    latest_sequence    bigint      NOT NULL DEFAULT 0,
    earliest_sequence  bigint      NOT NULL DEFAULT 1,
    total_items        bigint      NOT NULL DEFAULT 0,
    total_bytes        bigint      NOT NULL DEFAULT 0,
    -- cumulative bytes of everything up to earliest_sequence - 1 (pruned)
    pruned_bytes       bigint      NOT NULL DEFAULT 0,
    -- the minimum acknowledgement over the declared consumers; NULL = no consumers
    min_acked_sequence bigint,
    min_acked_bytes    bigint,
    closed_at          timestamptz,
    legal_hold         boolean     NOT NULL DEFAULT false,
    legal_hold_reason  text,
    -- until when someone waits on the stream's wakes: appends notify only then
    watched_until      timestamptz,
    CONSTRAINT streams_key UNIQUE (tenant, run_id, stream_id)
) WITH (fillfactor = 50);

-- The records of a stream. No foreign key to streams: a per-row check on every append
-- costs more than the append itself; the streams_delete_rows trigger below removes a
-- deleted stream's records instead.
CREATE TABLE workflow_streams.records (
    stream_pk        bigint      NOT NULL,
    sequence         bigint      NOT NULL,
    payload          text        NOT NULL,  -- compact JSON, stored as sent (key order kept)
    size             integer     NOT NULL,
    cumulative_bytes bigint      NOT NULL,  -- sum of sizes of sequences 1..sequence
    appended_at      timestamptz NOT NULL DEFAULT now(),
    object           jsonb,
    PRIMARY KEY (stream_pk, sequence)
);

-- What a keyed append request did, so that its retry is answered the same. No foreign
-- key, like records (streams_delete_rows removes them).
CREATE TABLE workflow_streams.append_receipts (
    stream_pk       bigint      NOT NULL,
    idempotency_key text        NOT NULL,
    request_hash    text        NOT NULL,
    first_sequence  bigint      NOT NULL,
    last_sequence   bigint      NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_pk, idempotency_key)
);

-- The declared consumers of a stream and how far each has acknowledged.
CREATE TABLE workflow_streams.consumers (
    stream_pk      bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    consumer_id    text        NOT NULL,
    acked_sequence bigint      NOT NULL DEFAULT 0,
    acked_bytes    bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_pk, consumer_id)
);

-- Large objects (docs/objects.md): an upload prepared, verified, then committed as a
-- record. record_payload is the metadata exactly as sent (it becomes the record's
-- payload); stored_md5 is the store's own checksum of the verified bytes.
CREATE TABLE workflow_streams.object_intents (
    object_id          uuid        PRIMARY KEY,
    stream_pk          bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    idempotency_key    text        NOT NULL,
    sha256             text        NOT NULL,
    size               bigint      NOT NULL,
    content_type       text        NOT NULL,
    schema             text,
    region             text        NOT NULL,
    metadata           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    storage_key        text        NOT NULL,
    state              text        NOT NULL DEFAULT 'prepared'
                       CHECK (state IN ('prepared', 'uploaded', 'committed', 'aborted', 'expired')),
    prepared_by        text        NOT NULL,
    prepared_scopes    text[]      NOT NULL,
    expires_at         timestamptz NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    uploaded_at        timestamptz,
    committed_sequence bigint,
    record_payload     text,
    stored_md5         text,
    committed_at       timestamptz,
    ended_at           timestamptz,
    CONSTRAINT object_intents_key UNIQUE (stream_pk, idempotency_key)
);

-- One row per input record, written in the append's own transaction: the outbox the
-- dispatcher signals workflows from. No foreign key, like records.
CREATE TABLE workflow_streams.input_deliveries (
    delivery_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_pk        bigint      NOT NULL,
    sequence         bigint      NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'retrying', 'delivered', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_expires_at timestamptz,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    retried_by       text,
    retried_at       timestamptz,
    -- the appending request's W3C traceparent, when it was traced
    trace_context    text,
    CONSTRAINT input_deliveries_record UNIQUE (stream_pk, sequence)
);

-- Object-store keys to delete. A deletion knows its stream (parsed from the key for
-- orphans), so that it waits while the stream is under legal hold, and its intent.
CREATE TABLE workflow_streams.deletion_outbox (
    deletion_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    region          text        NOT NULL,
    storage_key     text        NOT NULL,
    reason          text        NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    done_at         timestamptz,
    stream_pk       bigint,
    object_id       uuid
);

-- Sequence gaps a reader detected and repaired.
CREATE TABLE workflow_streams.gap_evidence (
    gap_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_pk         bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    expected_sequence bigint      NOT NULL,
    received_sequence bigint      NOT NULL,
    repaired_records  integer     NOT NULL,
    detected_by       text        NOT NULL,
    detected_at       timestamptz NOT NULL DEFAULT now()
);

-- Durable Streams writer state (docs/durable-streams.md): a stream's last Stream-Seq
-- and the producer request that closed it. A stream no DS writer used has no row.
CREATE TABLE workflow_streams.ds_stream_writers (
    stream_pk          bigint PRIMARY KEY REFERENCES workflow_streams.streams ON DELETE CASCADE,
    -- compared with COLLATE "C": byte-wise over UTF-8, as the protocol asks
    last_stream_seq    text,
    -- the producer request that closed the stream: its retry answers 204, not 409
    closed_by_producer text,
    closed_by_epoch    bigint,
    closed_by_seq      bigint
);

-- Durable Streams idempotent producers: the epoch that fences older sessions and the
-- last sequence accepted, which deduplicates retries.
CREATE TABLE workflow_streams.ds_producers (
    stream_pk   bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    producer_id text        NOT NULL,
    epoch       bigint      NOT NULL,
    last_seq    bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_pk, producer_id)
);

-- Streams per tenant, kept by the triggers on streams below: create_stream checks the
-- tenant's quota under this row's lock, so creates of other tenants never wait.
CREATE TABLE workflow_streams.tenant_streams (
    tenant  text   NOT NULL,
    streams bigint NOT NULL DEFAULT 0,
    CONSTRAINT tenant_streams_pkey PRIMARY KEY (tenant)
);

-- ---------------------------------------------------------------------------------
-- Indexes (beside those of the keys above)
-- ---------------------------------------------------------------------------------

-- The streams retention can touch: a definition with a retention limit.
CREATE INDEX streams_with_retention ON workflow_streams.streams (stream_pk)
    WHERE (definition -> 'retention' ->> 'max_records') IS NOT NULL
       OR (definition -> 'retention' ->> 'max_age_seconds') IS NOT NULL;

-- Prepared or uploaded intents, by when they expire.
CREATE INDEX object_intents_expiry ON workflow_streams.object_intents (expires_at)
    WHERE state IN ('prepared', 'uploaded');
-- The orphan sweep asks "does any live intent own this key?".
CREATE INDEX object_intents_storage_key ON workflow_streams.object_intents (storage_key);

-- Deliveries due for an attempt.
CREATE INDEX input_deliveries_due ON workflow_streams.input_deliveries (next_attempt_at)
    WHERE state IN ('pending', 'retrying');
-- Each stream's open deliveries in order: the lanes of open_delivery_heads.
CREATE INDEX input_deliveries_open ON workflow_streams.input_deliveries (stream_pk, sequence)
    WHERE state IN ('pending', 'retrying');
-- `?state=dead` (or any state) paged by delivery_id, and the per-state counts.
CREATE INDEX input_deliveries_state ON workflow_streams.input_deliveries (state, delivery_id);
-- Per-stream lag: only the rows still owed to a workflow.
CREATE INDEX input_deliveries_undelivered ON workflow_streams.input_deliveries (stream_pk, sequence)
    WHERE state <> 'delivered';

-- Deletions due for an attempt, and the pending deletion of a key.
CREATE INDEX deletion_outbox_due ON workflow_streams.deletion_outbox (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX deletion_outbox_pending_key ON workflow_streams.deletion_outbox (storage_key)
    WHERE state = 'pending';

-- Gap evidence of one stream, newest first.
CREATE INDEX gap_evidence_stream ON workflow_streams.gap_evidence (stream_pk, gap_id);

-- ---------------------------------------------------------------------------------
-- Views
-- ---------------------------------------------------------------------------------

-- The first open delivery of every stream that has one: a loose index scan over
-- input_deliveries_open, one index probe per stream, however many rows each has.
CREATE VIEW workflow_streams.open_delivery_heads AS
WITH RECURSIVE lanes AS (
    (SELECT o.stream_pk, o.sequence
       FROM workflow_streams.input_deliveries o
      WHERE o.state IN ('pending', 'retrying')
      ORDER BY o.stream_pk, o.sequence
      LIMIT 1)
    UNION ALL
    SELECT n.stream_pk, n.sequence
      FROM lanes l
     CROSS JOIN LATERAL (
           SELECT o.stream_pk, o.sequence
             FROM workflow_streams.input_deliveries o
            WHERE o.state IN ('pending', 'retrying') AND o.stream_pk > l.stream_pk
            ORDER BY o.stream_pk, o.sequence
            LIMIT 1) n
)
SELECT stream_pk, sequence FROM lanes;

-- ---------------------------------------------------------------------------------
-- Functions (helpers first: a LANGUAGE sql function is checked against those it calls)
-- ---------------------------------------------------------------------------------

-- A count from a definition's JSON, clamped to 0 .. 2^53 (retention and credit limits).
CREATE FUNCTION workflow_streams.clamped_count(p_value text)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT LEAST(GREATEST(p_value::numeric, 0), 9007199254740992)::bigint
$function$;

-- A record's fingerprint (store/fingerprint.py computes the same in Python).
CREATE FUNCTION workflow_streams.record_fingerprint(p_sequence bigint, p_appended_at timestamp with time zone, p_size integer)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT encode(timestamptz_send(p_appended_at), 'hex') || '-' || to_hex(p_size)
$function$;

-- The wake an append sends at commit: the records themselves when they fit in a
-- NOTIFY payload ('R...'), else only how far the stream reached ('r<pk>:<seq>').
CREATE FUNCTION workflow_streams.records_wake(p_stream_pk bigint, p_first bigint, p_payloads text[], p_sizes integer[], p_objects jsonb[])
 RETURNS text
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    v_count  integer := coalesce(array_length(p_payloads, 1), 0);
    v_last   bigint := p_first + v_count - 1;
    v_size   bigint := v_count + 64;
    v_joined text;
    v_wake   text;
    k        integer;
BEGIN
    -- Each record takes at least two bytes (one of JSON and its separator): a cheap
    -- bound before the loop, so that a large group costs nothing here.
    IF v_count = 0 OR 2 * v_count + 64 > 7900
       OR (p_objects IS NOT NULL AND cardinality(array_remove(p_objects, NULL)) > 0) THEN
        RETURN 'r' || p_stream_pk::text || ':' || v_last::text;
    END IF;
    FOR k IN 1 .. v_count LOOP
        v_size := v_size + p_sizes[k];
        IF v_size > 7900 THEN
            RETURN 'r' || p_stream_pk::text || ':' || v_last::text;
        END IF;
    END LOOP;
    v_joined := array_to_string(p_payloads, E'\x1e');
    IF length(v_joined) - length(replace(v_joined, E'\x1e', '')) <> v_count - 1 THEN
        RETURN 'r' || p_stream_pk::text || ':' || v_last::text;
    END IF;
    -- Epoch microseconds of now(), exact whatever type extract returns (double
    -- precision before Postgres 14): whole seconds, then the microseconds of the minute.
    v_wake := 'R' || p_stream_pk::text || ':' || v_last::text || ':' || p_first::text || ':'
              || (extract(epoch FROM date_trunc('second', now()))::bigint * 1000000
                  + extract(microseconds FROM now())::bigint % 1000000)::text
              || ':' || v_joined;
    IF octet_length(v_wake) > 7900 THEN
        RETURN 'r' || p_stream_pk::text || ':' || v_last::text;
    END IF;
    RETURN v_wake;
END;
$function$;

-- The append: requests of one stream decided in order under its row lock (credit,
-- quotas, keys), records, receipts, input delivery rows and the wake.
CREATE FUNCTION workflow_streams.append_requests(p_stream_pk bigint, p_counts integer[], p_keys text[], p_hashes text[], p_payloads text[], p_sizes integer[], p_objects jsonb[], p_notify boolean, p_traces text[])
 RETURNS TABLE(request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
 LANGUAGE plpgsql
AS $function$
DECLARE
    s               workflow_streams.streams%ROWTYPE;
    v_credit        jsonb;
    v_max_unread_i  bigint;
    v_max_unread_b  bigint;
    v_max_total_i   bigint;
    v_max_total_b   bigint;
    v_requests      integer := coalesce(array_length(p_counts, 1), 0);
    v_seq           bigint[];   -- [k]: sequence of record k; NULL unless appended
    v_cum           bigint[];   -- [k]: cumulative_bytes of record k once appended
    v_trace         text[];     -- [k]: the traceparent of record k's request (p_traces)
    v_latest_before bigint;
    v_offset        integer := 0;
    v_n             integer;
    v_bytes         bigint;
    v_receipt       workflow_streams.append_receipts%ROWTYPE;
    v_appended      boolean := false;
    i               integer;
    g               integer;
BEGIN
    SELECT * INTO s FROM workflow_streams.streams WHERE stream_pk = p_stream_pk FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT n::integer, 'not_found'::text, NULL::bigint, NULL::bigint
                     FROM generate_series(1, v_requests) n;
        RETURN;
    END IF;
    v_credit        := s.definition -> 'credit';
    v_max_unread_i  := workflow_streams.clamped_count(v_credit ->> 'max_unread_items');
    v_max_unread_b  := workflow_streams.clamped_count(v_credit ->> 'max_unread_bytes');
    v_max_total_i   := workflow_streams.clamped_count(v_credit ->> 'max_total_items');
    v_max_total_b   := workflow_streams.clamped_count(v_credit ->> 'max_total_bytes');
    v_latest_before := s.latest_sequence;
    -- Full length from the start: unnest below pairs v_seq with p_payloads by position.
    v_seq           := array_fill(NULL::bigint, ARRAY[coalesce(array_length(p_sizes, 1), 0)]);
    v_cum           := v_seq;
    IF p_traces IS NOT NULL THEN
        v_trace := array_fill(NULL::text, ARRAY[coalesce(array_length(p_sizes, 1), 0)]);
    END IF;

    FOR i IN 1 .. v_requests LOOP
        -- Request i is records v_offset + 1 .. v_offset + v_n ([0] is NULL: no records).
        v_n := p_counts[i];
        v_bytes := 0;
        FOR g IN v_offset + 1 .. v_offset + v_n LOOP
            v_bytes := v_bytes + p_sizes[g];
        END LOOP;
        request_index := i;
        first_sequence := NULL;
        last_sequence := NULL;

        IF p_keys[i] IS NOT NULL THEN
            SELECT * INTO v_receipt FROM workflow_streams.append_receipts
             WHERE stream_pk = p_stream_pk AND idempotency_key = p_keys[i];
            IF FOUND THEN
                IF v_receipt.request_hash = p_hashes[i] THEN
                    outcome := 'replayed';
                    first_sequence := v_receipt.first_sequence;
                    last_sequence := v_receipt.last_sequence;
                ELSE
                    outcome := 'key_reused';
                END IF;
                RETURN NEXT;
                v_offset := v_offset + v_n;
                CONTINUE;
            END IF;
        END IF;

        -- Every ceiling is the largest allowed value: reaching it is allowed.
        IF s.closed_at IS NOT NULL THEN
            outcome := 'stream_closed';
        ELSIF (v_max_total_i IS NOT NULL AND s.total_items + v_n > v_max_total_i)
           OR (v_max_total_b IS NOT NULL AND s.total_bytes + v_bytes > v_max_total_b) THEN
            outcome := 'quota_exhausted';
        ELSIF s.min_acked_sequence IS NOT NULL AND (
                 (v_max_unread_i IS NOT NULL
                  AND s.latest_sequence - s.min_acked_sequence + v_n > v_max_unread_i)
              OR (v_max_unread_b IS NOT NULL
                  AND s.total_bytes - s.min_acked_bytes + v_bytes > v_max_unread_b)) THEN
            outcome := 'credit_exhausted';
        ELSE
            first_sequence := s.latest_sequence + 1;
            last_sequence := s.latest_sequence + v_n;
            FOR g IN 1 .. v_n LOOP
                v_seq[v_offset + g] := s.latest_sequence + g;
                s.total_bytes := s.total_bytes + p_sizes[v_offset + g];
                v_cum[v_offset + g] := s.total_bytes;
            END LOOP;
            IF p_traces[i] IS NOT NULL THEN
                FOR g IN 1 .. v_n LOOP
                    v_trace[v_offset + g] := p_traces[i];
                END LOOP;
            END IF;
            IF p_keys[i] IS NOT NULL THEN
                INSERT INTO workflow_streams.append_receipts
                       (stream_pk, idempotency_key, request_hash, first_sequence, last_sequence)
                VALUES (p_stream_pk, p_keys[i], p_hashes[i], first_sequence, last_sequence);
            END IF;
            s.latest_sequence := last_sequence;
            s.total_items := s.total_items + v_n;  -- (total_bytes grew in the loop above)
            v_appended := true;
            outcome := 'appended';
        END IF;
        RETURN NEXT;
        v_offset := v_offset + v_n;
    END LOOP;

    IF v_appended THEN
        -- The accepted records of every request, in order.
        INSERT INTO workflow_streams.records
               (stream_pk, sequence, payload, size, cumulative_bytes, object)
        SELECT p_stream_pk, r.seq, r.payload, r.size, r.cum, r.object
          FROM unnest(p_payloads, p_sizes, p_objects, v_seq, v_cum)
               AS r(payload, size, object, seq, cum)
         WHERE r.seq IS NOT NULL;
        IF s.direction = 'input' AND v_trace IS NULL THEN
            INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence)
            SELECT p_stream_pk, n FROM generate_series(v_latest_before + 1, s.latest_sequence) n;
        ELSIF s.direction = 'input' THEN
            INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence, trace_context)
            SELECT p_stream_pk, r.seq, r.trace
              FROM unnest(v_seq, v_trace) AS r(seq, trace)
             WHERE r.seq IS NOT NULL;
        END IF;
        UPDATE workflow_streams.streams
           SET latest_sequence = s.latest_sequence,
               total_items = s.total_items,
               total_bytes = s.total_bytes
         WHERE stream_pk = p_stream_pk;
        -- A wake signal only: delivered by Postgres at commit, never before it; and only
        -- when someone waits for it (0011). s is the row as locked above: a watch
        -- registered before this transaction took the lock is in it. The wake carries
        -- the stream's latest sequence at this commit (the header above).
        IF p_notify AND (s.direction = 'input' OR s.watched_until > now()) THEN
            IF s.latest_sequence - v_latest_before = coalesce(array_length(p_sizes, 1), 0) THEN
                -- Every record of the call was appended (the usual case).
                PERFORM pg_notify('workflow_streams', workflow_streams.records_wake(
                    p_stream_pk, v_latest_before + 1, p_payloads, p_sizes, p_objects));
            ELSE
                PERFORM pg_notify('workflow_streams', workflow_streams.records_wake(
                    p_stream_pk, v_latest_before + 1,
                    ARRAY(SELECT r.payload FROM unnest(p_payloads, v_seq) AS r(payload, seq)
                           WHERE r.seq IS NOT NULL ORDER BY r.seq),
                    ARRAY(SELECT r.size FROM unnest(p_sizes, v_seq) AS r(size, seq)
                           WHERE r.seq IS NOT NULL ORDER BY r.seq),
                    ARRAY(SELECT r.object FROM unnest(p_objects, v_seq) AS r(object, seq)
                           WHERE r.seq IS NOT NULL ORDER BY r.seq)));
            END IF;
        END IF;
    END IF;
END;
$function$;

-- append_requests without traceparents.
CREATE FUNCTION workflow_streams.append_requests(p_stream_pk bigint, p_counts integer[], p_keys text[], p_hashes text[], p_payloads text[], p_sizes integer[], p_objects jsonb[], p_notify boolean)
 RETURNS TABLE(request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
 LANGUAGE sql
AS $function$
    SELECT * FROM workflow_streams.append_requests(
        p_stream_pk, p_counts, p_keys, p_hashes, p_payloads, p_sizes, p_objects, p_notify,
        NULL::text[])
$function$;

-- append_requests that always notifies.
CREATE FUNCTION workflow_streams.append_requests(p_stream_pk bigint, p_counts integer[], p_keys text[], p_hashes text[], p_payloads text[], p_sizes integer[], p_objects jsonb[])
 RETURNS TABLE(request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
 LANGUAGE sql
AS $function$
    SELECT * FROM workflow_streams.append_requests(
        p_stream_pk, p_counts, p_keys, p_hashes, p_payloads, p_sizes, p_objects, true)
$function$;

-- append_requests that also leases the input deliveries it wrote to this process's
-- dispatcher, sparing the dispatcher's claim.
CREATE FUNCTION workflow_streams.append_requests_leasing(p_stream_pk bigint, p_counts integer[], p_keys text[], p_hashes text[], p_payloads text[], p_sizes integer[], p_objects jsonb[], p_notify boolean, p_traces text[], p_owner text, p_lease_seconds double precision, p_max_leased integer)
 RETURNS TABLE(request_index integer, outcome text, first_sequence bigint, last_sequence bigint, leased bigint[])
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_first  bigint;  -- the first and last sequence this call appended (consecutive)
    v_last   bigint;
    v_leased bigint[];
    r        record;
BEGIN
    FOR r IN SELECT * FROM workflow_streams.append_requests(
                 p_stream_pk, p_counts, p_keys, p_hashes, p_payloads, p_sizes, p_objects,
                 p_notify, p_traces) a
              ORDER BY a.request_index LOOP
        request_index := r.request_index;
        outcome := r.outcome;
        first_sequence := r.first_sequence;
        last_sequence := r.last_sequence;
        leased := NULL;
        IF r.outcome = 'appended' THEN
            v_first := coalesce(v_first, r.first_sequence);
            v_last := r.last_sequence;
        END IF;
        RETURN NEXT;
    END LOOP;

    IF v_first IS NULL OR p_max_leased < 1 OR EXISTS (
           SELECT 1 FROM workflow_streams.input_deliveries o
            WHERE o.stream_pk = p_stream_pk AND o.sequence < v_first
              AND o.state IN ('pending', 'retrying')) THEN
        RETURN;  -- nothing appended, or not the head: a claim takes them in turn
    END IF;
    WITH taken AS (
        UPDATE workflow_streams.input_deliveries d
           SET lease_owner = p_owner,
               lease_expires_at = now() + make_interval(secs => p_lease_seconds)
         WHERE d.stream_pk = p_stream_pk
           AND d.sequence BETWEEN v_first AND least(v_last, v_first + p_max_leased - 1)
           AND d.state = 'pending'
        RETURNING d.delivery_id, d.sequence
    )
    SELECT array_agg(t.delivery_id ORDER BY t.sequence), max(t.sequence)
      INTO v_leased, v_last
      FROM taken t;
    IF v_leased IS NULL THEN
        RETURN;  -- an output stream: no deliveries
    END IF;
    request_index := 0;
    outcome := 'leased';
    first_sequence := v_first;
    last_sequence := v_last;
    leased := v_leased;
    RETURN NEXT;
END;
$function$;

-- Several streams' groups of requests in one statement: every group that fits each
-- ceiling appended whole in one pass, the others through append_requests.
CREATE FUNCTION workflow_streams.append_stream_groups(p_stream_pks bigint[], p_group_requests integer[], p_group_records integer[], p_counts integer[], p_keys text[], p_hashes text[], p_payloads text[], p_sizes integer[], p_objects jsonb[], p_notify boolean, p_traces text[])
 RETURNS TABLE(group_index integer, request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    v_groups    integer := coalesce(array_length(p_stream_pks, 1), 0);
    v_records   integer := coalesce(array_length(p_sizes, 1), 0);
    -- [k]: record k's stream, sequence and cumulative_bytes once appended whole; NULL
    -- for the records of the other groups (append_requests inserted those).
    v_pk        bigint[] := array_fill(NULL::bigint, ARRAY[v_records]);
    v_seq       bigint[] := array_fill(NULL::bigint, ARRAY[v_records]);
    v_cum       bigint[] := array_fill(NULL::bigint, ARRAY[v_records]);
    -- [k]: the traceparent of record k's request, for the groups appended whole.
    v_trace     text[] := array_fill(NULL::text, ARRAY[v_records]);
    v_k         integer;
    -- The groups a key keeps from the whole path: one of their keys has a receipt, or
    -- appears twice in the group (NULL: none).
    v_blocked   integer[];
    -- The receipts of the keyed requests appended whole: stream, request, sequences.
    v_rk_pk     bigint[] := '{}';
    v_rk_req    integer[] := '{}';
    v_rk_first  bigint[] := '{}';
    v_rk_last   bigint[] := '{}';
    v_rk        integer := 0;
    v_req_g     integer[];         -- [k]: request k's group (for the look at the keys)
    v_req_pk    bigint[];          -- [k]: request k's stream
    j           integer;
    -- [g]: group g's bytes; and, for the groups the UPDATE moved (appended whole), the
    -- stream's latest_sequence and total_bytes before it and whether it wakes anyone
    -- (NULL for the others).
    v_bytes_of  bigint[] := array_fill(0::bigint, ARRAY[v_groups]);
    v_latest_of bigint[] := array_fill(NULL::bigint, ARRAY[v_groups]);
    v_total_of  bigint[] := array_fill(NULL::bigint, ARRAY[v_groups]);
    v_wakes_of  boolean[] := array_fill(NULL::boolean, ARRAY[v_groups]);
    -- The UPDATE's answer, a row per group moved: its index, then as above.
    v_moved     integer[];
    v_m_latest  bigint[];
    v_m_total   bigint[];
    v_m_wakes   boolean[];
    v_inputs    boolean;           -- a group appended whole is an input stream's
    v_wakes     text[] := '{}';    -- the wakes of the groups appended whole
    v_latest    bigint;
    v_total_bytes bigint;
    v_nreq      integer;
    v_nrec      integer;
    v_bytes     bigint;
    v_req       integer := 0;      -- requests of the groups before g
    v_rec       integer := 0;      -- records of the groups before g
    g           integer;
    k           integer;
BEGIN
    IF cardinality(array_remove(p_keys, NULL)) = 0 THEN
        NULL;  -- no key: none keeps a group from the whole path
    ELSIF cardinality(p_counts) = v_groups THEN
        -- One request a group (an activity's writers send one batch at a time): request
        -- g is group g's, and no key can appear twice in a group. One index probe per
        -- key.
        SELECT array_agg(r.g::integer) INTO v_blocked
          FROM unnest(p_stream_pks, p_keys) WITH ORDINALITY AS r(pk, key, g)
         WHERE r.key IS NOT NULL
           AND EXISTS (SELECT 1 FROM workflow_streams.append_receipts a
                        WHERE a.stream_pk = r.pk AND a.idempotency_key = r.key);
    ELSE
        -- Each request's group and stream, for one look at every key of the statement.
        v_req_g := array_fill(0, ARRAY[coalesce(array_length(p_counts, 1), 0)]);
        v_req_pk := array_fill(0::bigint, ARRAY[coalesce(array_length(p_counts, 1), 0)]);
        FOR g IN 1 .. v_groups LOOP
            FOR k IN v_req + 1 .. v_req + p_group_requests[g] LOOP
                v_req_g[k] := g;
                v_req_pk[k] := p_stream_pks[g];
            END LOOP;
            v_req := v_req + p_group_requests[g];
        END LOOP;
        v_req := 0;
        -- A key used twice in its group, and a key with a receipt: one index probe
        -- each (OFFSET 0 keeps the probe a nested loop, not a scan of every receipt).
        SELECT array_agg(DISTINCT r.g) INTO v_blocked
          FROM (SELECT r.g FROM unnest(v_req_g, p_keys) AS r(g, key)
                 WHERE r.key IS NOT NULL GROUP BY r.g, r.key HAVING count(*) > 1
                UNION ALL
                SELECT r.g FROM unnest(v_req_g, v_req_pk, p_keys) AS r(g, pk, key)
                 CROSS JOIN LATERAL (SELECT 1 FROM workflow_streams.append_receipts a
                                      WHERE a.stream_pk = r.pk AND a.idempotency_key = r.key
                                     OFFSET 0) found
                 WHERE r.key IS NOT NULL) r;
    END IF;

    FOR g IN 1 .. v_groups LOOP
        v_bytes := 0;
        FOR k IN v_rec + 1 .. v_rec + p_group_records[g] LOOP
            v_bytes := v_bytes + p_sizes[k];
        END LOOP;
        v_bytes_of[g] := v_bytes;
        v_rec := v_rec + p_group_records[g];
    END LOOP;
    v_rec := 0;

    -- Every row of the statement, locked in ascending stream_pk (0037).
    PERFORM FROM workflow_streams.streams
      WHERE stream_pk = ANY (p_stream_pks) ORDER BY stream_pk FOR UPDATE;
    -- Moves the row of each group that a key does not keep from the whole path, only if
    -- the whole group fits; every ceiling is the largest allowed value: reaching it is
    -- allowed.
    WITH moved AS (
        UPDATE workflow_streams.streams s
           SET latest_sequence = s.latest_sequence + t.nrec,
               total_items = s.total_items + t.nrec,
               total_bytes = s.total_bytes + t.bytes
          FROM unnest(p_stream_pks, p_group_records, v_bytes_of)
               WITH ORDINALITY AS t(pk, nrec, bytes, g)
         WHERE s.stream_pk = t.pk
           AND (v_blocked IS NULL OR NOT t.g::integer = ANY (v_blocked))
           AND s.closed_at IS NULL
           AND (s.definition -> 'credit' ->> 'max_total_items' IS NULL
                OR s.total_items + t.nrec
                   <= workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_total_items'))
           AND (s.definition -> 'credit' ->> 'max_total_bytes' IS NULL
                OR s.total_bytes + t.bytes
                   <= workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_total_bytes'))
           AND (s.min_acked_sequence IS NULL OR (
                   (s.definition -> 'credit' ->> 'max_unread_items' IS NULL
                    OR s.latest_sequence - s.min_acked_sequence + t.nrec
                       <= workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_unread_items'))
               AND (s.definition -> 'credit' ->> 'max_unread_bytes' IS NULL
                    OR s.total_bytes - s.min_acked_bytes + t.bytes
                       <= workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_unread_bytes'))))
        RETURNING t.g::integer AS g, s.latest_sequence - t.nrec AS latest,
                  s.total_bytes - t.bytes AS total,
                  s.direction = 'input' AS input,
                  p_notify AND (s.direction = 'input' OR s.watched_until > now()) AS wakes)
    SELECT array_agg(m.g), array_agg(m.latest), array_agg(m.total), array_agg(m.wakes),
           bool_or(m.input)
      INTO v_moved, v_m_latest, v_m_total, v_m_wakes, v_inputs
      FROM moved m;
    FOR j IN 1 .. coalesce(array_length(v_moved, 1), 0) LOOP
        v_latest_of[v_moved[j]] := v_m_latest[j];
        v_total_of[v_moved[j]] := v_m_total[j];
        v_wakes_of[v_moved[j]] := v_m_wakes[j];
    END LOOP;

    FOR g IN 1 .. v_groups LOOP
        v_nreq := p_group_requests[g];
        v_nrec := p_group_records[g];
        IF v_latest_of[g] IS NULL THEN
            -- Decided request by request, as if alone.
            RETURN QUERY
                SELECT g, a.request_index, a.outcome, a.first_sequence, a.last_sequence
                  FROM workflow_streams.append_requests(
                           p_stream_pks[g],
                           p_counts[v_req + 1 : v_req + v_nreq],
                           p_keys[v_req + 1 : v_req + v_nreq],
                           p_hashes[v_req + 1 : v_req + v_nreq],
                           p_payloads[v_rec + 1 : v_rec + v_nrec],
                           p_sizes[v_rec + 1 : v_rec + v_nrec],
                           p_objects[v_rec + 1 : v_rec + v_nrec],
                           p_notify,
                           p_traces[v_req + 1 : v_req + v_nreq]) a
                 ORDER BY a.request_index;
        ELSE
            -- Appended whole: the records' places and each request's answer.
            v_latest := v_latest_of[g];
            v_total_bytes := v_total_of[g];
            FOR k IN 1 .. v_nrec LOOP
                v_total_bytes := v_total_bytes + p_sizes[v_rec + k];
                v_pk[v_rec + k] := p_stream_pks[g];
                v_seq[v_rec + k] := v_latest + k;
                v_cum[v_rec + k] := v_total_bytes;
            END LOOP;
            IF p_traces IS NOT NULL THEN
                v_k := v_rec;
                FOR k IN v_req + 1 .. v_req + v_nreq LOOP
                    FOR j IN 1 .. p_counts[k] LOOP
                        v_k := v_k + 1;
                        v_trace[v_k] := p_traces[k];
                    END LOOP;
                END LOOP;
            END IF;
            group_index := g;
            outcome := 'appended';
            FOR k IN 1 .. v_nreq LOOP
                request_index := k;
                first_sequence := v_latest + 1;
                last_sequence := v_latest + p_counts[v_req + k];
                v_latest := last_sequence;
                IF p_keys[v_req + k] IS NOT NULL THEN
                    v_rk := v_rk + 1;
                    v_rk_pk[v_rk] := p_stream_pks[g];
                    v_rk_req[v_rk] := v_req + k;
                    v_rk_first[v_rk] := first_sequence;
                    v_rk_last[v_rk] := last_sequence;
                END IF;
                RETURN NEXT;
            END LOOP;
            -- The wake as append_requests sends it (0011, 0012, 0035).
            IF v_wakes_of[g] THEN
                v_wakes := v_wakes || workflow_streams.records_wake(
                    p_stream_pks[g], v_latest_of[g] + 1,
                    p_payloads[v_rec + 1 : v_rec + v_nrec],
                    p_sizes[v_rec + 1 : v_rec + v_nrec],
                    p_objects[v_rec + 1 : v_rec + v_nrec]);
            END IF;
        END IF;
        v_req := v_req + v_nreq;
        v_rec := v_rec + v_nrec;
    END LOOP;
    IF cardinality(v_wakes) > 0 THEN
        PERFORM pg_notify('workflow_streams', w) FROM unnest(v_wakes) WITH ORDINALITY AS u(w, n)
          ORDER BY n;
    END IF;

    -- The receipts of the keyed requests appended whole, in one insert. A key that
    -- another transaction stored since the look above (it held the row lock this one
    -- then waited for) fails the insert, and so the statement: the appender then
    -- decides each group alone (store/append.py), where that key is replayed.
    IF v_rk > 0 THEN
        INSERT INTO workflow_streams.append_receipts
               (stream_pk, idempotency_key, request_hash, first_sequence, last_sequence)
        SELECT r.pk, p_keys[r.req], p_hashes[r.req], r.first, r.last
          FROM unnest(v_rk_pk, v_rk_req, v_rk_first, v_rk_last) AS r(pk, req, first, last);
    END IF;
    -- The records of every group appended whole, in one insert.
    INSERT INTO workflow_streams.records
           (stream_pk, sequence, payload, size, cumulative_bytes, object)
    SELECT r.pk, r.seq, r.payload, r.size, r.cum, r.object
      FROM unnest(v_pk, v_seq, p_payloads, p_sizes, v_cum, p_objects)
           AS r(pk, seq, payload, size, cum, object)
     WHERE r.seq IS NOT NULL;
    IF v_inputs THEN
        INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence, trace_context)
        SELECT r.pk, r.seq, r.trace
          FROM unnest(v_pk, v_seq, v_trace) AS r(pk, seq, trace)
          JOIN workflow_streams.streams st ON st.stream_pk = r.pk
         WHERE r.seq IS NOT NULL AND st.direction = 'input';
    END IF;
END;
$function$;

-- append_stream_groups without traceparents.
CREATE FUNCTION workflow_streams.append_stream_groups(p_stream_pks bigint[], p_group_requests integer[], p_group_records integer[], p_counts integer[], p_keys text[], p_hashes text[], p_payloads text[], p_sizes integer[], p_objects jsonb[], p_notify boolean)
 RETURNS TABLE(group_index integer, request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
 LANGUAGE sql
AS $function$
    SELECT * FROM workflow_streams.append_stream_groups(
        p_stream_pks, p_group_requests, p_group_records, p_counts, p_keys, p_hashes,
        p_payloads, p_sizes, p_objects, p_notify, NULL::text[])
$function$;

-- A consumer's acknowledgement, which frees credit.
CREATE FUNCTION workflow_streams.ack_consumer(p_stream_pk bigint, p_consumer_id text, p_sequence bigint)
 RETURNS TABLE(outcome text, acked_sequence bigint)
 LANGUAGE plpgsql
AS $function$
DECLARE
    s            workflow_streams.streams%ROWTYPE;
    v_acked      bigint;
    v_old_bytes  bigint;
    v_bytes      bigint;
    v_next_seq   bigint;
    v_next_start bigint;
BEGIN
    SELECT * INTO s FROM workflow_streams.streams WHERE stream_pk = p_stream_pk FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    SELECT c.acked_sequence, c.acked_bytes INTO v_acked, v_old_bytes
      FROM workflow_streams.consumers c
     WHERE c.stream_pk = p_stream_pk AND c.consumer_id = p_consumer_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'consumer_not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    IF p_sequence > s.latest_sequence THEN
        RETURN QUERY SELECT 'ack_in_future'::text, v_acked;
        RETURN;
    ELSIF p_sequence < v_acked THEN
        RETURN QUERY SELECT 'ack_regression'::text, v_acked;
        RETURN;
    ELSIF p_sequence = v_acked THEN
        RETURN QUERY SELECT 'unchanged'::text, v_acked;
        RETURN;
    END IF;

    -- Cumulative bytes of 1..p_sequence: read from the record when it is retained.
    SELECT r.cumulative_bytes INTO v_bytes FROM workflow_streams.records r
     WHERE r.stream_pk = p_stream_pk AND r.sequence = p_sequence;
    IF NOT FOUND THEN
        -- Pruned. Exact only when it is the record right before the first retained one
        -- (or the last record and nothing is retained); else keep the previous figure,
        -- a lower bound, so unread bytes are over- rather than under-counted.
        SELECT r.sequence, r.cumulative_bytes - r.size INTO v_next_seq, v_next_start
          FROM workflow_streams.records r
         WHERE r.stream_pk = p_stream_pk AND r.sequence > p_sequence
         ORDER BY r.sequence LIMIT 1;
        IF FOUND AND v_next_seq = p_sequence + 1 THEN
            v_bytes := v_next_start;
        ELSIF NOT FOUND AND p_sequence = s.latest_sequence THEN
            v_bytes := s.total_bytes;
        ELSE
            v_bytes := v_old_bytes;
        END IF;
    END IF;
    UPDATE workflow_streams.consumers c
       SET acked_sequence = p_sequence, acked_bytes = greatest(v_bytes, v_old_bytes),
           updated_at = now()
     WHERE c.stream_pk = p_stream_pk AND c.consumer_id = p_consumer_id;
    UPDATE workflow_streams.streams st
       SET (min_acked_sequence, min_acked_bytes) = (
             SELECT c.acked_sequence, c.acked_bytes FROM workflow_streams.consumers c
              WHERE c.stream_pk = p_stream_pk
              ORDER BY c.acked_sequence, c.acked_bytes LIMIT 1)
     WHERE st.stream_pk = p_stream_pk;
    -- Wakes producers blocked on credit; like every wake, only at commit.
    PERFORM pg_notify('workflow_streams', 'a' || p_stream_pk::text);
    RETURN QUERY SELECT 'acked'::text, p_sequence;
END;
$function$;

-- A stream created under its tenant's quota (tenant_streams).
CREATE FUNCTION workflow_streams.create_stream(p_tenant text, p_run_id text, p_stream_id text, p_direction text, p_definition jsonb, p_consumers text[], p_max_streams bigint, OUT r_stream_pk bigint, OUT r_outcome text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
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
$function$;

-- One Durable Streams write (append, append-and-close or close) with its writer checks,
-- in one transaction, under the stream's row lock: a retry is never accepted twice and a
-- fenced producer never appends. Outcomes, in the order they are decided:
--   not_found           the stream does not exist
--   duplicate           a producer's retry (seq at or below its last), or the retry of
--                       the producer request that closed the stream: nothing appended
--   already_closed      close-only on a closed stream (idempotent)
--   stream_closed       anything else on a closed stream
--   seq_gap             a new producer whose seq is not 0, or seq past last + 1
--                       (producer_seq: the expected one)
--   too_many_producers  a new producer past the stream's 10,000
--   stale_epoch         the producer's epoch is older than the stream's (producer_epoch)
--   epoch_seq           a new epoch whose seq is not 0
--   stream_seq_conflict Stream-Seq not greater than the last accepted one
--   credit_exhausted, quota_exhausted   append_requests' own refusals
--   appended            the records (if any) appended and, with p_close, the stream closed
-- The records go through append_requests, so credit, quotas, input delivery rows and
-- wakes are exactly those of a native append.
CREATE FUNCTION workflow_streams.ds_append(p_stream_pk bigint, p_payloads text[], p_sizes integer[], p_hash text, p_close boolean, p_stream_seq text, p_producer text, p_epoch bigint, p_seq bigint, p_trace text)
 RETURNS TABLE(outcome text, first_sequence bigint, last_sequence bigint, latest_sequence bigint, closed boolean, producer_epoch bigint, producer_seq bigint)
 LANGUAGE plpgsql
AS $function$
DECLARE
    s   workflow_streams.streams%ROWTYPE;
    w   workflow_streams.ds_stream_writers%ROWTYPE;
    pr  workflow_streams.ds_producers%ROWTYPE;
    r   record;
    v_n integer := coalesce(array_length(p_payloads, 1), 0);
BEGIN
    SELECT * INTO s FROM workflow_streams.streams WHERE stream_pk = p_stream_pk FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    latest_sequence := s.latest_sequence;
    closed := s.closed_at IS NOT NULL;
    producer_epoch := p_epoch;
    producer_seq := p_seq;
    SELECT * INTO w FROM workflow_streams.ds_stream_writers WHERE stream_pk = p_stream_pk;

    IF s.closed_at IS NOT NULL THEN
        IF p_producer IS NOT NULL AND w.closed_by_producer = p_producer
           AND w.closed_by_epoch = p_epoch AND w.closed_by_seq = p_seq THEN
            outcome := 'duplicate';
        ELSIF p_close AND v_n = 0 AND p_producer IS NULL THEN
            outcome := 'already_closed';
        ELSE
            outcome := 'stream_closed';
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_producer IS NOT NULL THEN
        SELECT * INTO pr FROM workflow_streams.ds_producers
         WHERE stream_pk = p_stream_pk AND producer_id = p_producer;
        IF NOT FOUND THEN
            IF p_seq <> 0 THEN
                outcome := 'seq_gap';
                producer_seq := 0;
            ELSIF (SELECT count(*) FROM (SELECT 1 FROM workflow_streams.ds_producers
                                          WHERE stream_pk = p_stream_pk LIMIT 10000) known)
                  >= 10000 THEN
                -- http/ds/writes.py MAX_PRODUCERS: counted under the stream's row lock,
                -- so concurrent new producers cannot pass the cap together.
                outcome := 'too_many_producers';
            END IF;
        ELSIF p_epoch < pr.epoch THEN
            outcome := 'stale_epoch';
            producer_epoch := pr.epoch;
        ELSIF p_epoch > pr.epoch THEN
            IF p_seq <> 0 THEN
                outcome := 'epoch_seq';
            END IF;
        ELSIF p_seq <= pr.last_seq THEN
            outcome := 'duplicate';
            producer_seq := pr.last_seq;
        ELSIF p_seq > pr.last_seq + 1 THEN
            outcome := 'seq_gap';
            producer_seq := pr.last_seq + 1;
        END IF;
        IF outcome IS NOT NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    IF p_stream_seq IS NOT NULL AND w.last_stream_seq IS NOT NULL
       AND p_stream_seq COLLATE "C" <= w.last_stream_seq COLLATE "C" THEN
        outcome := 'stream_seq_conflict';
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_n > 0 THEN
        SELECT * INTO r
          FROM workflow_streams.append_requests(
                   p_stream_pk, ARRAY[v_n], ARRAY[NULL::text], ARRAY[p_hash],
                   p_payloads, p_sizes, NULL::jsonb[], true,
                   CASE WHEN p_trace IS NULL THEN NULL ELSE ARRAY[p_trace] END) a;
        IF r.outcome <> 'appended' THEN
            outcome := r.outcome;
            RETURN NEXT;
            RETURN;
        END IF;
        first_sequence := r.first_sequence;
        last_sequence := r.last_sequence;
        latest_sequence := r.last_sequence;
    END IF;

    IF p_close THEN
        UPDATE workflow_streams.streams SET closed_at = now() WHERE stream_pk = p_stream_pk;
        -- The close wake of stream_close (schema/sql/streams.sql): followers read the end.
        PERFORM pg_notify('workflow_streams', 'c' || p_stream_pk::text);
        closed := true;
    END IF;

    IF p_producer IS NOT NULL THEN
        INSERT INTO workflow_streams.ds_producers (stream_pk, producer_id, epoch, last_seq)
        VALUES (p_stream_pk, p_producer, p_epoch, p_seq)
        ON CONFLICT (stream_pk, producer_id)
        DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = now();
    END IF;
    IF p_stream_seq IS NOT NULL OR (p_close AND p_producer IS NOT NULL) THEN
        INSERT INTO workflow_streams.ds_stream_writers
               (stream_pk, last_stream_seq, closed_by_producer, closed_by_epoch, closed_by_seq)
        VALUES (p_stream_pk, p_stream_seq,
                CASE WHEN p_close THEN p_producer END,
                CASE WHEN p_close THEN p_epoch END,
                CASE WHEN p_close THEN p_seq END)
        ON CONFLICT (stream_pk) DO UPDATE
           SET last_stream_seq = coalesce(excluded.last_stream_seq,
                                          workflow_streams.ds_stream_writers.last_stream_seq),
               closed_by_producer = coalesce(excluded.closed_by_producer,
                                             workflow_streams.ds_stream_writers.closed_by_producer),
               closed_by_epoch = coalesce(excluded.closed_by_epoch,
                                          workflow_streams.ds_stream_writers.closed_by_epoch),
               closed_by_seq = coalesce(excluded.closed_by_seq,
                                        workflow_streams.ds_stream_writers.closed_by_seq);
    END IF;
    outcome := 'appended';
    RETURN NEXT;
END;
$function$;

-- ds_append without a traceparent.
CREATE FUNCTION workflow_streams.ds_append(p_stream_pk bigint, p_payloads text[], p_sizes integer[], p_hash text, p_close boolean, p_stream_seq text, p_producer text, p_epoch bigint, p_seq bigint)
 RETURNS TABLE(outcome text, first_sequence bigint, last_sequence bigint, latest_sequence bigint, closed boolean, producer_epoch bigint, producer_seq bigint)
 LANGUAGE sql
AS $function$
    SELECT * FROM workflow_streams.ds_append(
        p_stream_pk, p_payloads, p_sizes, p_hash, p_close, p_stream_seq, p_producer,
        p_epoch, p_seq, NULL::text)
$function$;

-- Trigger: created streams counted in tenant_streams.
CREATE FUNCTION workflow_streams.count_created_streams()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO workflow_streams.tenant_streams AS t (tenant, streams)
    SELECT n.tenant, count(*) FROM created_streams n GROUP BY n.tenant
        ON CONFLICT (tenant) DO UPDATE SET streams = t.streams + excluded.streams;
    RETURN NULL;
END;
$function$;

-- Trigger: a deleted stream's records, receipts and deliveries (no foreign keys) go with
-- it, and its tenant's count goes down.
CREATE FUNCTION workflow_streams.delete_stream_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

-- ---------------------------------------------------------------------------------
-- Triggers: per statement, with the statement's rows as a transition table
-- ---------------------------------------------------------------------------------

CREATE TRIGGER streams_count_created
    AFTER INSERT ON workflow_streams.streams
    REFERENCING NEW TABLE AS created_streams
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_streams.count_created_streams();

CREATE TRIGGER streams_delete_rows
    AFTER DELETE ON workflow_streams.streams
    REFERENCING OLD TABLE AS deleted_streams
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_streams.delete_stream_rows();
