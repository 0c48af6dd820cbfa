"""This worker's links to every other worker of the broker, and what travels on them
besides messages: calls with answers, and the placement of queues.

A broker of N workers is a full mesh: one `Link` (an ordered, batched socket pair)
between each two workers, made by the supervisor. `Mesh` is one worker's view of
it. Records of each kind go to the handler registered for that kind (`on`), with
the peer they came from; `call` sends a REQUEST and returns the peer's REPLY, for
the operations that need one answer (a consume on a queue another worker owns, a
purge, a metadata change sent to the worker that writes metadata).

Call bodies are pickled: both ends are the same program, started together by the
supervisor, and the socket pair is private to them (nothing else can connect), so
the arguments (field tables with their decimals and timestamps, exceptions with
their AMQP reply codes) cross unchanged.

Placement: `owner_of` spreads queues over workers by a hash of vhost and name, so
every worker finds a queue's owner without asking. (A queue placed otherwise, an
exclusive queue on its connection's worker, carries its owner in its definition.)
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from leveret.workers.link import (
    REPLY,
    REQUEST,
    Link,
    Record,
    Reply,
    Request,
    open_link,
    socket_pair,
)

log = logging.getLogger("leveret.workers")

Handler = Callable[[int, Any], None]  # (peer, record)
Served = Callable[..., Any]  # (peer, *args) -> result, or an awaitable of it


class PeerDown(ConnectionError):
    """The worker a call or record was for is not running (or its link broke)."""

    def __init__(self, peer: int) -> None:
        super().__init__(f"worker {peer} is down")
        self.peer = peer


class RemoteError(Exception):
    """An exception the peer raised that could not cross as itself."""


def placement(vhost: str, name: str, count: int) -> int:
    """The worker that owns queue `name` of `vhost` in a broker of `count` workers.

    CRC-32 rather than Python's `hash`, which differs between processes."""
    if count == 1:
        return 0
    return zlib.crc32(f"{vhost}\x00{name}".encode()) % count


class Mesh:
    """One worker's links to the others (`links[peer]`), with dispatch by record kind."""

    def __init__(self, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} is not in 0..{count - 1}")
        self.index = index
        self.count = count
        self.links: dict[int, Link] = {}
        self._handlers: dict[int, Handler] = {}
        self._served: dict[str, Served] = {}
        self._calls: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        self._next_call = 0
        #: told (peer) when a peer's link is lost, after its pending calls failed
        self.peer_lost: list[Callable[[int], None]] = []
        #: told (peer) when a link to a peer is (re)attached
        self.peer_joined: list[Callable[[int], None]] = []

    # --- placement ----------------------------------------------------------------

    def owner_of(self, vhost: str, name: str) -> int:
        return placement(vhost, name, self.count)

    @property
    def peers(self) -> list[int]:
        """The workers this one has a live link to."""
        return [p for p, lk in self.links.items() if not lk.closed]

    # --- links --------------------------------------------------------------------

    async def connect(self, peer: int, sock: socket.socket) -> Link:
        """Run the link to `peer` over `sock` (this worker's end of their pair)."""
        if peer == self.index or not 0 <= peer < self.count:
            raise ValueError(f"worker {self.index} cannot link to worker {peer}")
        old = self.links.get(peer)
        if old is not None and not old.closed:
            # The peer restarted before this worker saw its old link break: what
            # waited on that link fails now, as for a link that broke.
            del self.links[peer]
            old.close()
            self._lost(peer, None)
        link: Link | None = None
        # What the peer wrote before this end was opened (a live worker writes to a
        # restarted one before it links) can arrive before `open_link` returns; it
        # is handled once the link is this peer's, so that its answers (replies,
        # confirms) have a link to go on.
        early: list[Record] | None = []

        def on_records(records: list[Record]) -> None:
            if early is not None:
                early.extend(records)
            else:
                self._records(peer, records)

        def lost(exc: BaseException | None) -> None:
            if link is not None and self.links.get(peer) is link:
                self._lost(peer, exc)

        link = await open_link(sock, on_records, on_lost=lost)
        self.links[peer] = link
        for tell in list(self.peer_joined):
            tell(peer)
        held, early = early, None
        if held:
            self._records(peer, held)
        if link.closed and self.links.get(peer) is link:
            self._lost(peer, link.error)  # it broke before it was this peer's
        return link

    def _lost(self, peer: int, exc: BaseException | None) -> None:
        log.warning("link to worker %d lost: %s", peer, exc or "closed")
        for cid, (to, fut) in list(self._calls.items()):
            if to == peer:
                del self._calls[cid]
                if not fut.done():
                    fut.set_exception(PeerDown(peer))
        for tell in list(self.peer_lost):
            tell(peer)

    def close(self) -> None:
        for link in self.links.values():
            link.close()

    # --- records ------------------------------------------------------------------

    def on(self, kind: int, handler: Handler) -> None:
        """Records of `kind` go to `handler(peer, record)` (one handler per kind)."""
        if kind in (REQUEST, REPLY):
            raise ValueError("requests and replies are the mesh's own (serve, call)")
        self._handlers[kind] = handler

    def link(self, peer: int) -> Link:
        """The live link to `peer`; raises PeerDown when there is none."""
        link = self.links.get(peer)
        if link is None or link.closed:
            raise PeerDown(peer)
        return link

    def send(self, peer: int, record: Record) -> None:
        self.link(peer).send(record)

    def _records(self, peer: int, records: list[Record]) -> None:
        handlers = self._handlers
        for record in records:
            kind = record.kind
            if kind == REQUEST:
                self._request(peer, record)  # type: ignore[arg-type]
            elif kind == REPLY:
                self._reply(record)  # type: ignore[arg-type]
            else:
                handler = handlers.get(kind)
                if handler is None:
                    log.error("no handler for %r from worker %d", record, peer)
                    continue
                try:
                    handler(peer, record)
                except Exception:
                    log.exception("handling %r from worker %d", record, peer)

    # --- calls --------------------------------------------------------------------

    def serve(self, op: str, handler: Served) -> None:
        """`call(peer, op, *args)` on another worker runs `handler(peer, *args)` here."""
        self._served[op] = handler

    def call(self, peer: int, op: str, *args: Any) -> asyncio.Future[Any]:
        """Run `op` on worker `peer`; the future has its result, or the exception it
        raised (PeerDown if the link is lost first)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        try:
            link = self.link(peer)
        except PeerDown as exc:
            fut.set_exception(exc)
            return fut
        self._next_call += 1
        cid = self._next_call
        self._calls[cid] = (peer, fut)
        link.send(Request(cid, pickle.dumps((op, args), protocol=pickle.HIGHEST_PROTOCOL)))
        return fut

    def _request(self, peer: int, request: Request) -> None:
        try:
            op, args = pickle.loads(request.body)
            handler = self._served[op]
            result = handler(peer, *args)
        except Exception as exc:  # the caller gets it
            self._answer(peer, request.id, False, exc)
            return
        if isinstance(result, Awaitable):
            task = asyncio.ensure_future(result)
            task.add_done_callback(lambda t: self._answer_task(peer, request.id, t))
        else:
            self._answer(peer, request.id, True, result)

    def _answer_task(self, peer: int, cid: int, task: asyncio.Future[Any]) -> None:
        if task.cancelled():
            self._answer(peer, cid, False, PeerDown(self.index))
        elif task.exception() is not None:
            self._answer(peer, cid, False, task.exception())
        else:
            self._answer(peer, cid, True, task.result())

    def _answer(self, peer: int, cid: int, ok: bool, value: Any) -> None:
        link = self.links.get(peer)
        if link is None or link.closed:
            return  # the caller is gone; its future failed with PeerDown there
        try:
            body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            ok, body = False, pickle.dumps(RemoteError(repr(value)))
        link.send(Reply(cid, ok, body))

    def _reply(self, reply: Reply) -> None:
        entry = self._calls.pop(reply.id, None)
        if entry is None:
            return
        fut = entry[1]
        if fut.done():
            return
        try:
            value = pickle.loads(reply.body)
        except Exception as exc:
            fut.set_exception(RemoteError(f"unreadable reply: {exc}"))
            return
        if reply.ok:
            fut.set_result(value)
        else:
            fut.set_exception(
                value if isinstance(value, BaseException) else RemoteError(repr(value))
            )


async def local_meshes(count: int) -> list[Mesh]:
    """`count` meshes in this process and loop, fully linked: a broker's workers
    without their processes, for tests of what crosses between workers."""
    meshes = [Mesh(i, count) for i in range(count)]
    for a in range(count):
        for b in range(a + 1, count):
            sa, sb = socket_pair()
            await meshes[a].connect(b, sa)
            await meshes[b].connect(a, sb)
    return meshes
