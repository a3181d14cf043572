-- 0001: the stream store. Every table the spec's Operations section names:
-- streams, records, append receipts, consumers, object intents, input delivery,
-- deletion outbox and gap evidence.

CREATE TABLE workflow_streams.streams (
    stream_pk          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant             text        NOT NULL,
    run_id             text        NOT NULL,
    stream_id          text        NOT NULL,
    direction          text        NOT NULL CHECK (direction IN ('input', 'output')),
    definition         jsonb       NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- counters kept under the row lock so that credit is O(1)
    latest_sequence    bigint      NOT NULL DEFAULT 0,
    earliest_sequence  bigint      NOT NULL DEFAULT 1,
    total_items        bigint      NOT NULL DEFAULT 0,
    total_bytes        bigint      NOT NULL DEFAULT 0,
    -- cumulative bytes of everything up to earliest_sequence - 1 (pruned)
    pruned_bytes       bigint      NOT NULL DEFAULT 0,
    -- the minimum acknowledgement over the declared consumers; NULL = no consumers
    min_acked_sequence bigint,
    min_acked_bytes    bigint,
    closed_at          timestamptz,
    legal_hold         boolean     NOT NULL DEFAULT false,
    legal_hold_reason  text,
    CONSTRAINT streams_key UNIQUE (tenant, run_id, stream_id)
);

CREATE TABLE workflow_streams.records (
    stream_pk        bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    sequence         bigint      NOT NULL,
    payload          text        NOT NULL,  -- compact JSON, stored as sent (key order kept)
    size             integer     NOT NULL,
    cumulative_bytes bigint      NOT NULL,  -- sum of sizes of sequences 1..sequence
    appended_at      timestamptz NOT NULL DEFAULT now(),
    object           jsonb,
    PRIMARY KEY (stream_pk, sequence)
);

CREATE TABLE workflow_streams.append_receipts (
    stream_pk       bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    idempotency_key text        NOT NULL,
    request_hash    text        NOT NULL,
    first_sequence  bigint      NOT NULL,
    last_sequence   bigint      NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_pk, idempotency_key)
);

CREATE TABLE workflow_streams.consumers (
    stream_pk      bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    consumer_id    text        NOT NULL,
    acked_sequence bigint      NOT NULL DEFAULT 0,
    acked_bytes    bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_pk, consumer_id)
);

CREATE TABLE workflow_streams.object_intents (
    object_id        uuid        PRIMARY KEY,
    stream_pk        bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    idempotency_key  text        NOT NULL,
    sha256           text        NOT NULL,
    size             bigint      NOT NULL,
    content_type     text        NOT NULL,
    schema           text,
    region           text        NOT NULL,
    metadata         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    storage_key      text        NOT NULL,
    state            text        NOT NULL DEFAULT 'prepared'
                     CHECK (state IN ('prepared', 'uploaded', 'committed', 'aborted', 'expired')),
    prepared_by      text        NOT NULL,
    prepared_scopes  text[]      NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    uploaded_at      timestamptz,
    committed_sequence bigint,
    CONSTRAINT object_intents_key UNIQUE (stream_pk, idempotency_key)
);
CREATE INDEX object_intents_expiry ON workflow_streams.object_intents (expires_at)
    WHERE state IN ('prepared', 'uploaded');

CREATE TABLE workflow_streams.input_deliveries (
    delivery_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_pk       bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    sequence        bigint      NOT NULL,
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'retrying', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_owner     text,
    lease_expires_at timestamptz,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    retried_by      text,
    retried_at      timestamptz,
    CONSTRAINT input_deliveries_record UNIQUE (stream_pk, sequence)
);
CREATE INDEX input_deliveries_due ON workflow_streams.input_deliveries (next_attempt_at)
    WHERE state IN ('pending', 'retrying');

CREATE TABLE workflow_streams.deletion_outbox (
    deletion_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    region          text        NOT NULL,
    storage_key     text        NOT NULL,
    reason          text        NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    done_at         timestamptz
);
CREATE INDEX deletion_outbox_due ON workflow_streams.deletion_outbox (next_attempt_at)
    WHERE state = 'pending';

CREATE TABLE workflow_streams.gap_evidence (
    gap_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_pk         bigint      NOT NULL REFERENCES workflow_streams.streams ON DELETE CASCADE,
    expected_sequence bigint      NOT NULL,
    received_sequence bigint      NOT NULL,
    repaired_records  integer     NOT NULL,
    detected_by       text        NOT NULL,
    detected_at       timestamptz NOT NULL DEFAULT now()
);
