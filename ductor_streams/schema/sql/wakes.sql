-- The append path's group commit and its wakes (issue 9). Named blocks as everywhere.

-- name: records_append_group
-- Appends a group of requests to one stream in one transaction WITHOUT a NOTIFY inside
-- it; the caller announces the commit afterwards with wake_send (store/wakes.py).
SELECT request_index, outcome, first_sequence, last_sequence
  FROM workflow_streams.append_requests($1, $2::integer[], $3::text[], $4::text[],
                                        $5::text[], $6::integer[], $7::jsonb[], false);

-- name: wake_send
-- Announces commits that have already happened: one NOTIFY per payload, in one
-- transaction. It carries nothing worth a WAL flush, so its commit does not wait for
-- one (the notify lock is held only briefly); a wake lost to a crash only delays.
SELECT count(pg_notify('workflow_streams', w))
  FROM unnest($1::text[]) w, set_config('synchronous_commit', 'off', true);

-- name: records_append_stream_groups
-- The groups of several streams (ascending stream_pk) in one transaction; the caller
-- says whether it carries its NOTIFYs ($10) or announces them after commit.
SELECT group_index, request_index, outcome, first_sequence, last_sequence
  FROM workflow_streams.append_stream_groups($1::bigint[], $2::integer[], $3::integer[],
                                             $4::integer[], $5::text[], $6::text[],
                                             $7::text[], $8::integer[], $9::jsonb[], $10);
