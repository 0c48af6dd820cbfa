"""x-message-deduplication: drop a message whose id was seen, as the community plugin.

The interface is that of RabbitMQ's rabbitmq-message-deduplication plugin (which
LavinMQ implements too): a message's `x-deduplication-header` header is its id;
a message whose id is in the cache is not routed (its publisher still gets its
confirm).  Arguments: `x-cache-size` (required, the most ids kept; the oldest
go first), `x-cache-ttl` (ms an id is kept; a message's own `x-cache-ttl`
header overrides it) and `x-cache-persistence` (`memory`, the default, or
`disk`).  Messages that are not duplicates go to every bound destination, as
the plugin routes them.

With `disk` on a durable exchange, ids are appended to a journal next to the
definitions and read back on start, so a publisher that replays after a broker
restart (Spark re-running a batch) is still deduplicated.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

from leveret import wallclock
from leveret.broker.errors import PreconditionFailed
from leveret.broker.exchanges.base import ExchangeType, RefCounts
from leveret.store import replica

HEADER = "x-deduplication-header"


def _positive(arguments: dict[str, Any], key: str, required: bool = False) -> None:
    value = arguments.get(key)
    if value is None:
        if required:
            raise PreconditionFailed(f"Missing or invalid argument {key}")
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PreconditionFailed(f"Invalid {key} argument: expected a positive integer")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def dedup_id(value: Any) -> str:
    """A header value as a deduplication id (the exchange and the queue agree)."""
    return _text(value)


class DeduplicationExchange(ExchangeType):
    name = "x-message-deduplication"

    def __init__(self, size: int = 1, ttl_ms: int | None = None, disk: bool = False) -> None:
        self._dests = RefCounts()
        self._size = size
        self._ttl_ms = ttl_ms
        self._disk = disk
        self._seen: OrderedDict[str, float] = OrderedDict()  # id → expiry (monotonic s; 0 never)
        self._journal_path: str | None = None
        self._journal = -1
        self._journal_lines = 0

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any]) -> None:
        _positive(arguments, "x-cache-size", required=True)
        _positive(arguments, "x-cache-ttl")
        persistence = arguments.get("x-cache-persistence", "memory")
        if _text(persistence) not in ("memory", "disk"):
            raise PreconditionFailed(
                f"Invalid x-cache-persistence argument: expected memory or disk, "
                f"got {_text(persistence)}",
            )

    @classmethod
    def for_exchange(cls, arguments: dict[str, Any]) -> DeduplicationExchange:
        return cls(
            arguments.get("x-cache-size", 1),
            arguments.get("x-cache-ttl"),
            _text(arguments.get("x-cache-persistence", "memory")) == "disk",
        )

    # --- the journal (x-cache-persistence: disk) ---------------------------------------

    def attach(self, storage_path: str | None) -> None:
        if not self._disk or storage_path is None:
            return
        path = storage_path + ".dedup"
        self._journal_path = path
        now_wall = wallclock.time()
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    key, _, deadline = line.rstrip("\n").rpartition("\t")
                    if not key:
                        continue  # a torn last line
                    wall = float(deadline or 0)
                    if wall and wall <= now_wall:
                        continue
                    expiry = time.monotonic() + (wall - now_wall) if wall else 0.0
                    self._remember(key, expiry)
        except FileNotFoundError:
            pass
        self._rewrite()

    def _rewrite(self) -> None:
        """Compact the journal to the live cache (on start, and when it doubles)."""
        assert self._journal_path is not None
        now_mono, now_wall = time.monotonic(), wallclock.time()
        tmp = self._journal_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for key, expiry in self._seen.items():
                f.write(f"{key}\t{now_wall + (expiry - now_mono) if expiry else 0}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._journal_path)
        replica.replaced(self._journal_path)  # a cluster's followers get the same journal
        if self._journal >= 0:
            os.close(self._journal)
        self._journal = os.open(self._journal_path, os.O_WRONLY | os.O_APPEND)
        self._journal_lines = len(self._seen)

    def detach(self) -> None:
        if self._journal >= 0:
            os.close(self._journal)
            self._journal = -1
        if self._journal_path is not None:
            for path in (self._journal_path, self._journal_path + ".tmp"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                replica.unlinked(path)

    # --- routing ---------------------------------------------------------------------

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self._dests.add(destination)

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self._dests.remove(destination)

    def _remember(self, key: str, expiry: float) -> None:
        self._seen[key] = expiry
        self._seen.move_to_end(key)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)

    def route(self, routing_key: str, message: Any):
        headers = message.headers
        if not headers or HEADER not in headers:
            return self._dests
        key = dedup_id(headers[HEADER])
        now = time.monotonic()
        expiry = self._seen.get(key)
        if expiry is not None and (expiry == 0.0 or expiry > now):
            return ()  # a duplicate: not routed, still confirmed
        ttl = headers.get("x-cache-ttl", self._ttl_ms)
        expiry = now + ttl / 1000.0 if isinstance(ttl, int) and ttl > 0 else 0.0
        self._remember(key, expiry)
        if self._journal >= 0:
            wall = wallclock.time() + (expiry - now) if expiry else 0
            line = f"{key}\t{wall}\n".encode()
            os.write(self._journal, line)
            replica.appended(self._journal_path, self._journal, line)
            self._journal_lines += 1
            if self._journal_lines > 2 * self._size + 1000:
                self._rewrite()
        return self._dests
