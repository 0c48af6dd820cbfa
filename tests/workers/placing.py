"""Queues placed on one worker as every worker of a broker sees them: the real queue
on its owner and a `RemoteQueue` (with the same bindings) on each other worker.

The tests of messages crossing between workers make that state themselves with
`place`, so that they test the data path alone; metadata replication makes the
same state from a client's declarations.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.queues.remote import RemoteQueue, install
from workers.inprocess import InProcessWorkers


def place(
    workers: InProcessWorkers,
    owner: int,
    name: str,
    *,
    durable: bool = False,
    arguments: dict[str, Any] | None = None,
    bind: tuple[str, str] | None = None,
    vhost: str = "/",
) -> None:
    """Declare queue `name` on worker `owner`, a RemoteQueue of it on the others, and
    bind it to `bind` = (exchange, routing key) on every worker."""
    args = dict(arguments or {})

    def go() -> None:
        for index, node in enumerate(workers.nodes):
            vh = node.broker.vhosts[vhost]
            if index == owner:
                queue: Any = vh.declare_queue(name, durable=durable, arguments=dict(args))
            else:
                queue = RemoteQueue(vh, name, owner, durable, None, False, dict(args))
                install(vh, queue)
            if bind is not None:
                vh.bind(vh.get_exchange(bind[0]), queue, bind[1], {})

    workers.call(go)


def declare_exchange(
    workers: InProcessWorkers, name: str, kind: str, *, durable: bool = False, vhost: str = "/"
) -> None:
    """The exchange `name` on every worker."""

    def go() -> None:
        for node in workers.nodes:
            node.broker.vhosts[vhost].declare_exchange(name, kind, durable=durable)

    workers.call(go)


def owned(workers: InProcessWorkers, owner: int, name: str, vhost: str = "/") -> Any:
    """The real queue on its owner (read it on the loop: `workers.call`)."""
    return workers.nodes[owner].broker.vhosts[vhost].queues[name]
