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
-- the payload: the commit's appended_at (the transaction's now()) and the record's size,
-- as `<appended_at>-<hex(size)>`, where <appended_at> is the timestamp's binary form in
-- hex (16 digits: microseconds since 2000-01-01 UTC, a big-endian 64-bit two's
-- complement integer). It is always compared with the record at one sequence, so the
-- sequence is not in it (writing it cost a third of what the fingerprint adds to a
-- page). Python writes the same text
-- (ductor_streams/store/fingerprint.py, record_fingerprint) for records it fans out from
-- commits and wakes; tests/live/test_fingerprints.py compares the two.
--
-- Cheap on the read paths, which write it for every record: no payload hash, and
-- timestamptz_send rather than extract(epoch ...), whose exact numeric cost about twice
-- as much, while date_part's float is not exact to the microsecond for long. IMMUTABLE
-- and a single expression, so the planner inlines it into each statement. The sequence
-- stays an argument: what a fingerprint is of may grow without changing the callers.

CREATE FUNCTION workflow_streams.record_fingerprint(
    p_sequence bigint, p_appended_at timestamptz, p_size integer
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT encode(timestamptz_send(p_appended_at), 'hex') || '-' || to_hex(p_size)
$$;
