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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.queues.base import Queue
from leveret.broker.stats import MessageStats

if TYPE_CHECKING:
    from leveret.broker.queue_args import QueueOptions
    from leveret.broker.vhost import VirtualHost


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
        self.options = options
        self.queue_type = arguments.get("x-queue-type", "classic")
        self.stats = MessageStats()
        self.consumers = []
        self.deleted = False
        self.tracked = False
        self.unacked = 0
        self.had_consumer = False
        self.bindings: set[Any] = set()

    def touch(self) -> None:
        """Declared again: the owner keeps the queue's x-expires clock."""

    def consumers_behind(self) -> bool:
        return False

    @property
    def message_count(self) -> int:
        return 0  # the owner's count; what asks for it asks the owner

    def describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"
