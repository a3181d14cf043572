-- 0011: an append notifies at commit only when something waits for its wake.
--
-- A NOTIFY at commit is not free even for one writer: Postgres signals every listening
-- backend, each wakes, reads the queue in a transaction of its own and passes the
-- notification to its client, and the listening process wakes too: for one client on
-- one stream that is a large share of an append (docs/speed.md, "Wakes after commit").
--
-- Who waits for a record wake ('r<pk>'): the input dispatcher (input streams only) and
-- live followers, in any process. So output streams now carry watched_until: a process
-- that follows a stream live sets it to a minute ahead (live_stream_watch) BEFORE it
-- reads where to start, and renews it while it follows (live_streams_rewatch). The
-- append below notifies when the stream is an input stream or watched. Why no wake is
-- lost: both the watch and the append take the stream's row lock. A watch committed
-- before an append locked the row is in the row the append locked (FOR UPDATE reads
-- the newest version), so that append notifies; an append that locked the row first
-- committed before the watch could, so the follower's start read has its records. A
-- watch that lapsed (its process stalled or died) only delays: followers also poll.
--
-- Unchanged: outcomes and rows (tests/speed/test_append_function.py), p_notify's
-- meaning for callers, and the wakes store/wakes.py sends after commit (the group-commit
-- path beside other statements), which still go for every stream.

ALTER TABLE workflow_streams.streams ADD COLUMN watched_until timestamptz;

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
    v_max_unread_i  := (v_credit ->> 'max_unread_items')::bigint;
    v_max_unread_b  := (v_credit ->> 'max_unread_bytes')::bigint;
    v_max_total_i   := (v_credit ->> 'max_total_items')::bigint;
    v_max_total_b   := (v_credit ->> 'max_total_bytes')::bigint;
    v_latest_before := s.latest_sequence;
    -- Full length from the start: unnest below pairs v_seq with p_payloads by position.
    v_seq           := array_fill(NULL::bigint, ARRAY[coalesce(array_length(p_sizes, 1), 0)]);
    v_cum           := v_seq;

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
        IF s.direction = 'input' THEN
            INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence)
            SELECT p_stream_pk, n FROM generate_series(v_latest_before + 1, s.latest_sequence) n;
        END IF;
        UPDATE workflow_streams.streams
           SET latest_sequence = s.latest_sequence,
               total_items = s.total_items,
               total_bytes = s.total_bytes
         WHERE stream_pk = p_stream_pk;
        -- A wake signal only: delivered by Postgres at commit, never before it; and only
        -- when someone waits for it (the header above). s is the row as locked above:
        -- a watch registered before this transaction took the lock is in it.
        IF p_notify AND (s.direction = 'input' OR s.watched_until > now()) THEN
            PERFORM pg_notify('workflow_streams', 'r' || p_stream_pk::text);
        END IF;
    END IF;
END;
$$;
