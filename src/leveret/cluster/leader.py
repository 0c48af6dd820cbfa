"""The leader's side of replication: the store's tap, one link per follower, and
the gate that holds confirms until every in-sync follower has the write.

Order of events for a confirmed publish on the leader:
1. the store reports the record's bytes to the `Tap` (on the loop, as it submits
   them to its writer thread); the tap numbers them (the stream position) and
   sends everything of one loop turn to every follower in one OPS frame;
2. the writer thread writes and fsyncs the group-commit batch, and hands its
   callbacks (confirms, tx.commit-ok) to `Tap.release` with the position the
   batch is covered by;
3. the callbacks run once every follower that must hold the write (the in-sync
   set, and a follower about to join it) has acknowledged that position, the
   in-sync set is at least `--cluster-min-replicas`, and the leader's etcd lease
   is certainly still valid. Otherwise they wait; if the node stops leading they
   never run (the client sees its connection close and republishes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leveret.cluster import datadir, wire
from leveret.store.committer import _run_callbacks
from leveret.store.replica import NotLeading

log = logging.getLogger("leveret.cluster")

Calls = list[tuple[Callable[..., None], BaseException | None]]

# A follower that has not acknowledged a write the leader waits on for this long
# (or whose link is down that long) leaves the in-sync set, if enough remain.
LAG_TIMEOUT_FRACTION = 0.4
# A snapshotting follower's queued live ops, and a live follower's unsent bytes: past
# this it is dropped (and syncs again when it comes back).
MAX_BACKLOG_BYTES = 256 * 1024 * 1024
# A link that carried nothing for this fraction of the lease (at least
# KEEPALIVE_MIN_SECONDS) gets a KEEPALIVE frame, so that the follower can tell a dead
# link (packets dropped without a reset, a half-open connection, a partition that
# carries only follower → leader) from an idle leader; and the follower sends them
# the other way (wire.SILENT_INTERVALS).
KEEPALIVE_FRACTION = 0.1
KEEPALIVE_MIN_SECONDS = 0.2


def keepalive_interval(lease_seconds: float) -> float:
    """The keepalive interval for a leader with this lease: 0.5 s at the default 5 s."""
    return max(KEEPALIVE_MIN_SECONDS, KEEPALIVE_FRACTION * lease_seconds)


class Tap:
    """Implements store.replica.FileTap for one data dir.

    Once stopped (the node stopped leading) it releases nothing: the node keeps it
    the store's tap until its broker has stopped, so that nothing the broker still
    writes meanwhile is confirmed (node.ClusterNode._step_down)."""

    def __init__(self, root: str, loop: asyncio.AbstractEventLoop) -> None:
        self.root = os.path.realpath(root) + os.sep
        self.loop = loop
        self.position = 0
        self._loop_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._buf: list[bytes] = []
        self._armed = False
        self.links: list[FollowerLink] = []
        self.pending: deque[tuple[int, Calls]] = deque()
        self.safe: Callable[[], int] = lambda: -1  # the position confirms may go up to
        # Runs the release of held confirms and writes what it queued at once
        # (listener.Server.output_batch, set once the broker exists): a confirm leaves
        # in the callback that found the lease valid, not a loop turn later.
        self.output_batch: Callable[[Callable[[], None]], None] = lambda fn: fn()
        self.stopped = False
        # Definition changes (SQL) are answered (declare-ok, HTTP 201/204) only once
        # the followers hold them: `sql_position` is where the last one ends.
        self.sql_position = 0
        self._waiters: list[tuple[int, Callable[[], None]]] = []
        self._futures: set[asyncio.Future[None]] = set()  # wait_safe's, failed by stop()
        # A write or fsync under the data dir failed: the node steps down (set by it).
        self.on_failed: Callable[[str, BaseException], None] | None = None

    # ---- the store's side (any thread; the loop's in practice) -------------------------

    def _rel(self, path: str) -> str | None:
        real = os.path.realpath(path) if not path.startswith(self.root) else path
        if not real.startswith(self.root):
            return None
        return real[len(self.root) :].replace(os.sep, "/")

    def _add(self, parts: list[bytes]) -> None:
        n = 0
        for p in parts:
            n += len(p)
        with self._lock:
            self._buf.extend(parts)
            self.position += n
            if self._armed:
                return
            self._armed = True
        if threading.get_ident() == self._loop_thread:
            self.loop.call_soon(self.ship)
        else:
            self.loop.call_soon_threadsafe(self.ship)

    def write(self, path: str, offset: int, chunks: Sequence[bytes]) -> None:
        rel = self._rel(path)
        if rel is not None:
            self._add(wire.op_write(rel, offset, chunks))

    def replace(self, path: str, data: bytes) -> None:
        rel = self._rel(path)
        if rel is not None and not datadir.skipped(rel):
            self._add(wire.op_replace(rel, data))

    def unlink(self, path: str) -> None:
        rel = self._rel(path)
        if rel is not None:
            self._add(wire.op_simple(wire.UNLINK, rel))

    def truncate(self, path: str, size: int) -> None:
        rel = self._rel(path)
        if rel is not None:
            self._add(wire.op_truncate(rel, size))

    def remove_tree(self, path: str) -> None:
        rel = self._rel(path)
        if rel is not None:
            self._add(wire.op_simple(wire.RMTREE, rel))

    def sql(self, path: str, statements: list[str]) -> None:
        rel = self._rel(path)
        if rel is not None:
            self._add(wire.op_sql(rel, statements))
            self.sql_position = self.position

    def failed(self, path: str, error: BaseException) -> None:
        """From any thread: this copy may differ from what the followers were sent (the
        store rolled back a failed write they already have), so the node must not lead."""
        if self.on_failed is None or self.stopped:
            return
        try:
            self.loop.call_soon_threadsafe(self.on_failed, path, error)
        except RuntimeError:
            pass  # the loop is closed: the node is going away

    def reached(self, position: int) -> bool:
        return not self.stopped and position <= self.safe()

    def when_safe(self, position: int, callback: Callable[[], None]) -> None:
        """Call `callback` on the loop once `position` may be confirmed (never, once
        this tap is stopped)."""
        if not self.stopped:
            self._waiters.append((position, callback))

    async def wait_safe(self, position: int) -> None:
        """Until `position` may be confirmed; NotLeading once this tap stops (the node
        stopped leading): it never will be here, and the caller must not say it was."""
        if self.stopped:
            raise NotLeading("this node stopped leading before its followers held the change")
        future = self.loop.create_future()
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        self.when_safe(position, lambda: future.done() or future.set_result(None))
        self.check()
        await future

    # ---- on the loop --------------------------------------------------------------------

    def take(self) -> tuple[bytes, int] | None:
        """What the store reported since the last ship and the position it reaches
        (None if nothing), taken from the writer thread's buffer."""
        with self._lock:
            self._armed = False
            if not self._buf:
                return None
            data = b"".join(self._buf)
            self._buf = []
            return data, self.position

    def ship(self) -> None:
        """Send what the store reported since the last ship, as one OPS frame."""
        taken = self.take()
        if taken is None or not self.links:
            return
        data, position = taken
        frame = wire.frame(wire.OPS, wire.U64.pack(position) + data)
        for link in self.links:
            link.send_ops(frame, position)

    def release(self, position: int, calls: Calls) -> None:
        """From the writer thread: run `calls` once `position` is safe."""
        try:
            self.loop.call_soon_threadsafe(self._queue, position, calls)
        except RuntimeError:
            pass  # the loop is closed: the node is going away and confirms nothing

    def _queue(self, position: int, calls: Calls) -> None:
        if self.stopped:
            return
        self.pending.append((position, calls))
        self.check()

    def check(self) -> None:
        """Run every held batch of callbacks that is now safe to confirm."""
        if self.stopped or not (self.pending or self._waiters):
            return
        self.output_batch(self._release_safe)

    def _release_safe(self) -> None:
        safe = self.safe()
        pending = self.pending
        while pending and pending[0][0] <= safe:
            _run_callbacks(pending.popleft()[1])
        if self._waiters:
            ready = [cb for pos, cb in self._waiters if pos <= safe]
            if ready:
                self._waiters = [(p, cb) for p, cb in self._waiters if p > safe]
                for cb in ready:
                    cb()

    @property
    def oldest_wait(self) -> int | None:
        return self.pending[0][0] if self.pending else None

    def stop(self) -> None:
        """Stop leading: drop every held confirm (and every later one), close every link."""
        self.stopped = True
        self.pending.clear()
        self._waiters.clear()
        for future in list(self._futures):
            if not future.done():
                future.set_exception(
                    NotLeading("this node stopped leading before its followers held the change")
                )
        for link in list(self.links):
            link.close()
        self.links.clear()


@dataclass
class FollowerLink:
    """One follower's connection to this leader."""

    name: str
    writer: asyncio.StreamWriter
    state: str = "snapshot"  # snapshot → live
    acked: int = -1
    sent: int = 0  # the position the last frame sent (or queued) brings it to
    backlog: list[bytes] = field(default_factory=list)
    backlog_bytes: int = 0
    required: bool = False  # confirms wait for it (in the in-sync set, or joining it)
    join_at: int | None = None  # joins the in-sync set once it acknowledges this
    status: dict[str, Any] = field(default_factory=dict)
    acked_at: float = field(default_factory=time.monotonic)
    heard: int = 0  # its frames other than ACK (STATUS, KEEPALIVE): for `keepalive`
    closed: bool = False

    def send_ops(self, frame: bytes, position: int) -> None:
        if self.closed:
            return
        self.sent = position
        if self.state == "snapshot":
            self.backlog.append(frame)
            self.backlog_bytes += len(frame)
            if self.backlog_bytes > MAX_BACKLOG_BYTES:
                log.warning(
                    "follower %s: snapshot too slow for the live stream; dropped", self.name
                )
                self.close()
            return
        transport = self.writer.transport
        if transport.get_write_buffer_size() > MAX_BACKLOG_BYTES:
            # Open but taking nothing (a network that drops packets without a reset:
            # TCP may take many minutes to give up): the leader would hold every write
            # for it in memory meanwhile. Dropped, it syncs again when it reconnects.
            log.warning("follower %s: its link takes nothing; dropped", self.name)
            self.closed = True
            transport.abort()  # close() would wait to send what it cannot
            return
        self.writer.write(frame)

    def go_live(self) -> None:
        for frame in self.backlog:
            self.writer.write(frame)
        self.backlog = []
        self.backlog_bytes = 0
        self.state = "live"

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


# How long a leader waits for the MANIFEST of a follower that sends no keepalives
# while it reads its data dir (an older version).
MANIFEST_SECONDS = 60.0


async def send_files(
    loop: asyncio.AbstractEventLoop,
    writer: asyncio.StreamWriter,
    root: str,
    sends: Sequence[Any],
    link: FollowerLink,
) -> bool:
    """A sync's file transfers (`datadir` transfers: path, start, fresh) to a joining
    follower, chunk by chunk read off the loop (a file gone since the manifest ends its
    transfer); False once `link` closed meanwhile. The leader's listener and a node
    of workers' relay both sync this way."""
    for transfer in sends:
        offset = transfer.start
        fresh = transfer.fresh
        path = os.path.join(root, transfer.path)
        while True:
            chunk = await loop.run_in_executor(None, _read_at, path, offset)
            if chunk is None:
                break
            if chunk or fresh:
                writer.write(wire.snap_file(transfer.path, offset, chunk, fresh))
                await writer.drain()
            fresh = False
            if len(chunk) < datadir.CHUNK:
                break
            offset += len(chunk)
        if link.closed:
            return False
    return True


def _read_at(path: str, offset: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(datadir.CHUNK)
    except FileNotFoundError:
        return None


async def read_manifest(
    reader: asyncio.StreamReader, interval: float, beating: bool
) -> tuple[int, bytes | bytearray]:
    """The follower's first frame after WELCOME other than KEEPALIVE: its MANIFEST.

    Reading a large data dir for its CRCs may take the follower minutes, so one that
    said in HELLO that it sends keepalives meanwhile (`beating`) may take as long as it
    needs while it is heard from every SILENT_INTERVALS intervals, and is given up
    once it is silent that long (cut off, paused, gone); an older follower gets
    MANIFEST_SECONDS, as before (a data dir it cannot read by then, it never could)."""
    limit = wire.SILENT_INTERVALS * interval if beating else MANIFEST_SECONDS
    while True:
        kind, payload = await asyncio.wait_for(wire.read_frame(reader), limit)
        if kind != wire.KEEPALIVE:
            return kind, payload


async def keepalive(
    writer: asyncio.StreamWriter,
    interval: float,
    link_of: Callable[[], FollowerLink | None],
    watch: bool = False,
) -> None:
    """Send KEEPALIVE on a follower's link each `interval` it carried no live OPS;
    with `watch` (the follower sends keepalives too), drop a live link on which the
    follower was heard from for none of wire.SILENT_INTERVALS ticks in a row.

    Timer-driven, so the publish path pays nothing: `FollowerLink.sent`, which
    `send_ops` keeps anyway, tells whether OPS went out since the last tick, and
    `acked` and `heard` (its other frames) whether the follower spoke. Before the link
    is live (the follower's manifest being compared, a snapshot being read) a
    keepalive goes out every tick: a snapshot's files may take longer than the
    follower waits for a frame, and a frame every interval costs nothing. Counting
    ticks rather than seconds, a pause of this process counts as one tick."""
    frame = wire.frame(wire.KEEPALIVE)
    loop = asyncio.get_running_loop()
    last = -1
    heard = (-2, -1)
    heard_at = loop.time()
    quiet = 0
    while not writer.is_closing():
        await asyncio.sleep(interval)
        link = link_of()
        if link is not None and link.state == "live":
            if link.closed:
                return
            if watch:
                now = (link.acked, link.heard)
                if now != heard:
                    heard, heard_at, quiet = now, loop.time(), 0
                else:
                    quiet += 1
                    if quiet >= wire.SILENT_INTERVALS:
                        log.warning(
                            "cluster: nothing from follower %s for at least %.1f s (%d "
                            "keepalive intervals of %g s): the link is dead; dropping it",
                            link.name,
                            loop.time() - heard_at,
                            wire.SILENT_INTERVALS,
                            interval,
                        )
                        link.closed = True
                        writer.transport.abort()  # its reader ends, and with it the link
                        return
            if link.sent != last:
                last = link.sent  # it carried OPS this interval
                continue
        if writer.is_closing():
            return
        writer.write(frame)
