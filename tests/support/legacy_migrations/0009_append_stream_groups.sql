-- 0009: the groups of several streams in one transaction (issue 9, store/append.py).
--
-- Every commit waits for a WAL flush, so one-append-per-transaction traffic over many
-- streams is capped at the disk's flush rate (16 clients on 16 streams: ~1,800 appends/s
-- here, about what raw Postgres does with one transaction per append). The appender
-- therefore runs a bounded number of append statements at once and sends the groups
-- that became ready meanwhile, one per stream, together through this function.
--
-- Each stream's group is decided by append_requests exactly as if it were sent alone
-- (its requests in order against the state the earlier ones left). The caller passes
-- the streams in ascending stream_pk order, so the row locks of two such transactions,
-- or of one and a single-stream append, are always taken in the same order (no
-- deadlock). The arrays hold the groups one after another: p_group_requests and
-- p_group_records say how many requests and records each group has.
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
    p_notify           boolean
) RETURNS TABLE (group_index integer, request_index integer, outcome text,
                 first_sequence bigint, last_sequence bigint)
LANGUAGE plpgsql AS $$
DECLARE
    g         integer;
    v_req     integer := 0;  -- requests of the groups before g
    v_rec     integer := 0;  -- records of the groups before g
    v_nreq    integer;
    v_nrec    integer;
BEGIN
    FOR g IN 1 .. coalesce(array_length(p_stream_pks, 1), 0) LOOP
        v_nreq := p_group_requests[g];
        v_nrec := p_group_records[g];
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
        v_req := v_req + v_nreq;
        v_rec := v_rec + v_nrec;
    END LOOP;
END;
$$;
