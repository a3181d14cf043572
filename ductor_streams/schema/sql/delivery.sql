-- Input delivery (the outbox of input records -> workflow signals). States:
-- pending -> delivered | retrying | dead; retrying -> delivered | retrying | dead;
-- dead -> pending (operator retry). See docs/temporal.md.

-- name: delivery_claim
-- Claims up to $3 streams' heads (the first open delivery of each stream) that are due
-- and not leased, for tenant $5, then leases up to $4 open deliveries of each claimed
-- stream, in sequence order, to owner $1 for $2 seconds.
-- Order per stream holds because only a head can start a claim: while any earlier
-- delivery of a stream is open (leased, locked by a concurrent claim, or backing off),
-- no later one is claimable. FOR UPDATE SKIP LOCKED lets concurrent claimers pass each
-- other; a head updated by a committed concurrent claim is re-checked (state, lease) and
-- dropped.
WITH heads AS (
    SELECT d.stream_pk, d.sequence
      FROM workflow_streams.input_deliveries d
      JOIN workflow_streams.open_delivery_heads l
        ON l.stream_pk = d.stream_pk AND l.sequence = d.sequence
      JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
     WHERE s.tenant = $5
       AND d.state IN ('pending', 'retrying')
       AND d.next_attempt_at <= now()
       AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= now())
     ORDER BY d.next_attempt_at, d.delivery_id
     LIMIT $3
       FOR UPDATE OF d SKIP LOCKED
), batch AS (
    SELECT b.delivery_id
      FROM heads h
     CROSS JOIN LATERAL (
            SELECT o.delivery_id
              FROM workflow_streams.input_deliveries o
             WHERE o.stream_pk = h.stream_pk AND o.sequence >= h.sequence
               AND o.state IN ('pending', 'retrying')
             ORDER BY o.sequence
             LIMIT $4) b
)
UPDATE workflow_streams.input_deliveries d
   SET lease_owner = $1,
       lease_expires_at = now() + make_interval(secs => $2)
  FROM batch, workflow_streams.streams s
 WHERE d.delivery_id = batch.delivery_id
   AND s.stream_pk = d.stream_pk
   AND d.state IN ('pending', 'retrying')
RETURNING d.delivery_id, d.stream_pk, d.sequence, d.attempts, d.created_at,
          d.trace_context, s.run_id, s.stream_id, s.tenant,
          (SELECT r.payload FROM workflow_streams.records r
            WHERE r.stream_pk = d.stream_pk AND r.sequence = d.sequence) AS payload,
          (SELECT r.object::text FROM workflow_streams.records r
            WHERE r.stream_pk = d.stream_pk AND r.sequence = d.sequence) AS object,
          (SELECT r.appended_at FROM workflow_streams.records r
            WHERE r.stream_pk = d.stream_pk AND r.sequence = d.sequence) AS appended_at;

-- name: delivery_claim_stream
-- delivery_claim for stream $6 only (a wake named it): its head is one index lookup,
-- where open_delivery_heads walks every stream with an open delivery, of every tenant,
-- so its cost grows with them (docs/speed.md, "Named claims"). The rest of the
-- statement is delivery_claim's, word for word, but for the last UPDATE naming stream $6
-- beside the batch's ids, so that every table it touches is found by the stream (one
-- shard under Citus, docs/scale.md; tests/temporal/test_named_claims.py compares them).
-- One stream, not an array of them, and not delivery_claim with a NULL argument: either
-- kept Postgres on custom plans, planned anew at each call, which cost about three times
-- a claim on the generic plan (docs/speed.md, "Named claims").
WITH named_head AS (
    -- Found without locking, as the view finds heads: locking here with SKIP LOCKED
    -- would pass a head that a concurrent claim holds and take the delivery behind it,
    -- out of order.
    SELECT o.stream_pk, o.sequence
      FROM workflow_streams.input_deliveries o
     WHERE o.stream_pk = $6 AND o.state IN ('pending', 'retrying')
     ORDER BY o.sequence
     LIMIT 1
), heads AS (
    SELECT d.stream_pk, d.sequence
      FROM workflow_streams.input_deliveries d
      JOIN named_head l
        ON l.stream_pk = d.stream_pk AND l.sequence = d.sequence
      JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
     WHERE s.tenant = $5
       AND d.state IN ('pending', 'retrying')
       AND d.next_attempt_at <= now()
       AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= now())
     ORDER BY d.next_attempt_at, d.delivery_id
     LIMIT $3
       FOR UPDATE OF d SKIP LOCKED
), batch AS (
    SELECT b.delivery_id
      FROM heads h
     CROSS JOIN LATERAL (
            SELECT o.delivery_id
              FROM workflow_streams.input_deliveries o
             WHERE o.stream_pk = h.stream_pk AND o.sequence >= h.sequence
               AND o.state IN ('pending', 'retrying')
             ORDER BY o.sequence
             LIMIT $4) b
)
UPDATE workflow_streams.input_deliveries d
   SET lease_owner = $1,
       lease_expires_at = now() + make_interval(secs => $2)
  FROM batch, workflow_streams.streams s
 WHERE d.delivery_id = batch.delivery_id AND d.stream_pk = $6
   AND s.stream_pk = d.stream_pk
   AND d.state IN ('pending', 'retrying')
RETURNING d.delivery_id, d.stream_pk, d.sequence, d.attempts, d.created_at,
          d.trace_context, s.run_id, s.stream_id, s.tenant,
          (SELECT r.payload FROM workflow_streams.records r
            WHERE r.stream_pk = d.stream_pk AND r.sequence = d.sequence) AS payload,
          (SELECT r.object::text FROM workflow_streams.records r
            WHERE r.stream_pk = d.stream_pk AND r.sequence = d.sequence) AS object,
          (SELECT r.appended_at FROM workflow_streams.records r
            WHERE r.stream_pk = d.stream_pk AND r.sequence = d.sequence) AS appended_at;

-- name: delivery_mark_delivered
-- Deliveries $1 (sequences) of stream $2 were signalled. Whoever sent the signal records
-- it, even if its lease has passed to another owner: the signal was sent, and the helper
-- in the workflow drops the repeat.
-- This statement and the four after it find a claim's rows by their stream and sequences
-- (the claim returned both; input_deliveries_record is unique on them), not by
-- delivery_id: each stays on its stream's shard with the tables distributed by stream
-- (docs/scale.md). The bounds of the sequences, as well as the list, keep the index's
-- range narrow on a generic plan too: whose estimate of one stream's open rows is an
-- average, so with `stream_pk = ` and the list alone it scanned every open row of a stream
-- with a backlog (12 ms for one row of a stream with 100,000 open, against 0.15 ms).
UPDATE workflow_streams.input_deliveries
   SET state = 'delivered', delivered_at = now(), attempts = attempts + 1,
       last_error = NULL, lease_owner = NULL, lease_expires_at = NULL
 WHERE stream_pk = $2 AND sequence = ANY($1::bigint[])
   AND sequence BETWEEN (SELECT min(q) FROM unnest($1::bigint[]) q)
                    AND (SELECT max(q) FROM unnest($1::bigint[]) q)
   AND state IN ('pending', 'retrying');

-- name: delivery_mark_retrying
-- One failed attempt of delivery $1 (a sequence) of stream $5 by owner $2: back off $4
-- seconds.
UPDATE workflow_streams.input_deliveries
   SET state = 'retrying', attempts = attempts + 1, last_error = $3,
       next_attempt_at = now() + make_interval(secs => $4),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE stream_pk = $5 AND sequence = $1 AND lease_owner = $2
   AND state IN ('pending', 'retrying');

-- name: delivery_mark_dead
-- Deliveries $1 (sequences) of stream $4 can never succeed (the workflow is gone):
-- visible to operators, who may re-queue them. Only the attempted one ($2) counts an
-- attempt.
UPDATE workflow_streams.input_deliveries
   SET state = 'dead', last_error = $3,
       attempts = attempts + CASE WHEN sequence = $2 THEN 1 ELSE 0 END,
       lease_owner = NULL, lease_expires_at = NULL
 WHERE stream_pk = $4 AND sequence = ANY($1::bigint[])
   AND sequence BETWEEN (SELECT min(q) FROM unnest($1::bigint[]) q)
                    AND (SELECT max(q) FROM unnest($1::bigint[]) q)
   AND state IN ('pending', 'retrying');

-- name: delivery_release
-- Gives back the unattempted rest $1 (sequences) of a claim of stream $4 (owner $2),
-- untouched otherwise; returns how many rows it gave back. With $3 (a dispatcher
-- stopping, or past its lease guard) and anything given back, it also wakes every
-- dispatcher at commit: wake 'd0' names stream 0, which the hub hands to its any-stream
-- watchers (process/dispatcher.py), so another replica claims the rows at once instead of
-- at its next idle poll.
WITH released AS (
    UPDATE workflow_streams.input_deliveries
       SET lease_owner = NULL, lease_expires_at = NULL
     WHERE stream_pk = $4 AND sequence = ANY($1::bigint[])
       AND sequence BETWEEN (SELECT min(q) FROM unnest($1::bigint[]) q)
                        AND (SELECT max(q) FROM unnest($1::bigint[]) q)
       AND lease_owner = $2
    RETURNING sequence
)
SELECT (SELECT count(*) FROM released) AS released,
       (SELECT count(pg_notify('workflow_streams', 'd0'))
          FROM (SELECT 1 FROM released WHERE $3::boolean LIMIT 1) one) AS woken;

-- name: delivery_renew
-- The lease heartbeat (dispatcher.py): owner $2 renews its leases of deliveries $1
-- (sequences) of stream $4 for $3 seconds from now: one statement per stream it holds,
-- all of them sent in one round trip (outbox.renew). Only leases that have not run out: a
-- lapsed lease may already be another dispatcher's, and an owner whose renewals stopped
-- has stopped sending before its leases lapse (it sends only within 80% of a lease after
-- its last renewal began). Returns the renewed rows: a held one missing from them is
-- a lease lost, and its claimed stream is never extended again. SKIP LOCKED: a row locked
-- now is being recorded or given back by this owner (it is no longer held, so missing it
-- means nothing) or claimed by another (then it is lost indeed); never wait for, or
-- deadlock with, those statements. Rows found by their key, within the held range:
-- O(held rows).
WITH live AS (
    SELECT sequence
      FROM workflow_streams.input_deliveries
     WHERE stream_pk = $4 AND sequence = ANY($1::bigint[])
       AND sequence BETWEEN (SELECT min(q) FROM unnest($1::bigint[]) q)
                        AND (SELECT max(q) FROM unnest($1::bigint[]) q)
       AND lease_owner = $2
       AND state IN ('pending', 'retrying') AND lease_expires_at > now()
       FOR UPDATE SKIP LOCKED
)
UPDATE workflow_streams.input_deliveries d
   SET lease_expires_at = now() + make_interval(secs => $3)
  FROM live
 WHERE d.stream_pk = $4 AND d.sequence = live.sequence
RETURNING d.stream_pk, d.sequence;

-- name: delivery_next_due
-- Seconds until the earliest stream head of tenant $1 becomes claimable (<= 0: now);
-- NULL when nothing is open. Rows behind a head do not count: they wait for it. A leased
-- head counts at its lease's end, so an idle dispatcher wakes right when the lease of a
-- replica that died runs out (its live owner keeps moving that end by renewing).
SELECT extract(epoch FROM min(greatest(d.next_attempt_at,
                                       coalesce(d.lease_expires_at, d.next_attempt_at)))
                           - now())::float8 AS seconds
  FROM workflow_streams.open_delivery_heads l
  JOIN workflow_streams.input_deliveries d ON d.stream_pk = l.stream_pk AND d.sequence = l.sequence
  JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
 WHERE s.tenant = $1;

-- name: delivery_stream_is_input
-- Whether stream $1 is an input stream (only their appends create deliveries).
SELECT direction = 'input' FROM workflow_streams.streams WHERE stream_pk = $1;
