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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from leveret.cluster import wire
from leveret.cluster.leader import Tap
from leveret.cluster.workertap import W_FAILED, W_OPS, W_STOP, grant_frame, parse_failed

log = logging.getLogger("leveret.cluster")


class WorkerStream:
    """One worker process's channel, from its start to its exit."""

    def __init__(self, index: int, writer: asyncio.StreamWriter) -> None:
        self.index = index
        self.writer = writer
        self.local = 0  # this worker's position after its last batch
        self.granted = -1
        self.closed = False

    def send_grant(self, position: int, deadline: float) -> None:
        if self.closed or self.writer.is_closing():
            return
        if position > self.granted:
            self.granted = position
        self.writer.write(grant_frame(self.granted, deadline))


class Relay:
    """Feeds `tap` (the node's stream) from its workers' channels."""

    def __init__(
        self,
        tap: Tap,
        deadline: Callable[[], float],
        on_failed: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.tap = tap
        self.deadline = deadline  # the node's lease deadline, time.monotonic()
        self.on_failed = on_failed
        self.streams: dict[int, WorkerStream] = {}

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
            writer.close()

    def _ops(self, stream: WorkerStream, payload: bytes | bytearray) -> None:
        (local,) = wire.U64.unpack_from(payload, 0)
        data = bytes(memoryview(payload)[8:])
        stream.local = local
        if not data:
            return
        tap = self.tap
        tap._add([data])
        end = tap.position
        tap.when_safe(end, lambda: stream.send_grant(local, self.deadline()))
        tap.check()

    def renewed(self) -> None:
        """The lease was renewed: every worker's held confirms may use the new deadline."""
        deadline = self.deadline()
        for stream in list(self.streams.values()):
            if stream.granted >= 0:
                stream.send_grant(stream.granted, deadline)

    def stop(self) -> None:
        """The node stopped leading: no worker releases anything from now on."""
        for stream in list(self.streams.values()):
            stream.closed = True
            if not stream.writer.is_closing():
                stream.writer.write(wire.frame(W_STOP))
