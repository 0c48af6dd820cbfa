"""A node of workers' replication: each worker's tap (cluster/workertap.py) feeding the
node's one stream through the relay (cluster/relay.py), on real socket pairs, with a
real group committer writing a worker's store and a real follower's `Applier` writing
the copy. No etcd and no processes: the node's in-sync rule is the `safe` function
the test sets, as `InSyncMixin._safe_position` would."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

from leveret.cluster import datadir, wire
from leveret.cluster.follower import Follower
from leveret.cluster.leader import FollowerLink, Tap
from leveret.cluster.relay import Relay
from leveret.cluster.workertap import W_STOP, Cutter, WorkerTap, grant_frame
from leveret.store import replica
from leveret.store.committer import GroupCommitter, segment_path

WAIT = 20.0  # generous: a loaded shared machine; nothing here is timed


async def _until(what: Callable[[], bool], why: str) -> None:
    deadline = time.monotonic() + WAIT
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {why}")
        await asyncio.sleep(0.01)


async def _pair() -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], ...]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return (
        await asyncio.open_unix_connection(sock=a),
        await asyncio.open_unix_connection(sock=b),
    )


class Rig:
    """A leading node's `Tap` and `Relay`, `count` workers' taps linked to it, and one
    live follower whose frames are applied to `copy` as a follower's writer would."""

    def __init__(self, root: str, copy: str) -> None:
        self.root = root
        self.copy = copy
        self.safe = -1
        self.deadline = time.monotonic() + 3600
        self.workers: list[WorkerTap] = []
        self.acked = -1
        self.tasks: list[asyncio.Task] = []

    async def start(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        self.tap = Tap(self.root, loop)
        self.tap.safe = lambda: self.safe
        self.relay = Relay(self.tap, lambda: self.deadline, count=count)
        for i in range(count):
            (wr, ww), (nr, nw) = await _pair()
            store = os.path.join(self.root, f"worker-{i}")
            os.makedirs(store, exist_ok=True)
            wtap = WorkerTap(store, self.root, loop, ww)
            self.tasks.append(asyncio.ensure_future(wtap.serve(wr)))
            self.tasks.append(asyncio.ensure_future(self.relay.serve(i, nr, nw)))
            self.workers.append(wtap)
        (fr, fw), (lr, lw) = await _pair()
        self.ends = (fw, lr)  # kept: a writer that is collected closes its socket
        self.link = FollowerLink("f", lw, state="live")
        self.tap.links.append(self.link)
        self.applier = datadir.Applier(self.copy, fsync=False)
        self.tasks.append(asyncio.ensure_future(self._follow(fr)))

    async def _follow(self, reader: asyncio.StreamReader) -> None:
        while True:
            kind, payload = await wire.read_frame(reader)
            if kind == wire.OPS:
                (position,) = wire.U64.unpack_from(payload, 0)
                self.applier.apply(memoryview(payload)[8:])
                self.acked = max(self.acked, position)

    def hold(self, position: int) -> None:
        """The in-sync followers hold the node's stream up to `position`."""
        self.safe = position
        self.tap.check()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.applier.close()


def _run(root: str, copy: str, body: Callable[[Rig], Awaitable[None]], count: int = 2) -> None:
    async def main() -> None:
        rig = Rig(root, copy)
        await rig.start(count)
        try:
            await body(rig)
        finally:
            await rig.close()

    asyncio.run(main())


def _called(log: list) -> Callable[[BaseException | None], None]:
    return lambda exc: log.append(exc)


def test_each_workers_writes_reach_the_followers_copy_under_its_own_dir(tmp_path) -> None:  # noqa: ANN001
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        w0, w1 = rig.workers
        w0.write(os.path.join(root, "worker-0", "msgs", "1.seg"), 0, [b"zero"])
        w1.write(os.path.join(root, "worker-1", "msgs", "1.seg"), 0, [b"one", b"!"])
        w1.replace(os.path.join(root, "worker-1", "queues.json"), b"{}")
        w0.write(os.path.join(root, "elsewhere"), 0, [b"x"])  # outside its store: ignored
        await _until(lambda: rig.acked == rig.tap.position and rig.acked > 0, "the stream")
        with open(os.path.join(copy, "worker-0", "msgs", "1.seg"), "rb") as f:
            assert f.read() == b"zero"
        with open(os.path.join(copy, "worker-1", "msgs", "1.seg"), "rb") as f:
            assert f.read() == b"one!"
        with open(os.path.join(copy, "worker-1", "queues.json"), "rb") as f:
            assert f.read() == b"{}"
        assert not os.path.exists(os.path.join(copy, "elsewhere"))
        assert sorted(os.listdir(copy)) == ["worker-0", "worker-1"]

    _run(root, copy, body)


def test_a_workers_confirm_waits_for_the_followers_of_its_own_writes(tmp_path) -> None:  # noqa: ANN001
    """Worker 0 writes, then worker 1, then worker 0 again: the node's stream holds them
    in that order. Once the followers hold it up to worker 1's write, worker 1 confirms
    and worker 0 confirms its first write, not its second."""
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        w0, w1 = rig.workers
        done: dict[str, list] = {"a": [], "b": [], "c": []}
        w0.write(os.path.join(root, "worker-0", "s"), 0, [b"a" * 10])
        w0.release(w0.position, [(_called(done["a"]), None)])
        await _until(lambda: rig.tap.position > 0, "worker 0's first write in the stream")
        w1.write(os.path.join(root, "worker-1", "s"), 0, [b"b" * 10])
        w1.release(w1.position, [(_called(done["b"]), None)])
        await _until(lambda: 0 < rig.relay.streams[1].local, "worker 1's write relayed")
        through_b = rig.tap.position
        w0.write(os.path.join(root, "worker-0", "s"), 10, [b"c" * 10])
        w0.release(w0.position, [(_called(done["c"]), None)])
        await _until(lambda: rig.relay.streams[0].local == w0.position, "worker 0's second")
        await _until(lambda: rig.acked == rig.tap.position, "the follower has everything")
        assert done == {"a": [], "b": [], "c": []}  # nothing is safe yet
        rig.hold(through_b)
        await _until(lambda: done["a"] and done["b"], "the confirms the followers cover")
        await asyncio.sleep(0.2)  # a wrongly granted confirm would arrive meanwhile
        assert done["c"] == []
        assert done["a"] == [None] and done["b"] == [None]
        rig.hold(rig.tap.position)
        await _until(lambda: done["c"], "worker 0's second confirm")

    _run(root, copy, body)


def test_no_confirm_past_the_lease_deadline_sent_with_the_grant(tmp_path) -> None:  # noqa: ANN001
    """The worker checks the node's lease deadline itself, when it writes confirms: a
    grant whose deadline has passed releases nothing until a renewal moves it."""
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        (w0,) = rig.workers
        done: list = []
        rig.deadline = time.monotonic() - 0.1
        w0.write(os.path.join(root, "worker-0", "s"), 0, [b"a"])
        await _until(lambda: rig.relay.streams[0].local == w0.position, "relayed")
        rig.hold(rig.tap.position)
        await _until(lambda: w0.granted == w0.position, "the grant")
        w0.release(w0.position, [(_called(done), None)])
        await asyncio.sleep(0.2)
        assert done == [] and w0.safe() == -1
        rig.deadline = time.monotonic() + 3600
        rig.relay.renewed()
        await _until(lambda: done == [None], "the confirm after the renewal")

    _run(root, copy, body, count=1)


def test_a_node_that_stops_leading_or_goes_away_releases_nothing_more(tmp_path) -> None:  # noqa: ANN001
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        w0, w1 = rig.workers
        done: list = []
        w0.write(os.path.join(root, "worker-0", "s"), 0, [b"a"])
        w0.release(w0.position, [(_called(done), None)])
        await _until(lambda: rig.relay.streams[0].local == w0.position, "relayed")
        w0.sql(os.path.join(root, "worker-0", "definitions.db"), ["SELECT 1"])
        waiting = asyncio.ensure_future(w0.wait_safe(w0.sql_position))
        rig.relay.stop()
        await _until(lambda: w0.stopped and w1.stopped, "both workers told")
        with pytest.raises(replica.NotLeading):
            await waiting
        rig.hold(rig.tap.position)  # too late: this node no longer leads
        await asyncio.sleep(0.2)
        assert done == []

    _run(root, copy, body)


def test_a_worker_whose_node_process_is_gone_stops_releasing(tmp_path) -> None:  # noqa: ANN001
    async def main() -> None:
        loop = asyncio.get_running_loop()
        (wr, ww), (_nr, nw) = await _pair()
        store = tmp_path / "node" / "worker-0"
        store.mkdir(parents=True)
        wtap = WorkerTap(str(store), str(tmp_path / "node"), loop, ww)
        serving = asyncio.ensure_future(wtap.serve(wr))
        wtap.grant(10, time.monotonic() + 3600)
        nw.close()  # the supervisor's end: the node process died
        await asyncio.wait_for(serving, WAIT)
        done: list = []
        wtap.release(5, [(_called(done), None)])
        await asyncio.sleep(0.1)
        assert wtap.stopped and done == []

    asyncio.run(main())


def test_a_store_outside_the_node_data_dir_is_refused(tmp_path) -> None:  # noqa: ANN001
    async def main() -> None:
        (_wr, ww), _ = await _pair()
        with pytest.raises(ValueError, match="not under the node's data dir"):
            WorkerTap(str(tmp_path / "a"), str(tmp_path / "b"), asyncio.get_running_loop(), ww)

    asyncio.run(main())


def test_a_real_group_commit_in_a_worker_confirms_once_the_followers_hold_it(tmp_path) -> None:  # noqa: ANN001
    """The store's own writer: its batch is written and fsynced, reported through the
    worker's tap, and its callback runs only once the node's followers hold it."""
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        (w0,) = rig.workers
        loop = asyncio.get_running_loop()
        store = os.path.join(root, "worker-0", "msgs")
        committer = GroupCommitter(store, "batch", loop=loop)
        replica.TAP = w0
        try:
            done: list = []
            committer.submit([(1, 0, [b"record-one"])], _called(done))
            committer.submit([(1, 10, [b"record-two"])], _called(done))
            await _until(lambda: rig.acked == rig.tap.position > 0, "the follower's copy")
            await _until(lambda: w0.pending, "the batch's callbacks held by the tap")
            await asyncio.sleep(0.1)
            assert done == []
            rig.hold(rig.tap.position)
            await _until(lambda: len(done) == 2, "both confirms")
            assert done == [None, None]
            copied = os.path.join(copy, "worker-0", "msgs", os.path.basename(segment_path("", 1)))
            with open(copied, "rb") as f:
                assert f.read() == b"record-onerecord-two"
        finally:
            replica.TAP = None
            await loop.run_in_executor(None, committer.close)

    _run(root, copy, body, count=1)


def test_a_followers_applier_keeps_each_workers_definitions_apart(tmp_path) -> None:  # noqa: ANN001
    copy = str(tmp_path / "copy")
    applier = datadir.Applier(copy, fsync=False)
    for i in range(2):
        os.makedirs(os.path.join(copy, f"worker-{i}"))
        rel = f"worker-{i}/{datadir.DEFINITIONS}"
        applier.sql(rel, ["CREATE TABLE q (name TEXT)", f"INSERT INTO q VALUES ('w{i}')"])
    applier.sqlite_image("worker-0/" + datadir.DEFINITIONS, _image(["x"]))
    applier.sql("worker-1/" + datadir.DEFINITIONS, ["INSERT INTO q VALUES ('more')"])
    applier.close()
    assert _names(os.path.join(copy, "worker-0", datadir.DEFINITIONS)) == ["x"]
    assert _names(os.path.join(copy, "worker-1", datadir.DEFINITIONS)) == ["more", "w1"]


def _image(names: list[str]) -> bytes:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE q (name TEXT)")
    db.executemany("INSERT INTO q VALUES (?)", [(n,) for n in names])
    db.commit()
    return db.serialize()


def _names(path: str) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return sorted(r[0] for r in db.execute("SELECT name FROM q"))
    finally:
        db.close()


# ---- a follower that joins: one cut per worker ----------------------------------------


class Store:
    """A worker's store as a cut sees it: each record reported to the worker's tap as it
    is submitted and written to its segment file later by the writer (here `write`,
    which the test's writer task and the cut's drain call, as the group committer's
    thread does), and a real SQLite definitions database whose committed statements
    are reported as the store's trace hook reports them."""

    def __init__(self, root: str, index: int, tap: WorkerTap) -> None:
        self.index = index
        self.dir = os.path.join(root, f"worker-{index}")
        self.segment = os.path.join(self.dir, "msgs", "1.seg")
        os.makedirs(os.path.dirname(self.segment), exist_ok=True)
        self.tap = tap
        self.db_path = os.path.join(self.dir, datadir.DEFINITIONS)
        self.db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE q (name TEXT)")
        self.offset = 0
        self.count = 0
        self.pending: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()
        tap.cutter = Cutter(flush=lambda: None, image=self.db.serialize, drain=self.drain)

    def step(self) -> None:
        data = f"w{self.index}:{self.count};".encode()
        self.tap.write(self.segment, self.offset, [data])
        with self.lock:
            self.pending.append((self.offset, data))
        self.offset += len(data)
        if self.count % 3 == 0:
            statement = f"INSERT INTO q VALUES ('w{self.index}-{self.count}')"
            self.db.execute(statement)
            self.tap.sql(self.db_path, [statement])
        self.count += 1

    def drain(self) -> None:
        """The cut waits for this: a writer in the middle of a slow fsync."""
        time.sleep(0.1)
        self.write()

    def write(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
            with open(self.segment, "r+b" if os.path.exists(self.segment) else "wb") as f:
                for offset, data in pending:
                    f.seek(offset)
                    f.write(data)


def test_a_follower_joining_while_every_worker_writes_gets_a_whole_copy(tmp_path) -> None:  # noqa: ANN001
    """Two workers write segments and definitions without pause while a follower
    joins from a stale copy; once they stop and it caught up, its copy of each
    worker's store is the worker's: segment bytes, definitions rows, the stale file
    gone. Its frames are applied by the follower's own writer (`Follower._apply`)."""
    root, copy, joiner = (str(tmp_path / d) for d in ("node", "copy", "joiner"))
    os.makedirs(os.path.join(joiner, "worker-0"))
    with open(os.path.join(joiner, "worker-0", "stale"), "wb") as f:
        f.write(b"from an older leader")

    async def body(rig: Rig) -> None:
        loop = asyncio.get_running_loop()
        stores = [Store(root, i, tap) for i, tap in enumerate(rig.workers)]
        stop = asyncio.Event()

        async def publish(store: Store) -> None:
            while not stop.is_set():
                store.step()
                await asyncio.sleep(0)

        joining = asyncio.Event()  # the writers write only through the cut's drain

        async def write_behind() -> None:
            while not stop.is_set():
                if joining.is_set():
                    await asyncio.sleep(0.005)
                    continue
                for store in stores:
                    await loop.run_in_executor(None, store.write)
                await asyncio.sleep(0.005)

        tasks = [asyncio.ensure_future(publish(s)) for s in stores]
        tasks.append(asyncio.ensure_future(write_behind()))
        follower = Follower(joiner, "f", "c", {}, 1, False)
        applied = {"ack": -1}
        (fr, fw), (lr, lw) = await _pair()

        async def apply() -> None:
            while True:
                kind, payload = await wire.read_frame(fr)
                ack = follower._apply([(kind, payload)])
                if ack is not None:
                    applied["ack"] = max(applied["ack"], ack)

        applying = asyncio.ensure_future(apply())
        try:
            await _until(lambda: all(s.count > 200 for s in stores), "writes before the join")
            joining.set()
            link = await rig.relay.sync_follower("f", datadir.manifest(joiner), lw, root)
            joining.clear()
            assert link is not None and link in rig.tap.links
            synced = [s.count for s in stores]
            await _until(
                lambda: all(s.count > n + 200 for s, n in zip(stores, synced, strict=True)),
                "writes after the join",
            )
            stop.set()
            await asyncio.gather(*tasks)
            for store in stores:
                store.write()
            await _until(lambda: applied["ack"] == rig.tap.position, "the joiner caught up")
        finally:
            stop.set()
            applying.cancel()
            await asyncio.gather(applying, return_exceptions=True)
            follower.applier.close()
            fw.close()
            lr.feed_eof()
        assert follower.synced and 0 < follower.synced_at <= rig.tap.position
        assert not os.path.exists(os.path.join(joiner, "worker-0", "stale"))
        for store in stores:
            rel = os.path.relpath(store.segment, root)
            with open(store.segment, "rb") as a, open(os.path.join(joiner, rel), "rb") as b:
                assert a.read() == b.read()
            names = _names(store.db_path)
            assert len(names) > 100
            assert _names(os.path.join(joiner, f"worker-{store.index}", datadir.DEFINITIONS)) == (
                names
            )
            store.db.close()

    _run(root, copy, body)


def test_a_cut_is_given_up_when_a_worker_goes_away_or_is_missing(tmp_path) -> None:  # noqa: ANN001
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        (_r, w), _ = await _pair()
        link = FollowerLink("g", w)
        # worker 1 has no store yet (no cutter): it says so, and the cut is given up
        Store(root, 0, rig.workers[0])
        assert await asyncio.wait_for(rig.relay.cut(link), WAIT) is None
        assert link not in rig.tap.links and not rig.relay.cuts
        # worker 1's store opens but its drain never ends; then it exits
        hang = threading.Event()
        rig.workers[1].cutter = Cutter(lambda: None, lambda: _image([]), hang.wait)
        cutting = asyncio.ensure_future(rig.relay.cut(link))
        await _until(lambda: len(rig.relay._draining) == 1, "both images in")
        rig.workers[1].channel.close()
        assert await asyncio.wait_for(cutting, WAIT) is None
        hang.set()
        assert link not in rig.tap.links and not rig.relay.cuts and not rig.relay._draining
        # and with worker 1 gone, no cut starts at all
        await _until(lambda: 1 not in rig.relay.streams, "worker 1's channel closed")
        assert await rig.relay.cut(link) is None

    _run(root, copy, body)


def test_a_worker_that_wrote_nothing_answers_once_a_renewal_brings_the_deadline(tmp_path) -> None:  # noqa: ANN001
    """Position 0 (nothing written) is held by every follower: a metadata answer or a
    definition change's hold that waits on it needs only a valid deadline."""
    root, copy = str(tmp_path / "node"), str(tmp_path / "copy")

    async def body(rig: Rig) -> None:
        (w0,) = rig.workers
        done: list = []
        w0.when_safe(w0.sql_position, lambda: done.append("answered"))
        w0.check()
        await asyncio.sleep(0.1)
        assert done == []  # no deadline from the node yet
        rig.relay.renewed()
        await _until(lambda: done == ["answered"], "the answer after the renewal")

    _run(root, copy, body, count=1)


def test_a_worker_whose_node_sends_no_renewal_past_its_lease_lapses(tmp_path) -> None:  # noqa: ANN001
    """The supervisor stopped (SIGSTOP) or starved while its workers run: once the
    lease deadline it sent passed `grace` ago with no renewal, the tap's `lapsed` is
    done (worker.py then stops the worker, whose clients would otherwise wait on it
    with no confirm for as long as the supervisor is stopped). Each renewal moves
    that point; a node that said it stops leading, or a tap without grace, never
    lapses."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        node = tmp_path / "node"
        taps = []
        for i in range(3):
            (wr, ww), (_nr, nw) = await _pair()
            store = node / f"worker-{i}"
            store.mkdir(parents=True)
            tap = WorkerTap(str(store), str(node), loop, ww, grace=0.0 if i == 2 else 0.3)
            taps.append((tap, asyncio.ensure_future(tap.serve(wr)), nw))
        (renewed, _, _), (stopped, stopped_serving, stopped_nw), (graceless, _, _) = taps
        for tap, _serving, _nw in taps:
            tap.grant(1, time.monotonic() + 0.2)
        stopped_nw.write(wire.frame(W_STOP, b""))  # the node stopped leading
        await asyncio.wait_for(stopped_serving, WAIT)
        for _ in range(10):  # renewals keep it: 1 s, past deadline + grace
            await asyncio.sleep(0.1)
            renewed.grant(1, time.monotonic() + 0.2)
        assert not renewed.lapsed.done()
        await asyncio.wait_for(renewed.lapsed, WAIT)  # the renewals stop: it lapses
        assert not stopped.lapsed.done()
        assert not graceless.lapsed.done()
        for _tap, _serving, nw in taps:
            nw.close()
        await asyncio.gather(*(t[1] for t in taps), return_exceptions=True)

    asyncio.run(main())


def test_a_worker_whose_own_loop_stalled_reads_the_renewals_before_it_lapses(tmp_path) -> None:  # noqa: ANN001
    """A worker paused (SIGSTOP) or starved past its lapse time while its node renewed:
    the renewal waits unread in the channel, and the overdue timer runs before it is
    read; it gives the channel `grace` more instead of lapsing."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        (wr, ww), (_nr, nw) = await _pair()
        store = tmp_path / "node" / "worker-0"
        store.mkdir(parents=True)
        tap = WorkerTap(str(store), str(tmp_path / "node"), loop, ww, grace=0.3)
        serving = asyncio.ensure_future(tap.serve(wr))
        tap.grant(1, time.monotonic() + 0.1)
        nw.write(grant_frame(1, time.monotonic() + 60))  # the node's renewal, unread
        await nw.drain()
        time.sleep(1.0)  # this worker's loop stalls past deadline + grace
        await _until(lambda: tap.deadline > time.monotonic() + 30, "the renewal read")
        await asyncio.sleep(0.5)
        assert not tap.lapsed.done()
        nw.close()
        await asyncio.wait_for(serving, WAIT)

    asyncio.run(main())
