-- 0039: append_stream_groups looks at the keys of a statement whose groups hold one
-- request each with one simple probe per key.
--
-- Every batch of an activity's stream_writer carries a key and a writer has one batch
-- in flight, so at 100 streaming activities every several-stream statement is of that
-- shape. 0033's look at the keys served any shape: it numbered the requests in plpgsql
-- loops, then ran one statement for a key used twice in its group (GROUP BY ... HAVING)
-- and for a key with a receipt (an index probe each), joined by UNION ALL. With one
-- request a group, request g is group g's and no key can appear twice in a group: the
-- loops and the first half have nothing to find. The other shapes keep 0033's look.
-- What the keys add to a statement falls by about a third (docs/speed.md, "Keyed groups
-- in one pass"; measure with python -m bench.keyed_groups --streams 16 --records 1).
--
-- Nothing else changes: outcomes, rows, locks, receipts and wakes are 0037's, and the
-- function keeps 0037's SET clauses and 0038's plan_cache_mode (CREATE OR REPLACE sets
-- a function's settings anew, so they are all restated below).

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
LANGUAGE plpgsql
-- Row by row through streams_pkey, whatever the table's size (0037).
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
-- Its generic plans whatever the connection's history (0038).
SET plan_cache_mode = force_generic_plan
AS $$
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
$$;
