"""The broker of a leading node that runs workers (`--workers N` in a cluster).

The node's `ClusterNode` runs in the supervisor process; when it leads, this class is
its broker in place of one `launcher.Node`: the supervisor of `workers/serve.py`, run
inside the node's event loop, with one more channel per worker start, a socket pair
whose worker end the worker's `WorkerTap` writes (`python -m leveret.worker
--tap-fd FD`) and whose other end the node's `Relay` reads (cluster/relay.py).

A worker that starts again while the node leads may have reported operations its
writer never wrote (it was killed between the two): the followers hold them, its own
disk does not. `on_restart` tells the node, which drops every follower link so that
each follower compares its files with the leader's again.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

from leveret.cluster.relay import Relay
from leveret.config import ServerConfig
from leveret.workers.control import send_cluster
from leveret.workers.serve import Workers

log = logging.getLogger("leveret.cluster")


def _shape(view: dict) -> tuple:
    """What of a cluster snapshot worker 0 must show at once (not the figures)."""
    keys = ("nodes", "running", "in_sync_followers", "term", "min_replicas")
    return tuple(str(view.get(k)) for k in keys)


class LeaderWorkers(Workers):
    """The workers of a leading node, their taps relayed to its replication stream."""

    handle_signals = False  # the node's own handlers stop it, and it stops these
    durable_state = None  # the stores are the workers' (a follower syncs through `Relay`)

    def __init__(
        self,
        config: ServerConfig,
        relay: Relay,
        on_restart: Callable[[int], None],
        log_level: str = "info",
    ) -> None:
        super().__init__(config, log_level)
        self.relay = relay
        self.on_restart = on_restart
        self._tap_ends: dict[int, socket.socket] = {}  # the worker's end, until it runs
        self._relaying: set[asyncio.Task[None]] = set()
        self._run: asyncio.Task[int] | None = None
        self._view_sent: tuple[socket.socket, dict] | None = None  # worker 0's last
        self._view_sent_at = 0.0

    def tell_cluster(self, view: dict) -> None:
        """Give worker 0, which serves the management API and Prometheus, the node's
        view of the cluster (cluster/view.py): at once when worker 0 is a new one or a
        node joined, left, stopped or started running, or the in-sync set or the term
        changed; a change of figures only (the followers' lag and their own reports,
        which change all the time under load) once a second at most. A full channel:
        the next call sends it."""
        channel = self.controls.get(0)
        if channel is None:
            return
        sent = self._view_sent
        if sent is not None and sent[0] is channel:
            if sent[1] == view:
                return
            if _shape(sent[1]) == _shape(view) and time.monotonic() - self._view_sent_at < 1.0:
                return
        try:
            if send_cluster(channel, view):
                self._view_sent = (channel, view)
                self._view_sent_at = time.monotonic()
        except OSError:
            pass  # worker 0 is exiting; its next start gets the view

    # --- as the node's broker ---------------------------------------------------------

    async def start(self, wait_for_recovery: bool = True) -> None:
        """Start every worker; return once all serve (their stores are recovered)."""
        self._run = asyncio.ensure_future(self.run())
        while not self.announced:
            if self._run.done():
                rc = self._run.result()  # raises what made it fail
                raise RuntimeError(f"the workers stopped before serving (exit status {rc})")
            await asyncio.sleep(0.05)

    @property
    def exited(self) -> bool:
        """The supervisor gave up (a worker that keeps dying): the node must not lead."""
        return self._run is not None and self._run.done()

    async def stop(self, reason: str = "") -> None:
        """Stop every worker (their clients get 320 CONNECTION_FORCED), then wait until
        the relay has read everything they reported."""
        run = self._run
        if run is None:
            return
        if not run.done() and self.supervisor is not None:
            log.info("cluster: stopping %d workers (%s)", self.count, reason or "stop")
            self.supervisor.stop()
        try:
            await run
        except Exception:  # noqa: BLE001 - its failure was logged; the node goes on
            log.exception("cluster: the workers' supervisor failed")
        if self._relaying:
            await asyncio.wait(set(self._relaying), timeout=10.0)

    # --- the supervisor's hooks -------------------------------------------------------

    def on_start(self, index: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._tap_ends[index] = theirs
        task = asyncio.get_running_loop().create_task(self._relay(index, ours))
        self._relaying.add(task)
        task.add_done_callback(self._relaying.discard)
        super().on_start(index)

    async def _relay(self, index: int, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        await self.relay.serve(index, reader, writer)

    def command(self, index: int) -> list[str]:
        return [*super().command(index), "--tap-fd", str(self._tap_ends[index].fileno())]

    def pass_fds(self, index: int) -> list[int]:
        return [*super().pass_fds(index), self._tap_ends[index].fileno()]

    def on_spawned(self, index: int) -> None:
        end = self._tap_ends.pop(index, None)
        if end is not None:
            end.close()  # the worker has its own copy (or never started)
        super().on_spawned(index)

    def _event(self, index: int, event: dict) -> None:
        again = self.announced and "ready" in event
        super()._event(index, event)
        if again:
            self.on_restart(index)

    def close(self) -> None:
        super().close()
        for end in self._tap_ends.values():
            end.close()
        self._tap_ends.clear()
