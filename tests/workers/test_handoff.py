"""Handing a TCP connection to another process mid-stream, with the bytes the first
process read but did not handle, and its state, travelling with the socket."""

from __future__ import annotations

import multiprocessing
import socket
import struct
import threading

import pytest

from leveret.workers import handoff
from leveret.workers.handoff import HandoffError

FORK = multiprocessing.get_context("fork")

PART1 = b"".join(b"%06d;" % i for i in range(0, 2000))  # 14,000 bytes
PART2 = b"".join(b"%06d;" % i for i in range(2000, 4000))
HANDLED = 1234  # what the first process handles of what it read


def _first(listener: socket.socket, channel: socket.socket, report) -> None:
    """Accepts, reads at least 3,000 bytes, handles HANDLED of them, answers, and
    hands the connection over with the rest as state."""
    conn, _ = listener.accept()
    read = b""
    while len(read) < 3000:
        read += conn.recv(1000)
    conn.sendall(b"from first;")
    report.send(read[:HANDLED])
    state = struct.pack(">I", HANDLED) + read[HANDLED:]
    handoff.send_connection(channel, conn, state)
    conn.close()  # our descriptor only: the connection lives on in the other process


def _second(channel: socket.socket, report) -> None:
    """Takes the connection over: handles the state's bytes first, then the socket's
    until the client's end of stream."""
    got = handoff.recv_connection(channel)
    assert got is not None
    conn, state = got
    (handled,) = struct.unpack_from(">I", state)
    data = state[4:]
    conn.sendall(b"from second;")
    while chunk := conn.recv(65536):
        data += chunk
    conn.sendall(b"bye")
    conn.close()
    report.send((handled, data))


def test_a_connection_moved_mid_stream_keeps_its_bytes_in_order() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    one, two = handoff.channel_pair()
    r1, w1 = FORK.Pipe(duplex=False)
    r2, w2 = FORK.Pipe(duplex=False)
    first = FORK.Process(target=_first, args=(listener, one, w1))
    second = FORK.Process(target=_second, args=(two, w2))
    first.start()
    second.start()
    client = socket.create_connection(listener.getsockname())
    client.settimeout(30)
    for i in range(0, len(PART1), 700):  # in pieces, as a client writes
        client.sendall(PART1[i : i + 700])
    replies = b""
    while len(replies) < len(b"from first;from second;"):
        replies += client.recv(100)
    client.sendall(PART2)  # after the move: straight to the second process
    client.shutdown(socket.SHUT_WR)
    while chunk := client.recv(100):
        replies += chunk
    handled_by_first = r1.recv()
    handled, rest = r2.recv()
    first.join(10)
    second.join(10)
    assert first.exitcode == 0 and second.exitcode == 0
    assert replies == b"from first;from second;bye"
    assert handled == HANDLED == len(handled_by_first)
    assert handled_by_first + rest == PART1 + PART2
    for s in (client, listener, one, two):
        s.close()


def test_handoffs_back_to_back_keep_their_states_apart() -> None:
    a, b = handoff.channel_pair()
    states = [b"", b"x", bytes(range(256)) * 400, b"last"]  # the third is 100 KB
    pairs = [socket.socketpair() for _ in states]

    def send_all() -> None:
        for (mine, _), state in zip(pairs, states, strict=True):
            handoff.send_connection(a, mine, state)
        a.close()

    sender = threading.Thread(target=send_all)
    sender.start()
    received = []
    while (got := handoff.recv_connection(b)) is not None:
        received.append(got)
    sender.join(10)
    assert [state for _, state in received] == states
    # each descriptor is the socket it was sent with: its peer's bytes arrive on it
    for (conn, _), (_, peer) in zip(received, pairs, strict=True):
        peer.sendall(b"ping")
        assert conn.recv(10) == b"ping"
        conn.close()
    for x, y in pairs:
        x.close()
        y.close()
    b.close()


def test_something_that_is_not_a_handoff_is_refused() -> None:
    a, b = handoff.channel_pair()
    x, y = socket.socketpair()
    socket.send_fds(a, [b"NOPE\x00\x00\x00\x00"], [x.fileno()])
    with pytest.raises(HandoffError, match="not a handoff"):
        handoff.recv_connection(b)
    a.sendall(b"LVH1\x00\x00\x00\x00")  # a header with no descriptor
    with pytest.raises(HandoffError, match="0 descriptors"):
        handoff.recv_connection(b)
    # a handoff cut short: the channel closes in the middle of the state
    socket.send_fds(a, [struct.pack(">4sI", b"LVH1", 100) + b"short"], [x.fileno()])
    a.close()
    with pytest.raises(HandoffError, match="middle"):
        handoff.recv_connection(b)
    with pytest.raises(ValueError):
        handoff.send_connection(b, x, bytes(handoff.MAX_STATE + 1))
    for s in (b, x, y):
        s.close()


def _send_many(channel: socket.socket, states: list[bytes]) -> None:
    """Child: hands over one end of a fresh socket pair per state, sending a marker
    byte into the other end first, so the receiver can tell which socket it got."""
    for i, state in enumerate(states):
        mine, peer = socket.socketpair()
        peer.sendall(bytes([i]))
        handoff.send_connection(channel, mine, state)
        mine.close()
        peer.close()
    channel.close()


def test_the_event_loop_receiver_takes_handoffs_as_they_come() -> None:
    """`receive_connections` in an asyncio loop, with a sender in another process
    sending handoffs back to back (states from empty to 200 KB, so reads cut them
    anywhere): each socket comes with its own state, in order."""
    import asyncio

    states = [bytes([i % 251]) * (i * 997 % 200_000) for i in range(60)] + [b""]
    a, b = handoff.channel_pair()
    child = FORK.Process(target=_send_many, args=(a, states))
    child.start()
    a.close()
    got: list[tuple[int, bytes]] = []

    def on_connection(conn: socket.socket, state: bytes) -> None:
        conn.setblocking(True)
        got.append((conn.recv(1)[0], state))
        conn.close()

    asyncio.run(asyncio.wait_for(handoff.receive_connections(b, on_connection), 60))
    child.join(30)
    b.close()
    assert child.exitcode == 0
    assert [i for i, _ in got] == list(range(len(states)))
    assert [state for _, state in got] == states


def test_the_event_loop_receiver_refuses_a_broken_channel() -> None:
    import asyncio

    a, b = handoff.channel_pair()
    x, y = socket.socketpair()
    # a whole handoff, then one cut short by the channel closing
    handoff.send_connection(a, x, b"fine")
    socket.send_fds(a, [struct.pack(">4sI", b"LVH1", 100) + b"short"], [x.fileno()])
    a.close()
    got: list[bytes] = []

    def on_connection(conn: socket.socket, state: bytes) -> None:
        got.append(state)
        conn.close()

    with pytest.raises(HandoffError, match="middle"):
        asyncio.run(handoff.receive_connections(b, on_connection))
    assert got == [b"fine"]
    b.close()
    reader = handoff.HandoffReader()
    with pytest.raises(HandoffError, match="not a handoff"):
        reader.feed(b"GARBAGE!", [])
    with pytest.raises(HandoffError, match="0 descriptors"):
        handoff.HandoffReader().feed(struct.pack(">4sI", b"LVH1", 0), [])
    x.close()
    y.close()
