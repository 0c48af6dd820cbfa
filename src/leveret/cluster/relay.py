"""The node's side of its workers' taps: one replication stream fed by every worker.

A leading node of workers runs its `ClusterNode` in the supervisor process and its
stores in the workers. Each worker's `WorkerTap` (cluster/workertap.py) sends its
operations here; the `Relay` appends them, as they arrive, to the node's one `Tap`, so
the followers get one stream (their copy holds `worker-<i>/...` like any path), and
the in-sync set, the election, the handover and the fencing work on it unchanged.

Each worker numbers its operations with its own position. For each batch the relay
keeps where it ends in both numberings, and once the node's `Tap` finds the batch's
global position safe (every in-sync follower acknowledged it, the set is large
enough, the lease is valid: `InSyncMixin._safe_position`) it grants that worker the
batch's own position, with the lease deadline, and the worker releases the confirms
it covers (if the deadline has not passed by then). Batches of one worker arrive in
its order, so a worker's grants only grow.

Lease renewals move the deadline: `renewed` sends every worker its last grant with
the new deadline, so confirms held only by the deadline go out.

A follower that joins is synced with one cut per worker (`cut`, `sync_follower`;
cluster/workertap.py says what a worker does at a cut). Until worker i's image
arrives, its operations are not the joining follower's (its files and image will hold
them); after it, they go to the follower's backlog. Once every worker's image is in,
the follower takes the whole stream like any other; once every worker's writer has
drained, the files are read. A frame of the backlog may carry a position below
SNAP_END's (that of the last image): everything below it is in the files, the images
or the backlog, and a follower never acknowledges backwards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from leveret.cluster import datadir, wire
from leveret.cluster.leader import FollowerLink, Tap, send_files
from leveret.cluster.workertap import (
    W_CUT,
    W_DRAINED,
    W_FAILED,
    W_IMAGE,
    W_OPS,
    W_STOP,
    W_UNREADY,
    grant_frame,
    parse_failed,
    parse_image,
)

log = logging.getLogger("leveret.cluster")


class WorkerStream:
    """One worker process's channel, from its start to its exit."""

    def __init__(self, index: int, writer: asyncio.StreamWriter) -> None:
        self.index = index
        self.writer = writer
        self.local = 0  # this worker's position after its last batch
        self.granted = 0  # (nothing written is held by every follower)
        self.closed = False

    def send_grant(self, position: int, deadline: float) -> None:
        if self.closed or self.writer.is_closing():
            return
        if position > self.granted:
            self.granted = position
        self.writer.write(grant_frame(self.granted, deadline))


class Cut:
    """One joining follower's cut of every worker's stream."""

    def __init__(self, link: FollowerLink, streams: dict[int, WorkerStream]) -> None:
        self.link = link
        self.streams = streams  # the workers' channels when it began: all must finish it
        self.seen: set[int] = set()  # workers whose image arrived
        self.drained: set[int] = set()
        self.images: list[tuple[str, bytes]] = []
        self.snapshot_at = -1  # the node's position when the last image arrived
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def finish(self, ok: bool) -> None:
        if not self.done.done():
            self.done.set_result(ok)


class Relay:
    """Feeds `tap` (the node's stream) from its `count` workers' channels."""

    def __init__(
        self,
        tap: Tap,
        deadline: Callable[[], float],
        on_failed: Callable[[str, BaseException], None] | None = None,
        count: int = 1,
    ) -> None:
        self.tap = tap
        self.deadline = deadline  # the node's lease deadline, time.monotonic()
        self.on_failed = on_failed
        self.count = count
        self.streams: dict[int, WorkerStream] = {}
        self.cuts: list[Cut] = []  # those still waiting for some worker's image
        self._draining: list[Cut] = []  # every image in; some writer still draining

    async def serve(
        self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Relay worker `index`'s operations until its channel ends (it exited)."""
        stream = WorkerStream(index, writer)
        old = self.streams.get(index)
        if old is not None:
            old.closed = True
        self.streams[index] = stream
        try:
            while True:
                kind, payload = await wire.read_frame(reader)
                if kind == W_OPS:
                    self._ops(stream, payload)
                elif kind == W_IMAGE:
                    self._image(stream, parse_image(payload))
                elif kind == W_DRAINED:
                    self._drained(stream)
                elif kind == W_UNREADY:
                    for cut in [*self.cuts, *self._draining]:
                        if cut.streams.get(index) is stream:
                            cut.finish(False)  # the follower connects again shortly
                elif kind == W_FAILED:
                    path, error = parse_failed(payload)
                    log.error("cluster: worker %d could not write %s: %s", index, path, error)
                    if self.on_failed is not None:
                        self.on_failed(path, OSError(error))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            stream.closed = True
            if self.streams.get(index) is stream:
                del self.streams[index]
            for cut in [*self.cuts, *self._draining]:
                if cut.streams.get(index) is stream:
                    cut.finish(False)  # its image or files may miss what it wrote
            writer.close()

    def _ops(self, stream: WorkerStream, payload: bytes | bytearray) -> None:
        (local,) = wire.U64.unpack_from(payload, 0)
        data = bytes(memoryview(payload)[8:])
        stream.local = local
        if not data:
            return
        tap = self.tap
        cuts = self.cuts
        if cuts:
            tap.ship()  # so that the next frame holds this worker's batch alone
        tap._add([data])
        end = tap.position
        if cuts:
            tap.ship()
            frame = wire.frame(wire.OPS, wire.U64.pack(end) + data)
            for cut in cuts:
                if stream.index in cut.seen:
                    cut.link.send_ops(frame, end)  # after this worker's cut: its backlog
        tap.when_safe(end, lambda: stream.send_grant(local, self.deadline()))
        tap.check()

    def _image(self, stream: WorkerStream, image: tuple[str, bytes]) -> None:
        for cut in list(self.cuts):
            if cut.streams.get(stream.index) is not stream or stream.index in cut.seen:
                continue
            cut.seen.add(stream.index)
            cut.images.append(image)
            if len(cut.seen) == len(cut.streams):
                # Every worker cut: from here the follower takes the whole stream.
                self.tap.ship()
                cut.snapshot_at = self.tap.position
                cut.link.sent = max(cut.link.sent, cut.snapshot_at)
                self.tap.links.append(cut.link)
                self.cuts.remove(cut)
                self._draining.append(cut)
                self._check_drained(cut)

    def _drained(self, stream: WorkerStream) -> None:
        for cut in [*self.cuts, *self._draining]:
            if cut.streams.get(stream.index) is stream:
                cut.drained.add(stream.index)
                self._check_drained(cut)

    def _check_drained(self, cut: Cut) -> None:
        if cut in self._draining and len(cut.drained) == len(cut.streams):
            cut.finish(True)

    async def cut(self, link: FollowerLink, timeout: float = 60.0) -> Cut | None:
        """Cut every worker's stream for `link`'s follower: on success the link is one
        of the tap's (its state still "snapshot": frames go to its backlog) and every
        worker's writer has written what it reported before its cut. None: a worker
        is missing, went away meanwhile, or did not answer within `timeout`."""
        streams = dict(self.streams)
        if sorted(streams) != list(range(self.count)):
            return None  # a worker is (re)starting: the follower tries again
        cut = Cut(link, streams)
        self.cuts.append(cut)
        for stream in streams.values():
            stream.writer.write(wire.frame(W_CUT))
        try:
            ok = await asyncio.wait_for(asyncio.shield(cut.done), timeout)
        except TimeoutError:
            ok = False
        finally:
            if cut in self.cuts:
                self.cuts.remove(cut)
            if cut in self._draining:
                self._draining.remove(cut)
        if not ok:
            if link in self.tap.links:
                self.tap.links.remove(link)
            return None
        return cut

    async def sync_follower(
        self, name: str, theirs: datadir.Manifest, writer: asyncio.StreamWriter, root: str
    ) -> FollowerLink | None:
        """Bring a follower's copy to a point of the node's stream, then go live: the
        counterpart for a node of workers of `ReplicationListenerMixin._snapshot`."""
        loop = asyncio.get_running_loop()
        link = FollowerLink(name, writer)
        cut = await self.cut(link)
        if cut is None:
            link.close()
            return None
        link.snapshot_at = cut.snapshot_at  # type: ignore[attr-defined]
        sends, deletes, total = await loop.run_in_executor(None, datadir.plan, root, theirs)
        log.info(
            "cluster: syncing %s: %d file(s), %d byte(s) to send, %d to delete; %d worker "
            "definitions image(s)",
            name,
            len(sends),
            total,
            len(deletes),
            len(cut.images),
        )
        for rel in deletes:
            writer.write(wire.frame(wire.SNAP_DELETE, rel.encode()))
        for rel, image in cut.images:
            writer.write(wire.snap_sqlite(rel, image))
        if not await send_files(loop, writer, root, sends, link):
            if link in self.tap.links:
                self.tap.links.remove(link)
            return None
        writer.write(wire.frame(wire.SNAP_END, wire.U64.pack(cut.snapshot_at)))
        link.go_live()
        await writer.drain()
        return link

    def renewed(self) -> None:
        """The lease was renewed: every worker's held confirms may use the new deadline."""
        deadline = self.deadline()
        for stream in list(self.streams.values()):
            stream.send_grant(stream.granted, deadline)

    def stop(self) -> None:
        """The node stopped leading: no worker releases anything from now on."""
        for stream in list(self.streams.values()):
            stream.closed = True
            if not stream.writer.is_closing():
                stream.writer.write(wire.frame(W_STOP))
