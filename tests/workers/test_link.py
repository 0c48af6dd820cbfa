"""The worker link: its records on the wire, and the asyncio link between two real
processes over a socket pair (ordering under batching, back-pressure, loss)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import socket
import struct

import pytest

from leveret.workers import link
from leveret.workers.link import (
    ACK,
    CONFIRM,
    NACK,
    REJECT,
    REQUEUE,
    Credit,
    Deliver,
    LinkError,
    LinkReader,
    LinkWriter,
    Meta,
    MetaApplied,
    Publish,
    Settle,
)

FORK = multiprocessing.get_context("fork")

SAMPLES: list[link.Record] = [
    Publish(1, "/", ["q1"], b"header+body"),
    Publish(0, "vh\u00e9", ["a", "b" * 255, ""], b""),
    Publish(2**64 - 1, "/", [], b"\x00" * 3000),
    Settle.of(CONFIRM, 0, [1, 2, 3, 10, 11, 20]),
    Settle.of(NACK, 0, [7]),
    Settle.of(ACK, 42, range(100, 1100)),
    Settle.of(REJECT, 43, [5, 4, 3], REQUEUE),
    Settle(ACK, 1, []),
    Credit(42, 1000),
    Deliver(42, 9, link.REDELIVERED, b"msg"),
    Meta(1, b'{"op": "bind"}'),
    MetaApplied(1),
    link.Request(7, b"\x80consume"),
    link.Reply(7, True, b""),
    link.Reply(2**64 - 1, False, b"no queue"),
]


def encode(records: list[link.Record]) -> bytes:
    w = LinkWriter()
    for r in records:
        w.add(r)
    assert w.records == len(records)
    data = w.data_to_send()
    assert w.pending == 0 and w.data_to_send() == b""
    return data


def test_records_round_trip_cut_at_every_byte() -> None:
    data = encode(SAMPLES)
    for cut in range(len(data) + 1):
        reader = LinkReader()
        out = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert out == SAMPLES, cut
    reader = LinkReader()
    out = []
    for i in range(len(data)):
        out += reader.feed(data[i : i + 1])
    assert out == SAMPLES


def test_settle_keeps_ids_as_runs() -> None:
    s = Settle.of(ACK, 1, [5, 6, 7, 9, 3, 4])
    assert s.runs == [(5, 3), (9, 1), (3, 2)]
    assert list(s.ids()) == [5, 6, 7, 9, 3, 4]
    with pytest.raises(ValueError):
        Settle(link.PUBLISH, 0, [])


def test_names_longer_than_a_short_string_are_refused() -> None:
    with pytest.raises(ValueError, match="queue name"):
        LinkWriter().publish(1, "/", ["x" * 256], b"")
    with pytest.raises(ValueError, match="vhost"):
        LinkWriter().publish(1, "v" * 256, ["q"], b"")
    with pytest.raises(TypeError):
        LinkWriter().add("not a record")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data, message",
    [
        (struct.pack(">IB", 0, 0), "unknown record kind 0"),
        (struct.pack(">IB", 0, 200), "unknown record kind 200"),
        (struct.pack(">IB", link.MAX_PAYLOAD + 1, link.PUBLISH), "is over"),
        # a settlement that claims two runs and carries one
        (struct.pack(">IB", 25, ACK) + struct.pack(">QBI", 1, 0, 2) + bytes(12), "2 runs"),
        (struct.pack(">IB", 3, link.CREDIT) + b"abc", "malformed credit"),
        # a publish whose queue name runs past its end
        (
            struct.pack(">IB", 13, link.PUBLISH) + struct.pack(">QB", 1, 0) + b"\x00\x01\x09x",
            "publish",
        ),
    ],
)
def test_bytes_that_are_not_records_are_an_error(data: bytes, message: str) -> None:
    with pytest.raises(LinkError, match=message):
        LinkReader().feed(data)


def test_a_publish_cut_inside_names_seen_before_is_an_error() -> None:
    """The reader finds a publisher's names by their bytes once it has decoded them:
    a later record whose names run past its end is still an error."""
    reader = LinkReader()
    assert reader.feed(encode([Publish(1, "/", ["q1"], b"x")])) == [Publish(1, "/", ["q1"], b"x")]
    payload = struct.pack(">QB", 2, 1) + b"/\x00\x01\x02q"  # the name's last byte is gone
    with pytest.raises(LinkError, match="publish"):
        reader.feed(struct.pack(">IB", len(payload), link.PUBLISH) + payload)


# -- two processes ----------------------------------------------------------------------

N_PUBLISHES = 20_000
END = 2**63


def _sender(sock: socket.socket, seed: int) -> None:
    """Child: sends N publishes (and settlements between them) in bursts of random
    size, then a Meta with its counters, and waits for the peer's MetaApplied."""

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()

        def on_records(records: list[link.Record]) -> None:
            for r in records:
                if isinstance(r, MetaApplied) and r.seq == END and not done.done():
                    done.set_result(None)

        lk = await link.open_link(sock, on_records)
        rng = random.Random(seed)
        seq = 1
        while seq <= N_PUBLISHES:
            for _ in range(rng.choice((1, 2, 7, 50, 400))):
                if seq > N_PUBLISHES:
                    break
                lk.publish(seq, "/", [f"q{seq % 3}"], seq.to_bytes(8, "big") * (seq % 5))
                if seq % 1000 == 0:
                    lk.send(Settle.of(CONFIRM, 0, range(seq - 999, seq + 1)))
                seq += 1
            if rng.random() < 0.5:
                await asyncio.sleep(0)  # end the turn: the burst is one write
            await lk.drain()
        lk.send(Meta(END, f"{lk.writer.records},{lk.writes}".encode()))
        await asyncio.wait_for(done, 30)
        lk.close()

    asyncio.run(main())


def test_records_arrive_in_order_and_batched_between_processes() -> None:
    mine, theirs = link.socket_pair()
    child = FORK.Process(target=_sender, args=(theirs, 7))
    child.start()
    theirs.close()

    async def main() -> list[link.Record]:
        got: list[link.Record] = []
        finished = asyncio.get_running_loop().create_future()

        def on_records(records: list[link.Record]) -> None:
            got.extend(records)
            if isinstance(records[-1], Meta) and records[-1].seq == END:
                lk.send(MetaApplied(END))
                finished.set_result(None)

        lk = await link.open_link(mine, on_records)
        await asyncio.wait_for(finished, 60)
        await asyncio.sleep(0)  # the MetaApplied's flush
        return got

    got = asyncio.run(main())
    child.join(30)
    assert child.exitcode == 0
    publishes = [r for r in got if isinstance(r, Publish)]
    assert [p.seq for p in publishes] == list(range(1, N_PUBLISHES + 1))
    for p in publishes:
        assert p.queues == (f"q{p.seq % 3}",)
        assert p.message == p.seq.to_bytes(8, "big") * (p.seq % 5)
    confirms = [r for r in got if isinstance(r, Settle)]
    assert [max(c.ids()) for c in confirms] == list(range(1000, N_PUBLISHES + 1, 1000))
    # each confirm came right after the publish it names
    for i, r in enumerate(got):
        if isinstance(r, Settle):
            assert isinstance(got[i - 1], Publish) and got[i - 1].seq == max(r.ids())
    records, writes = map(int, got[-1].change.split(b","))  # type: ignore[union-attr]
    assert records + 1 == len(got)  # and the Meta that carried the counts
    assert writes < records / 10, "records were not batched into writes"


RECORD = 4096
N_BIG = 3000


def _slow_reader(sock: socket.socket, conn: multiprocessing.connection.Connection) -> None:
    """Child: reads the link a little at a time, sleeping between reads; reports
    how many publishes arrived and whether they were in order and intact."""
    import time

    reader = LinkReader()
    expected = 1
    ok = True
    while expected <= N_BIG:
        data = sock.recv(4096)
        if not data:
            break
        for r in reader.feed(data):
            ok = ok and isinstance(r, Publish) and r.seq == expected
            ok = ok and r.message == bytes([expected % 256]) * RECORD
            expected += 1
        time.sleep(0.0005)
    conn.send((expected - 1, ok))


def test_a_slow_reader_pauses_the_writer_and_its_buffer_stays_bounded() -> None:
    mine, theirs = link.socket_pair()
    results, child_end = FORK.Pipe(duplex=False)
    child = FORK.Process(target=_slow_reader, args=(theirs, child_end))
    child.start()
    theirs.close()
    high_water = 64 << 10
    batch_limit = 32 << 10
    changes: list[bool] = []

    async def main() -> tuple[int, int]:
        lk = await link.open_link(
            mine,
            lambda records: None,
            high_water=high_water,
            batch_limit=batch_limit,
            on_writable=changes.append,
        )
        most = 0
        for seq in range(1, N_BIG + 1):
            await lk.drain()
            lk.publish(seq, "/", ["q"], bytes([seq % 256]) * RECORD)
            most = max(most, lk.buffered)
        await lk.drain()
        while lk.buffered:
            await asyncio.sleep(0.01)
        lk.close()
        return most, lk.pauses

    most, pauses = asyncio.run(main())
    count, in_order = results.recv()
    child.join(30)
    assert (count, in_order) == (N_BIG, True)
    # 12 MB went through a reader far slower than the writer: the writer was paused,
    # and never held more than the high-water mark and one batch
    assert pauses > 0
    assert changes[:2] == [False, True]
    assert most <= high_water + batch_limit + RECORD + 64


def test_drain_fails_and_on_lost_is_told_when_the_peer_goes() -> None:
    async def main() -> None:
        a, b = link.socket_pair()
        lost: list[BaseException | None] = []
        lk = await link.open_link(a, lambda r: None, high_water=1024, on_lost=lost.append)
        lk.publish(1, "/", ["q"], bytes(4 << 20))  # more than the kernel takes: paused
        lk.flush()
        assert not lk.writable
        waiter = asyncio.ensure_future(lk.drain())
        await asyncio.sleep(0)
        b.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(waiter, 10)
        for _ in range(100):
            if lost:
                break
            await asyncio.sleep(0.01)
        assert lk.closed and len(lost) == 1
        with pytest.raises(ConnectionError):
            await lk.drain()
        with pytest.raises(ConnectionError):
            lk.send(MetaApplied(1))
        with pytest.raises(ConnectionError):
            lk.publish(2, "/", ["q"], b"")

    asyncio.run(main())


def test_a_broken_stream_closes_the_link() -> None:
    async def main() -> None:
        a, b = link.socket_pair()
        lost: list[BaseException | None] = []
        lk = await link.open_link(a, lambda r: None, on_lost=lost.append)
        b.sendall(struct.pack(">IB", 0, 99))
        for _ in range(100):
            if lost:
                break
            await asyncio.sleep(0.01)
        assert lk.closed and isinstance(lost[0], LinkError)
        assert b.recv(10) == b""  # our end closed
        b.close()

    asyncio.run(main())
