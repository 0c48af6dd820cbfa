"""One worker process of `leveret server --workers N`: a node of the broker.

Started by the supervisor (`workers/serve.py`) as

    python -m leveret.worker --index I --count N --control-fd FD
        --listen-fds '[[FD, ...], ...]' --log-level LEVEL

with its settings, a pickled `ServerConfig` made for it (its own store dir, its
ports), in `LEVERET_WORKER_CONFIG`. It builds `launcher.Node(config, loop,
mesh=Mesh(I, N), wait_to_serve=True)` on the listening sockets it was passed (one
list per listener), starts it without accepting, tells the supervisor it is up once
its stored messages are back, then links to the other workers as the supervisor
hands it their socket pairs on the control channel (`control.py`): the first ones,
and a new one whenever a peer restarts (`Mesh.connect` replaces the link and fires
`peer_joined`). It reports its links and its sync with worker 0 (`Starting`), and
accepts clients when the supervisor says so: at a start of the whole broker, once
every worker is linked to every other and in sync; after a restart of this worker
alone, once it is.

It sits beside `launcher.py`, not in `workers/`: it builds a node, and the workers
package is below the launcher (the launcher gives each node its `Mesh`).

It stops as `leveret server` stops, on SIGTERM or SIGINT (clients get 320
CONNECTION_FORCED), and also when its control channel ends: the supervisor is gone
and nobody would restart or stop it. Its log lines name it (`worker I`). A start
that fails (a bad data dir, a port taken) exits non-zero with the reason logged, as
`leveret server` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from leveret.cluster.workertap import Cutter, WorkerTap
from leveret.config import ServerConfig
from leveret.workers.affinity import Handoffs
from leveret.workers.control import (
    cluster_view,
    event_line,
    is_serve,
    link_kind,
    link_pair,
    link_peer,
    ping_seq,
)
from leveret.workers.handoff import receive_connections
from leveret.workers.liveness import Probes
from leveret.workers.mesh import Mesh
from leveret.workers.serve import CONFIG_ENV, decode_config

log = logging.getLogger("leveret.workers")

#: A test hook (tests/workers/test_stuck_parts.py): while this variable names a file
#: holding "I J", worker I, at its next liveness ping, stops reading its link to
#: worker J (a reader stuck while the loop runs) and removes the file. Unset (always,
#: outside tests), nothing is read.
STUCK_LINK_ENV = "LEVERET_TEST_STUCK_LINK_FILE"

#: the exit status of a worker that gave up syncing with worker 0 (its supervisor
#: restarts it; a refused sync also stops the broker: `sync_failed` below)
EXIT_SYNC_FAILED = 3


class Starting:
    """A worker between its recovery and its first client: reports its links and its
    sync with worker 0 to the supervisor, which answers `serve` once every worker
    it waits for is linked to every other and in sync; then it accepts.

    Handoff channels (connections other workers move here) are attached only then:
    what they carry waits in them, as new connections wait in the backlog."""

    def __init__(self, node: Any, mesh: Mesh, control: socket.socket) -> None:
        self.node = node
        self.mesh = mesh
        self.control = control
        self.pairs: dict[int, int] = {}  # peer -> the supervisor's number of the live link
        self.serving = False
        self._handoffs: list[tuple[Any, int, socket.socket]] = []
        self._sent: dict[str, Any] | None = None
        self._tasks: set[asyncio.Task] = set()
        if node.metadata is not None:
            node.metadata.sync_watchers.append(self.report)
        # The first report: a worker restarted while no other runs has no link to wait for.
        self.report()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def synced(self) -> bool:
        """Worker 0: every worker it is linked to took its snapshot. Another: it
        follows worker 0's metadata."""
        meta = self.node.metadata
        if meta is None:
            return True
        if self.mesh.index == 0:
            return set(self.pairs) <= meta.synced
        return bool(meta.in_sync)

    def connected(self, task: asyncio.Task, peer: int, pair: int) -> None:
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.error("link to worker %d could not start: %s", peer, task.exception())
            return
        self.pairs[peer] = pair
        self.report()

    def lost(self, peer: int) -> None:
        self.pairs.pop(peer, None)
        self.report()

    def report(self) -> None:
        """Tell the supervisor this worker's links and sync, when they changed."""
        if self.serving:
            return
        event = {
            "linked": {str(p): n for p, n in sorted(self.pairs.items())},
            "synced": self.synced(),
        }
        if event == self._sent:
            return
        self._sent = event
        self.tell(event)

    def tell(self, event: dict[str, Any]) -> None:
        try:
            self.control.sendall(event_line(**event))
        except OSError as exc:  # the supervisor is gone: the control channel's end stops us
            log.warning("cannot tell the supervisor %s: %s", sorted(event), exc)

    def handoff(self, handoffs: Handoffs, peer: int, sock: socket.socket) -> None:
        if self.serving:
            handoffs.attach(peer, sock)
        else:
            self._handoffs.append((handoffs, peer, sock))

    def serve(self) -> None:
        if self.serving:
            return
        self.serving = True

        async def serve() -> None:
            await self.node.serve()
            pending, self._handoffs = self._handoffs, []
            for handoffs, peer, sock in pending:
                handoffs.attach(peer, sock)
            self.tell({"ready": [list(a) for a in self.node.addresses]})

        self._spawn(serve())

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for _handoffs, _peer, sock in self._handoffs:
            sock.close()
        self._handoffs = []


async def serve_worker(
    config: ServerConfig,
    index: int,
    count: int,
    control: socket.socket,
    listen_sockets: list[list[socket.socket]],
    tap_sock: socket.socket | None = None,
    mqtt_sockets: list[socket.socket] | None = None,
) -> int:
    """Run worker `index` until a signal or the end of its control channel.

    `tap_sock`: the worker of a leading cluster node; its store's writes are replicated
    through it (cluster/workertap.py), and its confirms wait for the node's followers."""
    from leveret.launcher import Node
    from leveret.server import gc_tuning

    loop = asyncio.get_running_loop()
    tap = await _cluster_tap(config, tap_sock) if tap_sock is not None else None
    mesh = Mesh(index, count)
    mesh.peer_joined.append(lambda peer: log.info("link to worker %d up", peer))
    node = Node(
        config,
        loop=loop,
        mesh=mesh,
        listen_sockets=listen_sockets,
        wait_to_serve=True,
        mqtt_sockets=mqtt_sockets or None,
    )
    if tap is not None:
        tap.output_batch = node.output_batch
        if index == 0:  # it serves the management API: the cluster from the supervisor
            from leveret.cluster.node import node_name
            from leveret.cluster.view import ClusterView

            node.cluster = ClusterView(node_name(config))
    # Connections handed over by peers are taken whatever this worker's setting;
    # with affinity on, this worker hands its own over too (workers/affinity.py).
    handoffs = Handoffs(mesh, node.listener.adopt)
    # MQTT over TCP goes to the worker of its client id whatever the setting.
    node.listener.handoff_channels = handoffs
    if config.worker_affinity:
        node.listener.handoffs = handoffs
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    exit_status = 0

    def sync_failed(reason: str, permanent: bool) -> None:
        # No sync with worker 0, no serving: this process stops. The supervisor
        # restarts it (a fresh process reads its store and syncs afresh), or, told
        # the failure is permanent, stops the broker with the reason.
        nonlocal exit_status
        exit_status = EXIT_SYNC_FAILED
        try:
            control.sendall(event_line(sync_failed=reason, permanent=permanent))
        except OSError as exc:
            log.warning("cannot tell the supervisor the sync failed: %s", exc)
        stop.set()

    if node.metadata is not None:
        node.metadata.sync_failures.append(sync_failed)
    # Linked to the others once its stored messages are back: a link's records
    # (publishes, acks, consumes) reach the queues directly, not through a client
    # connection that waits for recovery, and would otherwise go into queues ahead
    # of their recovered messages. It accepts no client until the supervisor says
    # so (`serve` below): the kernel keeps new connections in the listening
    # sockets' backlog meanwhile.
    await node.start(wait_for_recovery=True)
    if node.worker_stats is not None:
        # the supervisor's memory is the node's too (worker 0's /api/nodes and
        # Prometheus add it)
        node.worker_stats.supervisor = os.getppid()
    if tap is not None:
        _cut_from(tap, node)
    gc_tuning.tune()
    control.setblocking(True)
    control.sendall(event_line(started=True))
    starting = Starting(node, mesh, control)
    mesh.peer_lost.append(starting.lost)

    links: set[asyncio.Task] = set()

    def linked(sock: socket.socket, state: bytes) -> None:
        try:
            peer = link_peer(state)
            kind = link_kind(state)
            pair = link_pair(state)
        except ValueError as exc:
            log.error("bad link from the supervisor: %s", exc)
            sock.close()
            return
        if kind == "handoff":
            starting.handoff(handoffs, peer, sock)
            return
        task = loop.create_task(mesh.connect(peer, sock))
        links.add(task)
        task.add_done_callback(links.discard)
        task.add_done_callback(lambda t: starting.connected(t, peer, pair))

    # A round trip over each link at each ping: the answer says how long the oldest
    # one still out has waited, and the store's writer how long it has been on one
    # batch (liveness.py).
    probes = Probes()
    mesh.serve("probe", lambda peer: None)
    stuck_link = os.environ.get(STUCK_LINK_ENV) or None

    def probed(peer: int, call: asyncio.Future) -> None:
        if not call.cancelled():
            call.exception()  # a lost link: its next probe goes on the new one
        probes.done(peer, call)

    def parts() -> dict[str, Any]:
        now = loop.time()
        if stuck_link is not None:
            _stick_link(stuck_link, mesh)
        for peer in probes.due(mesh.peers):
            call = mesh.call(peer, "probe")
            probes.sent(peer, call, now)
            call.add_done_callback(lambda c, p=peer: probed(p, c))
        state = node.durable_state
        committer = state.messages.committer if state is not None else None
        since = committer.busy_since if committer is not None else None
        return {
            "links": {str(p): round(w, 3) for p, w in probes.waits(now).items()},
            "store": round(time.monotonic() - since, 3) if since is not None else 0.0,
        }

    def pinged(note: bytes) -> None:
        # Answered here, from the event loop: a loop that is stuck answers nothing,
        # and the supervisor kills it once the liveness timeout passes (liveness.py).
        try:
            if is_serve(note):
                starting.serve()
                return
            view = cluster_view(note)
            if view is not None:
                if node.cluster is not None:
                    node.cluster.update(view)
                return
            seq = ping_seq(note)
        except ValueError as exc:
            log.error("bad note from the supervisor: %s", exc)
            return
        try:
            control.sendall(event_line(pong=seq, **parts()))
        except (BlockingIOError, InterruptedError):
            pass  # the supervisor is not reading; its next ping asks again
        except OSError:
            pass  # the channel ended: receive_connections sees it and this worker stops

    channel = loop.create_task(receive_connections(control, linked, pinged))
    stopping = loop.create_task(stop.wait())
    waits: set[asyncio.Future] = {stopping, channel}
    if node.recovery is not None:
        waits.add(node.recovery)
    if tap is not None:
        waits.add(tap.lapsed)
    while True:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        recovery = node.recovery
        if recovery is not None and recovery in waits and recovery.done():
            waits.discard(recovery)
            if not recovery.cancelled() and recovery.exception() is not None:
                await node.stop()  # the store could not be read: main() names the problem
                raise recovery.exception()  # type: ignore[misc]
            continue
        break
    if channel.done() and not stopping.done():
        exc = None if channel.cancelled() else channel.exception()
        log.error("control channel to the supervisor ended (%s): stopping", exc or "closed")
    elif tap is not None and tap.lapsed.done() and not stopping.done():
        log.error(
            "the node's confirm deadline passed %g s ago with no lease renewal from its "
            "supervisor (stopped or starved: the lease has run out and another node may "
            "lead): stopping, so that this worker's clients connect elsewhere",
            tap.grace,
        )
    channel.cancel()
    stopping.cancel()
    await asyncio.gather(channel, stopping, return_exceptions=True)
    log.info("shutting down: closing %d connection(s)", len(node.connections))
    await node.stop()
    starting.close()
    handoffs.close()
    mesh.close()
    control.close()
    return exit_status


def _stick_link(flag: str, mesh: Mesh) -> None:
    """The test hook of STUCK_LINK_ENV."""
    try:
        with open(flag, encoding="utf-8") as f:
            index, peer = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return
    link = mesh.links.get(peer)
    if index != mesh.index or link is None or link.transport is None:
        return
    os.unlink(flag)
    log.warning("test fault: the link to worker %d stops reading", peer)
    link.transport.pause_reading()


async def _cluster_tap(config: ServerConfig, sock: socket.socket) -> WorkerTap:
    """The store's replication tap, set before the store opens: what its recovery
    writes is replicated too."""
    from leveret.store import replica

    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    node_dir = os.path.dirname(os.path.normpath(config.data_dir))
    # a lease past its deadline for one more lease has run out in etcd too
    tap = WorkerTap(config.data_dir, node_dir, loop, writer, grace=config.cluster_lease_seconds)
    replica.TAP = tap
    task = loop.create_task(tap.serve(reader))
    tap.serving = task  # type: ignore[attr-defined]  # kept: a task nobody holds may go
    return tap


def _cut_from(tap: WorkerTap, node: object) -> None:
    state = node.durable_state  # type: ignore[attr-defined]
    if state is None:
        return
    tap.cutter = Cutter(
        flush=lambda: state.messages.flush(0),
        image=state.definitions.db.serialize,
        drain=state.messages.committer.drain,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leveret.worker",
        description="One worker of `leveret server --workers N` (started by its supervisor).",
    )
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--listen-fds", required=True, help="JSON: a list of fds per listener")
    parser.add_argument("--mqtt-fds", default="[]", help="JSON: the MQTT port's fds")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--tap-fd", type=int, help="a leading cluster node's replication")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s worker {args.index} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    text = os.environ.pop(CONFIG_ENV, None)
    if text is None:
        log.error("%s is not set: a worker is started by `leveret server --workers N`", CONFIG_ENV)
        return 2
    config = decode_config(text)
    control = socket.socket(fileno=args.control_fd)
    listen_sockets = [
        [socket.socket(fileno=fd) for fd in fds] for fds in json.loads(args.listen_fds)
    ]
    mqtt_sockets = [socket.socket(fileno=fd) for fd in json.loads(args.mqtt_fds)]
    tap_sock = socket.socket(fileno=args.tap_fd) if args.tap_fd is not None else None
    from leveret.cli import run_until_stopped, use_uvloop

    use_uvloop(config)
    return run_until_stopped(
        config,
        lambda: serve_worker(
            config, args.index, args.count, control, listen_sockets, tap_sock, mqtt_sockets
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
