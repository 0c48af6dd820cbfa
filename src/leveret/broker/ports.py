"""What the model needs from the server and the store, as small typed interfaces,
and what packages above it may add to it (`Extension`).

The broker model (queues, consumers, flow control) hands work to objects it does
not own: a consumer's channel takes deliveries, a publishing connection is
resumed when a queue drains or the disk catches up, and paged-out bodies come back
from the store. Each is named here as a `typing.Protocol`, so calls go one way
(model → port), a reader sees exactly what is used, and the model can be driven in
a unit test by any object with these few members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.consumer import Consumer
    from leveret.broker.queues import Queue, QueueEntry


class DeliveryChannel(Protocol):
    """A consumer's channel, as its queue sees it (server.channel.Channel)."""

    deliverable: bool  # False while channel.flow, a full socket or closing stop deliveries
    global_prefetch: int  # basic.qos global=true; 0: no limit
    unacked_count: int

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        """Send basic.deliver for `entry`; it is the channel's until acked or requeued."""


class Publisher(Protocol):
    """A publishing connection that a queue paused (server.connection.ClientConnection).

    The connection pauses itself when a queue it publishes into is far behind
    (server.publisher_pause); the queue only remembers it and says when it drained.
    """

    def resume_after_flow(self, queue: Queue) -> None:
        """`queue` has drained (or is gone): it no longer holds this publisher back."""


class DiskWaiter(Protocol):
    """A publisher waiting for the store's write backlog to drain."""

    def resume_after_disk(self) -> None:
        """The backlog is short again."""


class PagedTail(Protocol):
    """A long queue's messages kept on disk only, in order (store.paged_index.PagedIndex).

    The store fills it and reads it back (DurabilityHooks.load_tail); the queue
    only counts it and, while it is not empty, puts entries it cannot page behind
    it so that the order holds.
    """

    n: int  # messages in the tail, held entries included
    nbytes: int  # what they count for in the queue's message bytes

    def hold(self, entry: QueueEntry, size: int) -> None:
        """Keep `entry` in its place behind the tail; it counts for `size` bytes."""


class Extension(Protocol):
    """Something a package above the model adds to every broker it is part of (the
    launcher passes them to `Broker`): runtime parameter components, policy keys.

    It is called with the new broker before its stored runtime parameters are read,
    so that those it validates are validated as they load. `leveret.links.register`
    is one (shovels, federation upstreams and their policy keys): the model never
    imports the packages that extend it.
    """

    def __call__(self, broker: Broker) -> None: ...
