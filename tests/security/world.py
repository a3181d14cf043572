"""A small, real world for one security test: a tenant, a run, a stream with records that
carry unique markers, and (on demand) an object and an input delivery, all made through
the real HTTP API of a server."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Any

import httpx

from ductor_streams.auth import SCOPES, issue_token
from tests.conftest import API, JWT_SECRET
from tests.security.routes import ApiRoute, Sample, fill_path, sample_for

CONSUMER = "c1"


def bearer(
    *,
    tenant: str,
    scopes: list[str] | tuple[str, ...] = SCOPES,
    runs: list[str] | None = None,
    sub: str = "alice",
    region: str | None = None,
    ttl: int = 600,
    secret: str = JWT_SECRET,
) -> dict[str, str]:
    token = issue_token(
        secret,
        sub=sub,
        tenant=tenant,
        scopes=list(scopes),
        runs=["*"] if runs is None else runs,
        region=region,
        ttl_seconds=ttl,
    )
    return {"Authorization": f"Bearer {token}"}


class World:
    """One tenant's run with one output stream ``stream_id`` holding two records.

    Record payloads: ``{"secret": secret_marker, "open": open_marker}``; the
    definition redacts ``/secret`` and allows egress to ``local`` only.
    """

    def __init__(self, http: httpx.AsyncClient, **definition: Any) -> None:
        self.http = http
        self.tenant = f"t-{uuid.uuid4().hex[:10]}"
        self.run_id = f"run-{uuid.uuid4().hex[:10]}"
        self.stream_id = f"s-{secrets.token_hex(4)}"
        self.secret_marker = f"SECRET-{uuid.uuid4().hex}"
        self.open_marker = f"OPEN-{uuid.uuid4().hex}"
        self.definition: dict[str, Any] = {
            "stream_id": self.stream_id,
            "direction": "output",
            "consumers": [CONSUMER],
            "redaction": {"json_pointers": ["/secret"]},
            "placement": {"client_egress_regions": ["local"]},
            **definition,
        }
        self.admin = bearer(tenant=self.tenant)
        self.prepared_bytes = b"object bytes " + self.open_marker.encode()
        self._object: dict[str, str] = {}
        self._delivery_id: str | None = None

    @property
    def watched(self) -> tuple[str, str]:
        """The tenants whose data a refused request must leave alone: this world's and
        the "other tenant" the matrix impersonates."""
        return (self.tenant, self.tenant + "-other")

    @property
    def payload(self) -> dict[str, str]:
        return {"secret": self.secret_marker, "open": self.open_marker}

    def url(self, suffix: str = "") -> str:
        return f"{API}/runs/{self.run_id}/streams/{self.stream_id}{suffix}"

    def fresh_stream_id(self) -> str:
        return f"n-{secrets.token_hex(4)}"

    async def setup(self, records: int = 2) -> World:
        r = await self.http.post(
            f"{API}/runs/{self.run_id}/streams", json=self.definition, headers=self.admin
        )
        assert r.status_code == 201, r.text
        if records:
            r = await self.http.post(
                self.url("/records"),
                json={"records": [{"payload": self.payload}] * records},
                headers=self.admin,
            )
            assert r.status_code == 201, r.text
        return self

    # --- objects (only used when the objects routes exist) -------------------------

    def object_pins(self, data: bytes) -> dict[str, Any]:
        return {
            "idempotency_key": f"k-{secrets.token_hex(6)}",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "content_type": "application/octet-stream",
            "schema": "test.blob/v1",
            "region": "local",
            "metadata": self.payload,
        }

    def forget_object(self) -> None:
        """The next object route works on a new object."""
        self._object.clear()

    async def prepared_object(self) -> str:
        if "id" not in self._object:
            r = await self.http.post(
                self.url("/objects"), json=self.object_pins(self.prepared_bytes), headers=self.admin
            )
            assert r.status_code == 201, r.text
            self._object["id"] = str(r.json()["object_id"])
            self._object["state"] = "prepared"
        return self._object["id"]

    async def uploaded_object(self) -> str:
        object_id = await self.prepared_object()
        if self._object["state"] == "prepared":
            r = await self.http.put(
                self.url(f"/objects/{object_id}/content"),
                content=self.prepared_bytes,
                headers={**self.admin, "Content-Type": "application/octet-stream"},
            )
            assert r.status_code == 200, r.text
            self._object["state"] = "uploaded"
        return object_id

    async def committed_object(self) -> str:
        object_id = await self.uploaded_object()
        if self._object["state"] == "uploaded":
            r = await self.http.post(self.url(f"/objects/{object_id}/commit"), headers=self.admin)
            assert r.status_code == 201, r.text
            self._object["state"] = "committed"
        return object_id

    # --- input deliveries (only used when the ops routes exist) --------------------

    async def delivery_id(self) -> str:
        if self._delivery_id is None:
            input_id = f"in-{secrets.token_hex(4)}"
            base = f"{API}/runs/{self.run_id}/streams"
            pins = {k: v for k, v in self.definition.items() if k not in ("stream_id", "direction")}
            r = await self.http.post(
                base,
                json={**pins, "stream_id": input_id, "direction": "input"},
                headers=self.admin,
            )
            assert r.status_code == 201, r.text
            r = await self.http.post(
                f"{base}/{input_id}/records",
                json={"records": [{"payload": self.payload}]},
                headers=self.admin,
            )
            assert r.status_code == 201, r.text
            r = await self.http.get(
                f"{API}/ops/deliveries",
                params={"run": self.run_id, "stream": input_id},
                headers=self.admin,
            )
            assert r.status_code == 200, r.text
            deliveries = r.json()["deliveries"]
            assert len(deliveries) == 1, deliveries
            self._delivery_id = str(deliveries[0]["delivery_id"])
        return self._delivery_id

    # --- requests ------------------------------------------------------------------

    async def path_values(self, route: ApiRoute) -> dict[str, str]:
        values = {"run": self.run_id, "stream": self.stream_id, "consumer": CONSUMER}
        params = {p.lower() for p in route.params}
        if any("object" in p for p in params):
            values["object"] = self._object.get("id") or await self.prepared_object()
        if any("delivery" in p for p in params):
            values["delivery"] = await self.delivery_id()
        return values

    async def request(
        self,
        route: ApiRoute,
        headers: dict[str, str],
        *,
        sample: Sample | None = None,
        path_values: dict[str, str] | None = None,
        read_body: bool = True,
    ) -> tuple[httpx.Response, bytes]:
        """Send the route's sample request; SSE bodies are read only when the stream
        ends by itself (closed stream) and ``read_body`` is set."""
        if sample is None:
            sample = await sample_for(route)(self)
        values = path_values or await self.path_values(route)
        path = fill_path(route, values)
        req_headers = {**sample.headers, **headers}
        async with self.http.stream(
            route.method,
            path,
            params=sample.params,
            json=sample.json,
            content=sample.content,
            headers=req_headers,
        ) as response:
            if (
                response.headers.get("content-type", "").startswith("text/event-stream")
                and not read_body
            ):
                return response, b""
            body = await response.aread()
        return response, body
