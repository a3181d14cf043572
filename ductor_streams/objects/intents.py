"""The object intent service: prepare, upload, commit, abort, download.

``prepared -> uploaded -> committed``, or ``aborted`` / ``expired`` (docs/objects.md).
Every transition is one guarded statement (schema/sql/objects.sql). Commit appends the
record (payload = metadata, ``object`` = reference) through the same plpgsql append
function as any append, in the statement that marks the intent committed, so credit,
quota and close rules are the same and a record is visible only once committed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

import msgspec

from ductor_streams.errors import (
    DefinitionConflict,
    NotFound,
    ObjectAborted,
    ObjectCommitted,
    ObjectEvidenceMismatch,
    ObjectExpired,
    ObjectNotUploaded,
    ObjectPruned,
    PlacementMismatch,
    StreamClosed,
)
from ductor_streams.foundation import metrics, tracing
from ductor_streams.objects.blobstore import (
    BLOCK_BYTES,
    Check,
    EvidenceHasher,
    SignedUpload,
    blocks,
    mismatch,
    storage_key,
)
from ductor_streams.objects.deletions import run_deletion
from ductor_streams.objects.models import ObjectIntent, PrepareRequest
from ductor_streams.objects.stores import BlobStores
from ductor_streams.schema import QUERIES
from ductor_streams.store import Store, StreamRef
from ductor_streams.store.append import outcome_to_result
from ductor_streams.store.credit_wait import (
    LOST_WAKE_RECHECK_SECONDS,
    exceeds_unread_ceiling,
    retry_on_credit,
    worth_sending,
)
from ductor_streams.store.gone import CallerGone
from ductor_streams.store.outcomes import AppendOutcome

DEFAULT_INTENT_TTL_SECONDS = 3600.0
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Prepared:
    intent: ObjectIntent
    created: bool
    signed_upload: SignedUpload | None


@dataclass(frozen=True, slots=True)
class Committed:
    sequence: int
    created: bool


class ObjectService:
    """Large objects of the streams in ``store``, kept in ``stores`` by region.

    ``region`` is this process's region: it writes objects only of streams whose
    ``metadata_home`` it is (a process elsewhere refuses with PlacementMismatch).
    """

    def __init__(
        self,
        store: Store,
        stores: BlobStores,
        *,
        region: str,
        intent_ttl_seconds: float = DEFAULT_INTENT_TTL_SECONDS,
        poll_interval: float = 0.05,
    ) -> None:
        self.store = store
        self.pool = store.pool
        self.stores = stores
        self.region = region
        self.intent_ttl_seconds = intent_ttl_seconds
        self._poll_interval = poll_interval

    # -- helpers -------------------------------------------------------------------------

    def _check_writer(self, ref: StreamRef) -> None:
        home = ref.definition.placement.metadata_home
        if home != self.region:
            raise PlacementMismatch(
                f"this process runs in region {self.region!r}; the stream's objects are "
                f"written only in its metadata home {home!r}"
            )

    async def get(self, ref: StreamRef, object_id: str | uuid.UUID) -> ObjectIntent:
        """The intent of this stream, or NotFound (also for an ID that is not a UUID)."""
        try:
            oid = object_id if isinstance(object_id, uuid.UUID) else uuid.UUID(object_id)
        except ValueError:
            raise NotFound(f"object {str(object_id)[:64]!r} does not exist") from None
        row = await self.pool.fetchrow(QUERIES["object_intent_get"], oid, ref.stream_pk)
        if row is None:
            raise NotFound(f"object {oid} does not exist")
        return ObjectIntent.from_row(row)

    @staticmethod
    def _raise_for_state(intent: ObjectIntent) -> None:
        state = intent.effective_state
        if state == "aborted":
            raise ObjectAborted()
        if state == "expired":
            raise ObjectExpired()
        if state == "committed":
            raise ObjectCommitted()

    # -- prepare -------------------------------------------------------------------------

    async def prepare(
        self, ref: StreamRef, request: PrepareRequest, *, principal: str, scopes: list[str]
    ) -> Prepared:
        """Pin an intent; the same key with the same pins returns it again (``created``
        False), with other pins DefinitionConflict. The storage key is the server's."""
        self._check_writer(ref)
        region = self._region_for(ref, request.region)
        existing = await self._by_key(ref, request.idempotency_key)
        if existing is None:
            if await self._closed(ref):
                raise StreamClosed()
            object_id = uuid.uuid4()
            row = await self.pool.fetchrow(
                QUERIES["object_intent_insert"],
                object_id,
                ref.stream_pk,
                request.idempotency_key,
                request.sha256,
                request.size,
                request.content_type,
                request.schema,
                region,
                request.payload,
                storage_key(ref.stream_pk, object_id),
                principal,
                sorted(scopes),
                float(self.intent_ttl_seconds),
            )
            if row is not None:
                intent = ObjectIntent.from_row(row)
                return Prepared(intent, True, self._signed(intent))
            existing = await self._by_key(ref, request.idempotency_key)
            assert existing is not None  # the insert lost to one with the same key
        if not existing.same_pins(request, region):
            raise DefinitionConflict(
                "this idempotency key already prepared an object with different pins"
            )
        signed = self._signed(existing) if existing.effective_state == "prepared" else None
        return Prepared(existing, False, signed)

    def _region_for(self, ref: StreamRef, asked: str | None) -> str:
        allowed = ref.definition.placement.object_regions or []
        if asked is None:
            if self.region in allowed:
                asked = self.region
            elif allowed:
                asked = allowed[0]
            else:
                raise PlacementMismatch("the stream's placement allows no object region")
        if asked not in allowed:
            raise PlacementMismatch(f"region {asked!r} is not among the stream's object_regions")
        if not self.stores.has(asked):
            raise PlacementMismatch(f"no object store is configured for region {asked!r}")
        return asked

    async def _by_key(self, ref: StreamRef, key: str) -> ObjectIntent | None:
        row = await self.pool.fetchrow(QUERIES["object_intent_get_by_key"], ref.stream_pk, key)
        return None if row is None else ObjectIntent.from_row(row)

    async def _closed(self, ref: StreamRef) -> bool:
        return (await self.store.state(ref)).closed

    def _signed(self, intent: ObjectIntent) -> SignedUpload | None:
        store = self.stores.for_region(intent.region)
        return store.signed_upload(
            intent.storage_key, content_type=intent.content_type, expires_at=intent.expires_at
        )

    # -- upload --------------------------------------------------------------------------

    async def upload(
        self, ref: StreamRef, object_id: str, chunks: AsyncIterable[bytes]
    ) -> ObjectIntent:
        """Store the bytes if their size and SHA-256 match the pins (else
        ObjectEvidenceMismatch and nothing kept); the intent becomes ``uploaded``.

        Uploading again to an ``uploaded`` intent checks the bytes against the pins and
        keeps what is stored (a retry after a lost answer gets the same answer).
        """
        with tracing.span("object upload", {"ductor_streams.object_id": str(object_id)}):
            return await self._upload(ref, object_id, chunks)

    async def _upload(
        self, ref: StreamRef, object_id: str, chunks: AsyncIterable[bytes]
    ) -> ObjectIntent:
        self._check_writer(ref)
        intent = await self.get(ref, object_id)
        self._raise_for_state(intent)
        if intent.state == "uploaded":
            await _verify_only(chunks, intent)
            return intent
        store = self.stores.for_region(intent.region)
        evidence = await store.write(
            intent.storage_key, chunks, pins=intent.pins, content_type=intent.content_type
        )
        marked = await self.pool.fetchval(
            QUERIES["object_intent_mark_uploaded"], intent.object_id, ref.stream_pk, evidence.md5
        )
        if marked is not None:
            return await self.get(ref, intent.object_id)
        now = await self.get(ref, intent.object_id)
        if now.state == "uploaded":
            return now  # a concurrent upload of the same verified bytes won the race
        # The intent was aborted or expired while the bytes were on their way: they
        # belong to nobody. Queue their deletion before answering.
        await self.pool.fetchval(
            QUERIES["object_orphan_queue_deletion"],
            now.region,
            now.storage_key,
            ref.stream_pk,
            now.object_id,
        )
        self._raise_for_state(now)
        raise ObjectNotUploaded()

    # -- commit --------------------------------------------------------------------------

    async def commit(
        self, ref: StreamRef, object_id: str, *, caller_gone: CallerGone | None = None
    ) -> Committed:
        """Append the object's record once the stored bytes match the pins; again ->
        the original sequence. Credit, quota and close apply as for any append; a wait
        for credit ends with ClientGone once ``caller_gone`` says the caller went."""
        with tracing.span("object commit", {"ductor_streams.object_id": str(object_id)}):
            return await self._commit(ref, object_id, caller_gone)

    async def _commit(
        self, ref: StreamRef, object_id: str, caller_gone: CallerGone | None
    ) -> Committed:
        self._check_writer(ref)
        intent = await self.get(ref, object_id)
        if intent.state == "committed":
            assert intent.committed_sequence is not None
            return Committed(intent.committed_sequence, False)
        self._raise_for_state(intent)
        store = self.stores.for_region(intent.region)
        if intent.state == "prepared":
            # Bytes PUT straight into the store (a signed URL) are checked in full.
            found = await store.check(intent.storage_key, intent.pins, stored_md5=None)
            if found is Check.MISSING:
                raise ObjectNotUploaded()
            if found is Check.MISMATCH:
                raise mismatch(intent.pins, "the stored object")
            await self.pool.fetchval(
                QUERIES["object_intent_mark_uploaded"], intent.object_id, ref.stream_pk, None
            )
        else:
            found = await store.check(intent.storage_key, intent.pins, stored_md5=intent.stored_md5)
            if found is not Check.MATCH:
                raise ObjectEvidenceMismatch(
                    "the stored object no longer matches the pins"
                    if found is Check.MISMATCH
                    else "the stored object is missing"
                )
        return await self._commit_record(ref, intent, caller_gone)

    async def _commit_record(
        self, ref: StreamRef, intent: ObjectIntent, caller_gone: CallerGone | None
    ) -> Committed:
        credit = ref.definition.credit
        if credit.on_unread_full != "block" or credit.block_timeout_ms <= 0:
            return await self._commit_once(ref, intent)
        # The block policy, as for any append (store/credit_wait.py): after a refusal
        # the record goes again only when the stream's row says it could fit, and the
        # wait ends as soon as the caller goes.
        size = len(intent.payload.encode("utf-8"))
        return await retry_on_credit(
            lambda: self._commit_once(ref, intent),
            hub=self.store.hub,
            stream_pk=ref.stream_pk,
            worth_it=lambda: worth_sending(self.pool, ref.stream_pk, 1, size, None),
            hopeless=exceeds_unread_ceiling(ref, 1, size),
            wait_seconds=credit.block_timeout_ms / 1000,
            recheck=self._poll_interval if self.store.hub is None else LOST_WAKE_RECHECK_SECONDS,
            caller_gone=caller_gone,
        )

    async def _commit_once(self, ref: StreamRef, intent: ObjectIntent) -> Committed:
        reference = _encoder.encode(intent.reference).decode()
        row = await self.pool.fetchrow(
            QUERIES["object_intent_commit"],
            intent.object_id,
            ref.stream_pk,
            intent.payload,
            len(intent.payload.encode("utf-8")),
            reference,
        )
        if row is not None:
            first = row["first_sequence"]
            result = outcome_to_result((AppendOutcome.parse(row["outcome"]), first, first))
            if not result.replayed:
                size = len(intent.payload.encode("utf-8"))
                metrics.count_append(ref.definition.direction, 1, size)
            return Committed(result.first_sequence, True)
        now = await self.get(ref, intent.object_id)
        if now.state == "committed":
            assert now.committed_sequence is not None
            return Committed(now.committed_sequence, False)
        self._raise_for_state(now)
        raise ObjectNotUploaded()

    # -- abort ---------------------------------------------------------------------------

    async def abort(self, ref: StreamRef, object_id: str) -> ObjectIntent:
        """Abort a prepared or uploaded intent and remove its stored bytes (through the
        deletion outbox, at once unless the stream is under legal hold)."""
        self._check_writer(ref)
        intent = await self.get(ref, object_id)
        if intent.state != "aborted":
            self._raise_for_state(intent)
            deletion_id = await self.pool.fetchval(
                QUERIES["object_intent_abort"], intent.object_id, ref.stream_pk
            )
            if deletion_id is None:
                now = await self.get(ref, intent.object_id)
                if now.state != "aborted":
                    self._raise_for_state(now)
            else:
                await run_deletion(self.pool, self.stores, deletion_id)
        return await self.get(ref, intent.object_id)

    # -- download ------------------------------------------------------------------------

    async def download(
        self, ref: StreamRef, object_id: str, *, block_bytes: int = BLOCK_BYTES
    ) -> tuple[ObjectIntent, AsyncIterator[bytes]]:
        """A committed object's bytes, in blocks of at most ``block_bytes`` (the caller
        has checked egress)."""
        intent = await self.get(ref, object_id)
        if intent.state != "committed":
            raise NotFound(f"object {intent.object_id} is not committed")
        assert intent.committed_sequence is not None and intent.earliest_sequence is not None
        if intent.committed_sequence < intent.earliest_sequence:
            raise ObjectPruned()
        store = self.stores.for_region(intent.region)
        return intent, store.read(intent.storage_key, block_bytes)


async def _verify_only(chunks: AsyncIterable[bytes], intent: ObjectIntent) -> None:
    hasher = EvidenceHasher()
    async for block in blocks(chunks, intent.pins):
        hasher.update(block)
    evidence = hasher.evidence()
    if not evidence.matches(intent.pins):
        raise mismatch(intent.pins, f"{evidence.size} bytes, sha256 {evidence.sha256}")
