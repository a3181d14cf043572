"""The property the multi-primary design (docs/scale.md) relies on: the statements of
the hot path reach one stream only, so that with every stream-owned table distributed by
``stream_pk`` (Citus) each of them stays on one shard.

Every named SQL block (QUERIES) and every function of schema/schema.sql is classified
here, with the reason: ONE_STREAM (pinned to the stream parameter named beside it: its
WHERE and join conditions tie every distributed table's ``stream_pk`` to it), CROSSES
(work across streams by its nature: sweeps, the dispatcher's discovery of streams with
due deliveries, the appender's and followers' several-stream statements, operator
listings, stream creation; said why and what Citus would need) or NO_DISTRIBUTED_TABLE.
There is no third way for a hot-path statement: one that names its rows by a global id
(a delivery's, an intent's) names their stream too, and is checked as ONE_STREAM. A new
statement must be put in one of the groups, a ONE_STREAM statement that loses its
filter fails, and so does a CROSSES one that in fact pins a parameter. The reader of
the SQL is tests/support/sql_pins.py.
"""

from __future__ import annotations

import re

import pytest

from ductor_streams.schema import QUERIES
from tests.foundation.test_schema import SCHEMA_FILE
from tests.support.sql_pins import (
    function_statements,
    schema_functions,
    touches,
    unpinned,
)

# Every table of the schema and its distribution under the design (docs/scale.md).
DISTRIBUTION = {
    "streams": "stream_pk",
    "records": "stream_pk",
    "consumers": "stream_pk",
    "append_receipts": "stream_pk",
    "input_deliveries": "stream_pk",
    "object_intents": "stream_pk",
    "ds_producers": "stream_pk",
    "ds_stream_writers": "stream_pk",
    "gap_evidence": "stream_pk",
    "deletion_outbox": "stream_pk",  # NULL (keys of no stream) becomes 0, see the doc
    "tenant_streams": "tenant",  # the streams quota's counters: one row per tenant
    "schema_migrations": "reference",
}
DISTRIBUTED = {t for t, d in DISTRIBUTION.items() if d == "stream_pk"} | {
    # The view walks every stream's open deliveries: never one shard's.
    "open_delivery_heads"
}

# Named blocks pinned to one stream: {name: (the stream's parameter, why it matters)}.
ONE_STREAM = {
    # appends (the HTTP append path's group commit, its staged form, its leasing form)
    "records_append_group": ("$1", "append: one stream's group of requests"),
    "records_append_group_staged": ("$1", "append: the same with staged payloads"),
    "records_append_group_leasing": ("$1", "append to an input stream, leasing its deliveries"),
    "records_append": ("$1", "append, the 7-argument form"),
    "ds_append": ("$1", "append through the Durable Streams endpoint"),
    "append_receipts_with_prefix": ("$1", "an activity's stream writer resumes its keys"),
    # reads and subscribe catch-up
    "records_read": ("$1", "read a page"),
    "records_read_page_json": ("$1", "read a page, written by Postgres"),
    "records_read_bytes": ("$1", "subscribe catch-up and a live follower's read"),
    "records_read_sse_frames": ("$1", "subscribe backfill, written by Postgres"),
    "records_range_json": ("$1", "a later piece of a page, written by Postgres"),
    "records_range": ("$1", "a later piece of a page, as rows"),
    "record_fingerprint_at": ("$1", "a resuming reader's fingerprint check"),
    "ds_records_read": ("$1", "Durable Streams catch-up read"),
    "ds_stream_head": ("$1", "Durable Streams HEAD and offset=now"),
    "stream_state": ("$1", "a stream's bounds and consumers"),
    "live_stream_watch": ("$1", "a follower starts: where, and ask for wakes"),
    "gap_evidence_insert": ("$1", "a subscriber's gap repair"),
    # acks, close, hold
    "consumer_ack": ("$1", "ack"),
    "stream_credit_probe": ("$1", "a waiting append's look at its stream's credit"),
    "stream_close": ("$1", "close"),
    "stream_set_legal_hold": ("$1", "legal hold on one stream"),
    # object writes
    "object_intent_insert": ("$2", "object prepare"),
    "object_intent_get_by_key": ("$1", "object prepare, repeated"),
    "object_intent_get": ("$2", "object upload and commit"),
    "object_intent_mark_uploaded": ("$2", "object upload"),
    "object_intent_abort": ("$2", "object abort, queueing its deletion"),
    "object_intent_commit": ("$2", "object commit: locks the intent, appends, marks it"),
    "object_orphan_queue_deletion": ("$3", "bytes of an intent that moved on"),
    # delivery of one stream: the claim of a stream a wake named, then every statement
    # on the claimed rows, which names their stream beside their ids
    "delivery_stream_is_input": ("$1", "a wake's stream: does it owe deliveries?"),
    "delivery_claim_stream": ("$6", "claim the stream a wake named"),
    "delivery_mark_delivered": ("$2", "record a claimed stream's signals"),
    "delivery_mark_retrying": ("$5", "back a failed head off"),
    "delivery_mark_dead": ("$4", "give a claimed stream's rest up"),
    "delivery_release": ("$4", "give a claim's unattempted rest back"),
    "delivery_renew": ("$4", "the lease heartbeat, one statement per held stream"),
    "append_receipts_prune": ("$1", "upkeep: one stream's expired receipts"),
    # upkeep of one stream (the sweeps that find the streams are in CROSSES)
    "stream_prune": ("$1", "retention of one stream, queueing its objects' deletion"),
    "deletion_insert": ("$4", "one stream's orphaned keys (NULL: keys of no stream)"),
}

# Named blocks that may reach several streams: {name: why, and what Citus would need}.
CROSSES = {
    "stream_get_by_key": "by (tenant, run_id, stream_id): the stream_keys directory, "
    "distributed by run_id, answers it on one shard, then the stream by stream_pk",
    "stream_insert": "creates the key and the stream: stream_keys (by run_id) then "
    "streams and consumers (by the new stream_pk), two shards",
    "records_append_stream_groups": "the appender's statement for several streams: group "
    "by shard, or one records_append_group per stream",
    "records_append_stream_groups_staged": "the same with staged payloads",
    "records_read_bytes_many": "live followers' reads of several streams in one "
    "statement: one per shard, or per stream",
    "live_streams_rewatch": "renews the watch of every followed stream: one per shard",
    "delivery_claim": "the dispatcher's discovery of the tenant's streams with due heads "
    "(recursive view, FOR UPDATE SKIP LOCKED: single-shard only): find due heads without "
    "locks, then delivery_claim_stream each",
    "delivery_next_due": "the earliest due head of a tenant, over every stream",
    "streams_browse": "the console's listing of a tenant's streams",
    "streams_with_retention": "the retention sweep's keyset over every stream",
    "streams_on_hold": "the orphan sweep's streams under legal hold (a list)",
    "object_intents_expire": "the expiry sweep, FOR UPDATE SKIP LOCKED across streams",
    "storage_keys_unowned": "the orphan sweep, by storage key",
    "storage_keys_not_queued": "the orphan sweep, by storage key",
    "deletions_claim": "the deletion outbox's claim across streams",
    "deletion_claim_one": "by deletion_id: would also take the stream_pk",
    "deletion_done": "by deletion_id: would also take the stream_pk",
    "deletion_failed": "by deletion_id: would also take the stream_pk",
    "deletions_pending_count": "a count over every stream (metrics)",
    "ops_deliveries_list": "operator listing across streams",
    "ops_delivery_get": "operator view, by delivery_id",
    "ops_delivery_retry": "operator retry, by delivery_id",
    "ops_deliveries_count_by_state": "operator counts across streams",
    "ops_deliveries_count_all": "metrics across every stream",
    "ops_deliveries_oldest_owed": "operator figure across streams",
    "ops_streams_lag": "operator listing across streams",
    "ops_gaps_list": "operator listing across streams",
}

# Touch no distributed table: {name: why it needs nothing, or what it needs instead}.
NO_DISTRIBUTED_TABLE = {
    "append_stage_payloads": "the session's temporary table of staged payloads",
    "wake_send": "NOTIFY only; under Citus sent on the node of the stream's shard",
    "database_identity": "the server's system identifier and timeline (pg_control_*)",
    "health_takes_writes": "the session's transaction_read_only, for /readyz",
    "doctor_notify": "NOTIFY only, on the doctor's own channel",
}

# Functions of schema.sql ("name/argument count"): pinned to the named argument, or not.
FUNCTIONS_ONE_STREAM = {
    "append_requests/7": "p_stream_pk",
    "append_requests/8": "p_stream_pk",
    "append_requests/9": "p_stream_pk",
    "append_requests_leasing/12": "p_stream_pk",
    "ack_consumer/3": "p_stream_pk",
    "ds_append/9": "p_stream_pk",
    "ds_append/10": "p_stream_pk",
}
FUNCTIONS_CROSSING = {
    "append_stream_groups/10": "several streams (p_stream_pks) in one call",
    "append_stream_groups/11": "several streams (p_stream_pks) in one call",
    "delete_stream_rows/0": "trigger: the rows of every deleted stream",
    "create_stream/9": "the tenant's counter row (tenant_streams, by tenant), then the "
    "key and the stream: under Citus the quota check is its own statement first",
}
# (count_created_streams: a trigger that writes only tenant_streams, distributed by tenant.)
FUNCTIONS_WITHOUT_TABLES = {
    "records_wake",
    "clamped_count",
    "record_fingerprint",
    "count_created_streams",
}

# Unique constraints (and primary keys) without the distribution column, which Citus
# refuses on a distributed table; the doc says what each becomes.
CONSTRAINTS_WITHOUT_STREAM_PK = {
    "deletion_outbox_pkey": "(deletion_id) -> (stream_pk, deletion_id)",
    "gap_evidence_pkey": "(gap_id) -> (stream_pk, gap_id)",
    "input_deliveries_pkey": "(delivery_id) -> (stream_pk, delivery_id)",
    "object_intents_pkey": "(object_id) -> (stream_pk, object_id)",
    "streams_key": "(tenant, run_id, stream_id) -> the stream_keys table by run_id",
}

PINNED_FUNCTIONS = {s.split("/")[0] for s in FUNCTIONS_ONE_STREAM}


def _schema() -> str:
    return SCHEMA_FILE.read_text(encoding="utf-8")


def _problems(sql: str, pin: str) -> list[str]:
    found = unpinned(
        sql,
        {pin},
        distributed=DISTRIBUTED,
        pinned_functions=PINNED_FUNCTIONS,
        table_free_functions=FUNCTIONS_WITHOUT_TABLES,
    )
    return [str(p) for p in found]


def test_every_named_block_is_classified_once() -> None:
    groups: list[list[str]] = [
        list(ONE_STREAM),
        list(CROSSES),
        list(NO_DISTRIBUTED_TABLE),
    ]
    classified = [name for group in groups for name in group]
    assert len(classified) == len(set(classified)), "a block is in two groups"
    assert sorted(classified) == sorted(QUERIES)


@pytest.mark.parametrize("name", sorted(ONE_STREAM))
def test_one_stream_block_pins_its_stream(name: str) -> None:
    pin, _why = ONE_STREAM[name]
    assert _problems(QUERIES[name], pin) == []


@pytest.mark.parametrize("name", sorted(CROSSES))
def test_crossing_blocks_do_cross(name: str) -> None:
    """A block listed as crossing that in fact pins one parameter belongs in ONE_STREAM.
    (Every parameter it takes is tried as the stream.)"""
    sql = QUERIES[name]
    parameters = sorted(set(re.findall(r"\$\d+", sql))) or ["$1"]
    assert all(_problems(sql, p) for p in parameters), [
        p for p in parameters if not _problems(sql, p)
    ]


@pytest.mark.parametrize("name", sorted(NO_DISTRIBUTED_TABLE))
def test_blocks_without_distributed_tables(name: str) -> None:
    assert (
        touches(
            QUERIES[name], distributed=DISTRIBUTED, table_free_functions=FUNCTIONS_WITHOUT_TABLES
        )
        == []
    )


def test_every_function_is_classified() -> None:
    signatures = {f.signature for f in schema_functions(_schema())}
    names = {s.split("/")[0] for s in signatures}
    classified = set(FUNCTIONS_ONE_STREAM) | set(FUNCTIONS_CROSSING)
    assert signatures - {s for s in signatures if s.split("/")[0] in FUNCTIONS_WITHOUT_TABLES} == (
        classified
    )
    assert FUNCTIONS_WITHOUT_TABLES <= names


@pytest.mark.parametrize("signature", sorted(FUNCTIONS_ONE_STREAM))
def test_one_stream_function_pins_its_argument(signature: str) -> None:
    (function,) = [f for f in schema_functions(_schema()) if f.signature == signature]
    argument = FUNCTIONS_ONE_STREAM[signature]
    assert argument in function.arguments
    statements = function_statements(function.body)
    assert statements
    problems = {s[:80]: _problems(s, argument) for s in statements}
    assert {s: p for s, p in problems.items() if p} == {}


@pytest.mark.parametrize("signature", sorted(FUNCTIONS_CROSSING))
def test_crossing_functions_do_cross(signature: str) -> None:
    (function,) = [f for f in schema_functions(_schema()) if f.signature == signature]
    pins = [a for a in function.arguments if "stream" in a] or ["p_stream_pk"]
    for pin in pins:
        assert any(_problems(s, pin) for s in function_statements(function.body))


@pytest.mark.parametrize("name", sorted(FUNCTIONS_WITHOUT_TABLES))
def test_functions_without_tables(name: str) -> None:
    for function in schema_functions(_schema()):
        if function.name == name:
            for statement in function_statements(function.body):
                found = touches(
                    statement,
                    distributed=DISTRIBUTED,
                    table_free_functions=FUNCTIONS_WITHOUT_TABLES,
                )
                assert found == []


def _tables(schema: str) -> dict[str, str]:
    return dict(re.findall(r"CREATE TABLE workflow_streams\.(\w+) \((.*?)\n\)", schema, re.S))


def test_every_table_has_a_distribution() -> None:
    assert sorted(_tables(_schema())) == sorted(DISTRIBUTION)


def test_distributed_tables_carry_the_column_and_their_constraints_are_known() -> None:
    """Every distributed table has stream_pk NOT NULL or is declared to change; the unique
    constraints without it are exactly those the doc lists."""
    schema = _schema()
    missing = {}
    for table, body in _tables(schema).items():
        if DISTRIBUTION[table] != "stream_pk":
            continue
        assert re.search(r"^\s+stream_pk bigint", body, re.M), table
        for name, columns in re.findall(
            r"CONSTRAINT (\w+) (?:PRIMARY KEY|UNIQUE) \(([^)]*)\)", body
        ):
            if "stream_pk" not in [c.strip() for c in columns.split(",")]:
                missing[name] = columns
    assert sorted(missing) == sorted(CONSTRAINTS_WITHOUT_STREAM_PK)


def test_foreign_keys_are_on_the_distribution_column() -> None:
    """Citus keeps a foreign key between distributed tables only on the distribution
    column (co-located): every one here is stream_pk -> streams(stream_pk)."""
    keys = re.findall(
        r"ALTER TABLE workflow_streams\.(\w+)\n\s+ADD CONSTRAINT \w+ FOREIGN KEY \((\w+)\) "
        r"REFERENCES workflow_streams\.(\w+)\((\w+)\)",
        _schema(),
    )
    assert keys
    assert {(column, target, target_column) for _, column, target, target_column in keys} == {
        ("stream_pk", "streams", "stream_pk")
    }


def test_the_reader_sees_a_lost_filter() -> None:
    """The reader itself: the same statements without their stream filter, or pinned to
    another parameter, are reported."""
    read = QUERIES["records_read"]
    assert _problems(read.replace("WHERE s.stream_pk = $1", "WHERE true"), "$1") != []
    assert _problems(read, "$2") != []
    ack = QUERIES["consumer_ack"]
    assert _problems(ack.replace("ack_consumer($1", "ack_consumer($2"), "$1") != []
    close = QUERIES["stream_close"]
    assert _problems(close.replace("WHERE stream_pk = $1", "WHERE closed_at IS NULL"), "$1")
    commit = QUERIES["object_intent_commit"]
    assert _problems(commit.replace("AND i.stream_pk = $2", ""), "$2") != []
    # Rows joined by a key that is not the stream's (a sequence, a delivery_id) are not
    # pinned by it: each side names the stream.
    renew = QUERIES["delivery_renew"]
    assert _problems(renew.replace("WHERE d.stream_pk = $4 AND ", "WHERE "), "$4") != []
    claim = QUERIES["delivery_claim_stream"]
    assert _problems(claim.replace(" AND d.stream_pk = $6", ""), "$6") != []
    insert = QUERIES["object_intent_insert"]
    assert _problems(insert.replace("VALUES ($1, $2,", "VALUES ($1, $3,"), "$2") != []
    (append,) = [f for f in schema_functions(_schema()) if f.signature == "append_requests/9"]
    lost = append.body.replace(
        "FROM workflow_streams.append_receipts\n             WHERE stream_pk = p_stream_pk",
        "FROM workflow_streams.append_receipts\n             WHERE true",
    )
    assert lost != append.body
    assert any(_problems(s, "p_stream_pk") for s in function_statements(lost))
