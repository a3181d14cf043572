-- 0035: the NOTIFY that an append statement sends at its own commit carries the
-- records it announces, as the wakes sent after a commit already did.
--
-- A statement alone in flight notifies inside its transaction (store/append.py); until
-- now that wake was the plain r<pk>:<latest>, so every follower in another process
-- (the server, for records an activity's stream_writer appended in a worker) read
-- Postgres on it. The wakes the appender sends after a commit (store/wakes.py) carried
-- the records when they were few and small (live/record_wakes.py), and followers fanned
-- those out without a read. At 100 streaming activities most statements are alone in
-- flight, so about half of the records were read back; each read cost the server and
-- Postgres a round trip and the record its latency (docs/speed.md, "Wakes that carry
-- records").
--
-- records_wake builds the payload exactly as record_wake does in Python
--
--     R<stream_pk>:<last sequence>:<first sequence>:<appended_at, epoch us>:<payloads>
--
-- the payloads joined by U+001E, appended_at the transaction's now() (the records'
-- appended_at), and falls back to the plain r<pk>:<last> on the same conditions: any
-- record with an object, more than MAX_PAYLOAD_BYTES (7,900) by the same estimate and
-- by the payload's own length, or a payload holding U+001E. tests/live/test_record_wakes.py
-- compares the two on the same records.
--
-- append_requests and append_stream_groups are 0020's and 0033's with that wake;
-- nothing else changes (outcomes, rows, locks, when a wake is sent).

CREATE FUNCTION workflow_streams.records_wake(
    p_stream_pk bigint,
    p_first     bigint,
    p_payloads  text[],
    p_sizes     integer[],
    p_objects   jsonb[]
) RETURNS text
LANGUAGE plpgsql STABLE AS $$
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
$$;

CREATE OR REPLACE FUNCTION workflow_streams.append_requests(
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
$$;

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
    IF cardinality(array_remove(p_keys, NULL)) > 0 THEN
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
        v_nreq := p_group_requests[g];
        v_nrec := p_group_records[g];
        v_whole := v_blocked IS NULL OR NOT g = ANY (v_blocked);
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
                IF p_keys[v_req + k] IS NOT NULL THEN
                    v_rk := v_rk + 1;
                    v_rk_pk[v_rk] := v_stream_pk;
                    v_rk_req[v_rk] := v_req + k;
                    v_rk_first[v_rk] := first_sequence;
                    v_rk_last[v_rk] := last_sequence;
                END IF;
                RETURN NEXT;
            END LOOP;
            v_inputs := v_inputs OR v_direction = 'input';
            -- The wake as append_requests sends it (0011, 0012, 0035).
            IF p_notify AND (v_direction = 'input' OR v_watched_until > now()) THEN
                PERFORM pg_notify('workflow_streams', workflow_streams.records_wake(
                    v_stream_pk, v_latest - v_nrec + 1,
                    p_payloads[v_rec + 1 : v_rec + v_nrec],
                    p_sizes[v_rec + 1 : v_rec + v_nrec],
                    p_objects[v_rec + 1 : v_rec + v_nrec]));
            END IF;
        END IF;
        v_req := v_req + v_nreq;
        v_rec := v_rec + v_nrec;
    END LOOP;

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
$$;
