"""The leader's side of one follower's link, on real sockets (no etcd, no nodes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest

from leveret.cluster import leader, wire
from leveret.cluster.leader import FollowerLink


def test_a_link_that_takes_nothing_is_dropped_past_the_bound(monkeypatch) -> None:  # noqa: ANN001
    """A follower whose link stays open but reads nothing (a network that drops
    packets without a reset; TCP may take many minutes to give up) must not make the
    leader hold every write for it in memory: past the bound the link is dropped, and
    the follower syncs again when it reconnects."""
    monkeypatch.setattr(leader, "MAX_BACKLOG_BYTES", 1 << 20)

    async def run() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result((reader, writer))

        server = await asyncio.start_server(never_read, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer_reader, peer_writer = await accepted
        link = FollowerLink("f", writer, state="live")
        frame = wire.frame(wire.OPS, bytes(8 + 64 * 1024))
        sent = 0
        # The kernel's socket buffers take a few MB before the transport's own fills.
        while not link.closed and sent < 64 << 20:
            link.send_ops(frame, sent)
            sent += len(frame)
            await asyncio.sleep(0)
        closed = link.closed
        if closed:  # the follower's end sees its link end once it reads what got through
            with contextlib.suppress(ConnectionError):
                while await asyncio.wait_for(peer_reader.read(1 << 20), 30):
                    pass
        link.close()
        peer_writer.close()
        server.close()
        assert closed, f"{sent} bytes queued for a follower that reads nothing"
        return sent

    assert asyncio.run(run()) < 64 << 20


# ---- liveness: the leader's keepalives and the follower's watch ----------------------
#
# A leader on real sockets, scripted here (the handshake, then silence, keepalives or a
# slow large frame), and a real `Follower` writing a real data dir.

INTERVAL = 0.05  # the keepalive interval the scripted leader announces


async def _stop(follower, task: asyncio.Task, server: asyncio.Server) -> None:  # noqa: ANN001
    """End a test's follower, its task and the scripted leader (_follow's parts)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    await follower.close()
    server.close()


async def _follow(root: str, script, keepalive: float | None = INTERVAL):  # noqa: ANN001, ANN202
    """Start a Follower against a scripted leader; returns (follower, its task, the
    leader's writer once the follower's MANIFEST is in, the server)."""
    from leveret.cluster.follower import Follower

    ready: asyncio.Future = asyncio.get_running_loop().create_future()

    async def leader_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, hello = await wire.read_frame(reader)
        assert kind == wire.HELLO and json.loads(hello)["keepalive"] is True
        welcome = {"epoch": 7, "leader": "l"}
        if keepalive is not None:
            welcome["keepalive"] = keepalive
        writer.write(wire.json_frame(wire.WELCOME, welcome))
        kind, _ = await wire.read_frame(reader)
        assert kind == wire.MANIFEST
        writer.write(wire.frame(wire.SNAP_END, wire.U64.pack(0)))  # nothing to send
        kind, _ = await wire.read_frame(reader)
        while kind == wire.KEEPALIVE:  # (the follower's, if its timer came first)
            kind, _ = await wire.read_frame(reader)
        assert kind == wire.ACK
        ready.set_result(writer)
        await script(reader, writer)

    server = await asyncio.start_server(leader_side, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    follower = Follower(
        root, "f", "c", {"node": "l", "host": "127.0.0.1", "cluster": port}, 7, False
    )
    task = asyncio.ensure_future(follower.run())
    writer = await asyncio.wait_for(ready, 30)
    return follower, task, writer, server


async def _hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # says nothing, holds the connection open


def test_a_follower_drops_a_leader_link_gone_silent(tmp_path) -> None:  # noqa: ANN001
    """The leader announced keepalives, then its side of the link says nothing while
    the connection stays open (a partition that drops packets without a reset, or
    lets only the follower's writes through): the follower takes the link for dead
    and ends it, saying why."""
    from leveret.cluster.follower import SILENT_INTERVALS, Silent

    async def run() -> None:
        follower, task, _writer, server = await _follow(str(tmp_path), _hold)
        try:
            with pytest.raises(Silent, match=f"{SILENT_INTERVALS} keepalive intervals"):
                await asyncio.wait_for(task, 60)
            assert follower.synced  # it was a healthy link before it went silent
        finally:
            await follower.close()
            server.close()

    asyncio.run(run())


def test_an_idle_link_with_keepalives_stays_up(tmp_path) -> None:  # noqa: ANN001
    """On an idle link the leader's `keepalive` and the follower's keep each side
    hearing the other through many times the bound: neither drops it, and it still
    carries writes afterwards."""
    from leveret.cluster.follower import SILENT_INTERVALS

    async def run() -> None:
        links: list[FollowerLink] = []
        beats: list[asyncio.Future] = []
        got_ack: asyncio.Future = asyncio.get_running_loop().create_future()

        async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # what the node's replication listener does with a live link
            link = FollowerLink("f", writer, state="live")
            links.append(link)
            beat = asyncio.ensure_future(leader.keepalive(writer, INTERVAL, lambda: link, True))
            beats.append(beat)
            try:
                while True:
                    kind, payload = await wire.read_frame(reader)
                    if kind == wire.ACK:
                        link.acked = wire.U64.unpack(payload)[0]
                        if not got_ack.done():
                            got_ack.set_result((kind, payload))
                    elif kind == wire.KEEPALIVE:
                        link.heard += 1
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                beat.cancel()

        follower, task, _writer, server = await _follow(str(tmp_path), idle)
        try:
            # Several times the bound, counted in the follower's own ticks' units.
            for _ in range(4 * SILENT_INTERVALS):
                await asyncio.sleep(INTERVAL)
                assert not task.done(), task.exception()
                assert not beats[0].done() and not links[0].closed
            assert links[0].heard > 0  # the follower's keepalives
            ops = wire.op_write("q/seg", 0, [b"after the idle spell"])
            position = sum(len(p) for p in ops)
            links[0].send_ops(
                wire.frame(wire.OPS, wire.U64.pack(position) + b"".join(ops)), position
            )
            kind, payload = await asyncio.wait_for(got_ack, 30)
            assert kind == wire.ACK and wire.U64.unpack(payload)[0] == position
            assert not task.done()
            assert (tmp_path / "q" / "seg").read_bytes() == b"after the idle spell"
        finally:
            await _stop(follower, task, server)

    asyncio.run(run())


def test_a_large_frame_arriving_slowly_is_not_silence(tmp_path) -> None:  # noqa: ANN001
    """A frame that takes longer than the bound to arrive, but keeps arriving (a large
    write over a slow link), is progress, not silence."""

    data = bytes(range(256)) * (16 * 1024)  # 4 MB: 4 pieces of wire.PROGRESS_CHUNK

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = wire.snap_file("big", 0, data, True)
        piece = 64 * 1024
        # 64 writes at least 10 ms apart: the frame takes over 0.64 s to arrive, more
        # than the follower's bound (8 intervals of 50 ms), and each megabyte of it
        # (what the follower counts as progress) 0.16 s
        for i in range(0, len(raw), piece):
            writer.write(raw[i : i + piece])
            await asyncio.sleep(0.01)
        writer.write(wire.frame(wire.SNAP_END, wire.U64.pack(0)))
        await reader.read()

    async def run() -> None:
        follower, task, _writer, server = await _follow(str(tmp_path), slow)
        try:
            path = tmp_path / "big"
            while not (path.exists() and path.stat().st_size == len(data)):
                assert not task.done(), task.exception()
                await asyncio.sleep(INTERVAL)
            assert path.read_bytes() == data
            assert not task.done()
        finally:
            await _stop(follower, task, server)

    asyncio.run(run())


def test_a_leader_that_announces_no_keepalive_is_not_watched(tmp_path) -> None:  # noqa: ANN001
    """An older leader sends no keepalives and names no interval: its follower does not
    drop an idle link (nodes of one cluster run one version; this keeps a rolling
    upgrade from flapping every link)."""
    from leveret.cluster.follower import SILENT_INTERVALS

    async def run() -> None:
        follower, task, _writer, server = await _follow(str(tmp_path), _hold, keepalive=None)
        try:
            assert follower.keepalive is None
            for _ in range(4 * SILENT_INTERVALS):
                await asyncio.sleep(INTERVAL)
                assert not task.done(), task.exception()
        finally:
            await _stop(follower, task, server)

    asyncio.run(run())


def test_the_leader_drops_a_live_link_whose_follower_went_silent(caplog) -> None:  # noqa: ANN001
    """A follower that said it sends keepalives and then says nothing at all (the other
    asymmetric partition: only the leader's frames get through) is dropped by the
    leader's `keepalive`, which says why; an older follower (no keepalives promised)
    is not watched, nor one whose snapshot is still being sent."""
    from leveret.cluster.follower import SILENT_INTERVALS

    async def run() -> None:
        peers: asyncio.Queue = asyncio.Queue()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await peers.put(writer)
            await reader.read()  # the follower's end: reads, says nothing

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            # watched; not watched (an older follower); watched but not yet reading the
            # follower's frames (its snapshot still being sent: no link yet)
            for watch, live in ((True, True), (False, True), (True, False)):
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                link = FollowerLink("f", writer, state="live")
                beat = asyncio.ensure_future(
                    leader.keepalive(
                        writer, INTERVAL, lambda link=link, live=live: link if live else None, watch
                    )
                )
                if watch and live:
                    await asyncio.wait_for(beat, 60)
                    assert link.closed and writer.is_closing()
                else:
                    for _ in range(4 * SILENT_INTERVALS):
                        await asyncio.sleep(INTERVAL)
                        assert not beat.done() and not link.closed
                    beat.cancel()
                    writer.close()
                (await peers.get()).close()
        finally:
            server.close()

    with caplog.at_level(logging.WARNING, logger="leveret.cluster"):
        asyncio.run(run())
    dropped = [
        r.getMessage() for r in caplog.records if "nothing from follower f" in r.getMessage()
    ]
    assert len(dropped) == 1 and f"{SILENT_INTERVALS} keepalive intervals" in dropped[0]


def test_a_handshake_nobody_answers_ends_at_its_bound(tmp_path) -> None:  # noqa: ANN001
    """A leader (or a proxy in front of it) that accepts the connection and reads HELLO
    but answers nothing: the follower gives the handshake up at its bound, saying
    where and why, and has neither been welcomed nor marked its copy as syncing."""
    from leveret.cluster import datadir
    from leveret.cluster.follower import Follower, NoWelcome, handshake_timeout

    assert handshake_timeout(5) == 4.0  # 8 keepalive intervals of 0.5 s
    assert handshake_timeout(0.5) == 2.0  # never under the floor

    async def run() -> None:
        hellos: list[bytes] = []

        async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hellos.append((await wire.read_frame(reader))[1])
            await reader.read()

        server = await asyncio.start_server(mute, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        follower = Follower(
            str(tmp_path),
            "f",
            "c",
            {"node": "l", "host": "127.0.0.1", "cluster": port},
            7,
            False,
            handshake=0.3,
        )
        try:
            with pytest.raises(NoWelcome, match=f"no WELCOME from leader l at 127.0.0.1:{port} "):
                await asyncio.wait_for(follower.run(), 30)
            assert len(hellos) == 1 and json.loads(hellos[0])["node"] == "f"
            assert not follower.welcomed and follower.handshake_seconds >= 0.3
            assert not (tmp_path / datadir.SYNCING_MARK).exists()
        finally:
            await follower.close()
            server.close()

    asyncio.run(run())


def test_a_follower_slow_to_read_its_data_dir_is_kept_then_a_silent_one_dropped(
    tmp_path,  # noqa: ANN001
    monkeypatch,  # noqa: ANN001
) -> None:
    """A follower whose data dir takes long to read for its MANIFEST (CRCs of many
    gigabytes) sends keepalives meanwhile, so a leader keeps waiting for it however
    long it takes (it once gave up after a fixed 60 s, and such a follower could never
    rejoin); a follower silent for the bound is given up. With a leader that did not
    say it takes keepalives before MANIFEST (an older one) the follower sends none."""
    from leveret.cluster import datadir
    from leveret.cluster.follower import Follower

    real = datadir.manifest
    monkeypatch.setattr(
        datadir, "manifest", lambda root: (time.sleep(20 * INTERVAL), real(root))[1]
    )

    async def handshake(takes_keepalives: bool) -> list[int]:
        """The follower's frame kinds up to its MANIFEST, read by the leader's code."""
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def leader_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            kind, hello = await wire.read_frame(reader)
            beating = json.loads(hello).get("manifest_keepalive") is True
            welcome = {"epoch": 7, "leader": "l", "keepalive": INTERVAL}
            if takes_keepalives:
                welcome["manifest_keepalive"] = True
            writer.write(wire.json_frame(wire.WELCOME, welcome))
            kinds = []
            if takes_keepalives:  # the leader's own wait, as node.py runs it
                kind, _ = await leader.read_manifest(reader, INTERVAL, beating)
                kinds.append(kind)
            else:
                kinds.append((await wire.read_frame(reader))[0])
            got.set_result(kinds)
            await reader.read()

        server = await asyncio.start_server(leader_side, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        follower = Follower(
            str(tmp_path), "f", "c", {"node": "l", "host": "127.0.0.1", "cluster": port}, 7, False
        )
        task = asyncio.ensure_future(follower.run())
        try:
            return await asyncio.wait_for(got, 30)
        finally:
            await _stop(follower, task, server)

    assert asyncio.run(handshake(True)) == [wire.MANIFEST]  # 20 intervals: kept
    assert asyncio.run(handshake(False)) == [wire.MANIFEST]  # nothing before it

    async def silent() -> None:
        async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()

        server = await asyncio.start_server(mute, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(wire.frame(wire.KEEPALIVE))  # heard once, then nothing
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(leader.read_manifest(reader, INTERVAL, True), 30)
        finally:
            writer.close()
            server.close()

    asyncio.run(silent())
