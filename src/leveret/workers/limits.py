"""Connection limits counted for the whole broker of workers.

RabbitMQ counts a vhost's and a user's `max-connections` over the whole node; a
broker of workers does the same by keeping one count, on worker 0 (the metadata
writer, [Metadata] in docs/workers.md):

- Worker 0 counts its own open connections (AMQP and MQTT) from its lists, as one
  process does, plus what every other worker told it it holds (`held[peer]`, by key
  `("v", vhost)` and `("u", user)`).
- A connection on another worker whose vhost or user has a limit asks worker 0
  (`admit`, the served op `limits_admit`) before it opens: worker 0 checks the limits
  against the whole count and, when they allow it, counts the connection at once, so
  two workers admitting at the same moment are answered one after the other and
  never both take the last slot. A connection without a limit is only told to
  worker 0 (`opened`), without waiting for an answer: a limit set later counts it.
- A counted connection that closes is told to worker 0 (`closed`); one handed to
  another worker moves its count there (`moved`).
- A user's `max-channels` is counted the same way: a channel.open on another worker
  of a user with the limit waits for worker 0's answer (`admit_channel`) before its
  open-ok; other channels opened and closed there are told (`channels`).
- When worker 0 loses its link to a worker (it died, or hung and was killed) it
  drops everything that worker held; when a worker links to worker 0 again (it or
  worker 0 restarted) it reports what it holds then (`limits_report`), which
  replaces the count worker 0 had for it.

While worker 0 is down a connection is admitted on its own worker's count alone
(it is reported once worker 0 is back), so limits do not stop a broker whose
writer restarts. `--workers 1` has no `LimitCounts` (`broker.limit_counts` is None).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.workers.mesh import Mesh

log = logging.getLogger("leveret.workers")

WRITER = 0
Key = tuple[str, str]  # ("v", vhost), ("u", user) or ("c", user): the user's channels
#: what `admit` refuses with: ("vhost", limit) or ("user", limit); None admits
Refusal = tuple[str, int] | None


def _keys(vhost: str, user: str) -> tuple[Key, Key]:
    return ("v", vhost), ("u", user)


class LimitCounts:
    """One worker's part in the broker-wide connection counts (see the module)."""

    def __init__(self, broker: Callable[[], Broker], mesh: Mesh) -> None:
        self._broker = broker
        self.mesh = mesh
        self.index = mesh.index
        #: worker 0: the connections each other worker holds, by key
        self.held: dict[int, Counter[Key]] = {}
        if self.index == WRITER:
            mesh.serve("limits_admit", self._serve_admit)
            mesh.serve("limits_opened", self._serve_opened)
            mesh.serve("limits_closed", self._serve_closed)
            mesh.serve("limits_report", self._serve_report)
            mesh.serve("limits_channel_admit", self._serve_channel_admit)
            mesh.serve("limits_channels", self._serve_channels)
            mesh.serve("limits_moved", self._serve_moved)
            mesh.peer_lost.append(self._peer_lost)
        else:
            mesh.peer_joined.append(self._peer_joined)

    @property
    def broker(self) -> Broker:
        return self._broker()

    # --- any worker ---------------------------------------------------------------

    def remote(self, key: Key) -> int:
        """Worker 0: the connections other workers hold under `key`."""
        return sum(counts[key] for counts in self.held.values())

    def limited(self, vhost: str, user: str) -> bool:
        """Whether a connection of `user` to `vhost` has a connection limit to check."""
        broker = self.broker
        v = broker.vhosts.get(vhost)
        if v is not None and v.limits.get("max-connections") is not None:
            return True
        account = broker.access.users.get(user)
        return account is not None and account.limit("max-connections") is not None

    def admit(self, vhost: str, user: str) -> asyncio.Future[Any]:
        """A worker other than 0: ask worker 0 to count a connection. The future's
        result is None (admitted and counted) or the refusal; PeerDown while worker 0
        is down (the connection is then admitted uncounted and reported later)."""
        return self.mesh.call(WRITER, "limits_admit", vhost, user)

    def opened(self, vhost: str, user: str, channels: int = 0) -> None:
        """A worker other than 0: tell worker 0 of a connection opened without a limit
        (or moved here with `channels` open channels)."""
        self._tell("limits_opened", vhost, user, channels)

    def closed(self, vhost: str, user: str, channels: int = 0) -> None:
        """A worker other than 0: tell worker 0 a counted connection closed (or moved
        away), with the channels it had counted."""
        self._tell("limits_closed", vhost, user, channels)

    def moved(self, to: int, vhost: str, user: str, channels: int) -> None:
        """A connection (with `channels` counted channels) was handed to worker `to`
        (workers/affinity.py): worker 0 moves its count in one step, so that no
        moment counts it on neither worker."""
        if self.index == WRITER:
            self._serve_opened(to, vhost, user, channels)
        else:
            self._tell("limits_moved", vhost, user, channels, to)

    def channel_limited(self, user: str) -> bool:
        account = self.broker.access.users.get(user)
        return account is not None and account.limit("max-channels") is not None

    def admit_channel(self, user: str) -> asyncio.Future[Any]:
        """A worker other than 0: ask worker 0 to count a channel of `user`; the
        future's result is None (admitted, counted) or the limit that refuses it."""
        return self.mesh.call(WRITER, "limits_channel_admit", user)

    def channels(self, user: str, delta: int) -> None:
        """A worker other than 0: `user` has `delta` more channels open here."""
        self._tell("limits_channels", user, delta)

    def _tell(self, op: str, *args: Any) -> None:
        if WRITER not in self.mesh.peers:
            return  # its restart drops the counts; our report after it has them right
        fut = self.mesh.call(WRITER, op, *args)
        fut.add_done_callback(_ignore)

    def _peer_joined(self, peer: int) -> None:
        if peer != WRITER:
            return
        counts: Counter[Key] = Counter()
        for conn in self.broker.connections_of():
            vhost = conn.vhost.name if conn.vhost is not None else None
            if vhost is None:
                continue
            for key in _keys(vhost, conn.user or ""):
                counts[key] += 1
            counts[("c", conn.user or "")] += getattr(conn, "channels_counted", 0)
        self._tell("limits_report", dict(counts))

    # --- worker 0 -----------------------------------------------------------------

    def refusal(self, vhost: str, user: str) -> Refusal:
        """Worker 0: which limit the next connection of `user` to `vhost` would pass,
        counting every worker's connections (RabbitMQ's order: the vhost's first)."""
        broker = self.broker
        v = broker.vhosts.get(vhost)
        limit = v.limits.get("max-connections") if v is not None else None
        if limit is not None:
            mine = len(broker.connections_of(vhost=vhost))
            if mine + self.remote(("v", vhost)) >= limit:
                return ("vhost", limit)
        account = broker.access.users.get(user)
        limit = account.limit("max-connections") if account is not None else None
        if limit is not None:
            mine = len(broker.connections_of(user=user))
            if mine + self.remote(("u", user)) >= limit:
                return ("user", limit)
        return None

    def _serve_admit(self, peer: int, vhost: str, user: str) -> Refusal:
        refused = self.refusal(vhost, user)
        if refused is None:
            self._serve_opened(peer, vhost, user)
        return refused

    def _serve_opened(self, peer: int, vhost: str, user: str, channels: int = 0) -> None:
        counts = self.held.setdefault(peer, Counter())
        for key in _keys(vhost, user):
            counts[key] += 1
        if channels:
            counts[("c", user)] += channels

    def _serve_closed(self, peer: int, vhost: str, user: str, channels: int = 0) -> None:
        for key in _keys(vhost, user):
            self._add(peer, key, -1)
        if channels:
            self._add(peer, ("c", user), -channels)

    def _add(self, peer: int, key: Key, delta: int) -> None:
        counts = self.held.setdefault(peer, Counter())
        n = counts[key] + delta
        if n > 0:
            counts[key] = n
        else:
            counts.pop(key, None)

    def channel_refusal(self, user: str) -> int | None:
        """Worker 0: the max-channels that refuses one more channel of `user`, counting
        every worker's channels; None when it may open."""
        account = self.broker.access.users.get(user)
        limit = account.limit("max-channels") if account is not None else None
        if limit is None:
            return None
        mine = sum(len(c.channels) for c in self.broker.connections_of(user=user))
        return limit if mine + self.remote(("c", user)) >= limit else None

    def _serve_channel_admit(self, peer: int, user: str) -> int | None:
        refused = self.channel_refusal(user)
        if refused is None:
            self._add(peer, ("c", user), 1)
        return refused

    def _serve_moved(self, peer: int, vhost: str, user: str, channels: int, to: int) -> None:
        self._serve_closed(peer, vhost, user, channels)
        if to != WRITER:  # (worker 0 counts its own from its lists)
            self._serve_opened(to, vhost, user, channels)

    def _serve_channels(self, peer: int, user: str, delta: int) -> None:
        self._add(peer, ("c", user), delta)

    def _serve_report(self, peer: int, counts: dict[Key, int]) -> None:
        self.held[peer] = Counter(counts)

    def _peer_lost(self, peer: int) -> None:
        self.held.pop(peer, None)


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a lost link is answered by the report after it
