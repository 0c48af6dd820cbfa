"""The sockets a supervisor makes for its workers: listening groups and the mesh.

Every worker accepts client connections on the broker's ports. The kernel spreads
them: each worker has its own listening socket, all bound to the same address with
`SO_REUSEPORT`, and Linux hashes each new connection to one socket of the group.
The supervisor makes the group and keeps every socket open, so a socket outlives
the worker that accepts on it: connections the kernel gives a dead worker's socket
wait in its backlog for the worker that replaces it, and the group (its port, too,
when the port was 0) stays the broker's across restarts.

`SO_REUSEPORT` lets any process of the same user join a group, so another broker
started on the same port would share it silently. Before the group is bound, a
probe without `SO_REUSEPORT` binds the address: it fails with EADDRINUSE when
anything listens there, and it picks the port when the port is 0.

Between each two workers there is one AF_UNIX stream socket pair (`mesh_pair`), the
byte stream that `link.Link` runs on.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

#: the listen backlog of each worker's socket, as the one-process listener's
BACKLOG = 1024


@dataclass
class ListeningGroup:
    """One configured listener's sockets: `sockets[worker]` is a list with one
    listening socket per address the host resolves to (usually one)."""

    host: str
    port: int
    kind: str
    sockets: list[list[socket.socket]]

    def fds(self, worker: int) -> list[int]:
        return [s.fileno() for s in self.sockets[worker]]

    def close(self) -> None:
        for per_worker in self.sockets:
            for sock in per_worker:
                sock.close()


def _addresses(host: str, port: int) -> list[tuple[int, tuple]]:
    """(family, sockaddr) of each address `host` resolves to for listening, as
    asyncio's `create_server` binds them ("" means every interface)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: list[tuple[int, tuple]] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        entry = (family, sockaddr[:2])
        if entry not in seen:
            seen.append(entry)
    return seen


def _socket(family: int, reuseport: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        # One socket per family, as asyncio does: IPv4 goes to the AF_INET socket.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


def _bind(sock: socket.socket, address: tuple[str, int]) -> None:
    """bind, with an error that names the address (as asyncio's create_server's)."""
    try:
        sock.bind(address)
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"error while attempting to bind on address {address!r}: "
            f"{(exc.strerror or str(exc)).lower()}",
        ) from None


def listening_group(host: str, port: int, kind: str, count: int) -> ListeningGroup:
    """`count` listening sockets per address of `host`:`port`, one for each worker,
    in one `SO_REUSEPORT` group; port 0 becomes the port the OS picks (the same for
    every worker). OSError (EADDRINUSE when something listens there) if it cannot."""
    addresses = _addresses(host, port)
    if not addresses:
        raise OSError(f"{host!r} resolves to no IPv4 or IPv6 address")
    made: list[socket.socket] = []
    per_worker: list[list[socket.socket]] = [[] for _ in range(count)]
    try:
        for family, sockaddr in addresses:
            probe = _socket(family, reuseport=False)
            try:
                _bind(probe, (sockaddr[0], port))
                port = probe.getsockname()[1]
            finally:
                probe.close()
            for worker in range(count):
                sock = _socket(family, reuseport=True)
                made.append(sock)
                _bind(sock, (sockaddr[0], port))
                sock.listen(BACKLOG)
                sock.setblocking(False)
                per_worker[worker].append(sock)
    except BaseException:
        for sock in made:
            sock.close()
        raise
    return ListeningGroup(host, port, kind, per_worker)


def mesh_pair() -> tuple[socket.socket, socket.socket]:
    """The two ends of the link between two workers."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
