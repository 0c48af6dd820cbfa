"""The leader's side of one follower's link, on real sockets (no etcd, no nodes)."""

from __future__ import annotations

import asyncio
import contextlib

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
