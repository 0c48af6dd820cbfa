"""A queue: ready messages in order, consumers in round-robin, delivery accounting.

Ordering rule (as RabbitMQ): a requeued message goes back to the place it had,
ahead of everything published after it. Ready messages are a deque in publish
order plus a heap of returned ones; every returned entry is older than any
entry still in the deque (entries leave the deque only from its head), so
"heap first, then deque" is exactly the original order.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from leveret.broker.consumer import Consumer
from leveret.broker.message import Message

if TYPE_CHECKING:
    from leveret.broker.vhost import VirtualHost


class QueueEntry:
    """One message's place in one queue."""

    __slots__ = ("seq", "message", "redelivered")

    def __init__(self, seq: int, message: Message, redelivered: bool = False) -> None:
        self.seq = seq
        self.message = message
        self.redelivered = redelivered

    def __lt__(self, other: QueueEntry) -> bool:
        return self.seq < other.seq


class ReadyMessages:
    """Messages waiting for a consumer, oldest first."""

    __slots__ = ("_fresh", "_returned", "bytes")

    def __init__(self) -> None:
        self._fresh: deque[QueueEntry] = deque()
        self._returned: list[QueueEntry] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._fresh) + len(self._returned)

    def __bool__(self) -> bool:
        return bool(self._fresh) or bool(self._returned)

    def append(self, entry: QueueEntry) -> None:
        self._fresh.append(entry)
        self.bytes += len(entry.message.body)

    def put_back(self, entry: QueueEntry) -> None:
        heapq.heappush(self._returned, entry)
        self.bytes += len(entry.message.body)

    def popleft(self) -> QueueEntry:
        entry = heapq.heappop(self._returned) if self._returned else self._fresh.popleft()
        self.bytes -= len(entry.message.body)
        return entry

    def clear(self) -> list[QueueEntry]:
        entries = sorted(self._returned) + list(self._fresh)
        self._fresh.clear()
        self._returned.clear()
        self.bytes = 0
        return entries


class Queue:
    """Queues compare by identity; the vhost guarantees one per name."""

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        durable: bool = False,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner  # the owning connection, or None
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.ready = ReadyMessages()
        self.consumers: list[Consumer] = []
        self._rr = 0  # round-robin cursor into consumers
        self._top_priority = 0  # highest x-priority among consumers
        self.unacked = 0  # delivered, not yet acked, across all channels
        self._seq = 0
        self.bindings: set[Any] = set()  # Binding objects targeting this queue
        self.had_consumer = False
        self.deleted = False

    # --- publishing and delivery (hot path) ---------------------------------

    def enqueue(self, message: Message) -> None:
        self._seq += 1
        self.ready.append(QueueEntry(self._seq, message))
        if self.consumers:
            self.dispatch()

    def dispatch(self) -> None:
        """Hand ready messages to consumers with spare capacity, round-robin."""
        ready = self.ready
        consumers = self.consumers
        top = self._top_priority
        while ready and consumers:
            n = len(consumers)
            start = self._rr
            best = None
            # Highest consumer priority wins; round-robin among equals.
            for k in range(n):
                c = consumers[(start + k) % n]
                if c.active and c.can_take() and (best is None or c.priority > best.priority):
                    best = c
                    self._rr = (start + k + 1) % n
                    if c.priority >= top:
                        break  # nobody outranks this one
            if best is None:
                return
            entry = ready.popleft()
            if not best.no_ack:
                self.unacked += 1
            best.channel.deliver(best, self, entry)

    def get(self) -> QueueEntry | None:
        """basic.get: the next ready message, if any."""
        if not self.ready:
            return None
        return self.ready.popleft()

    # --- settlement ---------------------------------------------------------

    def settle(self, entry: QueueEntry) -> None:
        """A delivery was acked (or rejected without requeue)."""
        self.unacked -= 1
        self.vhost.on_message_removed(self, entry)

    def requeue(self, entries: Iterable[QueueEntry], dispatch: bool = True) -> None:
        """Return delivered messages to their original places, marked redelivered."""
        if self.deleted:
            return
        for entry in entries:
            self.unacked -= 1
            entry.redelivered = True
            self.ready.put_back(entry)
        if dispatch and self.consumers:
            self.dispatch()

    def purge(self) -> int:
        entries = self.ready.clear()
        for entry in entries:
            self.vhost.on_message_removed(self, entry)
        return len(entries)

    # --- consumers ----------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        self._top_priority = max(c.priority for c in self.consumers)

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self._rr >= len(self.consumers):
            self._rr = 0
        self._top_priority = max((c.priority for c in self.consumers), default=0)

    @property
    def message_count(self) -> int:
        return len(self.ready)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} ready={len(self.ready)} unacked={self.unacked}>"
