"""The classic queue: ready messages in order, consumers in round-robin, delivery accounting.

Ordering rule (as RabbitMQ): a requeued message goes back to the place it had,
ahead of everything published after it. Ready messages are a deque in publish
order plus a heap of returned ones; every returned entry is older than any
entry still in the deque (entries leave the deque only from its head), so
"heap first, then deque" is exactly the original order.

The RabbitMQ extensions (TTL, length limits, priorities, single active
consumer, x-expires) are switched on per queue by its arguments; a queue with
none of them takes the short path in enqueue().
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from leveret.broker import dead_letter
from leveret.broker.consumer import Consumer
from leveret.broker.message import Message
from leveret.broker.queue_args import QueueOptions
from leveret.broker.queue_dedup import PresentIds, message_dedup_id
from leveret.broker.queues.base import FLOW_LIMIT, Queue, QueueEntry
from leveret.broker.stats import MessageStats

# Every queue type's entry (it moved to base.py) is imported from here too. Compiled,
# a name the .pxd cimports is no module attribute unless set so.
globals()["QueueEntry"] = QueueEntry

# Tail items read back from disk at a time when a paged queue's head runs dry.
REFILL_BATCH = 256
EXPIRE_BATCH = 2048  # expired messages the expiry timer drops per loop turn
FLOW_RESUME = FLOW_LIMIT // 2  # (FLOW_LIMIT: base.py) ready messages when they resume
_C_FLOW_LIMIT = FLOW_LIMIT  # C integers when compiled (classic.pxd)
_C_FLOW_RESUME = FLOW_RESUME

if TYPE_CHECKING:
    from leveret.broker.ports import PagedTail, Publisher
    from leveret.broker.vhost import VirtualHost


class ReadyMessages:
    """Messages waiting for a consumer, oldest first.

    A long queue keeps only its head as objects. Past the store's threshold a
    message whose body is on disk enters the *paged tail*: a compact index of disk
    positions the store owns (store.paged_index.PagedIndex), with no QueueEntry
    and no Message. The tail is read back in batches, in order, when the head runs
    dry (`loader`, set by the queue). An entry that was not paged (the store keeps
    short queues' messages as objects) is held in the tail in its place, so the
    tail stays after every entry of the head.

    `n` (head and tail) is kept as a plain attribute: the dispatch loop tests it
    per message, and an attribute read is much cheaper than a call to __len__.

    A priority queue has one of these per priority level, each with its own tail.
    """

    __slots__ = (
        "_fresh",
        "_returned",
        "tail",
        "_bytes",
        "n",
        "loader",
        "dropper",
        "tail_seq",
        "restored_at",
        "restored_left",
    )

    def __init__(self) -> None:
        self._fresh: deque[QueueEntry] = deque()
        self._returned: list[QueueEntry] = []
        self.tail: PagedTail | None = None
        self._bytes = 0  # the head's message bytes; the tail counts its own
        self.n = 0
        self.loader: Callable[[int], list[QueueEntry]] | None = None
        self.dropper: Callable[[], list[QueueEntry]] | None = None
        # The queue's bookkeeping for the tail: the last sequence number read back,
        # and when a restart put recovered messages there (their TTLs count from
        # then) and how many of the tail's first items those are.
        self.tail_seq = 0
        self.restored_at = 0.0
        self.restored_left = 0

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    @property
    def bytes(self) -> int:
        """Message bytes ready; a paged message counts its record less the fixed part
        (the body plus routing and properties) until it is read back."""
        tail = self.tail
        return self._bytes + (tail.nbytes if tail is not None else 0)

    @property
    def paged(self) -> int:
        """How many ready messages are in the paged tail (not materialised)."""
        tail = self.tail
        return tail.n if tail is not None else 0

    def head_cost(self, overhead: int) -> int:
        """RAM the head takes: its bodies, and `overhead` bytes for each entry's objects
        (the store's budget for all queues' heads)."""
        return self._bytes + (len(self._fresh) + len(self._returned)) * overhead

    def append(self, entry: QueueEntry) -> None:
        tail = self.tail
        if tail is not None and tail.n:
            tail.hold(entry, entry.message.size)  # behind the paged ones, to keep the order
        else:
            self._fresh.append(entry)
            self._bytes += entry.message.size
        self.n += 1

    def put_back(self, entry: QueueEntry) -> None:
        heapq.heappush(self._returned, entry)
        self._bytes += entry.message.size
        self.n += 1

    def _refill(self) -> None:
        """Materialise the next batch of the tail into the head (reads the disk)."""
        assert self.loader is not None, "a paged tail needs a loader"
        entries = self.loader(REFILL_BATCH)
        while not entries and self.tail is not None and self.tail.n:
            entries = self.loader(REFILL_BATCH)  # the store dropped a corrupt batch
        for entry in entries:
            self._bytes += entry.message.size
        self._fresh.extend(entries)
        # Recount: positions whose write failed may have left the tail meanwhile.
        self.n = len(self._fresh) + len(self._returned) + self.paged

    def peek(self) -> QueueEntry | None:
        if self._returned:
            return self._returned[0]
        if not self._fresh and self.tail is not None and self.tail.n:
            self._refill()
        return self._fresh[0] if self._fresh else None

    def popleft(self) -> QueueEntry | None:
        """The next ready entry; None only when the rest of a paged tail turned out
        corrupt on disk (the store dropped it, and `n` is recounted)."""
        if self._returned:
            entry = heapq.heappop(self._returned)
        else:
            # Hot path: plain attribute tests, no property call, when the head has some.
            if not self._fresh and self.tail is not None and self.tail.n:
                self._refill()
                if not self._fresh:
                    return None
            entry = self._fresh.popleft()
        self._bytes -= entry.message.size
        self.n -= 1
        return entry

    def clear(self) -> list[QueueEntry]:
        """Everything ready, oldest first. The paged tail's messages are dropped from
        the store here (no object is made for them); entries held in it come back."""
        entries = sorted(self._returned) + list(self._fresh)
        if self.paged:
            assert self.dropper is not None, "a paged tail needs a dropper"
            entries += self.dropper()
        self._fresh.clear()
        self._returned.clear()
        self._bytes = 0
        self.n = 0
        return entries


class PriorityReadyMessages(ReadyMessages):
    """x-max-priority queues: one ReadyMessages per priority, highest served first.

    Each level pages on its own: past the queue's RAM allowance a level keeps its
    newest messages as a paged tail, which the store keeps as a queue of its own
    (store.queue_ids.QueueKey), so a restart gives each level back in order.

    A subclass of ReadyMessages so that the queue's dispatch calls one type's
    methods (compiled, a C call); its own head and tail stay empty and unused."""

    __slots__ = ("levels", "max_priority")

    def __init__(self, max_priority: int) -> None:
        super().__init__()
        self.max_priority = max_priority
        self.levels = [ReadyMessages() for _ in range(max_priority + 1)]
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    @property
    def bytes(self) -> int:
        return sum(level.bytes for level in self.levels)

    @property
    def paged(self) -> int:
        return sum(level.paged for level in self.levels)

    def head_cost(self, overhead: int) -> int:
        return sum(level.head_cost(overhead) for level in self.levels)

    def level_for(self, message: Message) -> ReadyMessages:
        return self.levels[min(message.priority, self.max_priority)]

    def append(self, entry: QueueEntry) -> None:
        self.level_for(entry.message).append(entry)
        self.n += 1

    def put_back(self, entry: QueueEntry) -> None:
        self.level_for(entry.message).put_back(entry)
        self.n += 1

    def _top(self) -> ReadyMessages | None:
        for level in reversed(self.levels):
            if level:
                return level
        return None

    def peek(self) -> QueueEntry | None:
        top = self._top()
        if top is None:
            return None
        before = top.n
        entry = top.peek()
        self.n -= before - top.n  # a refill may have dropped corrupt records
        return entry

    def popleft(self) -> QueueEntry | None:
        """The next entry by priority; None only when what was left of a level's
        paged tail turned out corrupt (as ReadyMessages.popleft)."""
        top = self._top()
        if top is None:
            raise IndexError("pop from an empty queue")
        before = top.n
        entry = top.popleft()
        self.n -= before - top.n
        return entry

    def clear(self) -> list[QueueEntry]:
        entries: list[QueueEntry] = []
        for level in reversed(self.levels):
            entries += level.clear()
        self.n = 0
        return entries


class ClassicQueue(Queue):
    """Queues compare by identity; the vhost guarantees one per name."""

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        durable: bool = False,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        options: QueueOptions | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner  # the owning connection, or None
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.options = options or QueueOptions()
        self.plain = self.options.plain
        self.pageable = self.options.pageable
        self.dedup = PresentIds() if self.options.deduplication else None
        # Whether any entry may carry an expiry (queue TTL, or a message's expiration).
        self.expiring = self.options.message_ttl is not None
        # Priority levels (0: none); the store keeps each level's messages apart.
        self.max_priority = self.options.max_priority or 0
        self.ready: ReadyMessages | PriorityReadyMessages = (
            PriorityReadyMessages(self.max_priority) if self.max_priority else ReadyMessages()
        )
        self.consumers: list[Consumer] = []
        self._rr = 0  # round-robin cursor into consumers
        self._top_priority = 0  # highest x-priority among consumers
        self.unacked = 0  # delivered, not yet acked, across all channels
        self.stats = MessageStats()
        self._seq = 0
        self.bindings: set[Any] = set()  # Binding objects targeting this queue
        self.had_consumer = False
        self.deleted = False
        self.throttled: set[Publisher] = set()  # publishers paused for this queue
        # Durability: `tracked` sends every message event to the store hooks (paging,
        # persistence); `stores_messages` says persistent messages are written and
        # the queue is restored on restart.
        self.hooks = vhost.hooks
        self.tracked = vhost.hooks.active
        self.stores_messages = (
            durable and exclusive_owner is None and not name.startswith("amq.gen-")
        )
        # RabbitMQ's messages_persistent: in at enqueue, out in vhost.on_message_removed.
        self.persistent = 0
        self.persistent_bytes = 0
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_due = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

    # --- publishing and delivery (hot path) ---------------------------------

    def enqueue(self, message: Message, barrier: Any = None) -> bool:
        """Add a routed message; False when x-overflow=reject-publish turned it away.

        `barrier` (a WriteBarrier) learns about the disk write of a persistent message.
        """
        self._seq += 1
        self.stats.publish += 1
        entry = QueueEntry(self._seq, message)
        if self.plain and message.ttl is None:
            if message.persistent and self.durable:
                self.persistent += 1
                self.persistent_bytes += message.size
            # The store may keep a long queue's message as its disk position only
            # (in ready.tail); then the entry object is dropped here.
            if self.tracked and self.hooks.message_enqueued(self, entry, barrier, True):
                self._paged_one(self.ready)  # type: ignore[arg-type]  # plain: one level
            else:
                self.ready.append(entry)
            if self.consumers:
                self.dispatch()
            return True
        return self._enqueue_with_extensions(entry, barrier)

    def restore(self, message: Message, location: Any) -> None:
        """Put back a message recovered from disk at startup (in publish order)."""
        self._seq += 1
        entry = QueueEntry(self._seq, message, location.redelivered)
        entry.location = location
        self._start_expiry(entry, time.monotonic())
        self.ready.append(entry)
        self.persistent += 1  # what the store recovers was persistent
        self.persistent_bytes += message.size
        if self.dedup is not None:  # the ids come back with the messages
            self.dedup.add(message_dedup_id(message))

    def level_of(self, message: Message) -> ReadyMessages:
        """Where `message` waits: the queue's ReadyMessages, or its priority level's."""
        ready = self.ready
        if type(ready) is ReadyMessages:
            return ready
        return ready.level_for(message)  # type: ignore[union-attr]

    def _ready_levels(self) -> list[ReadyMessages]:
        ready = self.ready
        return ready.levels if type(ready) is PriorityReadyMessages else [ready]  # type: ignore[union-attr,list-item]

    def tail_for(self, message: Message) -> PagedTail | None:
        """The paged tail `message` would join, if its level has one yet (the store asks)."""
        return self.level_of(message).tail

    def attach_tail(self, message: Message, tail: PagedTail) -> None:
        """The store's paged tail for `message`'s level (it creates one when the level
        first pages a message)."""
        self.level_of(message).tail = tail

    def restore_tail(self, tail: PagedTail, level: int | None = None) -> None:
        """Put back recovered messages as a paged tail (of priority `level`, for a
        priority queue), without reading them: they are read when they near the
        head. TTLs, if any, then count from this moment, as for restore()."""
        ready = self.ready if level is None else self.ready.levels[level]  # type: ignore[union-attr]
        assert type(ready) is ReadyMessages, "a tail belongs to one level"
        ready.restored_at = time.monotonic()
        ready.restored_left = tail.n
        ready.tail = tail
        self._tail_starts(ready, self._seq)
        # Numbers stay ahead of every tail message, as if each had been enqueued.
        self._seq += tail.n
        ready.n += tail.n
        if ready is not self.ready:
            self.ready.n += tail.n
        self.persistent += tail.n  # what the store recovers was persistent
        self.persistent_bytes += tail.nbytes

    def _paged_one(self, ready: ReadyMessages) -> None:
        """Message number self._seq went into `ready`'s paged tail (the store put it there)."""
        if ready.paged == 1:  # the first one
            self._tail_starts(ready, self._seq - 1)
        ready.n += 1
        if ready is not self.ready:
            self.ready.n += 1

    def _tail_starts(self, ready: ReadyMessages, before: int) -> None:
        # Read back, tail items are numbered on from `before`: after every entry of
        # the level's head, whose numbers are all below the tail's.
        if ready.loader is None:
            ready.loader = partial(self._load_tail, ready)
            ready.dropper = partial(self._drop_tail, ready)
        if before > ready.tail_seq:
            ready.tail_seq = before

    @property
    def can_page(self) -> bool:
        """Whether a restart may keep this queue's messages as locations only, and a
        durable fan-out may share one record with it (the store asks). Not with
        deduplication: a restart reads every message back to learn its id."""
        return self.pageable and self.dedup is None

    def _start_expiry(self, entry: QueueEntry, now: float) -> None:
        ttl = self.options.message_ttl
        message_ttl = entry.message.ttl
        if message_ttl is not None and (ttl is None or message_ttl < ttl):
            ttl = message_ttl
        if ttl is not None:
            entry.expires_at = now + ttl / 1000.0
            self.expiring = True

    def _load_tail(self, ready: ReadyMessages, limit: int) -> list[QueueEntry]:
        """A ReadyMessages' loader: QueueEntries for its tail's next `limit` items.

        Sequence numbers only order requeued entries among themselves, so numbering
        on from the last materialised one keeps the original order."""
        items = self.vhost.hooks.load_tail(ready.tail, limit)
        entries = []
        seq = ready.tail_seq
        for item in items:
            if type(item) is not tuple:  # a held entry (of any QueueEntry class)
                seq = item.seq = max(seq + 1, item.seq)
                entries.append(item)
                continue
            location, message, expires_at = item
            seq += 1
            entry = QueueEntry(seq, message, location.redelivered)
            entry.location = location
            restored = ready.restored_left > 0
            if restored:
                ready.restored_left -= 1
            if expires_at:  # paged with its deadline
                entry.expires_at = expires_at
                self.expiring = True
            elif restored:
                # Recovered at startup (no deadline on disk): a TTL counts from the
                # restart. A message paged since had no TTL when it was queued, and
                # a TTL policy set later does not apply to it.
                self._start_expiry(entry, ready.restored_at)
            entries.append(entry)
        ready.tail_seq = seq
        return entries

    def _drop_tail(self, ready: ReadyMessages) -> list[QueueEntry]:
        """A ReadyMessages' dropper: free its tail's positions; held entries come back."""
        ready.restored_left = 0
        return self.vhost.hooks.drop_tail(ready.tail)

    def dispatch(self, check_expiry: bool = True) -> None:
        """Hand ready messages to consumers with spare capacity, round-robin."""
        ready = self.ready
        consumers = self.consumers
        top = self._top_priority
        check_expiry = check_expiry and self.expiring
        while ready.n and consumers:
            n = len(consumers)
            if n == 1:
                # The common case, without the round-robin arithmetic.
                best = consumers[0]
                if not (best.active and best.can_take()):
                    break
            else:
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
                    break
            if check_expiry and self._drop_expired_head():
                continue
            entry = ready.popleft()
            if entry is None:
                break  # what was left on disk was corrupt (and is dropped)
            if not best.no_ack:
                self.unacked += 1
            best.channel.deliver(best, self, entry)
        if self.throttled and ready.n <= _C_FLOW_RESUME:
            self.release_publishers()

    # --- publisher flow control ---------------------------------------------
    #
    # A publisher can hand the loop messages far faster than consumers take
    # them; unchecked, the queue grows without bound and consumers starve for
    # CPU. Like RabbitMQ's credit flow, a connection publishing into a queue
    # whose consumers are FLOW_LIMIT messages behind stops being read until the
    # backlog halves. Queues without consumers never throttle: they just fill.

    def consumers_behind(self) -> bool:
        # (Queue.consumers_behind, with `ready` a C field when compiled.)
        return bool(self.consumers) and self.ready.n > _C_FLOW_LIMIT

    def throttle(self, publisher: Publisher) -> None:
        """Remember a publisher that paused itself for this queue (it decided, in
        server.connection.maybe_throttle), to resume it when the backlog halves."""
        self.throttled.add(publisher)

    def release_publishers(self) -> None:
        waiting = self.throttled
        self.throttled = set()
        for connection in waiting:
            connection.resume_after_flow(self)

    def purge(self) -> list[QueueEntry]:
        paged = self.ready.paged
        entries = self._take_all_ready()
        if self.persistent:
            gone = [e.message.size for e in entries if e.message.persistent]
            self.persistent -= len(gone)
            self.persistent_bytes -= sum(gone)
            if paged and self.dedup is None:
                # A paged tail goes without an entry each: what is left is at most the
                # unacknowledged messages (exact when they are all persistent).
                self.persistent = min(self.persistent, self.unacked)
                if not self.persistent:
                    self.persistent_bytes = 0
        return entries

    def _take_all_ready(self) -> list[QueueEntry]:
        if self.dedup is not None:
            # Paged messages are read back so that their ids can be forgotten.
            entries = []
            ready = self.ready
            while ready.n:
                entry = ready.popleft()
                if entry is None:  # the rest of a tail was corrupt; `n` is recounted
                    continue
                entries.append(entry)
                self.dedup.forget(entry.message)
            return entries
        return self.ready.clear()

    def get(self) -> QueueEntry | None:
        """basic.get: the next ready message, if any."""
        self.touch()
        if self.expiring:
            self._drop_expired_head()
        if not self.ready:
            return None
        return self.ready.popleft()

    @property
    def message_count(self) -> int:
        if self.expiring:
            self._drop_expired_head()
        return len(self.ready)

    # --- extensions ---------------------------------------------------------

    def _enqueue_with_extensions(self, entry: QueueEntry, barrier: Any) -> bool:
        opts = self.options
        message = entry.message
        dedup = self.dedup
        key = None
        if dedup is not None and (key := message_dedup_id(message)) is not None and key in dedup:
            return True  # a duplicate of a message in the queue: dropped, still confirmed
        ttl = opts.message_ttl
        if message.ttl is not None and (ttl is None or message.ttl < ttl):
            ttl = message.ttl
        if ttl is not None:
            entry.expires_at = time.monotonic() + ttl / 1000.0
            self.expiring = True
        if self.expiring:
            self._drop_expired_head()  # so what is already dead does not count below
        limited = opts.max_length is not None or opts.max_length_bytes is not None
        if limited and opts.overflow != "drop-head" and self._would_overflow(message):
            if opts.overflow == "reject-publish-dlx":
                dead_letter.count(self.vhost, self, dead_letter.MAXLEN)
                dead_letter.dead_letter(self.vhost, self, message, dead_letter.MAXLEN)
            return False
        if message.persistent and self.durable:
            self.persistent += 1
            self.persistent_bytes += message.size
        # A queue with TTLs may page too: the deadline stays with the disk position.
        if self.tracked and self.vhost.hooks.message_enqueued(self, entry, barrier, self.pageable):
            self._paged_one(self.level_of(message))
        else:
            self.ready.append(entry)
        if dedup is not None:
            dedup.add(key)
        if self.consumers:
            # Expired entries ahead were just dropped; skipping the check here lets a
            # ready consumer still take a message with TTL 0, as RabbitMQ does.
            self.dispatch(check_expiry=False)
        if limited:
            self._drop_head_over_limit()
        if ttl is not None:
            self._drop_expired_head()
        return True

    def _would_overflow(self, message: Message) -> bool:
        opts = self.options
        if opts.max_length is not None and len(self.ready) >= opts.max_length:
            return True
        return (
            opts.max_length_bytes is not None
            and self.ready.bytes + message.size > opts.max_length_bytes
        )

    def _drop_head_over_limit(self) -> None:
        opts = self.options
        ready = self.ready
        while ready and (
            (opts.max_length is not None and len(ready) > opts.max_length)
            or (opts.max_length_bytes is not None and ready.bytes > opts.max_length_bytes)
        ):
            entry = ready.popleft()
            if entry is None:
                break  # what was left on disk was corrupt (and is dropped)
            self._discard(entry, dead_letter.MAXLEN)

    def _drop_expired_head(self, limit: int = 0) -> bool:
        """Drop expired messages at the head, at most `limit` (0: all); True if any
        went. Re-arms the expiry timer: at once if the limit stopped it."""
        ready = self.ready
        head = ready.peek()
        dropped = 0
        if head is not None and head.expires_at:
            now = time.monotonic()
            while head is not None and head.expires_at and head.expires_at <= now:
                self._discard(ready.popleft(), dead_letter.EXPIRED)
                dropped += 1
                if dropped == limit:
                    self._arm_expiry(now)
                    return True
                head = ready.peek()
        if head is not None and head.expires_at:
            self._arm_expiry(head.expires_at)
        return dropped > 0

    def _arm_expiry(self, due: float) -> None:
        if self._expiry_timer is not None and self._expiry_due <= due:
            return
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0.0, due - time.monotonic())
        self._expiry_due = due
        self._expiry_timer = loop.call_later(delay + 0.001, self._on_expiry_timer)

    def _on_expiry_timer(self) -> None:
        self._expiry_timer = None
        if not self.deleted:
            # A long queue's expired messages may have to be read back from disk (to
            # be dead-lettered): a batch per loop turn, so other work goes on.
            self._drop_expired_head(EXPIRE_BATCH)

    def _discard(self, entry: QueueEntry, reason: str) -> None:
        """A ready message leaves without delivery (expired, overflow): dead-letter it."""
        dead_letter.count(self.vhost, self, reason)
        if self.options.dead_letter_exchange is not None:
            dead_letter.dead_letter(self.vhost, self, self.with_body(entry), reason)
        self.vhost.on_message_removed(self, entry)

    def with_body(self, entry: QueueEntry) -> Message:
        """The entry's message with its body in memory (read back if it was paged out)."""
        message = entry.message
        if message.body is None:
            message = message.copy_with_body(self.vhost.hooks.load_body(entry))
        return message

    def apply_policy(self, arguments: dict[str, Any], options: QueueOptions) -> None:
        """New limits apply at once; a new TTL to messages from now on (as RabbitMQ,
        where a message's expiry is fixed when it is enqueued)."""
        old = self.options
        if options == old:
            return
        self.options = options
        self.plain = options.plain
        self.pageable = options.pageable
        if options.message_ttl is not None:
            self.expiring = True
        if options.max_length_bytes is not None and old.max_length_bytes is None:
            # Paged tails counted record bytes: from now on they count bodies exactly.
            for ready in self._ready_levels():
                if ready.tail is not None:
                    self.vhost.hooks.count_tail_bodies(ready.tail)
        if options.max_length is not None or options.max_length_bytes is not None:
            self._drop_head_over_limit()
        if options.expires != old.expires:
            self.touch()

    def touch(self) -> None:
        """The queue was used: restart its x-expires countdown."""
        expires = self.options.expires
        if expires is None or self.deleted:
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if not self.consumers:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(expires / 1000.0, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._idle_timer = None
        if self.vhost.hooks.recovering:
            self.touch()  # unused since the restart began: count again once it is back
            return
        if not self.deleted and not self.consumers:
            self.vhost.delete_queue(self)

    def stop_timers(self) -> None:
        if self.throttled:
            self.release_publishers()
        for timer in (self._expiry_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._expiry_timer = self._idle_timer = None

    # --- settlement ---------------------------------------------------------

    def settle(self, entry: QueueEntry) -> None:
        """A delivery was acked."""
        self.unacked -= 1
        self.removed(entry)

    def removed(self, entry: QueueEntry) -> None:
        """What vhost.on_message_removed does, in place: compiled, typed and a C call
        (the ack and the no-ack delivery of every message come here). Keep the two
        the same."""
        message = entry.message
        if message.persistent and self.persistent:  # counted in by a durable queue
            self.persistent -= 1
            self.persistent_bytes -= message.size
        if self.tracked:
            self.hooks.message_removed(self, entry)
        if self.dedup is not None:
            self.dedup.forget(message)

    def reject(self, entry: QueueEntry) -> None:
        """A delivery was rejected or nacked without requeue: dead-letter it."""
        self.unacked -= 1
        if not self.deleted:
            dead_letter.count(self.vhost, self, dead_letter.REJECTED)
        if self.options.dead_letter_exchange is not None and not self.deleted:
            dead_letter.dead_letter(self.vhost, self, self.with_body(entry), dead_letter.REJECTED)
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
        if not self.plain:
            self._drop_expired_head()

    # --- consumers ----------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        if self.options.single_active_consumer and any(c.active for c in self.consumers):
            consumer.active = False
        self.consumers.append(consumer)
        self.had_consumer = True
        self._top_priority = max(c.priority for c in self.consumers)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self._rr >= len(self.consumers):
            self._rr = 0
        self._top_priority = max((c.priority for c in self.consumers), default=0)
        if consumer.active and self.options.single_active_consumer and self.consumers:
            # Fail over to the longest-waiting consumer.
            self.consumers[0].active = True
        if not self.consumers:
            self.touch()
            if self.throttled:
                self.release_publishers()

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"

    def __repr__(self) -> str:
        return f"<ClassicQueue {self.name!r} ready={len(self.ready)} unacked={self.unacked}>"
