"""The replication tap of one worker of a leading node of workers.

In a node that runs workers (`leveret server --workers N` in a cluster) each worker
writes its own store, `<data-dir>/worker-<i>`, in its own process, so the store's hook
(`store.replica.TAP`) must be set there. A `WorkerTap` is that hook: it encodes each
change as the node's `Tap` does (the same operations), with its path relative to the
*node's* data dir (`worker-1/...`), numbers the operations with this worker's own
position, and sends each loop turn's operations to the node process (the supervisor)
over a channel of its own. There `cluster/relay.py` appends them to the node's one
replication stream, so the followers, the in-sync set and the election see one stream,
as with one process.

Confirms are held here, in the worker, exactly as the node's `Tap` holds them (it is
a `Tap`; only where its operations go and what "safe" means differ): a batch's
callbacks run once the node granted a position of this worker that covers them
*and* the lease deadline the node sent with its grants has not passed. The deadline
is on `time.monotonic()`, CLOCK_MONOTONIC, which every process of the machine shares,
and is checked in the callback that writes the confirms: so a worker never confirms
past the node's lease, even when the node process is paused or killed between its
grant and the worker's write.

The channel (an AF_UNIX stream socket pair) carries frames of `cluster/wire.py`'s
framing, with kinds of its own:

  worker → node   W_OPS     <u64 this worker's position after> operations
                  W_FAILED  JSON {path, error}: a write or fsync of the store failed
                  W_IMAGE   <u16 n><path> its definitions database's image at the cut
                  W_DRAINED its writer wrote everything reported before the cut
                  W_UNREADY its store is not open yet: no cut now (the node gives it up)
  node → worker   W_GRANT   <u64 this worker's safe position><f64 lease deadline>
                  W_STOP    the node stopped leading: release nothing, ever
                  W_CUT     a follower joins: cut this worker's stream (below)

A follower that joins needs files read after a point of the stream and the stream
after it; with several writers the node takes one cut per worker (`Relay.cut`). At
W_CUT the worker, in one loop callback, hands its loop turn's records to its writer,
sends what its tap holds, and then the image of its definitions database: so the
operations the node read before W_IMAGE are exactly those the image and the files
cover (SQLite's pages are not replicated: the image must match the stream exactly).
Once its writer has written all of them (the files hold them) it sends W_DRAINED.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from leveret.cluster import datadir, wire
from leveret.cluster.leader import Tap

# a lapse timer that fires this late (s) found this worker's own loop stalled
LATE = 0.5

W_OPS = 1
W_FAILED = 2
W_GRANT = 3
W_STOP = 4
W_CUT = 5
W_IMAGE = 6
W_DRAINED = 7
W_UNREADY = 8

GRANT = struct.Struct("<Qd")
_PATH = struct.Struct("<H")


def grant_frame(position: int, deadline: float) -> bytes:
    return wire.frame(W_GRANT, GRANT.pack(max(0, position), deadline))


@dataclass
class Cutter:
    """What a cut needs of the worker's store (built from its `DurableState`)."""

    flush: Callable[[], None]  # hand the loop turn's records to the writer thread
    image: Callable[[], bytes]  # the definitions database, serialized
    drain: Callable[[], None]  # blocks until the writer wrote everything submitted


class WorkerTap(Tap):
    """`store.replica.FileTap` in a worker process; its followers are the node's."""

    def __init__(
        self,
        store_root: str,
        node_root: str,
        loop: asyncio.AbstractEventLoop,
        channel: asyncio.StreamWriter,
        grace: float = 0.0,
    ) -> None:
        super().__init__(store_root, loop)
        # Done once the node's lease deadline passed `grace` s ago with no renewal (0:
        # never): its supervisor is stopped or starved, its lease has run out in etcd
        # and another node may lead, while this worker still holds its clients'
        # connections and answers their heartbeats. The worker stops on it so that
        # they connect elsewhere (worker.py), as they would from a stopped node of one
        # process, whose heartbeats stop.
        self.lapsed: asyncio.Future[None] = loop.create_future()
        self.grace = grace
        self._lapse_timer: asyncio.TimerHandle | None = None
        self._lapse_due = 0.0
        prefix = os.path.relpath(os.path.realpath(store_root), os.path.realpath(node_root))
        if prefix.startswith("..") or os.path.isabs(prefix) or prefix == ".":
            raise ValueError(f"{store_root} is not under the node's data dir {node_root}")
        self.prefix = prefix.replace(os.sep, "/") + "/"
        self.channel = channel
        # this worker's position the node said its followers hold (0: nothing written
        # yet, which they trivially hold, once a deadline came with a grant or renewal)
        self.granted = 0
        self.deadline = 0.0  # the node's lease deadline (time.monotonic()) with that grant
        self.safe = self._safe_now
        self.on_failed = self._report_failed
        self.cutter: Cutter | None = None  # set once the worker's store is open
        self._cuts: set[asyncio.Future[None]] = set()

    def _safe_now(self) -> int:
        if time.monotonic() >= self.deadline:
            return -1
        return self.granted

    def _rel(self, path: str) -> str | None:
        rel = super()._rel(path)
        return None if rel is None else self.prefix + rel

    def ship(self) -> None:
        """Send what the store reported since the last ship to the node, as one frame."""
        taken = self.take()
        if taken is None:
            return
        data, position = taken
        if not self.stopped and not self.channel.is_closing():
            self.channel.write(wire.frame(W_OPS, wire.U64.pack(position) + data))

    def grant(self, position: int, deadline: float) -> None:
        """The node's word: its followers hold this worker's writes up to `position`,
        and it leads at least until `deadline` (time.monotonic())."""
        if self.stopped:
            return
        if position > self.granted:
            self.granted = position
        self.deadline = deadline
        if self.grace > 0 and deadline > 0:
            if self._lapse_timer is not None:
                self._lapse_timer.cancel()
            self._arm(max(0.0, deadline - time.monotonic()) + self.grace)
        self.check()

    def _arm(self, delay: float) -> None:
        self._lapse_due = time.monotonic() + delay
        self._lapse_timer = self.loop.call_later(delay, self._lapse)

    def _lapse(self) -> None:
        if self.stopped or self.lapsed.done():
            return
        if time.monotonic() - self._lapse_due > LATE:
            # This worker's own loop did not run meanwhile (it was paused or starved):
            # renewals the node sent may wait unread in the channel, and this timer
            # runs before they are read. Give them `grace` more.
            self._arm(self.grace)
            return
        self.lapsed.set_result(None)

    def _report_failed(self, path: str, error: BaseException) -> None:
        if not self.channel.is_closing():
            doc = {"path": path, "error": f"{error.__class__.__name__}: {error}"}
            self.channel.write(wire.json_frame(W_FAILED, doc))

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Read the node's grants until the channel ends or the node stops leading;
        either way this tap then releases nothing (the node is gone or follows)."""
        try:
            while True:
                kind, payload = await wire.read_frame(reader)
                if kind == W_GRANT:
                    position, deadline = GRANT.unpack(payload)
                    self.grant(position, deadline)
                elif kind == W_STOP:
                    return
                elif kind == W_CUT:
                    self._cut()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.stop()
            if self._lapse_timer is not None:
                self._lapse_timer.cancel()
            for cut in list(self._cuts):
                cut.cancel()

    def _cut(self) -> None:
        """Cut this worker's stream for a joining follower (the module's docstring)."""
        cutter = self.cutter
        if self.channel.is_closing():
            return
        if cutter is None:  # starting: its recovery may still be writing
            self.channel.write(wire.frame(W_UNREADY))
            return
        cutter.flush()
        self.ship()
        image = cutter.image()
        rel = (self.prefix + datadir.DEFINITIONS).encode()
        self.channel.write(wire.frame(W_IMAGE, _PATH.pack(len(rel)) + rel + image))
        drained = asyncio.ensure_future(self.loop.run_in_executor(None, cutter.drain))
        self._cuts.add(drained)
        drained.add_done_callback(self._drained)

    def _drained(self, future: asyncio.Future[None]) -> None:
        self._cuts.discard(future)
        if future.cancelled() or future.exception() is not None:
            return  # the node gives the cut up when the channel ends
        if not self.channel.is_closing():
            self.channel.write(wire.frame(W_DRAINED))


def parse_image(payload: bytes | bytearray) -> tuple[str, bytes]:
    """W_IMAGE's (path, image)."""
    view = memoryview(payload)
    (n,) = _PATH.unpack_from(view, 0)
    return bytes(view[2 : 2 + n]).decode(), bytes(view[2 + n :])


def parse_failed(payload: bytes | bytearray) -> tuple[str, str]:
    doc = json.loads(payload)
    return str(doc.get("path", "")), str(doc.get("error", ""))
