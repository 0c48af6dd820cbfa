"""The quorum queue (`x-queue-type: quorum`), as RabbitMQ 3.10's on one node.

A quorum queue is a classic queue's machinery (ready messages, paging, TTLs,
length limits, consumer priorities, single active consumer, x-expires, the
store) with RabbitMQ's quorum rules on top. Every rule below was checked
against RabbitMQ 3.10.8 (tests/test_quorum.py runs against both):

- Declaration: durable only; another type's arguments and server-named queues
  are refused (vhost.declare_queue, queue_args.TYPE_ARGUMENTS).
- Every message is stored, whatever its delivery mode (`persists_all`): a quorum
  queue keeps transient messages across a restart too.
- Returned messages (nack or reject with requeue, basic.recover) count a
  delivery: `x-delivery-count` goes up by one each time. Where they go back
  depends on `x-delivery-limit`, as in RabbitMQ 3.10 (which turns a return into
  a fresh enqueue when no limit is set): without a limit to the back of the
  queue, with one to the front (in the order returned). Messages a closed
  channel held go back to the front either way, counted too.
- A message returned more than `x-delivery-limit` times is dead-lettered with
  reason `delivery_limit` (dropped without a dead-letter exchange). RabbitMQ
  checks no type for the argument: a negative limit trips on the first return,
  one that is not a number never trips (but still sends returns to the front).
- `x-delivery-count` is on every redelivery, and on every basic.get (0 the
  first time), in a headers table sorted by key, as RabbitMQ rewrites it. The
  stored message keeps the publisher's header: a dead-lettered copy has none.
- `x-overflow: reject-publish` takes messages while the queue is at or under
  its limit and refuses publishes once it is over, until it is back under 80%
  (RabbitMQ's soft limit); `reject-publish-dlx` acts as `drop-head`.
- Dead-lettering is at-most-once, or at-least-once (`x-dead-letter-strategy`,
  with a dead-letter exchange and `x-overflow: reject-publish`; otherwise
  RabbitMQ falls back to at-most-once): the message stays in the queue, as
  `messages_dlx`, until every target queue has it on disk, and is retried while
  any target refuses it or none is routed to.
- Exclusive consumers are not exclusive, and a channel with a global prefetch
  limit cannot consume (540), as in RabbitMQ 3.10.

The delivery count survives a restart without a write per delivery: the
store's DELIVERED record already says "delivered at least once", which after
a restart is a count of 1 (RabbitMQ counts the delivery a stopped consumer held
as returned); only when a message that was returned goes out again does the
store write its count after that delivery (`message_redelivered`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from leveret.broker import dead_letter
from leveret.broker.durability import WriteBarrier
from leveret.broker.errors import NotSupported, PreconditionFailed, ResourceLocked
from leveret.broker.message import Message
from leveret.broker.queue_args import TYPE_ARGUMENTS, QueueOptions
from leveret.broker.queues.classic import ClassicQueue, QueueEntry, ReadyMessages
from leveret.protocol.fieldtable import Long, encode_value, join_table, split_table
from leveret.protocol.properties import FLAG_HEADERS, rewrite_header, split_properties

if TYPE_CHECKING:
    from leveret.broker.queues.base import Queue
    from leveret.broker.vhost import VirtualHost

DELIVERY_LIMIT = "delivery_limit"  # the dead-letter reason
SOFT_LIMIT = 0.8  # reject-publish lets publishers in again under this share of the limit
# How often at-least-once dead-lettering tries again for messages no target took:
# RabbitMQ's dead_letter_worker_publisher_confirm_timeout (3 minutes).
RETRY_INTERVAL = 180.0
_COUNT_KEY = "x-delivery-count"


class QuorumEntry(QueueEntry):
    """A quorum queue's entry once it has a delivery count (returned, read back after a
    restart, or taken by basic.get): `message` is what goes out, with the
    `x-delivery-count` header; `original` is the message as stored and dead-lettered."""

    __slots__ = ("count", "original")

    def __init__(self, entry: QueueEntry, count: int, original: Message) -> None:
        super().__init__(entry.seq, with_delivery_count(original, count), entry.redelivered)
        self.expires_at = entry.expires_at
        self.delivered_at = entry.delivered_at
        self.location = entry.location
        self.count = count
        self.original = original


def with_delivery_count(message: Message, count: int) -> Message:
    """A copy of `message` whose headers table has `x-delivery-count` (a long) and is
    sorted by key, as RabbitMQ sets the header; every other property keeps its bytes."""
    present = split_properties(message.header)
    table = split_table(present[FLAG_HEADERS]) if FLAG_HEADERS in present else {}
    table[_COUNT_KEY] = encode_value(Long(count))
    ordered = dict(sorted(table.items(), key=lambda item: item[0].encode()))
    copy = message.paged_copy()
    copy.body = message.body
    copy.set_header(rewrite_header(message.header, {FLAG_HEADERS: join_table(ordered)}))
    return copy


def stored_message(entry: QueueEntry) -> Message:
    """The message as it was published (without a delivery-count header)."""
    return entry.original if type(entry) is QuorumEntry else entry.message  # type: ignore[attr-defined]


class _DeadLettering:
    """A message on its way to its dead-letter targets (at-least-once): which targets
    have it on disk, which still need it, and whether a write is outstanding."""

    __slots__ = ("entry", "message", "reason", "settled", "waiting")

    def __init__(self, entry: QueueEntry, message: Message, reason: str) -> None:
        self.entry = entry
        self.message = message  # the dead-lettered copy (x-death and all)
        self.reason = reason
        self.settled: set[Queue] = set()
        self.waiting = False


class QuorumQueue(ClassicQueue):
    queue_type = "quorum"
    # RabbitMQ's module name, in its texts ("... for type rabbit_quorum_queue")
    type_module = "rabbit_quorum_queue"
    server_named_ok = False  # "Cannot declare a server-named queue for type ..."
    # Redeclaration compares these, in this order (RabbitMQ's list for quorum queues).
    equivalence_args = TYPE_ARGUMENTS["quorum"]
    # The store keeps every message of this queue, persistent or not.
    persists_all = True
    # basic.consume's `exclusive` flag is ignored, as RabbitMQ 3.10's quorum queues do.
    exclusive_consumers = False
    # RabbitMQ's quorum queues take these from a policy over their own arguments.
    policy_wins = ("overflow", "expires")

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        durable: bool = True,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        options: QueueOptions | None = None,
    ) -> None:
        super().__init__(
            vhost,
            name,
            durable,
            exclusive_owner,
            auto_delete,
            arguments,
            _quorum_options(options or QueueOptions()),
        )
        self.stores_messages = durable  # always: declaration refuses anything else
        # reject-publish: over the limit, publishes are refused until under SOFT_LIMIT.
        self.rejecting = False
        # At-least-once dead-lettering in progress, by entry; their bytes.
        self.dead_lettering: dict[QueueEntry, _DeadLettering] = {}
        self.dead_lettering_bytes = 0
        self._retry_timer: asyncio.TimerHandle | None = None
        self._configure()

    # --- declaration and consuming ----------------------------------------------

    @staticmethod
    def check_declare(
        describe: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict
    ) -> None:
        """RabbitMQ's checks, in its order: auto-delete, exclusive, durable."""
        for bad, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                          (not durable, "non-durable")):  # fmt: skip
            if bad:
                raise PreconditionFailed(f"invalid property '{name}' for {describe}")

    def check_consume(self, prefetch: int, global_prefetch: int, no_ack: bool, args: dict) -> None:
        if global_prefetch:
            raise NotSupported(f"{self.describe()} does not support global qos")

    def _configure(self) -> None:
        """What the options mean here: the delivery limit and the dead-letter strategy."""
        opts = self.options
        limit = opts.delivery_limit
        if limit is None:
            limit = self.vhost.default_delivery_limit  # a server setting (RabbitMQ 4's 20)
        # Where returns go and when they trip: see the module docstring.
        self.front_returns = limit is not None
        numeric = isinstance(limit, int | float) and not isinstance(limit, bool)
        self.delivery_limit = limit if numeric else None
        self.at_least_once = (
            opts.dead_letter_strategy == "at-least-once"
            and opts.dead_letter_exchange is not None
            and opts.overflow == "reject-publish"
        )

    def apply_policy(self, arguments: dict[str, Any], options: QueueOptions) -> None:
        super().apply_policy(arguments, _quorum_options(options))
        self._configure()
        self._check_rejecting()
        if self.dead_lettering and not self.at_least_once:
            self._dead_letter_now()

    # --- publishing: x-overflow ------------------------------------------------

    def _would_overflow(self, message: Message) -> bool:
        """reject-publish: refused only while the queue is marked over its limit."""
        if self.rejecting:
            self._check_rejecting()
        return self.rejecting

    def _drop_head_over_limit(self) -> None:
        if self.options.overflow == "reject-publish":
            if not self.rejecting and self._over_limit():
                self.rejecting = True  # this message was taken; the next are not
            return
        super()._drop_head_over_limit()

    def _over_limit(self) -> bool:
        opts = self.options
        ready = self.ready
        return (
            opts.max_length is not None and ready.n + len(self.dead_lettering) > opts.max_length
        ) or (
            opts.max_length_bytes is not None
            and ready.bytes + self.dead_lettering_bytes > opts.max_length_bytes
        )

    def _check_rejecting(self) -> None:
        """Let publishers in again once the queue is under SOFT_LIMIT of every limit."""
        if not self.rejecting:
            return
        opts = self.options
        n = self.ready.n + len(self.dead_lettering)
        nbytes = self.ready.bytes + self.dead_lettering_bytes
        if opts.overflow != "reject-publish" or (
            (opts.max_length is None or n <= int(opts.max_length * SOFT_LIMIT))
            and (opts.max_length_bytes is None or nbytes <= int(opts.max_length_bytes * SOFT_LIMIT))
        ):
            self.rejecting = False

    def dispatch(self, check_expiry: bool = True) -> None:
        super().dispatch(check_expiry)
        if self.rejecting:
            self._check_rejecting()

    # --- delivery ----------------------------------------------------------------

    def get(self) -> QueueEntry | None:
        """basic.get: the message always carries `x-delivery-count` (0 the first time).
        Not with single active consumer, as RabbitMQ 3.10 refuses it (405)."""
        if self.options.single_active_consumer:
            raise ResourceLocked(
                f"cannot obtain access to locked {self.describe()}. basic.get operations "
                "are not supported by quorum queues with single active consumer"
            )
        entry = super().get()
        if entry is None:
            return None
        if self.rejecting:
            self._check_rejecting()
        if type(entry) is not QuorumEntry:
            entry = QuorumEntry(entry, 0, entry.message)
        return entry

    def delivery_body(self, entry: QueueEntry) -> bytes:
        body = super().delivery_body(entry)
        if type(entry) is QuorumEntry and entry.count and entry.location is not None:  # type: ignore[attr-defined]
            # After this delivery the message is acked, or returned (count + 1), or the
            # broker stops first, which after a restart counts as a return too.
            self.vhost.hooks.message_redelivered(self, entry, entry.count + 1)  # type: ignore[attr-defined]
        return body

    def with_body(self, entry: QueueEntry) -> Message:
        message = stored_message(entry)
        if message.body is None:
            message = message.copy_with_body(self.vhost.hooks.load_body(entry))
        return message

    # --- returns --------------------------------------------------------------

    def requeue(self, entries: Iterable[QueueEntry], dispatch: bool = True) -> None:
        """nack/reject with requeue, basic.recover: counted; back or front (see above)."""
        self._return(entries, self.front_returns, dispatch)

    def return_unacked(self, entries: Iterable[QueueEntry]) -> None:
        """A closed channel's unacked messages: counted, and to the front."""
        self._return(entries, True, False)

    def _return(self, entries: Iterable[QueueEntry], front: bool, dispatch: bool) -> None:
        if self.deleted:
            return
        limit = self.delivery_limit
        ready = self.ready
        for entry in entries:
            self.unacked -= 1
            original = stored_message(entry)
            count = (entry.count if type(entry) is QuorumEntry else 0) + 1  # type: ignore[attr-defined]
            if limit is not None and count > limit:
                self._dead_letter_entry(entry, DELIVERY_LIMIT)
                continue
            returned = QuorumEntry(entry, count, original)
            returned.redelivered = True
            self._seq += 1
            returned.seq = self._seq  # the front holds returns in the order they came
            if front:
                ready.put_back(returned)
            else:
                ready.append(returned)  # type: ignore[arg-type]  # no priorities here
        if dispatch and self.consumers:
            self.dispatch()
        if not self.plain:
            self._drop_expired_head()

    # --- reading back after a restart ----------------------------------------------

    def _load_tail(self, ready: ReadyMessages, limit: int) -> list[QueueEntry]:
        entries = super()._load_tail(ready, limit)
        hooks = self.vhost.hooks
        for i, entry in enumerate(entries):
            if type(entry) is QueueEntry and entry.location is not None:
                count = hooks.delivery_count(entry)
                if count:
                    counted = entries[i] = QuorumEntry(entry, count, entry.message)
                    counted.redelivered = True
        return entries

    # --- leaving the queue ------------------------------------------------------

    def reject(self, entry: QueueEntry) -> None:
        """A reject or nack without requeue: dead-lettered (reason `rejected`)."""
        self.unacked -= 1
        if self.deleted:
            self.vhost.on_message_removed(self, entry)
            return
        self._dead_letter_entry(entry, dead_letter.REJECTED)

    def _discard(self, entry: QueueEntry, reason: str) -> None:
        """Expired or dropped by drop-head."""
        self._dead_letter_entry(entry, reason)

    def _dead_letter_entry(self, entry: QueueEntry, reason: str) -> None:
        if self.at_least_once:
            dead_letter.count(self.vhost, self, reason, strategy="at_least_once")
            self._dead_letter_at_least_once(entry, reason)
            return
        dead_letter.count(self.vhost, self, reason)
        if self.options.dead_letter_exchange is not None:
            dead_letter.dead_letter(self.vhost, self, self.with_body(entry), reason)
        self.vhost.on_message_removed(self, entry)

    # --- at-least-once dead-lettering ------------------------------------------

    def _dead_letter_at_least_once(self, entry: QueueEntry, reason: str) -> None:
        copy = dead_letter.dead_letter_message(self.with_body(entry), self, reason)
        pending = _DeadLettering(entry, copy, reason)
        self.dead_lettering[entry] = pending
        self.dead_lettering_bytes += copy.size
        self._forward(pending)

    def _forward(self, pending: _DeadLettering) -> None:
        """Offer the copy to every target that does not have it yet; the entry leaves
        this queue once each has it on disk (`_forwarded`)."""
        targets = dead_letter.targets(self.vhost, self, pending.message, pending.reason)
        todo = [q for q in targets if q not in pending.settled]
        if not todo:
            if pending.settled:
                # Every target has it, or the routes went away after one took it
                # (RabbitMQ's rule too: one confirm is enough then).
                self._forwarded(pending)
            else:
                self._retry_later()  # no route (or no such exchange): try again later
            return
        taken: list[Queue] = []
        refused = False

        def done(error: BaseException | None) -> None:
            pending.waiting = False
            if error is None:
                pending.settled.update(taken)
            if pending.entry not in self.dead_lettering:
                return  # the queue was purged or deleted meanwhile
            if refused or error is not None:
                self._retry_later()
            else:
                self._forwarded(pending)

        barrier = WriteBarrier(done)
        pending.waiting = True
        for target in todo:
            if target.enqueue(pending.message, barrier):
                taken.append(target)
            else:
                refused = True  # x-overflow: reject-publish at the target
        barrier.seal()

    def _forwarded(self, pending: _DeadLettering) -> None:
        entry = pending.entry
        if self.dead_lettering.pop(entry, None) is None:
            return
        self.dead_lettering_bytes -= pending.message.size
        self.vhost.on_message_removed(self, entry)
        dead_letter.count(self.vhost, self, "confirmed", strategy="at_least_once")
        if self.rejecting:
            self._check_rejecting()

    def _retry_later(self) -> None:
        if self._retry_timer is None and not self.deleted:
            loop = asyncio.get_running_loop()
            self._retry_timer = loop.call_later(RETRY_INTERVAL, self._retry)

    def _retry(self) -> None:
        self._retry_timer = None
        if self.deleted:
            return
        for pending in list(self.dead_lettering.values()):
            if not pending.waiting:
                self._forward(pending)

    def _dead_letter_now(self) -> None:
        """The strategy changed to at-most-once: what waits goes as at-most-once would."""
        for entry, pending in list(self.dead_lettering.items()):
            del self.dead_lettering[entry]
            self.dead_lettering_bytes -= pending.message.size
            dead_letter.forward(self.vhost, self, pending.message, pending.reason, pending.settled)
            self.vhost.on_message_removed(self, entry)

    def purge(self) -> list[QueueEntry]:
        entries = super().purge()
        if self.rejecting:
            self._check_rejecting()
        return entries

    def stop_timers(self) -> None:
        super().stop_timers()
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        self.dead_lettering.clear()

    def __repr__(self) -> str:
        return f"<QuorumQueue {self.name!r} ready={len(self.ready)} unacked={self.unacked}>"


def _quorum_options(options: QueueOptions) -> QueueOptions:
    """The options as a quorum queue applies them: `reject-publish-dlx` is not a
    quorum overflow mode (RabbitMQ logs a warning and uses drop-head), and
    x-message-deduplication (the plugin's, for classic queues) does nothing here."""
    changes: dict[str, Any] = {}
    if options.overflow == "reject-publish-dlx":
        changes["overflow"] = "drop-head"
    if options.deduplication:
        changes["deduplication"] = False
    return dataclasses.replace(options, **changes) if changes else options
