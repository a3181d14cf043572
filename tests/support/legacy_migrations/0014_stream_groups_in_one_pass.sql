-- 0014: append_stream_groups appends the groups that nothing can refuse itself.
--
-- 0009 called append_requests once per stream: for 16 streams of one record each, 16
-- function calls, each with its row lock, request loop, one-row insert and update.
-- That statement is what "16 clients on 16 streams" waits for, one at a time.
--
-- A group that nothing can refuse is appended whole, every request in order: its stream
-- exists and is open, no request of it carries an idempotency key, and the group as a
-- whole fits under every ceiling. The last is checked for the whole group at once: each
-- request's own check (append_requests) compares the state left by the requests before
-- it plus its own records with the ceiling, and while none is refused that is at most
-- the state before the group plus all of the group's records. For such a group
-- append_requests would answer 'appended' to every request with consecutive sequences,
-- so here one conditional UPDATE takes the row lock and moves the row (the WHERE is the
-- test), and one INSERT at the end stores the records of every such group. A group
-- whose UPDATE matched nothing (a key, a ceiling it would pass, a closed or missing
-- stream) goes through append_requests, which decides each request as before.
--
-- Locks: the groups come in ascending stream_pk order (the caller's, 0009) and each
-- row is locked in turn, by the UPDATE or by append_requests, so two such transactions,
-- or one and a single-stream append, never deadlock. An UPDATE whose WHERE fails locks
-- nothing; append_requests then locks the row and decides on what it finds. So records
-- are still inserted only while their stream's row is locked (0013's reason why no
-- record can name a missing stream): the UPDATE that matched holds the lock until
-- commit, past the INSERT at the end.
--
-- Unchanged: outcomes, rows, wakes (0011, 0012: only when someone waits, carrying the
-- stream's latest sequence) and the result's shape; tests/speed/test_append_function.py
-- runs each kind of group both ways and compares. What it buys: docs/speed.md, "Group
-- commit and stream groups".

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
LANGUAGE plpgsql AS $$
DECLARE
    v_groups    integer := coalesce(array_length(p_stream_pks, 1), 0);
    v_records   integer := coalesce(array_length(p_sizes, 1), 0);
    -- [k]: record k's stream, sequence and cumulative_bytes once appended whole; NULL
    -- for the records of the other groups (append_requests inserted those).
    v_pk        bigint[] := array_fill(NULL::bigint, ARRAY[v_records]);
    v_seq       bigint[] := array_fill(NULL::bigint, ARRAY[v_records]);
    v_cum       bigint[] := array_fill(NULL::bigint, ARRAY[v_records]);
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
                       <= (definition -> 'credit' ->> 'max_total_items')::bigint)
               AND (definition -> 'credit' ->> 'max_total_bytes' IS NULL
                    OR total_bytes + v_bytes
                       <= (definition -> 'credit' ->> 'max_total_bytes')::bigint)
               AND (min_acked_sequence IS NULL OR (
                       (definition -> 'credit' ->> 'max_unread_items' IS NULL
                        OR latest_sequence - min_acked_sequence + v_nrec
                           <= (definition -> 'credit' ->> 'max_unread_items')::bigint)
                   AND (definition -> 'credit' ->> 'max_unread_bytes' IS NULL
                        OR total_bytes - min_acked_bytes + v_bytes
                           <= (definition -> 'credit' ->> 'max_unread_bytes')::bigint)))
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
                           p_notify) a
                 ORDER BY a.request_index;
        ELSE
            -- Appended whole: the records' places and each request's answer.
            FOR k IN 1 .. v_nrec LOOP
                v_total_bytes := v_total_bytes + p_sizes[v_rec + k];
                v_pk[v_rec + k] := v_stream_pk;
                v_seq[v_rec + k] := v_latest + k;
                v_cum[v_rec + k] := v_total_bytes;
            END LOOP;
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
        INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence)
        SELECT r.pk, r.seq
          FROM unnest(v_pk, v_seq) AS r(pk, seq)
          JOIN workflow_streams.streams st ON st.stream_pk = r.pk
         WHERE r.seq IS NOT NULL AND st.direction = 'input';
    END IF;
END;
$$;
