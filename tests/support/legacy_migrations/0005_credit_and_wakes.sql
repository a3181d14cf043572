-- 0005: credit fixes and wakes off the commit path (issues 4 and 9; docs/credit.md).
--
-- 1. append_requests gains an overload with p_notify. The store's group-commit path
--    passes false and announces the commit itself, coalesced, AFTER the commit returns
--    (ductor_streams/store/wakes.py): a NOTIFY inside the append transaction takes
--    Postgres's database-wide notify lock through the commit's WAL flush and so
--    serialises commits across ALL streams. The 7-argument form keeps its old meaning
--    (notify inside the transaction, at commit) for any caller that appends inside a
--    transaction of its own.
-- 2. ack_consumer never overstates what a consumer acknowledged in bytes. When the acked
--    record was pruned by retention its exact cumulative byte count is gone; 0002 used
--    the pruning boundary, which is too high whenever the ack lands below it and so
--    under-counts unread bytes (over-admission). Now: exact when the record is retained
--    or sits right below the first retained one; otherwise the consumer's previous
--    (exact or lower) figure is kept, so unread bytes are never under-counted.
--    The stream's minimum ack breaks ties on sequence by the smaller byte figure.

CREATE FUNCTION workflow_streams.append_requests(
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
    v_is_input      boolean;
    v_offset        integer := 0;
    v_n             integer;
    v_bytes         bigint;
    v_receipt       workflow_streams.append_receipts%ROWTYPE;
    v_appended      boolean := false;
    i               integer;
BEGIN
    SELECT * INTO s FROM workflow_streams.streams WHERE stream_pk = p_stream_pk FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT g::integer, 'not_found'::text, NULL::bigint, NULL::bigint
                     FROM generate_series(1, coalesce(array_length(p_counts, 1), 0)) g;
        RETURN;
    END IF;
    v_credit       := s.definition -> 'credit';
    v_max_unread_i := (v_credit ->> 'max_unread_items')::bigint;
    v_max_unread_b := (v_credit ->> 'max_unread_bytes')::bigint;
    v_max_total_i  := (v_credit ->> 'max_total_items')::bigint;
    v_max_total_b  := (v_credit ->> 'max_total_bytes')::bigint;
    v_is_input     := s.direction = 'input';

    FOR i IN 1 .. coalesce(array_length(p_counts, 1), 0) LOOP
        v_n := p_counts[i];
        SELECT coalesce(sum(x), 0) INTO v_bytes FROM unnest(p_sizes[v_offset + 1 : v_offset + v_n]) x;
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
            INSERT INTO workflow_streams.records
                   (stream_pk, sequence, payload, size, cumulative_bytes, object)
            SELECT p_stream_pk, s.latest_sequence + r.ord, r.payload, r.size,
                   s.total_bytes + sum(r.size) OVER (ORDER BY r.ord), r.object
              FROM unnest(p_payloads[v_offset + 1 : v_offset + v_n],
                          p_sizes[v_offset + 1 : v_offset + v_n],
                          p_objects[v_offset + 1 : v_offset + v_n])
                   WITH ORDINALITY AS r(payload, size, object, ord);
            IF v_is_input THEN
                INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence)
                SELECT p_stream_pk, s.latest_sequence + g FROM generate_series(1, v_n) g;
            END IF;
            first_sequence := s.latest_sequence + 1;
            last_sequence := s.latest_sequence + v_n;
            IF p_keys[i] IS NOT NULL THEN
                INSERT INTO workflow_streams.append_receipts
                       (stream_pk, idempotency_key, request_hash, first_sequence, last_sequence)
                VALUES (p_stream_pk, p_keys[i], p_hashes[i], first_sequence, last_sequence);
            END IF;
            s.latest_sequence := last_sequence;
            s.total_items := s.total_items + v_n;
            s.total_bytes := s.total_bytes + v_bytes;
            v_appended := true;
            outcome := 'appended';
        END IF;
        RETURN NEXT;
        v_offset := v_offset + v_n;
    END LOOP;

    IF v_appended THEN
        UPDATE workflow_streams.streams
           SET latest_sequence = s.latest_sequence,
               total_items = s.total_items,
               total_bytes = s.total_bytes
         WHERE stream_pk = p_stream_pk;
        IF p_notify THEN
            -- A wake signal only: delivered by Postgres at commit, never before it.
            PERFORM pg_notify('workflow_streams', 'r' || p_stream_pk::text);
        END IF;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION workflow_streams.append_requests(
    p_stream_pk bigint,
    p_counts    integer[],
    p_keys      text[],
    p_hashes    text[],
    p_payloads  text[],
    p_sizes     integer[],
    p_objects   jsonb[]
) RETURNS TABLE (request_index integer, outcome text, first_sequence bigint, last_sequence bigint)
LANGUAGE sql AS $$
    SELECT * FROM workflow_streams.append_requests(
        p_stream_pk, p_counts, p_keys, p_hashes, p_payloads, p_sizes, p_objects, true)
$$;

CREATE OR REPLACE FUNCTION workflow_streams.ack_consumer(
    p_stream_pk bigint, p_consumer_id text, p_sequence bigint
) RETURNS TABLE (outcome text, acked_sequence bigint)
LANGUAGE plpgsql AS $$
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
$$;
