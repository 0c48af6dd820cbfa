"""The model's interface to the disk.

The broker model never imports the store. It calls these hooks, and the persistence
package (leveret.persistence.durable_state) implements them on the store. The in-memory broker
(tests, `persistence=False`) uses the no-op DurabilityHooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.broker.exchange import Binding, Exchange
    from leveret.broker.ports import DiskWaiter, PagedTail
    from leveret.broker.queues.base import Queue, QueueEntry


class WriteBarrier:
    """Counts outstanding disk writes for one publish (or one tx.commit).

    `on_done(error)` runs once every write added before seal() is durable,
    with the first error seen (or None).
    """

    __slots__ = ("pending", "error", "sealed", "on_done")

    def __init__(self, on_done: Callable[[BaseException | None], None]) -> None:
        self.pending = 0
        self.error: BaseException | None = None
        self.sealed = False
        self.on_done = on_done

    def add(self) -> Callable[[BaseException | None], None]:
        self.pending += 1
        return self._one_done

    def _one_done(self, error: BaseException | None) -> None:
        self.pending -= 1
        if error is not None and self.error is None:
            self.error = error
        if self.sealed and self.pending == 0:
            self.on_done(self.error)

    def seal(self) -> None:
        self.sealed = True
        if self.pending == 0:
            self.on_done(self.error)


class DurabilityHooks:
    """What the model tells the disk. This base class keeps everything in memory."""

    def __init__(self) -> None:
        # False: queues skip every per-message hook (the in-memory broker's fast path).
        self.active = False
        # True while stored messages are still being read back at startup (the broker
        # already listens, but holds client operations): nothing may delete a queue yet.
        self.recovering = False

    def exchange_state_path(self, vhost: str, name: str) -> str | None:
        """Where a durable exchange type keeps state (the dedup cache); None: nowhere."""
        return None

    def stream_directory(self, vhost: str, name: str) -> str | None:
        """Where a stream keeps its log; None: a scratch directory, no fsync."""
        return None

    def stream_sync(
        self,
    ) -> Callable[[list[int], Callable[[BaseException | None], None]], None] | None:
        """How a stream's fsyncs join the store's writer thread; None: on their own."""
        return None

    # The catalog: vhosts, users, permissions and limits as (kind, key) → record.
    def catalog_load(self) -> dict[str, dict[str, dict[str, Any]]] | None:
        """Every stored record by kind and key; None on a first start (nothing stored)."""
        return None

    def catalog_initialize(self) -> None:
        """Remember that the catalog exists, so defaults are created only once."""

    def catalog_put(self, kind: str, key: str, record: dict[str, Any]) -> None:
        """Store a record durably before the change is visible to anyone."""

    def catalog_delete(self, kind: str, key: str) -> None: ...

    def vhost_deleted(self, vhost: str) -> None:
        """Remove whatever durable data is left of a deleted vhost."""

    def delay_store(self, exchange: Exchange) -> Any:
        """Where a delayed exchange keeps the messages it holds back (see
        broker/exchanges/delayed.py for what it must do); here: in RAM."""
        from leveret.broker.exchanges.delayed import MemoryDelays

        return MemoryDelays()

    def exchange_declared(self, exchange: Exchange) -> None: ...
    def exchange_deleted(self, exchange: Exchange) -> None: ...
    def queue_declared(self, queue: Queue) -> None: ...
    def queue_deleted(self, queue: Queue, entries: list[QueueEntry]) -> None: ...
    def queue_purged(self, queue: Queue, entries: list[QueueEntry]) -> None: ...
    def binding_added(self, binding: Binding) -> None: ...
    def binding_removed(self, binding: Binding) -> None: ...

    def message_enqueued(
        self, queue: Queue, entry: QueueEntry, barrier: Any, may_page: bool = False
    ) -> bool:
        """Store or page out a message entering a queue; `barrier` tracks its fsync.

        With `may_page` the queue can keep the message as its location alone: True
        says the body is now on disk only (entry.location), and the queue should.
        """
        return False

    def share_body(self, message: Any, queues: list[Queue], barrier: Any) -> bool:
        """A persistent message is about to enter several queues: the store may write
        its body once for all of them, each queue's `message_enqueued` then taking
        its share. True if it did; then `share_done` must follow the enqueues
        (callers use try/finally), and no other sharing starts before it."""
        return False

    def share_done(self) -> None:
        """Every queue had its turn: a share that no queue took is let go."""

    def message_delivered(self, queue: Queue, entry: QueueEntry) -> None:
        """First delivery of a stored message (so recovery marks it redelivered)."""

    def message_redelivered(self, queue: Queue, entry: QueueEntry, count: int) -> None:
        """A quorum queue delivers a message it had returned: after a restart its delivery
        count is to be at least `count` (the one it has once this delivery ends)."""

    def delivery_count(self, entry: QueueEntry) -> int:
        """The delivery count a message read back after a restart had: what the last
        `message_redelivered` said, else 1 if it had been delivered, else 0."""
        return 0

    def message_removed(self, queue: Queue, entry: QueueEntry) -> None:
        """The message left the queue for good (acked, expired, dropped)."""

    def load_body(self, entry: QueueEntry) -> bytes:
        raise RuntimeError("message body was paged out but no store is attached")

    def load_tail(self, tail: PagedTail, limit: int) -> list[Any]:
        """The next `limit` items of a paged tail, in order: a held QueueEntry as it
        went in, a paged message as (location, Message, expires_at) with its body
        read back (expires_at as the entry had it when it was paged; 0: none)."""
        raise RuntimeError("messages were paged out but no store is attached")

    def drop_tail(self, tail: PagedTail) -> list[QueueEntry]:
        """Free a paged tail's messages (purge, delete); returns its held entries."""
        raise RuntimeError("messages were paged out but no store is attached")

    def count_tail_bodies(self, tail: PagedTail) -> None:
        """From now on let `tail.nbytes` be its bodies' bytes exactly (a policy gave
        the queue x-max-length-bytes after it had paged)."""
        raise RuntimeError("messages were paged out but no store is attached")

    def disk_backlogged(self) -> bool:
        """True when writes queue up faster than the disk takes them."""
        return False

    def wait_for_disk(self, connection: DiskWaiter) -> None:
        """Call connection.resume_after_disk() once the write backlog has drained."""
