-- The append path's group commit and its wakes (issue 9). Named blocks as everywhere.

-- name: records_append_group
-- The append path's statement for one stream's group (store/append.py). The records
-- travel as one text each: payloads ($5) joined by U+001E (compact JSON never holds that
-- control character raw: it is escaped inside strings) and sizes ($6) joined by commas;
-- objects ($7) are NULL when no record has one (unnest pads a NULL array with NULLs).
-- asyncpg encodes text[]/integer[]/jsonb[] element by element, which cost client CPU
-- per record (docs/speed.md, "Joined text arguments"). $8: NOTIFY at commit (the statement
-- is alone in flight) or not (the caller announces the commit afterwards, wake_send).
-- appended_at: now() is the transaction's start, the records' appended_at (live
-- delivery of this process builds the committed records from it without a read).
-- $9: each request's traceparent, NULL when none has one (input_deliveries.trace_context).
SELECT request_index, outcome, first_sequence, last_sequence, now() AS appended_at
  FROM workflow_streams.append_requests($1, $2::integer[], $3::text[], $4::text[],
                                        string_to_array($5::text, E'\x1e'),
                                        string_to_array($6::text, ',')::integer[],
                                        $7::jsonb[], $8::boolean, $9::text[]);

-- name: records_append_group_leasing
-- records_append_group for an input stream that this process's dispatcher can take at
-- once (store/append.py, "Leases taken by the append"): $10 the dispatcher's owner, $11
-- its lease in seconds, $12 how many deliveries it takes at most. The rows are
-- records_append_group's, then one row with request_index 0 when the append leased its
-- deliveries (append_requests_leasing): their ids in `leased`, sequences first..last.
SELECT request_index, outcome, first_sequence, last_sequence, leased, now() AS appended_at
  FROM workflow_streams.append_requests_leasing($1, $2::integer[], $3::text[], $4::text[],
                                                string_to_array($5::text, E'\x1e'),
                                                string_to_array($6::text, ',')::integer[],
                                                $7::jsonb[], $8::boolean, $9::text[],
                                                $10::text, $11::float8, $12::integer);

-- name: wake_send
-- Announces commits that have already happened: one NOTIFY per payload, in one
-- transaction. It carries nothing worth a WAL flush, so its commit does not wait for
-- one (the notify lock is held only briefly); a wake lost to a crash only delays.
SELECT count(pg_notify('workflow_streams', w))
  FROM unnest($1::text[]) w, set_config('synchronous_commit', 'off', true);

-- name: append_stage_payloads
-- A statement's payloads, for one that carries more than store/append.py's
-- STAGED_STATEMENT_BYTES: they are COPYed here in the statement's own transaction, in
-- chunks (one Bind message of a large batch holds the client's event loop for tens of
-- milliseconds: docs/speed.md, "Staged statements"), and the staged forms of the append
-- statements below read them back in order.
CREATE TEMP TABLE append_staged_payloads (ord integer, payload text) ON COMMIT DROP;

-- name: records_append_group_staged
-- records_append_group with its payloads from append_staged_payloads: $5 sizes joined
-- by commas, $6 objects, $7 NOTIFY at commit or not, $8 traceparents.
SELECT request_index, outcome, first_sequence, last_sequence, now() AS appended_at
  FROM workflow_streams.append_requests($1, $2::integer[], $3::text[], $4::text[],
                                        (SELECT array_agg(payload ORDER BY ord)
                                           FROM append_staged_payloads),
                                        string_to_array($5::text, ',')::integer[],
                                        $6::jsonb[], $7::boolean, $8::text[]);

-- name: records_append_stream_groups_staged
-- records_append_stream_groups with its payloads from append_staged_payloads: $7 sizes,
-- $8 objects, $9 NOTIFY at commit or not, $10 traceparents.
SELECT group_index, request_index, outcome, first_sequence, last_sequence,
       now() AS appended_at
  FROM workflow_streams.append_stream_groups($1::bigint[], $2::integer[], $3::integer[],
                                             $4::integer[], $5::text[], $6::text[],
                                             (SELECT array_agg(payload ORDER BY ord)
                                                FROM append_staged_payloads),
                                             string_to_array($7::text, ',')::integer[],
                                             $8::jsonb[], $9, $10::text[]);

-- name: records_append_stream_groups
-- The groups of several streams (ascending stream_pk) in one transaction; records travel
-- as in records_append_group ($7, $8, $9); $10: NOTIFY at commit or not; $11 each
-- request's traceparent, NULL when none has one.
SELECT group_index, request_index, outcome, first_sequence, last_sequence,
       now() AS appended_at
  FROM workflow_streams.append_stream_groups($1::bigint[], $2::integer[], $3::integer[],
                                             $4::integer[], $5::text[], $6::text[],
                                             string_to_array($7::text, E'\x1e'),
                                             string_to_array($8::text, ',')::integer[],
                                             $9::jsonb[], $10, $11::text[]);
