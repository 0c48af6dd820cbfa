"""Mutated frame streams: the broker must answer or close, never crash or hang.

Each case opens a real connection, completes the handshake, then sends a stream of
valid frames (declares, binds, publishes with content, consumes, acks) with random
damage: flipped bytes, truncations, duplicated or dropped frames, random channel
numbers. Afterwards the broker must still serve a fresh connection, and nothing may
have reached the log as an internal error (an unhandled exception).
"""

from __future__ import annotations

import logging
import random

import pytest
from pamqp import commands

from rawamqp import RawClient, content_frames, method_frame

pytestmark = pytest.mark.leveret_only


def _valid_stream(rng: random.Random) -> list[bytes]:
    q = f"fz{rng.randrange(1000)}"
    frames = [
        method_frame(1, commands.Queue.Declare(queue=q, arguments={"x-max-length": 5})),
        method_frame(1, commands.Exchange.Declare(exchange="fzx", exchange_type="topic")),
        method_frame(1, commands.Queue.Bind(queue=q, exchange="fzx", routing_key="a.#")),
        method_frame(1, commands.Basic.Qos(prefetch_count=2)),
        method_frame(1, commands.Basic.Consume(queue=q, consumer_tag="c1")),
        method_frame(1, commands.Confirm.Select()),
    ]
    for i in range(rng.randrange(1, 6)):
        props = commands.Basic.Properties(
            headers={"n": i, "s": "x" * rng.randrange(20)},
            delivery_mode=rng.choice([1, 2]),
            priority=rng.randrange(10),
            expiration=rng.choice([None, "100", "0"]),
        )
        frames.append(method_frame(1, commands.Basic.Publish(exchange="fzx", routing_key="a.b")))
        frames += _split(content_frames(1, b"b" * rng.randrange(5000), props, frame_max=4096))
    frames.append(method_frame(1, commands.Basic.Ack(delivery_tag=1, multiple=True)))
    frames.append(method_frame(1, commands.Basic.Nack(delivery_tag=2, requeue=False)))
    return frames


def _split(raw: bytes) -> list[bytes]:
    """Split concatenated frames back into single frames."""
    out, pos = [], 0
    while pos < len(raw):
        size = int.from_bytes(raw[pos + 3 : pos + 7], "big")
        out.append(raw[pos : pos + 8 + size])
        pos += 8 + size
    return out


def _mutate(rng: random.Random, frames: list[bytes]) -> bytes:
    frames = list(frames)
    for _ in range(rng.randrange(1, 4)):
        if not frames:
            break
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        if not f:
            continue
        kind = rng.randrange(6)
        if kind == 0 and f:  # flip a byte
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate the frame (and so desynchronise the stream)
            del f[rng.randrange(len(f)) :]
        elif kind == 2:  # duplicate
            frames.insert(i, bytes(f))
        elif kind == 3:  # drop
            frames.pop(i)
            continue
        elif kind == 4 and len(f) > 3:  # another channel number
            f[1:3] = rng.randrange(65536).to_bytes(2, "big")
        else:  # random garbage inside the payload
            pos = rng.randrange(len(f))
            f[pos:pos] = rng.randbytes(rng.randrange(1, 16))
        frames[i] = bytes(f)
    return b"".join(frames)


def _run_case(host: str, port: int, rng: random.Random) -> None:
    client = RawClient(host, port, timeout=3)
    try:
        client.handshake(frame_max=4096)
        client.open_channel(1)
        client.send(_mutate(rng, _valid_stream(rng)))
        # Read whatever comes back until the server closes or goes quiet.
        try:
            for _ in range(200):
                client.read_frame(timeout=0.15)
        except Exception:
            pass
    finally:
        # Just drop the socket: after a truncated frame a polite close would be
        # swallowed as the rest of that frame.
        client.sock.close()


def _broker_still_serves(host: str, port: int) -> None:
    probe = RawClient(host, port, timeout=5)
    probe.handshake()
    probe.open_channel(1)
    ok = probe.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    assert ok
    probe.close()


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(16))
def test_mutated_streams_never_crash_the_broker(amqp_host_port, caplog, seed, soak_rounds):
    """--soak-rounds N runs N+1 mutated streams per seed (CI: 4)."""
    host, port = amqp_host_port
    rng = random.Random(seed)
    with caplog.at_level(logging.WARNING, logger="leveret"):
        for _ in range(soak_rounds + 1):
            try:
                _run_case(host, port, rng)
            except (TimeoutError, ConnectionError, OSError):
                pass  # the server may close on us at any point: that is allowed
        _broker_still_serves(host, port)
    crashes = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not crashes, [r.getMessage() for r in crashes]
