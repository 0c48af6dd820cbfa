"""Queue types, one module each, chosen by the `x-queue-type` argument.

`new_queue` is the factory the vhost calls; `QUEUE_TYPES` names the types a
client may declare (RabbitMQ's names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.errors import PreconditionFailed
from leveret.broker.queues.base import Queue
from leveret.broker.queues.classic import ClassicQueue, QueueEntry
from leveret.broker.queues.quorum import QuorumQueue
from leveret.broker.queues.stream import StreamQueue

if TYPE_CHECKING:
    from leveret.broker.queue_args import QueueOptions
    from leveret.broker.vhost import VirtualHost

__all__ = [
    "ClassicQueue",
    "Queue",
    "QueueEntry",
    "QuorumQueue",
    "StreamQueue",
    "new_queue",
    "QUEUE_CLASSES",
]

QUEUE_CLASSES: dict[str, type[Queue]] = {
    "classic": ClassicQueue,
    "quorum": QuorumQueue,
    "stream": StreamQueue,
}


def new_queue(
    vhost: VirtualHost,
    name: str,
    durable: bool,
    exclusive_owner: Any,
    auto_delete: bool,
    arguments: dict[str, Any],
    options: QueueOptions,
) -> Queue:
    """A queue of the type `arguments` ask for (validated by parse_queue_arguments)."""
    cls = check_new_queue(vhost, name, durable, exclusive_owner, auto_delete, arguments)
    return cls(vhost, name, durable, exclusive_owner, auto_delete, arguments, options)


def check_new_queue(
    vhost: VirtualHost,
    name: str,
    durable: bool,
    exclusive_owner: Any,
    auto_delete: bool,
    arguments: dict[str, Any],
) -> type[Queue]:
    """The class of a new queue, once its type accepts the declaration (also what
    checks a queue another worker of the broker is to own)."""
    cls = QUEUE_CLASSES[arguments.get("x-queue-type", "classic")]
    if name.startswith("amq.") and not getattr(cls, "server_named_ok", True):
        # amq.* names reach here only as names this broker generated (amq.gen-*)
        raise PreconditionFailed(
            f"Cannot declare a server-named queue for type {cls.type_module}"  # type: ignore[attr-defined]
        )
    cls.check_declare(
        f"queue '{name}' in vhost '{vhost.name}'",
        durable,
        exclusive_owner is not None,
        auto_delete,
        arguments,
    )
    return cls
