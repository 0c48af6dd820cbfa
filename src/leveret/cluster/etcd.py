"""A small etcd v3 client over etcd's JSON gateway (`/v3/...`), on aiohttp.

Why not a gRPC client: a cluster node talks to etcd a few times a second (lease
keep-alives, a watch, a transaction when leadership or the in-sync set changes),
so the client's speed does not matter (measured in docs/cluster.md: a put or a
transaction costs about a millisecond either way). What matters is what it brings:
the maintained asyncio gRPC clients (`aetcd`, `etcetra`) pull in grpcio and
protobuf, a large native dependency with its own threads and poller beside the
broker's uvloop, for the seven calls below. The gateway is part of etcd's stable
v3 API (same messages as gRPC, as JSON; bytes are base64) and aiohttp is already
a dependency for the management API.

Every call takes the endpoints in turn until one answers, so a node survives the
loss of one etcd member of several; a member that answers "unavailable" (gRPC code
14: it has no leader, its leader changed, it lost its quorum) counts as not
answering. Errors are `EtcdError` (etcd answered with an error) or
`EtcdUnavailable` (no endpoint answered in time, or none could serve).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("leveret.cluster")


UNAVAILABLE = 14  # gRPC's code for "this member cannot serve now" (no leader, ...)


class EtcdError(Exception):
    """etcd answered, with an error (lease not found, bad request, ...)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the timeout."""


def _b64(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The range end that makes a range request cover every key under `prefix`."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # keys here are ASCII paths: the last byte never is 0xff
    return raw.decode()


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(kv.get("key")).decode(),
            value=_unb64(kv.get("value")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "PUT" or "DELETE"
    kv: KeyValue


# ---- transaction building blocks (the gateway's JSON shapes) ---------------------------


def cmp_mod_revision(key: str, revision: int, result: str = "EQUAL") -> dict[str, Any]:
    """Compare a key's last modification revision (0: the key does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": result, "mod_revision": str(revision)}


def cmp_create_revision(key: str, revision: int, result: str = "EQUAL") -> dict[str, Any]:
    return {
        "key": _b64(key),
        "target": "CREATE",
        "result": result,
        "create_revision": str(revision),
    }


def op_put(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        put["lease"] = str(lease)
    return {"request_put": put}


def op_delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def op_get(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


class Etcd:
    """An etcd client for one cluster of endpoints (`http://host:port`)."""

    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("etcd: no endpoint given")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._preferred = 0
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        """POST one request; the endpoint that answered last is tried first next time."""
        errors: list[str] = []
        n = len(self.endpoints)
        limit = aiohttp.ClientTimeout(total=timeout or self.timeout)
        for i in range(n):
            index = (self._preferred + i) % n
            url = self.endpoints[index] + path
            try:
                async with self._http().post(url, json=body, timeout=limit) as res:
                    text = await res.text()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                errors.append(f"{self.endpoints[index]}: {exc.__class__.__name__} {exc}")
                continue
            try:
                data = json.loads(text) if text else {}
            except json.JSONDecodeError:
                raise EtcdError(f"etcd {url}: not JSON: {text[:200]!r}") from None
            if res.status != 200 or "error" in data and "result" not in data:
                message = data.get("message") or data.get("error") or text[:200]
                if res.status == 503 or data.get("code") == UNAVAILABLE:
                    # This member cannot serve now (no leader, leader changed, cut off
                    # from the others): another may, as etcd's own clients retry.
                    errors.append(f"{self.endpoints[index]}: {message}")
                    continue
                self._preferred = index
                raise EtcdError(f"etcd {path}: {message}")
            self._preferred = index
            return data
        raise EtcdUnavailable("etcd unreachable: " + "; ".join(errors))

    # ---- keys ------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        data = await self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = data.get("kvs") or []
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, and the store revision they were read at."""
        data = await self.call(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        )
        revision = int(data.get("header", {}).get("revision", 0))
        return [KeyValue.from_json(kv) for kv in data.get("kvs") or []], revision

    async def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Returns the revision of the write."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        data = await self.call("/v3/kv/put", body)
        return int(data.get("header", {}).get("revision", 0))

    async def delete(self, key: str) -> int:
        data = await self.call("/v3/kv/deleterange", {"key": _b64(key)})
        return int(data.get("deleted", 0))

    async def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> tuple[bool, int, list[Any]]:
        """Atomic compare-and-set: (succeeded, revision after it, the ops' responses)."""
        data = await self.call(
            "/v3/kv/txn", {"compare": compare, "success": success, "failure": failure or []}
        )
        revision = int(data.get("header", {}).get("revision", 0))
        return bool(data.get("succeeded")), revision, data.get("responses") or []

    # ---- leases ----------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted, which may be longer than asked)."""
        data = await self.call("/v3/lease/grant", {"TTL": str(ttl)})
        return int(data["ID"]), int(data.get("TTL", ttl))

    async def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew a lease; returns the TTL it has again, 0 if it is gone (expired)."""
        data = await self.call("/v3/lease/keepalive", {"ID": str(lease)}, timeout)
        return int(data.get("result", {}).get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        try:
            await self.call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if "not found" not in str(exc):
                raise

    # ---- watch -----------------------------------------------------------------------

    async def watch(
        self, prefix: str, start_revision: int, *, whole_prefix: bool = True
    ) -> AsyncIterator[WatchEvent]:
        """Changes under `prefix` from `start_revision` on, until the connection drops.

        The gateway streams one JSON object per line for one long POST; the caller
        re-reads state and watches again when this ends (EtcdUnavailable).
        """
        create: dict[str, Any] = {"key": _b64(prefix), "start_revision": str(start_revision)}
        if whole_prefix:
            create["range_end"] = _b64(prefix_end(prefix))
        endpoint = self.endpoints[self._preferred]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        try:
            async with self._http().post(
                endpoint + "/v3/watch", json={"create_request": create}, timeout=timeout
            ) as res:
                if res.status != 200:
                    raise EtcdError(f"etcd watch: HTTP {res.status}")
                async for line in res.content:
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if result.get("canceled"):
                        raise EtcdError(f"etcd watch canceled: {result.get('cancel_reason')}")
                    for event in result.get("events") or []:
                        yield WatchEvent(event.get("type", "PUT"), KeyValue.from_json(event["kv"]))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._preferred = (self._preferred + 1) % len(self.endpoints)
            raise EtcdUnavailable(f"etcd watch on {endpoint} ended: {exc}") from None
        raise EtcdUnavailable(f"etcd watch on {endpoint} ended")
