-- 0041: a record's fingerprint, written by Postgres where it writes a record's JSON.
--
-- With asynchronous replication a failover can lose commits a reader already saw: the
-- new primary never had sequence N, and its next append uses N again for other records.
-- A reader that resumes after N would skip the new N without knowing. Each record's JSON
-- therefore carries a short opaque `fingerprint`, and a read or subscribe may send back
-- the fingerprint of the record at its cursor (`fingerprint=`): the answer is 409
-- history_diverged when the stored record differs (docs/api.md, "Fingerprints").
--
-- The fingerprint is of what tells two commits of one sequence apart without reading
-- the payload: the commit's appended_at (the transaction's now(), in microseconds since
-- the epoch) xor the sequence, in hex, then the record's size in hex:
-- `<hex(micros xor sequence)>-<hex(size)>`. Python writes the same text
-- (ductor_streams/store/fingerprint.py, record_fingerprint) for records it fans out from
-- commits and wakes; tests/live/test_fingerprints.py compares the two. Cheap on the
-- read paths: no payload hash, an exact numeric epoch (date_part's float is not exact
-- in microseconds for long), and a SQL function Postgres inlines into each statement
-- (STABLE: extract(epoch from timestamptz) is).

CREATE FUNCTION workflow_streams.record_fingerprint(
    p_sequence bigint, p_appended_at timestamptz, p_size integer
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT to_hex((extract(epoch FROM p_appended_at) * 1000000)::bigint # p_sequence)
           || '-' || to_hex(p_size)
$$;
