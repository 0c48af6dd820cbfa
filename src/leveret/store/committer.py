"""Group commit: one writer thread turns many small appends into one write + one fsync.

The broker's event loop must never block on the disk, and fsync costs the same for
one record as for a thousand, so publishes are queued here and made durable in
batches; publisher confirms go out from the `on_durable` callbacks, after the fsync.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from leveret.store import replica
from leveret.store.errors import StoreError, StoreWriteError
from leveret.store.summaries import summary_path, write_file

log = logging.getLogger("leveret.store")

OnDurable = Callable[[BaseException | None], None]
# One write: (segment seq, offset in the segment, byte chunks to write there). With
# offset SUMMARY_OP the chunks are the segment's summary (see store.summaries): it is
# written to its own file once everything before it in the batch is synced.
WriteOp = tuple[int, int, Sequence[bytes]]
SUMMARY_OP = -1

FSYNC_MODES = ("always", "batch", "never")

_WRITE = 0
_UNLINK = 1
_BARRIER = 2
_SYNC = 3  # fsync descriptors another log wrote itself (stream segments)

_sync_file = getattr(os, "fdatasync", os.fsync)


def segment_path(directory: str, seq: int) -> str:
    """Zero-padded so a plain directory listing sorts segments in log order."""
    return os.path.join(directory, f"{seq:016d}.seg")


class Buckets:
    """A fixed-bucket histogram in plain ints: O(1) memory, filled by the writer thread,
    read by the metrics endpoint (a reading may be one observation behind; no lock)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


#: A test hook (tests/workers/test_stuck_parts.py): while this variable names a file
#: that exists, the writer thread waits before each batch, as on a disk that does not
#: answer. Unset (always, outside tests), the writer is the plain one.
STUCK_FILE_ENV = "LEVERET_TEST_STUCK_STORE_FILE"

FSYNC_SECONDS_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class GroupCommitter:
    """Owns the writer thread for one directory of segment files.

    Callers reserve offsets themselves (see SegmentLog), so the thread only copies
    bytes to where they were promised; it never decides placement. `generation`
    changes whenever a write fails: ops reserved under an older generation are
    refused, because their offsets may no longer line up with the file.
    """

    def __init__(
        self,
        directory: str,
        mode: str = "batch",
        loop: asyncio.AbstractEventLoop | None = None,
        name: str = "leveret-store-writer",
    ) -> None:
        if mode not in FSYNC_MODES:
            raise ValueError(f"fsync mode must be one of {FSYNC_MODES}, not {mode!r}")
        self.directory = directory
        self.mode = mode
        self.loop = loop
        self.generation = 0
        # Earliest (seq, offset) lost by the last failure; SegmentLog resyncs from it.
        self.failed_from: tuple[int, int] | None = None
        # Segments whose unlink was dropped by a failure (their preceding writes failed).
        self.failed_unlinks: list[int] = []
        self.unlinks_disabled = False
        self.batches = 0
        self.syncs = 0
        self.fsync_seconds = Buckets(FSYNC_SECONDS_BOUNDS)  # for /metrics
        self.batch_sizes = Buckets(BATCH_SIZE_BOUNDS)  # writes per group commit
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._pending: list[tuple[int, object, object]] = []
        # Records queued but not yet taken by the writer thread (approximate: read
        # without the lock). A plain attribute, not a property: every connection
        # reads it once a read (persistence/durable_state.py's disk_backlogged).
        self.backlog = 0
        self._closing = False
        self._written: dict[int, int] = {}
        self._fds: dict[int, int] = {}
        self._new_file = False
        self._batch_release: tuple[replica.FileTap, int] | None = None
        #: monotonic time the writer thread took the batch it works on (its writes and
        #: fsync), None while it waits for work: how long the oldest write taken has
        #: waited, for a worker's liveness report (workers/liveness.py). Set by the
        #: writer thread once a batch, never by `submit`.
        self.busy_since: float | None = None
        flag = os.environ.get(STUCK_FILE_ENV)
        if flag:
            self._stick_while(flag)
        os.makedirs(directory, exist_ok=True)
        self._dirfd = os.open(directory, os.O_RDONLY)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- called from the event loop -------------------------------------------------

    def submit(
        self,
        records: Sequence[WriteOp],
        on_durable: OnDurable | None = None,
        generation: int | None = None,
    ) -> bool:
        """Queue writes; `on_durable(exc)` runs on the loop once they are on disk (or failed).

        Cheap by design (a lock and a list append): it runs once per publish.
        Returns False if the ops were refused because a failure invalidated them.
        """
        with self._lock:
            if self._closing:
                raise StoreError("store is closed")
            if generation is None or generation == self.generation:
                if replica.TAP is not None:  # a cluster leader: the followers get them too
                    _tap_writes(self.directory, records)
                self._pending.append((_WRITE, records, on_durable))
                self.backlog += len(records)
                if len(self._pending) == 1:
                    self._work.notify()
                return True
        if on_durable is not None:
            err = StoreWriteError("an earlier store write failed; this write was not made")
            self._deliver([(on_durable, err)])
        return False

    def submit_sync(self, fds: Sequence[int], on_durable: OnDurable) -> None:
        """fsync descriptors that another log (a stream) wrote to, in the next batch.

        Streams write their own records but share this thread and its batching:
        every fd is synced once per batch however many publishes wait on it,
        and `--fsync never` applies to them too.  The caller keeps the fds open
        until `on_durable` has run.
        """
        with self._lock:
            if self._closing:
                raise StoreError("store is closed")
            self._pending.append((_SYNC, fds, on_durable))
            if len(self._pending) == 1:
                self._work.notify()

    def submit_unlink(self, seq: int) -> None:
        """Delete a segment file, but only after everything queued before it is durable.

        Ordering matters: compacted copies must be on disk before the original goes,
        and a segment holding ACKs must outlive the segment whose PUBLISHes they cancel.
        """
        with self._lock:
            if replica.TAP is not None:
                replica.unlinked(summary_path(self.directory, seq))
                replica.unlinked(segment_path(self.directory, seq))
            self._pending.append((_UNLINK, seq, None))
            if len(self._pending) == 1:
                self._work.notify()

    def drain(self, timeout: float | None = None) -> bool:
        """Block until everything submitted so far has been processed (tests, shutdown)."""
        done = threading.Event()
        with self._lock:
            if self._closing and not self._thread.is_alive():
                return True
            self._pending.append((_BARRIER, done, None))
            if len(self._pending) == 1:
                self._work.notify()
        return done.wait(timeout)

    def mark_written(self, seq: int, end: int) -> None:
        """Record that a segment found at startup already holds `end` bytes."""
        with self._lock:
            if self._written.get(seq, -1) < end:
                self._written[seq] = end

    def wait_written(self, seq: int, end: int, timeout: float = 30.0) -> None:
        """Wait until bytes up to `end` of segment `seq` have been handed to the OS."""
        if self._written.get(seq, -1) >= end:
            return
        deadline = time.monotonic() + timeout
        with self._lock:
            gen = self.generation
            while self._written.get(seq, -1) < end:
                if self.generation != gen:
                    raise StoreWriteError(f"segment {seq} write failed before offset {end}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreError(f"timed out waiting for segment {seq} to reach {end}")
                self._progress.wait(remaining)

    def close(self) -> None:
        """Write out everything pending, then stop the thread and close files."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._work.notify()
        self._thread.join()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        os.close(self._dirfd)

    # ---- writer thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._work.wait()
                if not self._pending:
                    return
                batch = self._pending
                self._pending = []
                self.backlog = 0
                # A cluster leader confirms this batch once the followers hold everything
                # reported to the tap so far (which includes the whole batch).
                tap = replica.TAP
                self._batch_release = (tap, tap.position) if tap is not None else None
            self.busy_since = time.monotonic()
            try:
                self._process(batch)
            except Exception:  # never let the writer die silently
                log.exception("store writer: unexpected error")
            finally:
                self.busy_since = None

    def _stick_while(self, flag: str) -> None:
        """The test hook of STUCK_FILE_ENV: each batch waits while `flag` exists, as a
        write or fsync that the disk does not answer."""
        plain = self._process

        def stuck(batch: list[tuple[int, object, object]]) -> None:
            while os.path.exists(flag):
                time.sleep(0.05)
            plain(batch)

        self._process = stuck  # type: ignore[method-assign]

    def _process(self, batch: list[tuple[int, object, object]]) -> None:
        always = self.mode == "always"
        durable = 0  # batch[:durable] is on disk
        parts: list[bytes] = []
        run_seq = -1
        run_start = 0
        dirty: set[int] = set()
        # First offset written per segment since the last sync: where to truncate on failure.
        firsts: dict[int, int] = {}
        barriers: list[threading.Event] = []
        sealed: list[tuple[int, Sequence[bytes]]] = []  # summaries to write once synced
        # Stream fsyncs do not depend on this store's writes: all of them run,
        # even when a write below fails.
        syncs = [(arg, cb) for kind, arg, cb in batch if kind == _SYNC]
        try:
            for i, (kind, arg, _cb) in enumerate(batch):
                if kind == _WRITE:
                    for seq, off, chunk in arg:  # type: ignore[attr-defined]
                        if off < 0:
                            sealed.append((seq, chunk))
                            continue
                        if seq != run_seq or not parts:
                            if parts:
                                self._flush(run_seq, run_start, parts, dirty)
                            parts = []
                            run_seq = seq
                            run_start = off
                            firsts.setdefault(seq, off)
                        parts.extend(chunk)
                    if always:
                        run_start = self._flush(run_seq, run_start, parts, dirty)
                        parts = []
                        self._sync(dirty)
                        firsts.clear()
                        durable = i + 1
                elif kind == _UNLINK:
                    if parts:
                        run_start = self._flush(run_seq, run_start, parts, dirty)
                        parts = []
                    self._sync(dirty)
                    firsts.clear()
                    durable = i
                    sealed = [item for item in sealed if item[0] != arg]
                    self._unlink(arg)  # type: ignore[arg-type]
                    run_seq = -1
                    durable = i + 1
                elif kind == _SYNC:
                    pass  # done after this batch's own writes: see `syncs`
                else:
                    barriers.append(arg)  # type: ignore[arg-type]
            if parts:
                self._flush(run_seq, run_start, parts, dirty)
            self._sync(dirty)
            durable = len(batch)
            for seq, chunks in sealed:
                self._write_summary(seq, chunks)
        except OSError as exc:
            self._fail(batch, durable, firsts, exc)
        self.batches += 1
        self.batch_sizes.observe(sum(1 for kind, _a, _cb in batch if kind == _WRITE))
        with self._lock:
            self._progress.notify_all()
        done = [(cb, None) for kind, _a, cb in batch[:durable] if kind == _WRITE and cb]
        if syncs:
            done += self._sync_other(syncs)
        if done:
            if self._batch_release is not None:
                tap, position = self._batch_release
                tap.release(position, done)
            else:
                self._deliver(done)
        for ev in barriers:
            ev.set()
        # Keep only the newest segment's descriptor open; older ones are sealed.
        if len(self._fds) > 1:
            newest = max(self._fds)
            for seq in [s for s in self._fds if s != newest]:
                os.close(self._fds.pop(seq))

    def _flush(self, seq: int, start: int, parts: list[bytes], dirty: set[int]) -> int:
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        fd = self._fds.get(seq)
        if fd is None:
            fd = os.open(
                segment_path(self.directory, seq), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            self._fds[seq] = fd
            self._new_file = True
        view = memoryview(data)
        pos = start
        while view:
            n = os.pwrite(fd, view, pos)
            pos += n
            view = view[n:]
        dirty.add(seq)
        self._written[seq] = pos
        return pos

    def _sync(self, dirty: set[int]) -> None:
        if self.mode != "never" and (dirty or self._new_file):
            started = time.perf_counter()
            for seq in dirty:
                _sync_file(self._fds[seq])
            if self._new_file:
                os.fsync(self._dirfd)
            self.syncs += 1
            self.fsync_seconds.observe(time.perf_counter() - started)
        self._new_file = False
        dirty.clear()

    def _sync_other(
        self, syncs: list[tuple[Sequence[int], OnDurable]]
    ) -> list[tuple[OnDurable, BaseException | None]]:
        """fsync each stream descriptor once; its error goes only to its own waiters
        (it says nothing about this store's segments)."""
        results: dict[int, OSError | None] = {}
        calls: list[tuple[OnDurable, BaseException | None]] = []
        for fds, cb in syncs:
            error = None
            for fd in fds:
                if fd not in results:
                    results[fd] = None
                    if self.mode != "never":
                        try:
                            _sync_file(fd)
                        except OSError as exc:
                            results[fd] = exc
                            replica.failed(self.directory, exc)
                error = error or results[fd]
            calls.append((cb, error))
        if self.mode != "never":
            self.syncs += 1
        return calls

    def _write_summary(self, seq: int, chunks: Sequence[bytes]) -> None:
        """A summary is only a shortcut for recovery: failing to write one costs the
        next crash recovery a walk of this segment, nothing else."""
        try:
            write_file(summary_path(self.directory, seq), chunks)
        except OSError as exc:
            log.warning("store: summary of segment %d not written (%s)", seq, exc)

    def _unlink(self, seq: int) -> None:
        if self.unlinks_disabled:
            return
        fd = self._fds.pop(seq, None)
        if fd is not None:
            os.close(fd)
        try:
            # The summary first: a crash in between leaves a segment without one
            # (walked on recovery), never a summary without its segment.
            os.unlink(summary_path(self.directory, seq))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("store: could not delete the summary of segment %d (%s)", seq, exc)
        try:
            os.unlink(segment_path(self.directory, seq))
            if self.mode != "never":
                os.fsync(self._dirfd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # Later unlinks may depend on this one (ACKs cancelling its PUBLISHes), so stop
            # reclaiming rather than risk resurrecting acked messages after a crash.
            self.unlinks_disabled = True
            log.error("store: could not delete segment %d (%s); disk reclaim paused", seq, exc)

    def _fail(
        self,
        batch: list[tuple[int, object, object]],
        durable: int,
        firsts: dict[int, int],
        exc: OSError,
    ) -> None:
        name = errno.errorcode.get(exc.errno or 0, "error")
        replica.failed(self.directory, exc)
        for seq, off in sorted(firsts.items()):
            fd = self._fds.pop(seq, None)
            try:
                if off == 0:
                    os.unlink(segment_path(self.directory, seq))
                elif fd is not None:
                    os.ftruncate(fd, off)
            except OSError as texc:
                log.error("store: could not roll back segment %d to %d: %s", seq, off, texc)
            if fd is not None:
                os.close(fd)
            self._written[seq] = off
        with self._lock:
            rest = self._pending
            self._pending = []
            self.backlog = 0
            self.generation += 1
            self.failed_from = min(firsts.items()) if firsts else None
            failed = batch[durable:] + rest
            for kind, arg, _cb in failed:
                if kind == _UNLINK:
                    self.failed_unlinks.append(arg)  # type: ignore[arg-type]
        log.error(
            "store write/fsync failed in %s (%s: %s); %d submissions not made durable",
            self.directory,
            name,
            exc,
            sum(1 for k, _a, _c in failed if k == _WRITE),
        )
        cbs = [(cb, exc) for kind, _a, cb in batch[durable:] if kind == _WRITE and cb]
        cbs += [(cb, exc) for kind, _a, cb in rest if kind in (_WRITE, _SYNC) and cb]
        if cbs:
            self._deliver(cbs)
        for kind, arg, _cb in failed:
            if kind == _BARRIER:
                arg.set()  # type: ignore[attr-defined]

    def _deliver(self, calls: list[tuple[OnDurable, BaseException | None]]) -> None:
        """One loop wake-up per batch, not per callback: call_soon_threadsafe is not free."""
        if self.loop is None:
            _run_callbacks(calls)
            return
        try:
            self.loop.call_soon_threadsafe(_run_callbacks, calls)
        except RuntimeError:  # loop closed during shutdown; nobody is listening
            pass


def _tap_writes(directory: str, records: Sequence[WriteOp]) -> None:
    for seq, off, chunks in records:
        if off < 0:  # SUMMARY_OP: the whole summary file
            replica.replaced(summary_path(directory, seq), b"".join(chunks))
        else:
            replica.wrote(segment_path(directory, seq), off, chunks)


def _run_callbacks(calls: list[tuple[OnDurable, BaseException | None]]) -> None:
    for cb, exc in calls:
        try:
            cb(exc)
        except Exception:
            log.exception("store: on_durable callback raised")
