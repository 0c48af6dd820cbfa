"""The follower's side of replication: sync with the leader, then apply its stream.

1. HELLO with the epoch this node believes the leader has; the leader refuses a
   follower that knows a newer epoch (it is an old leader), and the follower
   refuses a leader older than the one etcd names (`Follower.epoch`).
2. MANIFEST: every file with its size and CRC32. The leader answers with the
   files (or file tails) that differ, the files to delete, a fresh image of the
   SQLite definitions and SNAP_END with the stream position they amount to.
   Meanwhile `datadir.SYNCING_MARK` is on disk: a half-synced copy is never a
   candidate for leadership.
3. Then the live stream: each batch of OPS frames is written (and fsynced, but
   under `--fsync never`) by one writer thread and acknowledged with the
   position it reaches: a follower's group commit.

Liveness: a leader sends KEEPALIVE on a link that carried nothing for an interval
(it names the interval in WELCOME). A follower that hears nothing, not even a piece
of a large frame, for SILENT_INTERVALS of them takes the link for dead (packets
dropped without a reset, a half-open connection, a partition that lets only its own
ACKs through), drops it and connects again, syncing what it lacks. Without this it
would wait on such a link until TCP gave up (many minutes; never, where its own
writes still get through). A leader that names no interval (an older version) is
not watched. The follower sends KEEPALIVE too, each interval it acknowledged
nothing, so that the leader can watch its side the same way (it said so in HELLO).

The handshake (the TCP connect, HELLO, WELCOME) has a bound of its own that follows
the lease as the keepalives do: `handshake_timeout`, the time a live link may stay
silent. A handshake can hang where nothing resets the connection: a leader that was
paused (SIGSTOP, a VM stall) or cut off after the kernel accepted the connection, a
TCP proxy, NAT or load balancer in between (`--cluster-advertise`) that accepted it
and lost its first bytes or its upstream, a SYN dropped by a partition. Before the
bound followed the lease, such a follower waited 15 s (5 for the connect, 10 for
WELCOME) before it tried again, however short the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from leveret.cluster import datadir, wire
from leveret.cluster.leader import keepalive_interval
from leveret.cluster.wire import SILENT_INTERVALS

log = logging.getLogger("leveret.cluster")

# A handshake's bound never goes under this: one lost SYN (Linux sends it again after
# 1 s) and a busy leader's loop must not fail it.
HANDSHAKE_MIN_SECONDS = 2.0


def handshake_timeout(lease_seconds: float) -> float:
    """How long a follower waits for the TCP connect and WELCOME together: as long as
    a live link may stay silent (SILENT_INTERVALS keepalive intervals, 0.8 lease), at
    least HANDSHAKE_MIN_SECONDS; 4 s at the default 5 s lease. A leader answers HELLO
    at once, without touching its disk, so a leader that does not answer within the
    time its own lease allows a silent link is paused, cut off or gone."""
    return max(HANDSHAKE_MIN_SECONDS, SILENT_INTERVALS * keepalive_interval(lease_seconds))


class Refused(Exception):
    pass


class Silent(Exception):
    """The leader's side of the link has been silent for SILENT_INTERVALS keepalives."""


class NoWelcome(Exception):
    """The handshake did not finish within its bound (the connect, or WELCOME)."""


class CopyFailed(Exception):
    """This node could not write its own copy (a full disk, an I/O error): not the
    link's fault, and no reason to trust the next attempt more than this one."""


class Follower:
    def __init__(
        self,
        root: str,
        node: str,
        cluster: str,
        leader: dict[str, Any],
        epoch: int,
        fsync: bool,
        status: Any = None,
        handshake: float = HANDSHAKE_MIN_SECONDS,
        workers: int = 1,
    ) -> None:
        self.root = root
        self.node = node
        self.workers = workers  # this node's --workers: its copy serves as that many
        self.cluster = cluster
        self.leader = leader
        self.epoch = epoch
        self.applier = datadir.Applier(root, fsync)
        self.position = -1  # acknowledged
        self.synced = False
        self.synced_at = -1  # the position the snapshot brought this copy to
        self.streamed = False  # it applied and acknowledged live writes after the sync
        self._status = status  # () -> dict: this node's figures for /api/nodes
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="leveret-follower")
        self._writer: asyncio.StreamWriter | None = None
        self.keepalive: float | None = None  # the leader's interval, from WELCOME
        self._heard = 0  # frames (and pieces of large ones) read, for _watch
        self.handshake = handshake  # the bound on the connect and WELCOME together
        self.welcomed = False  # the leader answered HELLO with WELCOME
        self.handshake_seconds = 0.0  # how long the handshake took, or failed after

    async def run(self) -> None:
        """Follow until the link ends (returns or raises); the node decides what next."""
        loop = asyncio.get_running_loop()
        # (cluster_host: the leader's --cluster-advertise; older nodes had only host)
        host = self.leader.get("cluster_host") or self.leader["host"]
        port = self.leader["cluster"]
        started = loop.time()
        deadline = started + self.handshake
        where = f"leader {self.leader.get('node')} at {host}:{port}"
        try:
            async with asyncio.timeout_at(deadline):
                reader, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            self.handshake_seconds = loop.time() - started
            raise NoWelcome(
                f"no connection to {where} within {self.handshake:g} s (a partition, "
                "or a host that drops connections)"
            ) from None
        self._writer = writer
        try:
            writer.write(
                wire.json_frame(
                    wire.HELLO,
                    {
                        "cluster": self.cluster,
                        "node": self.node,
                        "epoch": self.epoch,
                        "keepalive": True,  # it sends them once WELCOME names an interval
                        # ... from the start: while it reads its data dir for MANIFEST too
                        "manifest_keepalive": True,
                        # a node of workers says how many (absent: one process)
                        **({"workers": self.workers} if self.workers != 1 else {}),
                    },
                )
            )
            try:
                async with asyncio.timeout_at(deadline):
                    kind, payload = await wire.read_frame(reader)
            except TimeoutError:
                raise NoWelcome(
                    f"no WELCOME from {where} within {self.handshake:g} s (the "
                    "connection was accepted, but HELLO went unanswered: a leader "
                    "paused or cut off, or a proxy in between that lost the connection)"
                ) from None
            finally:
                self.handshake_seconds = loop.time() - started
            if kind != wire.WELCOME:
                reason = json.loads(payload).get("reason") if payload else "?"
                raise Refused(f"leader refused: {reason}")
            welcome = json.loads(payload)
            if welcome.get("epoch") != self.epoch:
                raise Refused(f"leader epoch {welcome.get('epoch')} is not {self.epoch}")
            self.welcomed = True
            interval = welcome.get("keepalive")
            if isinstance(interval, int | float) and interval > 0:
                self.keepalive = float(interval)
            await loop.run_in_executor(self._pool, self._mark_syncing)
            # Reading a large data dir for its CRCs may take minutes: keepalives tell the
            # leader this follower is at work, not gone (it said so in HELLO).
            # (an older leader takes only MANIFEST here, and does not say it takes more)
            beat = self.keepalive if welcome.get("manifest_keepalive") is True else None
            reading = loop.run_in_executor(self._pool, datadir.manifest, self.root)
            manifest = await _beating(reading, writer, beat)
            writer.write(
                wire.json_frame(wire.MANIFEST, [[p, s, c] for p, (s, c) in manifest.items()])
            )
            status_task = asyncio.ensure_future(self._send_status())
            try:
                await self._stream(reader, writer)
            finally:
                status_task.cancel()
        finally:
            writer.close()

    async def _send_status(self) -> None:
        while self._status is not None and self._writer is not None:
            try:
                self._writer.write(wire.json_frame(wire.STATUS, self._status()))
            except Exception:  # the link is closing
                return
            await asyncio.sleep(1.0)

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()

        def heard() -> None:
            self._heard += 1

        async def read() -> None:
            try:
                while True:
                    kind, payload = await wire.read_frame(reader, heard)
                    self._heard += 1
                    if kind != wire.KEEPALIVE:
                        queue.put_nowait((kind, payload))
            finally:
                queue.put_nowait(None)

        reading = asyncio.ensure_future(read())
        silent: list[str] = []  # why the watchdog dropped the link
        watching = (
            asyncio.ensure_future(self._watch(self.keepalive, writer, silent))
            if self.keepalive is not None
            else None
        )
        try:
            while True:
                item = await queue.get()
                batch = [item]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                done = [b for b in batch if b is not None]
                if done:
                    try:
                        acked = await loop.run_in_executor(self._pool, self._apply, done)
                    except (OSError, sqlite3.Error) as exc:
                        raise CopyFailed(f"{exc.__class__.__name__}: {exc}") from exc
                    if acked is not None and acked > self.position:
                        self.position = acked
                        self.streamed = self.streamed or (self.synced and acked > self.synced_at)
                        writer.write(wire.frame(wire.ACK, wire.U64.pack(acked)))
                if len(done) < len(batch):
                    break  # the leader went away
        finally:
            reading.cancel()
            if watching is not None:
                watching.cancel()
        if silent:
            raise Silent(silent[0])
        exc = reading.exception() if reading.done() and not reading.cancelled() else None
        if exc is not None and not isinstance(exc, asyncio.IncompleteReadError | ConnectionError):
            raise exc

    async def _watch(
        self, interval: float, writer: asyncio.StreamWriter, silent: list[str]
    ) -> None:
        """Drop the link once SILENT_INTERVALS ticks in a row heard nothing; send a
        keepalive at each tick that follows an interval without an acknowledgement.

        It counts ticks, not seconds since the last frame: after this process was
        paused (or its loop held up) the frames that arrived meanwhile may not have
        been read yet when the timer fires, and a pause counts as one tick."""
        loop = asyncio.get_running_loop()
        keepalive = wire.frame(wire.KEEPALIVE)
        last = self._heard
        last_at = loop.time()  # the tick that last saw something
        quiet = 0
        acked = self.position
        while True:
            await asyncio.sleep(interval)
            if self.position == acked and not writer.is_closing():
                writer.write(keepalive)
            acked = self.position
            if self._heard != last:
                last = self._heard
                last_at = loop.time()
                quiet = 0
                continue
            quiet += 1
            if quiet >= SILENT_INTERVALS:
                silent.append(
                    f"nothing from leader {self.leader.get('node')} for at least "
                    f"{loop.time() - last_at:.1f} s ({SILENT_INTERVALS} keepalive intervals "
                    f"of {interval:g} s)"
                )
                writer.transport.abort()  # the reader ends, and with it the stream
                return

    def _apply(self, frames: list[tuple[int, bytes]]) -> int | None:
        """Writer thread: apply frames in order, sync, return the position to ack.

        The acknowledgement never goes back: a node of workers syncs a follower with a
        cut per worker (cluster/relay.py), and frames after one worker's cut may carry
        positions below SNAP_END's, which everything before them already covers."""
        ack = None
        a = self.applier
        for kind, payload in frames:
            view = memoryview(payload)
            if kind == wire.OPS:
                (position,) = wire.U64.unpack_from(view, 0)
                if ack is None or position > ack:
                    ack = position
                a.apply(view[8:])
            elif kind == wire.SNAP_FILE:
                fresh, rel, offset, data = wire.parse_snap_file(view)
                a.write(rel, offset, data, fresh)
            elif kind == wire.SNAP_DELETE:
                a.unlink(bytes(view).decode())
            elif kind == wire.SNAP_SQLITE:
                rel, image = wire.parse_snap_sqlite(view)
                a.sqlite_image(rel, image)
            elif kind == wire.SNAP_END:
                (position,) = wire.U64.unpack_from(view, 0)
                a.sync()
                self._clear_syncing()
                self.synced = True
                self.synced_at = position
                if ack is None or position > ack:
                    ack = position
            elif kind == wire.REFUSE:
                raise Refused(json.loads(payload).get("reason", "refused"))
        if ack is not None:
            a.sync()
        return ack

    def _mark_syncing(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        path = os.path.join(self.root, datadir.SYNCING_MARK)
        with open(path, "wb") as f:
            os.fsync(f.fileno())
        _fsync_dir(self.root)

    def _clear_syncing(self) -> None:
        try:
            os.unlink(os.path.join(self.root, datadir.SYNCING_MARK))
            _fsync_dir(self.root)
        except FileNotFoundError:
            pass

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.applier.close)
        self._pool.shutdown(wait=True)


async def _beating(
    work: asyncio.Future[Any], writer: asyncio.StreamWriter, interval: float | None
) -> Any:
    """`work`'s result; meanwhile a KEEPALIVE each `interval` (none without one)."""
    if interval is None:
        return await work
    keepalive = wire.frame(wire.KEEPALIVE)
    while True:
        done, _ = await asyncio.wait({work}, timeout=interval)
        if done:
            return work.result()
        if writer.is_closing():
            return await work
        writer.write(keepalive)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncing(root: str) -> bool:
    """True while a snapshot is half applied: this copy must not lead."""
    return os.path.exists(os.path.join(root, datadir.SYNCING_MARK))
