"""Queue-level deduplication (`x-message-deduplication: true` on queue.declare).

The interface is that of the community rabbitmq-message-deduplication plugin: a
message whose `x-deduplication-header` value matches a message already in the
queue is not enqueued.  "In the queue" means ready or delivered and not yet
settled: an ack, a reject, an expiry, an overflow drop, a no-ack delivery or a
purge forgets the id; a requeue keeps it.  The publisher of a duplicate still
gets its confirm, as the plugin gives it.

Unlike the plugin's in-memory cache, the ids are rebuilt from the messages a
durable queue recovers at start, so the rule holds across a restart.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.exchanges.deduplication import HEADER, dedup_id


def message_dedup_id(message: Any) -> str | None:
    """The message's deduplication id, or None when it carries none."""
    headers = message.headers
    if not headers or HEADER not in headers:
        return None
    return dedup_id(headers[HEADER])


class PresentIds:
    """The deduplication ids of the messages a queue holds.

    A plain set: a duplicate is never enqueued, so at most one held message
    carries a given id.
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def add(self, key: str | None) -> None:
        """Remember an id (from message_dedup_id); None, a message without one, is skipped."""
        if key is not None:
            self._ids.add(key)

    def forget(self, message: Any) -> None:
        key = message_dedup_id(message)
        if key is not None:
            self._ids.discard(key)
