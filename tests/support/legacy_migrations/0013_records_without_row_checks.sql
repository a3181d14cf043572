-- 0013: records and input deliveries drop their foreign key to streams; deleting a
-- stream still deletes them (a trigger, below).
--
-- A foreign key is checked per inserted row: Postgres queues a trigger per row that
-- looks the stream up and locks it FOR KEY SHARE. On a 100-record append that was half
-- of the statement (docs/speed.md, "Records without foreign keys"). A statement-level
-- trigger doing the same check cost as much as a whole 1-record append, so it is not
-- used either (docs/decisions.md, "The append path in Postgres").
--
-- Why no record can name a missing stream: only workflow_streams.append_requests writes
-- either table, and it inserts only after it has locked the stream's row FOR UPDATE
-- (0002 and every restatement since), which a DELETE of that row must wait for. The
-- product never deletes streams (retention prunes records, not streams); an operator's
-- DELETE of a stream row takes its records and deliveries with it, as ON DELETE CASCADE
-- did: the trigger runs after the delete, whose row lock waited for any append in
-- flight, and its statements see what that append committed.

ALTER TABLE workflow_streams.records DROP CONSTRAINT records_stream_pk_fkey;
ALTER TABLE workflow_streams.input_deliveries DROP CONSTRAINT input_deliveries_stream_pk_fkey;

CREATE FUNCTION workflow_streams.delete_stream_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflow_streams.input_deliveries d
     USING deleted_streams g WHERE d.stream_pk = g.stream_pk;
    DELETE FROM workflow_streams.records r
     USING deleted_streams g WHERE r.stream_pk = g.stream_pk;
    RETURN NULL;
END;
$$;

CREATE TRIGGER streams_delete_rows
    AFTER DELETE ON workflow_streams.streams
    REFERENCING OLD TABLE AS deleted_streams
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_streams.delete_stream_rows();
