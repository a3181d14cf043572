-- 0020: an input record's delivery row keeps the trace context of the request that
-- appended it.
--
-- input_deliveries.trace_context holds a W3C traceparent ("00-<trace>-<span>-<flags>") of
-- the appending request's span, when tracing is on and that request was sampled; the
-- dispatcher's signal span continues it (ductor_streams/tracing.py, docs/operators.md).
-- NULL otherwise: with tracing off the append statements pass no trace array at all,
-- and the rows are written exactly as before.
--
-- append_requests and append_stream_groups take one more argument, p_traces: one
-- traceparent (or NULL) per request, or NULL for none. They are 0015's functions with
-- that argument carried to the delivery rows; nothing else changes (outcomes, rows,
-- locks, wakes). The forms without it stay, as wrappers passing NULL, so that a server
-- of the previous version keeps working against this schema during a rolling upgrade.

ALTER TABLE workflow_streams.input_deliveries ADD COLUMN trace_context text;

CREATE FUNCTION workflow_streams.append_requests(
    p_stream_pk bigint,
    p_counts    integer[],
    p_keys      text[],
    p_hashes    text[],
    p_payloads  text[],
    p_sizes     integer[],
    p_objects   jsonb[],
    p_notify    boolean,
    p_traces    text[]
) RETURNS TABLE (request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
LANGUAGE plpgsql AS $$
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
            PERFORM pg_notify('workflow_streams',
                              'r' || p_stream_pk::text || ':' || s.latest_sequence::text);
        END IF;
    END IF;
END;
$$;

CREATE FUNCTION workflow_streams.append_stream_groups(
    p_stream_pks       bigint[],
    p_group_requests   integer[],
    p_group_records    integer[],
    p_counts           integer[],
    p_keys             text[],
    p_hashes           text[],
    p_payloads         text[],
    p_sizes            integer[],
    p_objects          jsonb[],
    p_notify           boolean,
    p_traces           text[]
) RETURNS TABLE (group_index integer, request_index integer, outcome text,
                 first_sequence bigint, last_sequence bigint)
LANGUAGE plpgsql AS $$
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
    j           integer;
    v_inputs    boolean := false;  -- a group appended whole is an input stream's
    v_whole     boolean;
    -- The stream of a group appended whole, as its UPDATE left it; v_latest and
    -- v_total_bytes start from the values before it and move record by record.
    v_stream_pk       bigint;
    v_direction       text;
    v_watched_until   timestamptz;
    v_latest          bigint;
    v_total_bytes     bigint;
    v_nreq      integer;
    v_nrec      integer;
    v_bytes     bigint;
    v_req       integer := 0;      -- requests of the groups before g
    v_rec       integer := 0;      -- records of the groups before g
    g           integer;
    k           integer;
BEGIN
    FOR g IN 1 .. v_groups LOOP
        v_nreq := p_group_requests[g];
        v_nrec := p_group_records[g];
        v_whole := true;
        FOR k IN v_req + 1 .. v_req + v_nreq LOOP
            IF p_keys[k] IS NOT NULL THEN
                v_whole := false;
                EXIT;
            END IF;
        END LOOP;
        IF v_whole THEN
            v_bytes := 0;
            FOR k IN v_rec + 1 .. v_rec + v_nrec LOOP
                v_bytes := v_bytes + p_sizes[k];
            END LOOP;
            -- Locks and moves the row only if the whole group fits (the header above);
            -- every ceiling is the largest allowed value: reaching it is allowed.
            UPDATE workflow_streams.streams
               SET latest_sequence = latest_sequence + v_nrec,
                   total_items = total_items + v_nrec,
                   total_bytes = total_bytes + v_bytes
             WHERE stream_pk = p_stream_pks[g]
               AND closed_at IS NULL
               AND (definition -> 'credit' ->> 'max_total_items' IS NULL
                    OR total_items + v_nrec
                       <= workflow_streams.clamped_count(definition -> 'credit' ->> 'max_total_items'))
               AND (definition -> 'credit' ->> 'max_total_bytes' IS NULL
                    OR total_bytes + v_bytes
                       <= workflow_streams.clamped_count(definition -> 'credit' ->> 'max_total_bytes'))
               AND (min_acked_sequence IS NULL OR (
                       (definition -> 'credit' ->> 'max_unread_items' IS NULL
                        OR latest_sequence - min_acked_sequence + v_nrec
                           <= workflow_streams.clamped_count(definition -> 'credit' ->> 'max_unread_items'))
                   AND (definition -> 'credit' ->> 'max_unread_bytes' IS NULL
                        OR total_bytes - min_acked_bytes + v_bytes
                           <= workflow_streams.clamped_count(definition -> 'credit' ->> 'max_unread_bytes'))))
            RETURNING stream_pk, direction, watched_until,
                      latest_sequence - v_nrec, total_bytes - v_bytes
                 INTO v_stream_pk, v_direction, v_watched_until, v_latest, v_total_bytes;
            v_whole := FOUND;
        END IF;

        IF NOT v_whole THEN
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
            FOR k IN 1 .. v_nrec LOOP
                v_total_bytes := v_total_bytes + p_sizes[v_rec + k];
                v_pk[v_rec + k] := v_stream_pk;
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
                RETURN NEXT;
            END LOOP;
            v_inputs := v_inputs OR v_direction = 'input';
            -- The wake as append_requests sends it (0011, 0012).
            IF p_notify AND (v_direction = 'input' OR v_watched_until > now()) THEN
                PERFORM pg_notify('workflow_streams',
                                  'r' || v_stream_pk::text || ':' || v_latest::text);
            END IF;
        END IF;
        v_req := v_req + v_nreq;
        v_rec := v_rec + v_nrec;
    END LOOP;

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
$$;

-- The form without traces (0015's signature): no trace context.
CREATE OR REPLACE FUNCTION workflow_streams.append_requests(
    p_stream_pk bigint,
    p_counts    integer[],
    p_keys      text[],
    p_hashes    text[],
    p_payloads  text[],
    p_sizes     integer[],
    p_objects   jsonb[],
    p_notify    boolean
) RETURNS TABLE (request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
LANGUAGE sql AS $$
    SELECT * FROM workflow_streams.append_requests(
        p_stream_pk, p_counts, p_keys, p_hashes, p_payloads, p_sizes, p_objects, p_notify,
        NULL::text[])
$$;

-- The form without traces (0015's signature): no trace context.
CREATE OR REPLACE FUNCTION workflow_streams.append_stream_groups(
    p_stream_pks       bigint[],
    p_group_requests   integer[],
    p_group_records    integer[],
    p_counts           integer[],
    p_keys             text[],
    p_hashes           text[],
    p_payloads         text[],
    p_sizes            integer[],
    p_objects          jsonb[],
    p_notify           boolean
) RETURNS TABLE (group_index integer, request_index integer, outcome text,
                 first_sequence bigint, last_sequence bigint)
LANGUAGE sql AS $$
    SELECT * FROM workflow_streams.append_stream_groups(
        p_stream_pks, p_group_requests, p_group_records, p_counts, p_keys, p_hashes,
        p_payloads, p_sizes, p_objects, p_notify, NULL::text[])
$$;
