"""Nothing follows a close on its channel: confirms, deliveries, returns.

Node's amqplib forgets a channel when it sees channel.close-ok (or answers the
server's channel.close), and throws "Frame on unknown channel" for any later
frame on it: in a Node service that kills the process.  So a confirm that is
ready goes out before the close; one that is not is never sent.

What RabbitMQ 3.10.8 does (recorded with these tests against it, and with
tests/compat/amqp): on the client's channel.close it sends the confirms its
queues have returned by then, then close-ok, and nothing after it (for a burst
of 1,000 transient publishes read together with the close, acks up to about
900; none for persistent messages still waiting for the disk).  Leveret sends
every confirm that is due when the close is read (every transient one, the
persistent ones already on disk) before close-ok and drops the rest; on a
channel error it sends the ready confirms before its channel.close.  On the
client's connection.close, ready confirms go out before connection.close-ok;
those waiting for the disk are dropped.

Each case runs with an in-memory broker (every confirm ready at once) and with a
persistent broker whose fsync is slow (`--fsync always`, 30 ms a sync): then
confirms wait for the disk when the close arrives.
"""

from __future__ import annotations

import time

import pytest
from pamqp import commands

from conftest import against_rabbitmq
from rawamqp import ConnectionLost, RawClient, Timeout, content_frames, method_frame

BURST = 500


@pytest.fixture(params=["memory", "slow-disk"])
def broker_port(request, tmp_path, monkeypatch, amqp_host_port):
    """(host, port, slow_disk) of the broker under test."""
    if request.param == "memory" or against_rabbitmq():
        if against_rabbitmq() and request.param == "slow-disk":
            pytest.skip("the slow disk is a Leveret broker's")
        yield (*amqp_host_port, False)
        return
    from leveret.config import ServerConfig
    from leveret.store import committer
    from leveret.testing import EmbeddedBroker

    real_sync = committer._sync_file

    def slow_sync(fd):
        time.sleep(0.03)
        real_sync(fd)

    monkeypatch.setattr(committer, "_sync_file", slow_sync)
    config = ServerConfig(
        host="127.0.0.1", port=0, persistence=True, data_dir=str(tmp_path), fsync="always"
    )
    broker = EmbeddedBroker(config).start()
    try:
        yield ("127.0.0.1", broker.port, True)
    finally:
        broker.stop()


def _client(host: str, port: int) -> RawClient:
    client = RawClient(host, port)
    client.handshake()
    client.open_channel(1)
    return client


def _confirm_queue(client: RawClient, name: str) -> None:
    client.rpc(1, commands.Queue.Declare(queue=name, durable=True), commands.Queue.DeclareOk)
    client.rpc(1, commands.Queue.Purge(queue=name), commands.Queue.PurgeOk)
    client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)


def _burst(name: str, n: int, persistent: bool, exchange: str = "") -> bytes:
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    one = method_frame(1, commands.Basic.Publish(exchange=exchange, routing_key=name))
    return (one + content_frames(1, b"m" * 100, props)) * n


def _frames_until(client: RawClient, stop, settle: float = 0.5) -> list:
    """Every frame up to the one `stop(channel, frame)` accepts, then whatever
    else arrives within `settle` seconds (late confirms of a slow disk)."""
    seen = []
    while True:
        channel, frame = client.read_frame()
        seen.append((channel, frame))
        if stop(channel, frame):
            break
    end = time.monotonic() + settle
    try:
        while (left := end - time.monotonic()) > 0:
            seen.append(client.read_frame(timeout=left))
    except (Timeout, ConnectionLost):
        pass
    return seen


def _check_acks(frames: list, n: int) -> int:
    """Confirms on channel 1 go up, never past n; returns the highest."""
    last = 0
    for channel, frame in frames:
        if channel == 1 and isinstance(frame, commands.Basic.Ack | commands.Basic.Nack):
            assert isinstance(frame, commands.Basic.Ack), frame
            assert last < frame.delivery_tag <= n, (last, frame.delivery_tag)
            last = frame.delivery_tag
    return last


def _after(frames: list, channel: int, kind) -> list:
    """Frames on `channel` after the first `kind` frame on it."""
    for i, (ch, frame) in enumerate(frames):
        if ch == channel and isinstance(frame, kind):
            return [(c, f) for c, f in frames[i + 1 :] if c == channel]
    raise AssertionError(f"no {kind.__name__} on channel {channel}: {frames}")


def _count(client: RawClient, channel: int, name: str) -> int:
    ok = client.rpc(
        channel,
        commands.Queue.Declare(queue=name, durable=True, passive=True),
        commands.Queue.DeclareOk,
    )
    return ok.message_count


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_client_channel_close_sends_nothing_after_close_ok(broker_port, names, persistent):
    host, port, slow = broker_port
    name = names.queue("close-ok")
    client = _client(host, port)
    try:
        _confirm_queue(client, name)
        close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        client.send(
            _burst(name, BURST, persistent)
            + method_frame(1, close)
            + method_frame(2, commands.Channel.Open())
        )
        frames = _frames_until(
            client,
            lambda ch, f: ch == 1 and isinstance(f, commands.Channel.CloseOk),
        )
        assert _after(frames, 1, commands.Channel.CloseOk) == []
        acked = _check_acks(frames, BURST)
        if not against_rabbitmq() and not (persistent and slow):
            # Every confirm was due when the close was read: all go out before
            # close-ok (RabbitMQ sends those its queues have returned by then).
            assert acked == BURST
        # The channel is gone, its messages are not: every publish was routed.
        if not any(c == 2 and isinstance(f, commands.Channel.OpenOk) for c, f in frames):
            client.wait_for(commands.Channel.OpenOk, channel=2)
        assert _count(client, 2, name) == BURST
        # The number is free again, and the new channel starts its own confirms.
        client.open_channel(1)
        client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        client.publish(1, "", name, b"again")
        _ch, ack = client.wait_for(commands.Basic.Ack, channel=1)
        assert ack.delivery_tag == 1
    finally:
        client.close()


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_channel_error_sends_ready_confirms_before_channel_close(broker_port, names, persistent):
    host, port, slow = broker_port
    name = names.queue("close-err")
    missing = names.exchange("missing")
    client = _client(host, port)
    try:
        _confirm_queue(client, name)
        client.send(_burst(name, BURST, persistent) + _burst(name, 1, persistent, missing))
        frames = _frames_until(
            client, lambda ch, f: ch == 1 and isinstance(f, commands.Channel.Close)
        )
        close = next(f for c, f in frames if c == 1 and isinstance(f, commands.Channel.Close))
        assert close.reply_code == 404
        assert close.reply_text == f"NOT_FOUND - no exchange '{missing}' in vhost '/'"
        assert (close.class_id, close.method_id) == (60, 40)
        assert _after(frames, 1, commands.Channel.Close) == []
        acked = _check_acks(frames, BURST)
        if not against_rabbitmq() and not (persistent and slow):
            # Every confirm was ready: Leveret sends them all before its close
            # (RabbitMQ sends those of earlier batches only).
            assert acked == BURST
        client.send_method(1, commands.Channel.CloseOk())
        client.open_channel(2)
        assert _count(client, 2, name) == BURST
    finally:
        client.close()


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_client_connection_close_sends_nothing_after_close_ok(broker_port, names, persistent):
    host, port, slow = broker_port
    name = names.queue("conn-close")
    client = _client(host, port)
    try:
        _confirm_queue(client, name)
        close = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        client.send(_burst(name, BURST, persistent) + method_frame(0, close))
        frames = _frames_until(
            client, lambda ch, f: ch == 0 and isinstance(f, commands.Connection.CloseOk)
        )
        assert _after(frames, 0, commands.Connection.CloseOk) == []
        assert all(isinstance(f, commands.Basic.Ack) for c, f in frames if c == 1)
        acked = _check_acks(frames, BURST)
        if not against_rabbitmq() and not (persistent and slow):
            assert acked == BURST  # ready confirms go out before close-ok
    finally:
        client.close()
    check = _client(host, port)
    try:
        assert _count(check, 1, name) == BURST
    finally:
        check.close()


def test_server_connection_close_is_the_last_frame(broker_port, names):
    """A connection error after a burst: ready confirms, then connection.close, then
    nothing (a reply to channel.open on an open channel is 504 CHANNEL_ERROR)."""
    host, port, _slow = broker_port
    name = names.queue("conn-err")
    client = _client(host, port)
    try:
        _confirm_queue(client, name)
        client.send(_burst(name, BURST, True) + method_frame(1, commands.Channel.Open()))
        frames = _frames_until(
            client, lambda ch, f: ch == 0 and isinstance(f, commands.Connection.Close)
        )
        close = next(f for c, f in frames if isinstance(f, commands.Connection.Close))
        assert close.reply_code == 504
        assert frames[-1] == (0, close)  # nothing after it, on any channel
        _check_acks(frames, BURST)
        client.send_method(0, commands.Connection.CloseOk())
        assert client.wait_closed()
    finally:
        client.close()


def test_no_delivery_after_close_ok(amqp_host_port, names):
    """A consumer's channel closed in the middle of a stream of publishes from
    another connection: the last frame on the channel is close-ok."""
    host, port = amqp_host_port
    name = names.queue("deliveries")
    consumer = _client(host, port)
    publisher = _client(host, port)
    try:
        consumer.rpc(1, commands.Queue.Declare(queue=name), commands.Queue.DeclareOk)
        consumer.rpc(
            1, commands.Basic.Consume(queue=name, consumer_tag="c"), commands.Basic.ConsumeOk
        )
        publisher.send(_burst(name, BURST, False))
        consumer.read_frame()  # deliveries have started
        close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        consumer.send_method(1, close)
        publisher.send(_burst(name, BURST, False))
        frames = _frames_until(
            consumer, lambda ch, f: ch == 1 and isinstance(f, commands.Channel.CloseOk)
        )
        assert _after(frames, 1, commands.Channel.CloseOk) == []
    finally:
        consumer.close()
        publisher.close()
