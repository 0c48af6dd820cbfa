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
    """The deduplication ids of the messages a queue holds, with a count each.

    A count, not a set: a message without an id check (published before the
    argument existed, or recovered twice over a requeue) must not let a
    later removal forget an id another copy still holds.
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def add(self, message: Any) -> None:
        key = message_dedup_id(message)
        if key is not None:
            self._ids[key] = self._ids.get(key, 0) + 1

    def forget(self, message: Any) -> None:
        key = message_dedup_id(message)
        if key is None:
            return
        left = self._ids.get(key, 0) - 1
        if left > 0:
            self._ids[key] = left
        else:
            self._ids.pop(key, None)
