"""What every queue type offers the rest of the broker.

The vhost, the channel and the store talk to a queue only through this
interface, so a new queue type (the stream, say) is a new module beside
`classic.py`, chosen by `x-queue-type`, rather than a branch inside the
classic queue.  Routing tells queues from exchanges by `type(dest) is Exchange`
(one class), never by the queue's class.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.broker.consumer import Consumer
    from leveret.broker.message import Message


# Ready messages behind a queue's consumers before its publishers are paused
# (server/publisher_pause.py; ClassicQueue resumes them at half).
FLOW_LIMIT = 4096


class QueueEntry:
    """One message's place in one queue (of any type: the classic queue, the stream
    and the types built on them; broker.queues.classic re-exports it)."""

    __slots__ = ("seq", "message", "redelivered", "expires_at", "delivered_at", "location")

    def __init__(self, seq: int, message: Message, redelivered: bool = False) -> None:
        self.seq = seq
        self.message = message  # message.body is None while the body is paged out to disk
        self.redelivered = redelivered
        self.expires_at = 0.0  # time.monotonic() deadline; 0 = never
        self.delivered_at = 0.0
        self.location: Any = None  # where the store keeps it, if it does

    def __lt__(self, other: QueueEntry) -> bool:
        return self.seq < other.seq

    def __hash__(self) -> int:
        # Entries hash by identity; said so because, compiled, a type with __lt__ and no
        # __hash__ would not be hashable (quorum keys a dict by entry).
        return object.__hash__(self)


class Queue:
    """Base of the queue types; the methods below are what each must implement."""

    # What every type sets in its __init__ (compiled, the first seven are C fields of
    # this class, declared in base.pxd; the rest each type keeps as it likes):
    #   vhost: VirtualHost; name: str; stats: MessageStats (broker.stats: the channel
    #   and the queue type count into it); consumers: list[Consumer]; deleted: bool;
    #   tracked: bool; unacked: int;
    #   durable, auto_delete, had_consumer, stores_messages: bool;
    #   exclusive_owner: Any; arguments: dict[str, Any]; bindings: set[Any].
    queue_type = "classic"
    # Whether the store may keep this queue's messages as disk locations alone
    # (see ClassicQueue.restore_tail); a type that can says so.
    can_page = False
    # Priority levels (x-max-priority); 0: none. The store keeps each level apart.
    max_priority = 0
    # The ids of x-message-deduplication (broker.queue_dedup), or None: most
    # queues never deduplicate and pay one `is None` test per removal.
    dedup = None  # PresentIds | None
    # Persistent messages in a durable queue, ready and unacknowledged, and their body
    # bytes (RabbitMQ's messages_persistent); a type that counts them sets them.
    persistent = 0
    persistent_bytes = 0
    # The store keeps every message of the queue, transient ones too (quorum queues).
    persists_all = False
    # A placeholder for a queue another worker owns (broker.queues.remote): the
    # channel calls the owner for what a local queue answers at once.
    remote = False
    # Whether basic.consume's `exclusive` flag holds (RabbitMQ's quorum queues ignore it).
    exclusive_consumers = True
    # Policy keys whose value replaces the queue's own argument (policies.py).
    policy_wins: tuple[str, ...] = ()

    def enqueue(self, message: Message, barrier: Any = None) -> bool:
        """Accept a routed message; False when the queue turned it away."""
        raise NotImplementedError

    def dispatch(self, check_expiry: bool = True) -> None:
        """Deliver to consumers with spare capacity."""
        raise NotImplementedError

    def get(self) -> QueueEntry | None:
        """basic.get."""
        raise NotImplementedError

    def settle(self, entry: QueueEntry) -> None:
        """An ack: the delivery is done."""
        raise NotImplementedError

    def removed(self, entry: QueueEntry) -> None:
        """`entry` left this queue for good (acked, delivered without ack, expired,
        dropped): the vhost's bookkeeping (vhost.on_message_removed). The classic
        queue does the same in place, typed (compiled, the channel's call is a C call)."""
        self.vhost.on_message_removed(self, entry)

    def consumers_behind(self) -> bool:
        """Whether publishers into this queue should pause: it has consumers and they
        are FLOW_LIMIT ready messages behind. Asked after every routed publish; a
        type whose ready list has no `n` overrides it (the classic queue does, to
        answer from C fields when compiled)."""
        return bool(self.consumers) and self.ready.n > FLOW_LIMIT  # type: ignore[attr-defined]

    def reject(self, entry: QueueEntry) -> None:
        """A reject or nack without requeue."""
        raise NotImplementedError

    def requeue(self, entries: Iterable[QueueEntry], dispatch: bool = True) -> None:
        """Deliveries returned unacked (nack/reject with requeue, channel closed)."""
        raise NotImplementedError

    def return_unacked(self, entries: Iterable[QueueEntry]) -> None:
        """The unacked deliveries of a channel that closed (or whose connection did);
        a type that tells these from a nack's returns says so."""
        self.requeue(entries, dispatch=False)

    def add_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def purge(self) -> list[QueueEntry]:
        """queue.purge: remove and return the ready messages."""
        raise NotImplementedError

    @property
    def message_count(self) -> int:
        raise NotImplementedError

    @staticmethod
    def check_declare(
        describe: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict
    ) -> None:
        """Refuse declarations this type cannot take (before the queue exists)."""

    def check_consume(self, prefetch: int, global_prefetch: int, no_ack: bool, args: dict) -> None:
        """Refuse a basic.consume this type cannot serve."""

    def apply_policy(self, arguments: dict[str, Any], options: Any) -> None:
        """Policies changed what this queue behaves by: `arguments` are its declared
        arguments merged with its policies, `options` (QueueOptions) their parse.
        `self.arguments` stays as declared (redeclaration compares those alone)."""

    def release(self) -> None:
        """The queue was deleted: free what it holds outside Python (files)."""

    def delivery_body(self, entry: QueueEntry) -> bytes:
        """The body to send for `entry` when the store has a part in it: read back if it
        was paged out, and a durable message marked delivered first, so that after a
        restart it comes back with redelivered=true. The channel calls this only for
        such entries; a transient message in RAM goes out without it."""
        hooks = self.vhost.hooks
        body = entry.message.body
        if body is None:
            body = hooks.load_body(entry)
        location = entry.location
        if location is not None and not location.redelivered:
            hooks.message_delivered(self, entry)
        return body

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"
