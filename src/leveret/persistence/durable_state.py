"""The broker's durable state: the store side of broker.durability.DurabilityHooks.

Definitions (durable exchanges, queues, bindings) go to SQLite; persistent
messages in durable queues go to the segment log, and their publisher confirms
wait for the group commit's fsync. Message bodies beyond the memory budget are
paged out to the same log (transient messages as records recovery ignores)
and read back when delivered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from leveret.broker.durability import DurabilityHooks
from leveret.broker.errors import PreconditionFailed
from leveret.broker.exchange import Binding, Exchange
from leveret.broker.message import Message
from leveret.broker.queue_args import parse_expiration
from leveret.broker.queues.base import Queue, QueueEntry
from leveret.broker.queues.remote import RemoteQueue
from leveret.persistence.delayed_messages import StoredDelays
from leveret.protocol.properties import FLAG_EXPIRATION, parse_header
from leveret.store import replica
from leveret.store.catalog import CatalogStore
from leveret.store.definitions import DefinitionStore
from leveret.store.delay_queue import DELAYED, is_delay_key
from leveret.store.errors import StoreError
from leveret.store.locations import SharedRecord
from leveret.store.message_store import MessageStore
from leveret.store.queue_ids import QueueKey
from leveret.store.stream_log import SyncSubmitter

if TYPE_CHECKING:
    from leveret.broker.ports import DiskWaiter

log = logging.getLogger("leveret.store")

# Store writes queued for the writer thread before publishers are paused. Checked
# after each read (server.connection), so transient messages that a long queue
# pages to disk count too: with reads of up to 4 MB, 20,000 let the backlog, and
# the RSS it leaves behind, grow by tens of MB (tests/durability/test_paged_tail.py).
DISK_BACKLOG = 4096
# Ready messages a plain queue holds in RAM; past them it keeps locations only.
# Above FLOW_LIMIT (4096), so consumers that keep up never make a queue page.
DEFAULT_QUEUE_RAM_MESSAGES = 8192
DEFAULT_QUEUE_RAM_BYTES = 128 * 1024 * 1024
# What a ready message kept as objects costs beside its body (QueueEntry, Message, the
# header bytes, the deque slot): 409 B measured with tracemalloc at 16 B bodies.
ENTRY_OVERHEAD = 400
# A queue with fewer ready messages than this is never paged for the shared budget
# (a short queue's fast path pays nothing), so every queue may keep this many
# entries beyond the budget.
HEADS_CHECK_FROM = 64
_C_HEADS_CHECK_FROM = HEADS_CHECK_FROM  # a C integer when compiled (durable_state.pxd)


def _key(queue: Queue) -> tuple[str, str]:
    return (queue.vhost.name, queue.name)


def _store_key(queue: Queue, message: Message) -> QueueKey:
    """Where the store keeps `message` for `queue`: a priority queue keeps each level
    as a queue of its own (recovery then gives each level back in its order)."""
    if queue.max_priority:
        return (queue.vhost.name, queue.name, min(message.priority, queue.max_priority))
    return (queue.vhost.name, queue.name)


def _record_header(message: Message) -> bytes:
    """What the store keeps besides the body: exchange and routing key, then the header."""
    return message.exchange_and_key + message.header


def _split_record_header(blob: bytes) -> tuple[str, str, bytes, bytes]:
    """(exchange, routing key, their encoded form, content header) of a stored record."""
    n = blob[0]
    exchange = blob[1 : 1 + n].decode()
    m = blob[1 + n]
    routing_key = blob[2 + n : 2 + n + m].decode()
    return exchange, routing_key, blob[: 2 + n + m], blob[2 + n + m :]


def _message_from_record(blob: bytes, body: bytes) -> Message:
    """The Message a stored record holds (its per-message TTL parsed again)."""
    exchange, routing_key, encoded, header = _split_record_header(blob)
    _cls, _w, _size, flags, delivery_mode = parse_header(header)
    message = Message(exchange, routing_key, header, body, flags, delivery_mode == 2, encoded)
    if flags & FLAG_EXPIRATION:
        try:
            message.ttl = parse_expiration(message.properties.expiration)
        except PreconditionFailed:
            message.ttl = None
    return message


class DurableState(DurabilityHooks):
    def __init__(
        self,
        data_dir: str,
        fsync: str,
        max_memory_bytes: int,
        loop: asyncio.AbstractEventLoop,
        queue_ram_messages: int = DEFAULT_QUEUE_RAM_MESSAGES,
        queue_ram_bytes: int = DEFAULT_QUEUE_RAM_BYTES,
    ) -> None:
        if os.path.exists(data_dir) and not os.path.isdir(data_dir):
            raise StoreError(f"--data-dir {data_dir} exists but is not a directory")
        os.makedirs(data_dir, exist_ok=True)
        super().__init__()
        self.active = True
        self.data_dir = data_dir
        self.definitions = DefinitionStore(os.path.join(data_dir, "definitions.db"))
        self.catalog = CatalogStore(self.definitions.db)
        self.messages = MessageStore(data_dir, fsync=fsync, loop=loop)
        self.memory_budget = max_memory_bytes
        # Ready messages a plain queue keeps in RAM before it pages the rest.
        self.queue_ram_messages = queue_ram_messages or 1 << 62  # 0: never by length
        # One budget for all queues' heads (`_heads_full`): each queue's last known head
        # cost, and their sum. A figure is refreshed when its queue gets a message, and
        # all of them at most once a second when the sum says the budget is spent.
        self.queue_ram_bytes = queue_ram_bytes or 1 << 62
        self.heads_used = 0
        self.heads_full = False  # what the last _heads_full said
        self._head_costs: dict[Any, int] = {}
        self._heads_recounted = 0.0
        self.memory_used = 0  # bodies held in RAM by queue entries
        self.paged_out = 0  # bodies ever paged out to disk (messages, then bytes)
        self.paged_out_bytes = 0
        # Messages written to and read back from disk (the overview's disk_writes and
        # disk_reads, as RabbitMQ counts its queues' writes and reads).
        self.disk_writes = 0
        self.disk_reads = 0
        self._restoring = False
        self._started = 0.0
        self.loop = loop
        self._disk_waiters: set[DiskWaiter] = set()
        self._disk_timer: asyncio.TimerHandle | None = None
        # Durable fan-out in progress: the message, its record, queue -> its slot.
        self._sharing: tuple[Message, SharedRecord, dict[Queue, int]] | None = None
        # Delayed exchanges' stores (closed with the store), and the delay queues of
        # exchanges deleted while the store recovered (dropped once it has).
        self._delay_stores: weakref.WeakSet[StoredDelays] = weakref.WeakSet()
        self.delay_drops: list[tuple[str, str]] = []

    # --- the catalog --------------------------------------------------------

    def catalog_load(self) -> dict[str, dict[str, dict[str, Any]]] | None:
        return self.catalog.load()

    def catalog_initialize(self) -> None:
        self.catalog.initialize()

    def catalog_put(self, kind: str, key: str, record: dict[str, Any]) -> None:
        self.catalog.put(kind, key, record)

    def catalog_delete(self, kind: str, key: str) -> None:
        self.catalog.delete(kind, key)

    def vhost_deleted(self, vhost: str) -> None:
        """The vhost's queues were deleted one by one; sweep rows and directories left."""
        self.definitions.delete_vhost(vhost)
        for kind in ("streams", "exchanges"):
            directory = os.path.join(self.data_dir, kind, quote(vhost, safe=""))
            shutil.rmtree(directory, ignore_errors=True)
            replica.removed_tree(directory)

    # --- definitions --------------------------------------------------------

    def exchange_declared(self, exchange: Exchange) -> None:
        if not self._restoring and exchange.name and not exchange.name.startswith("amq."):
            self.definitions.save_exchange(
                exchange.vhost_name,
                exchange.name,
                exchange.type_name,
                exchange.durable,
                exchange.auto_delete,
                exchange.internal,
                exchange.arguments,
            )

    def delay_store(self, exchange: Exchange) -> StoredDelays:
        store = StoredDelays(self.messages, exchange.vhost_name, exchange.name, self)
        self._delay_stores.add(store)
        return store

    def exchange_deleted(self, exchange: Exchange) -> None:
        self.definitions.delete_exchange(exchange.vhost_name, exchange.name)

    def exchange_state_path(self, vhost: str, name: str) -> str | None:
        directory = os.path.join(self.data_dir, "exchanges", quote(vhost, safe=""))
        os.makedirs(directory, exist_ok=True)
        return os.path.join(directory, quote(name, safe=""))

    def stream_directory(self, vhost: str, name: str) -> str | None:
        return os.path.join(self.data_dir, "streams", quote(vhost, safe=""), quote(name, safe=""))

    def stream_sync(self) -> SyncSubmitter:
        """Streams' fsyncs go through the message store's writer thread (one batch)."""

        def submit(fds: list[int], done: Callable[[BaseException | None], None]) -> None:
            committer = self.messages.committer
            if committer is None:
                raise StoreError("the message store is not open")
            committer.submit_sync(fds, done)

        return submit

    def queue_declared(self, queue: Queue) -> None:
        if not self._restoring:
            # A queue another worker owns is kept with its owner (RemoteQueue.worker).
            worker = getattr(queue, "worker", None) if type(queue) is RemoteQueue else None
            self.definitions.save_queue(
                queue.vhost.name,
                queue.name,
                queue.durable,
                queue.auto_delete,
                queue.arguments,
                worker,
            )

    def queue_deleted(self, queue: Queue, entries: list[QueueEntry]) -> None:
        self._forget_bodies(entries)
        if queue.stores_messages or type(queue) is RemoteQueue:
            self.definitions.delete_queue(queue.vhost.name, queue.name)
        for key in self.messages.queue_keys(queue.vhost.name, queue.name):
            self.messages.delete_queue(key)

    def queue_purged(self, queue: Queue, entries: list[QueueEntry]) -> None:
        self._forget_bodies(entries)
        # Unacked deliveries keep their records until they are acked.
        for entry in entries:
            if entry.location is not None:
                self.messages.ack(entry.location)

    def binding_added(self, binding: Binding) -> None:
        if not self._restoring:
            self.definitions.save_binding(*self._binding_row(binding))

    def binding_removed(self, binding: Binding) -> None:
        self.definitions.delete_binding(*self._binding_row(binding))

    @staticmethod
    def _binding_row(binding: Binding) -> tuple[Any, ...]:
        dest = binding.destination
        kind = "exchange" if type(dest) is Exchange else "queue"
        vhost = dest.vhost.name if kind == "queue" else dest.vhost_name
        return (vhost, binding.source.name, dest.name, kind, binding.routing_key, binding.arguments)

    # --- messages (publish path) --------------------------------------------

    # A persistent message routed to several durable queues is written once, as
    # one FANOUT record (store.message_store), before the queues take it in turn:
    # `share_body` writes it, each pageable queue's `message_enqueued` takes its slot
    # instead of writing a record of its own, and `share_done` lets go of a slot
    # that no queue took (a queue over x-max-length with reject-publish turned the
    # message away). Queues that cannot page (byte limits, priorities,
    # deduplication) write their own records as before.

    def share_body(self, message: Message, queues: list[Queue], barrier: Any) -> bool:
        if self._sharing is not None or not message.persistent:
            # Nested: a queue taking the shared message dead-letters another one
            # (drop-head); that copy is written per queue, as without sharing.
            return False
        takers = list(dict.fromkeys(q for q in queues if q.stores_messages and q.can_page))
        if len(takers) < 2:
            return False
        shared = self.messages.publish_shared(
            [_store_key(q, message) for q in takers],
            _record_header(message),
            message.body,
            barrier.add() if barrier is not None else None,
        )
        self._sharing = (message, shared, {q: k for k, q in enumerate(takers)})
        return True

    def share_done(self) -> None:
        sharing, self._sharing = self._sharing, None
        if sharing is not None:
            _message, shared, slots = sharing
            for k in slots.values():
                self.messages.release_slot(shared, k)

    def _slot(self, queue: Queue, message: Message) -> tuple[SharedRecord, int] | None:
        """This queue's slot of the fan-out record being shared, if it has one."""
        sharing = self._sharing
        if sharing is None or sharing[0] is not message:
            return None
        k = sharing[2].pop(queue, None)
        return None if k is None else (sharing[1], k)

    def _heads_full(self, queue: Queue) -> bool:
        """Whether the heads of all queues, this one's counted as it is now, have spent
        `queue_ram_bytes`. Others' figures may be high (drained since their last
        message), so a full budget is recounted from every queue, once a second at most."""
        cost = queue.ready.head_cost(ENTRY_OVERHEAD)  # type: ignore[attr-defined]
        self.heads_used += cost - self._head_costs.get(queue, 0)
        self._head_costs[queue] = cost
        if self.heads_used < self.queue_ram_bytes:
            self.heads_full = False
            return False
        now = self.loop.time()
        if now - self._heads_recounted >= 1.0:
            self._heads_recounted = now
            costs = self._head_costs
            for q in list(costs):
                if q.deleted:
                    del costs[q]
                else:
                    costs[q] = q.ready.head_cost(ENTRY_OVERHEAD)
            self.heads_used = sum(costs.values())
        self.heads_full = self.heads_used >= self.queue_ram_bytes
        return self.heads_full

    def message_enqueued(
        self, queue: Queue, entry: QueueEntry, barrier: Any, may_page: bool = False
    ) -> bool:
        message = entry.message
        size = message.size
        # Only a classic queue (or a quorum queue, built on it) calls this: compiled,
        # `classic` is that C type, so its fields below are read without lookups.
        classic = queue
        # A quorum queue stores transient messages too (persists_all): asked only of a
        # transient message to a queue that stores messages, so neither a persistent
        # message nor a non-durable queue pays for it.
        persistent = classic.stores_messages and (message.persistent or queue.persists_all)
        over_budget = self.memory_used + size > self.memory_budget and size
        shared = self._slot(queue, message) if self._sharing is not None else None
        # A long queue keeps new messages as disk positions only: its own length
        # decides, as for RabbitMQ's lazy and v2 classic queues, and so does the RAM
        # all queues' heads take together, not just the budget for bodies.
        # The shared budget is asked about a queue at every 64th ready message while
        # it is not spent (a queue's figure lags by 64 entries at most; the ask
        # costs about 3,000 instructions), and at every message once it is.
        ready_n = classic.ready.n
        if may_page and (
            over_budget
            or ready_n >= self.queue_ram_messages
            or (
                ready_n >= _C_HEADS_CHECK_FROM
                and (self.heads_full or not ready_n & 63)
                and self._heads_full(queue)
            )
        ):
            tail = queue.tail_for(message)  # type: ignore[attr-defined]
            if tail is None:
                # x-max-length-bytes counts bodies exactly: so must the tail.
                exact = queue.options.max_length_bytes is not None  # type: ignore[attr-defined]
                tail = self.messages.paged_index(_store_key(queue, message), exact)
                queue.attach_tail(message, tail)  # type: ignore[attr-defined]
            # A TTL's deadline stays with the position (the queue's clock: opaque here).
            if shared is not None:
                self.messages.take_slot_paged(shared[0], tail, entry.expires_at)
            else:
                self.messages.publish_paged(
                    tail,
                    _record_header(message),
                    message.body,
                    barrier.add() if persistent and barrier is not None else None,
                    transient=not persistent,
                    stamp=entry.expires_at,
                )
            self.paged_out += 1
            self.paged_out_bytes += size
            self.disk_writes += 1
            return True
        if shared is not None:
            entry.location = self.messages.take_slot(*shared)
            self.disk_writes += 1
        elif persistent:
            self.disk_writes += 1
            entry.location = self.messages.publish(
                _store_key(queue, message),
                _record_header(message),
                message.body,
                barrier.add() if barrier is not None else None,
            )
        if over_budget:
            self._to_disk(queue, entry)
            # Only this entry drops the body; the shared message stays for other queues.
            entry.message = message.paged_copy()
        else:
            self.memory_used += size
        return False

    def _to_disk(self, queue: Queue, entry: QueueEntry) -> None:
        """Over the memory budget, a queue that cannot page (byte limits, priorities,
        deduplication) still drops the body from RAM: it needs a record to read it back from, a
        transient one unless the message was already stored."""
        message = entry.message
        if entry.location is None:
            self.disk_writes += 1
            entry.location = self.messages.publish(
                _store_key(queue, message),
                _record_header(message),
                message.body,
                None,
                transient=True,
            )
        self.paged_out += 1
        self.paged_out_bytes += message.size

    def message_delivered(self, queue: Queue, entry: QueueEntry) -> None:
        self.messages.mark_delivered(entry.location)

    def message_redelivered(self, queue: Queue, entry: QueueEntry, count: int) -> None:
        if entry.location is not None:
            self.messages.note_count(entry.location, count)

    def delivery_count(self, entry: QueueEntry) -> int:
        return self.messages.delivery_count(entry.location)

    def message_removed(self, queue: Queue, entry: QueueEntry) -> None:
        if entry.message.body is not None:
            self.memory_used -= entry.message.size
        if entry.location is not None:
            self.messages.ack(entry.location)

    # --- backpressure from the disk ------------------------------------------
    #
    # Publishers without confirms get no signal from the disk, so they could queue
    # writes without bound. Past DISK_BACKLOG operations their connections stop
    # being read until the writer thread has caught up by half.

    def disk_backlogged(self) -> bool:
        committer = self.messages.committer
        return committer is not None and committer.backlog > DISK_BACKLOG

    def wait_for_disk(self, connection: DiskWaiter) -> None:
        self._disk_waiters.add(connection)
        if self._disk_timer is None:
            self._disk_timer = self.loop.call_later(0.005, self._check_disk)

    def _check_disk(self) -> None:
        self._disk_timer = None
        committer = self.messages.committer
        if committer is not None and committer.backlog > DISK_BACKLOG // 2:
            self._disk_timer = self.loop.call_later(0.005, self._check_disk)
            return
        waiters, self._disk_waiters = self._disk_waiters, set()
        for connection in waiters:
            connection.resume_after_disk()

    def load_body(self, entry: QueueEntry) -> bytes:
        self.disk_reads += 1
        return self.messages.read_body(entry.location)[1]

    def load_tail(self, tail: Any, limit: int) -> list[Any]:
        """A paged tail's next items, bodies read back into RAM."""
        items: list[Any] = []
        for item in self.messages.take_paged(tail, limit, stamped=True):
            if type(item) is tuple:
                location, blob, body, expires_at = item
                message = _message_from_record(blob, body)
                self.memory_used += message.size
                self.disk_reads += 1
                items.append((location, message, expires_at))
            else:
                items.append(item)
        return items

    def drop_tail(self, tail: Any) -> list[QueueEntry]:
        return self.messages.drop_paged(tail)

    def count_tail_bodies(self, tail: Any) -> None:
        self.messages.make_exact(tail)

    def _forget_bodies(self, entries: list[QueueEntry]) -> None:
        for entry in entries:
            if entry.message.body is not None:
                self.memory_used -= entry.message.size

    # --- startup and shutdown -----------------------------------------------

    def restore(self, broker: Any) -> None:
        """Recreate durable definitions and queued messages, all before returning."""
        self.restore_definitions(broker)
        self.restore_messages(broker, self.messages.recover())

    def restore_definitions(self, broker: Any) -> None:
        """Recreate vhosts' exchanges, queues and bindings, and open the message store
        far enough to refuse a data dir it cannot read. Its cost grows with the number
        of definitions, not with what is queued, so it runs before the broker listens;
        the messages follow with `messages.recover` and `restore_messages`."""
        self._started = time.monotonic()
        self.recovering = True
        self._restoring = True
        try:
            defs = self.definitions.load()
            self.messages.prepare()
            unknown = {d.vhost for d in (*defs.exchanges, *defs.queues)} - set(broker.vhosts)
            for name in sorted(unknown):
                # Kept on disk, not deleted: they come back if the vhost is defined again.
                log.warning("definitions of vhost '%s' kept but not loaded: no such vhost", name)
            for ex in defs.exchanges:
                vhost = broker.vhosts.get(ex.vhost)
                if vhost is None or ex.name in vhost.exchanges:
                    continue
                vhost.declare_exchange(
                    ex.name, ex.type, False, ex.durable, ex.auto_delete, ex.internal, ex.arguments
                )
            # In a broker of several workers (broker.mesh), a queue another worker owns
            # comes back as its stand-in; a queue stored without an owner is this one's.
            index = broker.mesh.index if broker.mesh is not None else None
            for q in defs.queues:
                vhost = broker.vhosts.get(q.vhost)
                if vhost is not None:
                    worker = q.worker if index is not None and q.worker != index else None
                    vhost.declare_queue(
                        q.name, False, q.durable, False, q.auto_delete, q.arguments, worker=worker
                    )
            for b in defs.bindings:
                vhost = broker.vhosts.get(b.vhost)
                if vhost is None:
                    continue
                source = vhost.exchanges.get(b.source)
                if b.destination_kind == "queue":
                    dest = vhost.queues.get(b.destination)
                else:
                    dest = vhost.exchanges.get(b.destination)
                if source is not None and dest is not None:
                    vhost.bind(source, dest, b.routing_key, b.arguments)
        finally:
            self._restoring = False
        log.info(
            "recovered %d exchanges, %d queues and %d bindings in %.2f s from %s",
            len(defs.exchanges),
            len(defs.queues),
            len(defs.bindings),
            time.monotonic() - self._started,
            self.data_dir,
        )

    def restore_messages(self, broker: Any, stored: dict[QueueKey, Any]) -> None:
        """Give the queues their recovered messages (on the loop, after `recover`)."""
        self.recovering = False
        self.messages.finish_recovery()
        count = self._restore_delays(broker, stored)
        count += self._restore_messages(broker, stored)
        log.info(
            "recovered %d messages in %.2f s from %s",
            count,
            time.monotonic() - self._started,
            self.data_dir,
        )

    def _restore_delays(self, broker: Any, stored: dict[QueueKey, Any]) -> int:
        """Delayed exchanges' pending messages: each exchange wakes for its first.
        Takes their keys out of `stored`."""
        drops, self.delay_drops = self.delay_drops, []
        for vhost_name, name in drops:
            self.messages.delays.drop(vhost_name, name)
            stored.pop((vhost_name, name, DELAYED), None)  # type: ignore[call-overload]
        count = 0
        for key in [k for k in stored if is_delay_key(k)]:
            index = stored.pop(key)
            vhost = broker.vhosts.get(key[0])
            exchange = vhost.exchanges.get(key[1]) if vhost is not None else None
            if exchange is not None and exchange.type_name == "x-delayed-message":
                count += len(index)
                exchange.router.recovered()
            elif not len(index):
                self.messages.delete_queue(key)  # a non-durable exchange's: nothing to keep
            else:
                # As for queues: never delete messages on a guess.
                log.warning(
                    "kept %d delayed message(s) of exchange '%s' in vhost '%s' on disk: no "
                    "such delayed exchange is defined; they return when it is",
                    len(index),
                    key[1],
                    key[0],
                )
        return count

    def _restore_messages(self, broker: Any, stored: dict[QueueKey, Any]) -> int:
        count = 0
        # A queue that can page reads nothing here: all it holds stays on disk as its
        # paged tail, read back (256 at a time) when consumers reach it. Reading
        # each queue's head now would make a restart wait on the number of queues
        # times --queue-ram-messages (200 queues of 10,000: 6.7 s and 1.1 GB).
        # A queue's own key first (records of an older build), then its levels, highest first.
        order = sorted(stored, key=lambda k: (k[0], k[1], -k[2] if len(k) == 3 else -(1 << 16)))
        for key in order:
            tail = stored[key]
            if not tail.n:
                continue
            vhost_name, queue_name = key[0], key[1]
            level: int | None = key[2] if len(key) == 3 else None  # type: ignore[misc]
            vhost = broker.vhosts.get(vhost_name)
            queue = vhost.queues.get(queue_name) if vhost is not None else None
            if queue is None:
                # No definition to place them in (lost, or not loaded yet): never delete
                # messages on a guess.  They stay on disk and come back on a start
                # where their queue exists again.
                log.warning(
                    "kept %d message(s) of queue '%s' in vhost '%s' on disk: no such "
                    "durable queue is defined; they return when it is",
                    tail.n,
                    queue_name,
                    vhost_name,
                )
                continue
            count += tail.n
            # A tail can stay a tail if it is one level's (or a plain queue's) own:
            # records a priority queue kept under its own key (an older build) mix
            # levels, and so do level records of a queue declared again without
            # priorities; those are all read, and join their levels as objects.
            levels = queue.max_priority
            pageable = queue.can_page and (
                (level is None and not levels) or (level is not None and level <= levels)
            )
            head = 0 if pageable else tail.n
            if head:
                for location, blob, body in self.messages.take_paged(tail, head):
                    message = _message_from_record(blob, body)
                    size = message.size
                    if self.memory_used + size > self.memory_budget and size:
                        message.body = None  # stays paged out until delivered
                        self.paged_out += 1
                        self.paged_out_bytes += size
                    else:
                        self.memory_used += size
                    queue.restore(message, location)
            if tail.n:
                if queue.options.max_length_bytes is not None:
                    self.messages.make_exact(tail)
                queue.restore_tail(tail, level)
        return count

    def close(self) -> None:
        for delays in list(self._delay_stores):
            delays.closed = True
        self.messages.close()
        self.definitions.close()
