"""A queue that another worker owns, as the other workers of the broker see it.

In a broker of several worker processes (leveret.workers) every worker holds the
whole model's metadata, and each queue lives on one of them, its owner (`worker`).
The others keep a `RemoteQueue` under the queue's name in the vhost, so that
routing, bindings, passive declares and permission checks find it as they find a
local queue. Messages routed to it, consumers on it and their acks cross to the
owner over the worker link (leveret.workers.link); the owner's real queue does the
rest (ordering, durability, redelivery).

An exclusive queue is owned by the worker of its connection; elsewhere its
`exclusive_owner` is a `RemoteOwner`, which no local connection is, so every other
worker answers 405 RESOURCE_LOCKED for it as the owner does.

The data path goes through the vhost's `crossing` (a `Crossing`, below; the workers
package provides it as `leveret.workers.crossing.Crossing`): this module is the
model's side and imports nothing of the workers.

- A routed message: `enqueue` hands it to the crossing, which sends one PUBLISH per
  owner and message (the queues of a fan-out that the owner has join one record),
  taking `barrier.add()` so that the publisher's confirm (or its tx.commit-ok)
  waits for the owner's CONFIRM, sent once its queues hold the message (durably,
  for a persistent one). So a RemoteQueue counts as a queue that keeps transient
  messages too (`persists_all`): a transient message with publisher confirms is
  confirmed once the owner has it, as RabbitMQ confirms once the queue process
  took it; a nack says the owner refused it or went down first.
- Back-pressure: while the link to the owner is not writable, `consumers_behind`
  says so and the publishing connection pauses itself as for a queue backlog
  (server/publisher_pause.py); the crossing releases it when the link drains.
  So do they while the owner says its queue is FLOW_LIMIT messages behind its
  consumers (`behind`), until it says the queue drained.
- Deliveries come from the owner's queue, to a consumer registered there, as
  entries of this queue (`QueueEntry.seq` is the owner's delivery id); their acks,
  rejects and requeues go back as ACK and REJECT records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.errors import ModelError
from leveret.broker.queue_args import QueueOptions, parse_queue_arguments
from leveret.broker.queues.base import Queue, QueueEntry
from leveret.broker.queues.classic import ReadyMessages
from leveret.broker.stats import MessageStats

if TYPE_CHECKING:
    from leveret.broker.consumer import Consumer
    from leveret.broker.message import Message
    from leveret.broker.ports import Publisher
    from leveret.broker.vhost import VirtualHost


class Crossing(Protocol):
    """What a RemoteQueue asks of this worker's links (leveret.workers.crossing)."""

    def enqueue(self, queue: RemoteQueue, message: Message, barrier: Any) -> None:
        """Send `message` to `queue`'s owner (barrier.add() for its CONFIRM)."""

    def settle(self, queue: RemoteQueue, entry: QueueEntry, kind: str) -> None:
        """`entry` was acked ("ack"), rejected ("drop"), returned ("requeue") or
        returned by a channel that closed ("return")."""

    def writable(self, worker: int) -> bool:
        """Whether the link to `worker` takes more without pausing its publishers."""

    def wait_writable(self, queue: RemoteQueue) -> None:
        """Call queue.release_publishers() once the link to its owner drains."""

    def forget_consumer(self, consumer: Consumer) -> None:
        """A consumer on the queue is gone here (its channel closed): the owner
        drops it and requeues what it had not acked."""


class RemoteOwner:
    """The connection (on another worker) that an exclusive queue belongs to."""

    __slots__ = ("worker", "connection")

    def __init__(self, worker: int, connection: str) -> None:
        self.worker = worker
        self.connection = connection  # the owner's name for it, for listings

    def __repr__(self) -> str:
        return f"RemoteOwner({self.worker}, {self.connection!r})"


class RemoteQueue(Queue):
    """Queue `name` of `vhost`, owned by worker `worker`."""

    stores_messages = False  # its messages are in the owner's store
    persists_all = True  # confirms wait for the owner (see the module's docstring)
    remote = True

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        worker: int,
        durable: bool,
        exclusive_owner: Any,
        auto_delete: bool,
        arguments: dict[str, Any],
        options: QueueOptions | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.worker = worker
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        # (The channel reads options.consumer_timeout for the deliveries it holds.)
        self.options = options if options is not None else _options(arguments, self.describe())
        self.queue_type = arguments.get("x-queue-type", "classic")
        self.stats = MessageStats()
        self.consumers = []
        self.deleted = False
        self.tracked = False
        self.unacked = 0
        # Never set: auto-delete is the owner's decision (its queue had the consumers).
        self.had_consumer = False
        self.bindings: set[Any] = set()
        self.ready = ReadyMessages()  # always empty: the messages wait on the owner
        self.throttled: set[Publisher] = set()  # publishers paused for the owner's link
        # The owner said its queue is FLOW_LIMIT messages behind its consumers (until
        # it drains): publishers here pause as they would for a local queue.
        self.behind = False
        self._crossing: Crossing | None = getattr(vhost, "crossing", None)

    @property
    def crossing(self) -> Crossing:
        crossing = self._crossing
        if crossing is None:
            crossing = self._crossing = self.vhost.crossing
            if crossing is None:
                raise RuntimeError(f"{self.describe()} is remote, but no worker mesh runs")
        return crossing

    # --- messages -----------------------------------------------------------------

    def enqueue(self, message: Message, barrier: Any = None) -> bool:
        self.stats.publish += 1
        (self._crossing or self.crossing).enqueue(self, message, barrier)
        return True

    def dispatch(self, check_expiry: bool = True) -> None:
        """The owner dispatches."""

    def get(self) -> QueueEntry | None:
        raise RuntimeError("basic.get on a remote queue is a call to its owner")

    def purge(self) -> list[QueueEntry]:
        return []  # queue.purge calls the owner (leveret.workers.crossing)

    # --- settlement: to the owner -------------------------------------------------

    def settle(self, entry: QueueEntry) -> None:
        self.unacked -= 1
        (self._crossing or self.crossing).settle(self, entry, "ack")

    def removed(self, entry: QueueEntry) -> None:
        """A delivery without ack: the owner took it out when it sent it."""

    def reject(self, entry: QueueEntry) -> None:
        self.unacked -= 1
        self.crossing.settle(self, entry, "drop")

    def requeue(self, entries: Iterable[QueueEntry], dispatch: bool = True) -> None:
        crossing = self.crossing
        for entry in entries:
            self.unacked -= 1
            crossing.settle(self, entry, "requeue")

    def return_unacked(self, entries: Iterable[QueueEntry]) -> None:
        """A closed channel's deliveries: the owner's queue takes them back as its type
        takes a closed channel's (a quorum queue: to the front, counted)."""
        crossing = self.crossing
        for entry in entries:
            self.unacked -= 1
            crossing.settle(self, entry, "return")

    # --- consumers: registered on the owner too -----------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        self.crossing.forget_consumer(consumer)

    # --- publisher flow: the link to the owner ------------------------------------

    def throttle(self, publisher: Publisher) -> None:
        self.throttled.add(publisher)
        if not self.crossing.writable(self.worker):
            self.crossing.wait_writable(self)

    def release_publishers(self) -> None:
        waiting = self.throttled
        self.throttled = set()
        for connection in waiting:
            connection.resume_after_flow(self)

    def stop_timers(self) -> None:
        if self.throttled:
            self.release_publishers()

    def touch(self) -> None:
        """Declared again: the owner keeps the queue's x-expires clock."""

    def consumers_behind(self) -> bool:
        """Whether publishers pause: the owner's queue is far behind its consumers, or
        the link to the owner holds more than it should."""
        return self.behind or not (self._crossing or self.crossing).writable(self.worker)

    @property
    def message_count(self) -> int:
        return 0  # the owner's count; what asks for it asks the owner

    def describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"


def _options(arguments: dict[str, Any], describe: str) -> QueueOptions:
    try:
        return parse_queue_arguments(arguments, describe)
    except ModelError:  # the owner took them; what this build cannot read is its own
        return QueueOptions()


def install(vhost: VirtualHost, queue: RemoteQueue) -> None:
    """Put `queue` into `vhost` as the placeholder of a queue another worker owns,
    with the bookkeeping `VirtualHost.declare_queue` does for a queue it makes (its
    transient messages count as stored, so confirms wait for the owner)."""
    vhost.queues[queue.name] = queue
    vhost.persisting += 1
