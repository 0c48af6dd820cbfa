"""Queues placed on one worker as every worker of a broker sees them: the real queue
on its owner and a `RemoteQueue` (with the same bindings) on each other worker.

`place` gives a queue a name that its worker owns by placement (a prefix and a
suffix: `mesh.owner_of`), then declares it:

- through a client on the owner's port when the broker replicates metadata
  (`broker.meta`): the declaration reaches every worker as in production;
- otherwise by putting the real queue into the owner's model and a RemoteQueue into
  the others' (`remote.install`): the state that replication makes, so that the
  data path can be tested on its own.
"""

from __future__ import annotations

from typing import Any

import pika

from leveret.broker.queues.remote import RemoteQueue, install
from leveret.workers.mesh import placement
from workers.inprocess import InProcessWorkers


def name_on(workers: InProcessWorkers, owner: int, prefix: str, vhost: str = "/") -> str:
    """`prefix` or `prefix-N`: a queue name that worker `owner` owns."""
    if placement(vhost, prefix, workers.count) == owner:
        return prefix
    for i in range(1, 10_000):
        name = f"{prefix}-{i}"
        if placement(vhost, name, workers.count) == owner:
            return name
    raise AssertionError(f"no name from {prefix!r} for worker {owner}")


def replicated(workers: InProcessWorkers) -> bool:
    return getattr(workers.nodes[0].broker, "meta", None) is not None


def place(
    workers: InProcessWorkers,
    owner: int,
    prefix: str,
    *,
    durable: bool = False,
    arguments: dict[str, Any] | None = None,
    bind: tuple[str, str] | None = None,
) -> str:
    """Declare a queue owned by worker `owner` (bound to `bind` = (exchange, routing
    key) if given) as every worker sees it; its name (`prefix`, or with a suffix)."""
    name = name_on(workers, owner, prefix)
    args = dict(arguments or {})
    if replicated(workers):
        conn = pika.BlockingConnection(pika.URLParameters(workers.url(owner)))
        try:
            ch = conn.channel()
            ch.queue_declare(name, durable=durable, arguments=args)
            if bind is not None:
                ch.queue_bind(name, bind[0], bind[1])
        finally:
            conn.close()
        return name

    def go() -> None:
        for index, node in enumerate(workers.nodes):
            vh = node.broker.vhosts["/"]
            if index == owner:
                queue: Any = vh.declare_queue(name, durable=durable, arguments=dict(args))
            else:
                queue = RemoteQueue(vh, name, owner, durable, None, False, dict(args))
                install(vh, queue)
            if bind is not None:
                vh.bind(vh.get_exchange(bind[0]), queue, bind[1], {})

    workers.call(go)
    return name


def declare_exchange(workers: InProcessWorkers, name: str, kind: str, *, durable: bool) -> None:
    """The exchange `name` on every worker."""
    if replicated(workers):
        conn = pika.BlockingConnection(pika.URLParameters(workers.url(0)))
        try:
            conn.channel().exchange_declare(name, kind, durable=durable)
        finally:
            conn.close()
        return

    def go() -> None:
        for node in workers.nodes:
            node.broker.vhosts["/"].declare_exchange(name, kind, durable=durable)

    workers.call(go)


def owned(workers: InProcessWorkers, owner: int, name: str, vhost: str = "/") -> Any:
    """The real queue on its owner (read it on the loop: `workers.call`)."""
    return workers.nodes[owner].broker.vhosts[vhost].queues[name]
