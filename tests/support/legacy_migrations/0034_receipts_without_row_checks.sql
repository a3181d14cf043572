-- 0034: append receipts drop their foreign key to streams, as records did in 0013;
-- deleting a stream still deletes them (the trigger 0013 made, extended below).
--
-- Every batch of an activity's stream_writer carries an idempotency key, so each stores
-- a receipt, and the key's per-row check (a trigger that looks the stream up and locks
-- it FOR KEY SHARE) ran once per batch: at 100 streaming activities thousands a second
-- (docs/speed.md, "Records without foreign keys").
--
-- Why no receipt can name a missing stream: only append_requests and
-- append_stream_groups write receipts, each after it has locked the stream's row (FOR
-- UPDATE, or the UPDATE that moves it), which a DELETE of that row must wait for; the
-- trigger runs after the delete and its statement sees what that append committed.

ALTER TABLE workflow_streams.append_receipts DROP CONSTRAINT append_receipts_stream_pk_fkey;

CREATE OR REPLACE FUNCTION workflow_streams.delete_stream_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflow_streams.input_deliveries d
     USING deleted_streams g WHERE d.stream_pk = g.stream_pk;
    DELETE FROM workflow_streams.records r
     USING deleted_streams g WHERE r.stream_pk = g.stream_pk;
    DELETE FROM workflow_streams.append_receipts a
     USING deleted_streams g WHERE a.stream_pk = g.stream_pk;
    RETURN NULL;
END;
$$;
