-- 0036: an input append may lease its own deliveries, in its own transaction, to the
-- dispatcher of the process that appends.
--
-- Until now a record appended to an input stream reached its workflow after two round
-- trips to Postgres: the append's, then the dispatcher's claim (delivery_claim_stream)
-- once the wake of that commit had reached it. On an idle stream the claim always
-- leases exactly the rows the append has just inserted, so the append can take that
-- lease itself: the dispatcher of the same process then sends the signal as soon as the
-- append's answer is back (delivery/service.py, "Leases taken by the append").
--
-- append_requests_leasing runs append_requests unchanged (the same rows, locks, wake and
-- outcomes), then leases the deliveries it inserted to p_owner for p_lease_seconds, at
-- most p_max_leased of them, but only when they are the stream's head: no earlier
-- delivery of the stream is open (pending or retrying, leased or not, due or backing
-- off). That is the claim's own rule for order (delivery.sql, delivery_claim: only a
-- head can start a claim), decided under the stream's row lock, which append_requests
-- took and holds until commit, so no other append of the stream runs meanwhile. The
-- rows are leased from the moment they exist: no other claim ever sees them unleased.
-- A lease taken here is an ordinary lease: renewed by its owner while it delivers,
-- claimable by any dispatcher once it runs out (the owner died before sending).
--
-- The answer is append_requests' rows, then, when something was leased, one more row:
-- request_index 0, outcome 'leased', the first and last leased sequence, and the leased
-- delivery ids in sequence order.

CREATE FUNCTION workflow_streams.append_requests_leasing(
    p_stream_pk     bigint,
    p_counts        integer[],
    p_keys          text[],
    p_hashes        text[],
    p_payloads      text[],
    p_sizes         integer[],
    p_objects       jsonb[],
    p_notify        boolean,
    p_traces        text[],
    p_owner         text,
    p_lease_seconds double precision,
    p_max_leased    integer
) RETURNS TABLE (request_index integer, outcome text, first_sequence bigint,
                 last_sequence bigint, leased bigint[])
LANGUAGE plpgsql AS $$
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
$$;
