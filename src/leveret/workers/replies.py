"""Direct reply-to in a broker of workers: a reply reaches the requester's worker.

The channel that consumes `amq.rabbitmq.reply-to` lives on its connection's worker,
while the responder that publishes the reply may be connected to any worker. So a
worker's reply-to names carry the worker: the token of
`amq.rabbitmq.reply-to.<worker>.<random>` starts with the index of the worker that
made it. A reply published on another worker is sent there (the served op
`direct_reply`), on the same link as every other record between the two workers,
so replies from one responder arrive in the order published. One worker's own
replies take the registry's lookup as on one process.

As in RabbitMQ, a reply to a channel that has gone is dropped; a reply crossing to
another worker is not returned to a mandatory publisher (the responder's worker
cannot know the channel has gone without waiting for an answer).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from leveret.broker.direct_reply import PREFIX, DirectReplyRegistry, new_token
from leveret.workers import messages

if TYPE_CHECKING:
    from leveret.broker.message import Message
    from leveret.workers.mesh import Mesh


def _dropped(fut: asyncio.Future[Any]) -> None:
    """A reply's call that failed (the worker went down): the reply is dropped."""
    if not fut.cancelled():
        fut.exception()


class _RemoteReplyTarget:
    """The channel of another worker, as `_route_direct_reply` sees it."""

    closing = False

    def __init__(self, mesh: Mesh, worker: int) -> None:
        self.mesh = mesh
        self.worker = worker

    def deliver_reply(self, message: Message) -> None:
        data = messages.encode(message, message.body or b"")
        fut = self.mesh.call(self.worker, "direct_reply", data)
        fut.add_done_callback(_dropped)


class WorkerDirectReplies(DirectReplyRegistry):
    """The registry of one worker of several: its tokens name it, and a reply to
    another worker's token goes to that worker."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__()
        self.mesh = mesh
        self._mark = f"{mesh.index}."
        self._remote: dict[int, _RemoteReplyTarget] = {}
        mesh.serve("direct_reply", self._on_reply)

    def register(self, channel: Any) -> str:
        token = self._mark + new_token()
        self._by_token[token] = channel
        return token

    def lookup(self, routing_key: str) -> Any:
        token = routing_key[len(PREFIX) :]
        channel = self._by_token.get(token)
        if channel is not None:
            return channel
        worker, dot, _ = token.partition(".")
        if not dot or not worker.isdigit():
            return None
        index = int(worker)
        if index == self.mesh.index or index >= self.mesh.count:
            return None
        target = self._remote.get(index)
        if target is None:
            target = self._remote[index] = _RemoteReplyTarget(self.mesh, index)
        return target

    def _on_reply(self, peer: int, data: bytes) -> None:
        message = messages.decode(data)
        channel = self._by_token.get(message.routing_key[len(PREFIX) :])
        if channel is not None and not channel.closing:
            channel.deliver_reply(message)
