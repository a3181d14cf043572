-- 0004: large objects and upkeep (docs/objects.md).
-- Object intents remember the store's own MD5 of the bytes whose SHA-256 was verified
-- at upload, so that commit can check what the store holds without re-reading it, and
-- the metadata exactly as sent (compact JSON, key order kept: jsonb would sort the
-- keys), which becomes the record's payload at commit.
ALTER TABLE workflow_streams.object_intents
    ADD COLUMN record_payload text,
    ADD COLUMN stored_md5   text,
    ADD COLUMN committed_at timestamptz,
    ADD COLUMN ended_at     timestamptz;
-- The orphan sweep asks "does any live intent own this key?".
CREATE INDEX object_intents_storage_key ON workflow_streams.object_intents (storage_key);

-- A deletion knows its stream (parsed from the key for orphans), so that it can wait
-- while the stream is under legal hold, and the intent it came from, if any.
ALTER TABLE workflow_streams.deletion_outbox
    ADD COLUMN stream_pk bigint,
    ADD COLUMN object_id uuid;
CREATE INDEX deletion_outbox_pending_key ON workflow_streams.deletion_outbox (storage_key)
    WHERE state = 'pending';

-- The streams retention can touch: a definition with a retention limit.
CREATE INDEX streams_with_retention ON workflow_streams.streams (stream_pk)
    WHERE (definition -> 'retention' ->> 'max_records') IS NOT NULL
       OR (definition -> 'retention' ->> 'max_age_seconds') IS NOT NULL;
