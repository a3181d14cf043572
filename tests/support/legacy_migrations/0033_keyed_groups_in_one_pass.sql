-- 0033: append_stream_groups appends keyed groups whole too.
--
-- 0014 appended a group in one pass with the others only when no request of it carried
-- an idempotency key; any key sent the group through append_requests (its row lock,
-- receipt look-up and insert, record insert and update, one group at a time). Every
-- batch of an activity's stream_writer carries a key (ds:act:<digest>:<attempt>:<n>),
-- so at 100 streaming activities every group of every statement took that path, at
-- about three times the Postgres CPU of a keyless request (docs/speed.md, "Keyed groups
-- in one pass").
--
-- A request with a key is appended exactly as one without when its key has no
-- receipt on the stream and no earlier request of its group has the same key: then
-- append_requests finds nothing, decides it on the ceilings alone and stores its
-- receipt. So one query at the start looks up every key of the statement (the
-- primary key's index, one probe each) and marks the groups with a key that has a
-- receipt (a replay, or a reuse with another body) or repeats within the group; those
-- go through append_requests as before. The rest take 0014's path: the conditional
-- UPDATE (row lock and ceilings), and at the end one INSERT of their receipts beside
-- the one of their records, both while the rows are locked.
--
-- The look-up runs before the row locks. A transaction that held a group's row lock
-- meanwhile and stored the same key (the same request sent twice at once) has ended
-- by the time this one's UPDATE has the lock; if it committed, this one's receipt insert
-- then fails on the primary key: the statement fails without committing anything, and
-- the appender decides each group alone (store/append.py, _run_groups), where the key
-- is found and replayed. A request never gets 'appended' twice for one key.
--
-- Unchanged: outcomes, rows, receipts, wakes and the result's shape;
-- tests/speed/test_append_function.py runs each kind of group both ways and compares.
-- The 10-argument form (0020's wrapper) calls this one.

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
            -- The wake as append_requests sends it (0011, 0012).
            IF p_notify AND (v_direction = 'input' OR v_watched_until > now()) THEN
                PERFORM pg_notify('workflow_streams',
                                  'r' || v_stream_pk::text || ':' || v_latest::text);
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
