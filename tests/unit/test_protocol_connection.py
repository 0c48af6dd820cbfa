"""The sans-IO protocol core, both roles talking to each other in memory.

No sockets and no broker: a client-role and a server-role Connection exchange
bytes through `pump()`. What reaches the wire is checked against pamqp where
the core uses hand-written codecs.
"""

from __future__ import annotations

import struct

import pytest
from pamqp import commands as cmd
from pamqp import frame as pamqp_frame

from leveret.protocol import connection as pc
from leveret.protocol import constants as k
from leveret.protocol.frames import FRAME_HEAD
from leveret.protocol.properties import EMPTY_PROPERTIES, BasicProperties


def feed(conn: pc.Connection, data: bytes) -> list:
    """All the events `data` completes, as a list."""
    return list(conn.receive_data(data))


def pump(client: pc.Connection, server: pc.Connection) -> tuple[list, list]:
    """Move bytes both ways until neither side has anything to send."""
    client_events: list = []
    server_events: list = []
    for _ in range(100):
        to_server = client.data_to_send()
        to_client = server.data_to_send()
        if not to_server and not to_client:
            return client_events, server_events
        if to_server:
            server_events += feed(server, to_server)
        if to_client:
            client_events += feed(client, to_client)
    raise AssertionError("the two ends never went quiet")


def handshake(
    client_kwargs: dict | None = None, server_kwargs: dict | None = None
) -> tuple[pc.Connection, pc.Connection]:
    client = pc.Connection(
        pc.CLIENT, username="u", password="p", vhost="v", **(client_kwargs or {})
    )
    server = pc.Connection(pc.SERVER, server_properties={"product": "t"}, **(server_kwargs or {}))
    client.initiate()
    _, sev = pump(client, server)
    (start_ok,) = sev
    assert isinstance(start_ok, pc.StartOkReceived)
    assert (start_ok.mechanism, start_ok.username, start_ok.password) == ("PLAIN", "u", "p")
    server.accept_login()
    _, sev = pump(client, server)
    (open_req,) = sev
    assert isinstance(open_req, pc.OpenRequested) and open_req.virtual_host == "v"
    server.accept_open()
    cev, _ = pump(client, server)
    (opened,) = cev
    assert isinstance(opened, pc.ConnectionOpened)
    assert client.is_open and server.is_open
    return client, server


def open_channel(client: pc.Connection, server: pc.Connection) -> int:
    number = client.open_channel()
    cev, sev = pump(client, server)
    assert [type(e) for e in sev] == [pc.ChannelOpened]
    assert [type(e) for e in cev] == [pc.ChannelOpened]
    return number


# -- handshake and tuning ----------------------------------------------------------


def test_handshake_negotiates_the_smaller_limits():
    client, server = handshake(
        {"frame_max": 65536, "channel_max": 100, "heartbeat": 10},
        {"frame_max": 131072, "channel_max": 2047, "heartbeat": 60},
    )
    assert (client.frame_max, client.channel_max, client.heartbeat) == (65536, 100, 10)
    assert (server.frame_max, server.channel_max, server.heartbeat) == (65536, 100, 10)
    assert client.server_properties["product"] == "t"


def test_client_without_a_heartbeat_preference_takes_the_servers():
    client, server = handshake({}, {"heartbeat": 7})
    assert client.heartbeat == server.heartbeat == 7


def test_amqplain_credentials_are_read():
    user, password = pc.parse_credentials(
        "AMQPLAIN", b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x03pwd"
    )
    assert (user, password) == ("guest", "pwd")
    assert pc.parse_credentials("PLAIN", b"no-nul-bytes") == (None, None)


def test_bad_protocol_header_gets_ours_back():
    server = pc.Connection(pc.SERVER)
    events = feed(server, b"HTTP/1.1 GET /")
    assert [type(e) for e in events] == [pc.BadProtocolHeader]
    assert server.data_to_send() == k.PROTOCOL_HEADER
    assert server.state == pc.CLOSED


def test_protocol_header_in_pieces():
    server = pc.Connection(pc.SERVER)
    assert feed(server, b"AMQ") == []
    assert feed(server, b"P\x00\x00\x09\x01") == []
    assert server.state == pc.AWAITING_START_OK
    assert server.data_to_send().startswith(b"\x01\x00\x00")  # connection.start


def test_method_out_of_order_in_the_handshake_closes_with_503():
    client = pc.Connection(pc.CLIENT)
    server = pc.Connection(pc.SERVER)
    client.initiate()
    feed(server, client.data_to_send())
    server.data_to_send()
    events = feed(server, pamqp_frame.marshal(cmd.Connection.Open("/"), 0))
    (err,) = events
    assert isinstance(err, pc.ProtocolError) and err.error.code == k.COMMAND_INVALID
    assert err.drop and server.state == pc.CLOSED
    assert b"expected Connection.StartOk" in server.data_to_send()


def test_server_refuses_a_frame_max_above_its_own():
    client = pc.Connection(pc.CLIENT, frame_max=131072)
    server = pc.Connection(pc.SERVER, frame_max=65536)
    client.initiate()
    pump(client, server)
    server.accept_login()
    # A misbehaving client ignores the server's limit.
    client.frame_max = 131072
    server.data_to_send()
    events = feed(server, pamqp_frame.marshal(cmd.Connection.TuneOk(2047, 131072, 0), 0))
    (err,) = events
    assert err.error.code == k.NOT_ALLOWED and "frame_max" in err.error.reply_text


def test_refused_login_reaches_the_client_as_connection_closed():
    client = pc.Connection(pc.CLIENT, password="wrong")
    server = pc.Connection(pc.SERVER)
    client.initiate()
    pump(client, server)
    server.close(k.ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused", 10, 11)
    assert server.state == pc.CLOSED  # before open: nobody waits for close-ok
    cev, _ = pump(client, server)
    (closed,) = cev
    assert isinstance(closed, pc.ConnectionClosed) and closed.reply_code == 403
    assert client.state == pc.CLOSED


def test_what_a_refused_client_sends_is_ignored():
    """After refuse_login the core acts on nothing the client sends (RabbitMQ's
    reader sleeps through it): handshake methods, a channel, a close, broken frames.
    close() still queues the 403 for a client that asked for one."""
    server = pc.Connection(pc.SERVER)
    client = pc.Connection(pc.CLIENT, password="wrong")
    client.initiate()
    _, sev = pump(client, server)
    assert [type(e) for e in sev] == [pc.StartOkReceived]
    server.refuse_login()
    assert server.state == pc.LOGIN_REFUSED
    events = feed(
        server,
        pamqp_frame.marshal(cmd.Connection.TuneOk(0, 131072, 0), 0)
        + pamqp_frame.marshal(cmd.Connection.Open("/"), 0)
        + pamqp_frame.marshal(cmd.Channel.Open(), 1)
        + pamqp_frame.marshal(cmd.Connection.Close(200, "bye", 0, 0), 0)
        + b"\x03\x00\x00\x00\x00\x00\x01x\x00",  # a body on channel 0, bad frame end
    )
    assert events == [] and server.data_to_send() == b""
    assert server.state == pc.LOGIN_REFUSED
    server.close(k.ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused")
    assert server.state == pc.CLOSED
    cev, _ = pump(client, server)
    assert [(type(e), e.reply_code) for e in cev] == [(pc.ConnectionClosed, 403)]


def test_refuse_login_outside_a_login_is_a_usage_error():
    client, server = handshake()
    with pytest.raises(pc.UsageError):
        server.refuse_login()


# -- channels -----------------------------------------------------------------------


def test_channel_open_and_client_close():
    client, server = handshake()
    n = open_channel(client, server)
    assert client.channel_is_open(n) and server.channel_is_open(n)
    client.close_channel(n)
    cev, sev = pump(client, server)
    assert [type(e) for e in sev] == [pc.ChannelClosed]
    assert [type(e) for e in cev] == [pc.ChannelCloseOk]
    assert not client.channel_is_open(n) and not server.channel_is_open(n)
    assert client.open_channel() == n + 1  # numbers are not reused at once


def test_server_closes_a_channel_and_the_connection_carries_on():
    client, server = handshake()
    n = open_channel(client, server)
    server.close_channel(n, k.NOT_FOUND, "NOT_FOUND - no queue 'q'", 50, 10)
    cev, sev = pump(client, server)
    (closed,) = cev
    assert isinstance(closed, pc.ChannelClosed)
    assert (closed.reply_code, closed.class_id, closed.method_id) == (404, 50, 10)
    assert [type(e) for e in sev] == [pc.ChannelCloseOk]
    assert client.is_open
    with pytest.raises(pc.UsageError, match="channel 1 is closed"):
        client.send_publish(n, "", "q", b"x", EMPTY_PROPERTIES)


def test_frames_on_a_closing_channel_are_dropped_until_close_ok():
    client, server = handshake()
    n = open_channel(client, server)
    server.close_channel(n, k.PRECONDITION_FAILED, "PRECONDITION_FAILED - x")
    # The client publishes before it hears of the close; the server drops it.
    client.send_publish(n, "", "q", b"late", EMPTY_PROPERTIES)
    cev, sev = pump(client, server)
    assert [type(e) for e in sev] == [pc.ChannelCloseOk]
    assert [type(e) for e in cev] == [pc.ChannelClosed]


def test_both_ends_close_a_channel_at_once():
    client, server = handshake()
    n = open_channel(client, server)
    client.close_channel(n)
    server.close_channel(n, 406, "PRECONDITION_FAILED - x")
    cev, sev = pump(client, server)
    assert [type(e) for e in cev] == [pc.ChannelCloseOk]
    assert [type(e) for e in sev] == [pc.ChannelCloseOk]


def test_method_on_an_unopened_channel_is_a_channel_error():
    client, server = handshake()
    events = feed(server, pamqp_frame.marshal(cmd.Queue.Declare(queue="q"), 5))
    (err,) = events
    assert err.error.code == k.CHANNEL_ERROR and "channel.open" in err.error.reply_text


def test_channel_above_channel_max_is_refused():
    client, server = handshake({"channel_max": 3}, {})
    with pytest.raises(pc.UsageError):
        client.open_channel(4)
    events = feed(server, pamqp_frame.marshal(cmd.Channel.Open(), 4))
    assert events[0].error.code == k.NOT_ALLOWED


def test_second_channel_open_is_a_channel_error():
    client, server = handshake()
    n = open_channel(client, server)
    events = feed(server, pamqp_frame.marshal(cmd.Channel.Open(), n))
    assert events[0].error.code == k.CHANNEL_ERROR


# -- content --------------------------------------------------------------------------


def test_publish_reaches_the_server_as_one_event():
    client, server = handshake()
    n = open_channel(client, server)
    props = BasicProperties(content_type="text/plain", message_id="m1", delivery_mode=2)
    client.send_publish(n, "amq.direct", "rk", b"hello", props.encode(), mandatory=True)
    _, sev = pump(client, server)
    (pub,) = sev
    assert isinstance(pub, pc.Publish)
    assert (pub.exchange, pub.routing_key, pub.mandatory, pub.body) == (
        "amq.direct",
        "rk",
        True,
        b"hello",
    )
    assert BasicProperties.decode(pub.header) == props


def test_body_bigger_than_frame_max_is_split_and_reassembled():
    client, server = handshake({"frame_max": 4096}, {})
    n = open_channel(client, server)
    body = bytes(range(256)) * 100  # 25,600 bytes: seven body frames
    client.send_publish(n, "", "q", body, EMPTY_PROPERTIES)
    wire_bytes = client.data_to_send()
    frames = list(pc.FrameReader(4096).feed(wire_bytes))
    bodies = [p for t, _, p in frames if t == k.FRAME_BODY]
    assert len(bodies) == 7 and all(len(b) <= 4096 - 8 for b in bodies)
    (pub,) = feed(server, wire_bytes)
    assert pub.body == body


def test_empty_body_has_no_body_frames():
    client, server = handshake()
    n = open_channel(client, server)
    client.send_publish(n, "", "q", b"", EMPTY_PROPERTIES)
    wire_bytes = client.data_to_send()
    assert [t for t, _, _ in pc.FrameReader(131072).feed(wire_bytes)] == [1, 2]
    (pub,) = feed(server, wire_bytes)
    assert pub.body == b""


def test_deliver_get_ok_and_return_reach_the_client():
    client, server = handshake()
    n = open_channel(client, server)
    header = struct.pack(">HHQ", 60, 0, 3) + BasicProperties(priority=3).encode()
    server.send_content(n, cmd.Basic.Deliver("ctag", 7, True, "ex", "rk"), header, b"abc")
    server.send_content(n, cmd.Basic.GetOk(8, False, "", "q", 41), header, b"abc")
    server.send_content(n, cmd.Basic.Return(312, "NO_ROUTE", "ex", "nowhere"), header, b"abc")
    cev, _ = pump(client, server)
    deliver, get_ok, returned = cev
    assert isinstance(deliver, pc.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag", 7, True)
    assert (deliver.exchange, deliver.routing_key, deliver.body) == ("ex", "rk", b"abc")
    assert BasicProperties.decode(deliver.header).priority == 3
    assert isinstance(get_ok, pc.GetOk) and get_ok.message_count == 41
    assert isinstance(returned, pc.Return)
    assert (returned.reply_code, returned.routing_key) == (312, "nowhere")


def test_acks_and_nacks_both_ways():
    client, server = handshake()
    n = open_channel(client, server)
    client.send_ack(n, 5, multiple=True)
    client.send_nack(n, 6, multiple=False, requeue=False)
    client.send_reject(n, 7, requeue=True)
    _, sev = pump(client, server)
    ack, nack, reject = sev
    assert (ack.delivery_tag, ack.multiple) == (5, True)
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (6, False, False)
    assert isinstance(reject, pc.MethodReceived) and reject.method.requeue is True
    server.send_method(n, cmd.Basic.Ack(9, True))
    server.send_method(n, cmd.Basic.Nack(10, False))
    cev, _ = pump(client, server)
    assert isinstance(cev[0], pc.Ack) and cev[0].delivery_tag == 9
    assert isinstance(cev[1], pc.Nack) and cev[1].delivery_tag == 10


def test_content_header_without_a_method_is_unexpected_frame():
    client, server = handshake()
    n = open_channel(client, server)
    header = struct.pack(">HHQH", 60, 0, 1, 0)
    frame = FRAME_HEAD.pack(2, n, len(header)) + header + b"\xce"
    (err,) = feed(server, frame)
    assert err.error.code == k.UNEXPECTED_FRAME


def test_method_in_the_middle_of_content_is_unexpected_frame():
    client, server = handshake()
    n = open_channel(client, server)
    feed(server, pamqp_frame.marshal(cmd.Basic.Publish(routing_key="q"), n))
    (err,) = feed(server, pamqp_frame.marshal(cmd.Basic.Qos(1), n))
    assert err.error.code == k.UNEXPECTED_FRAME
    assert server.state == pc.CLOSING  # close sent, waiting for close-ok


def test_body_longer_than_announced_is_a_frame_error():
    client, server = handshake()
    n = open_channel(client, server)
    feed(server, pamqp_frame.marshal(cmd.Basic.Publish(routing_key="q"), n))
    header = struct.pack(">HHQH", 60, 0, 2, 0)
    data = FRAME_HEAD.pack(2, n, len(header)) + header + b"\xce"
    data += FRAME_HEAD.pack(3, n, 5) + b"toolong"[:5] + b"\xce"
    (err,) = feed(server, data)
    assert err.error.code == k.FRAME_ERROR


def test_message_over_max_body_size_closes_only_its_channel():
    client, server = handshake({}, {"max_body_size": 10})
    n = open_channel(client, server)
    m = open_channel(client, server)
    client.send_publish(n, "", "q", b"x" * 11, EMPTY_PROPERTIES)
    client.send_publish(m, "", "q", b"fine", EMPTY_PROPERTIES)
    cev, sev = pump(client, server)
    assert [type(e) for e in sev] == [pc.ChannelProtocolError, pc.Publish, pc.ChannelCloseOk]
    assert sev[0].error.code == k.PRECONDITION_FAILED and sev[1].body == b"fine"
    assert [type(e) for e in cev] == [pc.ChannelClosed]
    assert server.is_open


def test_heartbeat_on_a_channel_is_unexpected_frame():
    client, server = handshake()
    n = open_channel(client, server)
    (err,) = feed(server, FRAME_HEAD.pack(8, n, 0) + b"\xce")
    assert err.error.code == k.UNEXPECTED_FRAME


def test_bad_frame_end_drops_the_connection():
    client, server = handshake()
    (err,) = feed(server, FRAME_HEAD.pack(8, 0, 0) + b"\x00")
    assert err.error.code == k.FRAME_ERROR and err.drop
    assert server.state == pc.CLOSED


def test_heartbeats_are_silent():
    client, server = handshake()
    client.send_heartbeat()
    assert feed(server, client.data_to_send()) == []


# -- closing ----------------------------------------------------------------------------


def test_connection_close_handshake_from_the_client():
    client, server = handshake()
    open_channel(client, server)
    client.close()
    assert client.state == pc.CLOSING
    with pytest.raises(pc.UsageError):
        client.open_channel()
    cev, sev = pump(client, server)
    assert [type(e) for e in sev] == [pc.ConnectionClosed]
    assert [type(e) for e in cev] == [pc.ConnectionCloseOk]
    assert client.state == server.state == pc.CLOSED


def test_server_forced_close_reaches_the_client():
    client, server = handshake()
    n = open_channel(client, server)
    server.close(k.CONNECTION_FORCED, "CONNECTION_FORCED - shutdown")
    client.send_publish(n, "", "q", b"in flight", EMPTY_PROPERTIES)
    cev, sev = pump(client, server)
    (closed,) = cev
    assert isinstance(closed, pc.ConnectionClosed) and closed.reply_code == 320
    assert [type(e) for e in sev] == [pc.ConnectionCloseOk]  # the publish was dropped


def test_blocked_and_unblocked():
    client, server = handshake()
    server.send_method(0, cmd.Connection.Blocked("low on memory"))
    server.send_method(0, cmd.Connection.Unblocked())
    cev, _ = pump(client, server)
    assert isinstance(cev[0], pc.ConnectionBlocked) and cev[0].reason == "low on memory"
    assert isinstance(cev[1], pc.ConnectionUnblocked)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="role"):
        pc.Connection("peer")
    with pytest.raises(ValueError, match="frame_max"):
        pc.Connection(pc.CLIENT, frame_max=100)
    with pytest.raises(ValueError, match="heartbeat"):
        pc.Connection(pc.CLIENT, heartbeat=-1)
    client = pc.Connection(pc.CLIENT)
    with pytest.raises(pc.UsageError):
        client.open_channel()


# -- method constants -----------------------------------------------------------------------


def test_named_method_constants_match_pamqp():
    from pamqp import commands

    for index, cls in commands.INDEX_MAPPING.items():
        cls_name, method = cls.name.split(".")
        snake = "".join("_" + c if c.isupper() else c for c in method).lstrip("_").upper()
        assert getattr(k, f"{cls_name.upper()}_{snake}") == index, cls.name


# -- the fast path and the frame-by-frame path agree ------------------------------------


def _summary(events):
    out = []
    for e in events:
        fields = tuple(getattr(e, name) for name in e.__slots__)
        out.append((type(e).__name__, fields))
    return out


@pytest.mark.parametrize("chunk", [1, 2, 7, 19, 64, 1000, 10**9])
def test_any_split_of_the_byte_stream_gives_the_same_events(chunk):
    client, server = handshake({"frame_max": 4096}, {"frame_max": 4096})
    n = open_channel(client, server)
    header = struct.pack(">HHQ", 60, 0, 0) + BasicProperties(message_id="m").encode()
    bodies = [b"", b"x", b"y" * 4088, b"z" * 4089, b"w" * 10000, b"small"]
    for i, body in enumerate(bodies):
        h = header[:4] + struct.pack(">Q", len(body)) + header[12:]
        server.send_content(n, cmd.Basic.Deliver("ctag", i + 1, i % 2 == 1, "ex", "rk"), h, body)
        server.send_method(n, cmd.Basic.Ack(i + 1, False))
    server.send_method(0, cmd.Connection.Blocked("x"))
    wire_bytes = server.data_to_send()
    events = []
    for start in range(0, len(wire_bytes), chunk):
        events += feed(client, wire_bytes[start : start + chunk])
    deliveries = [e for e in events if isinstance(e, pc.Deliver)]
    assert [d.body for d in deliveries] == bodies
    assert [d.delivery_tag for d in deliveries] == list(range(1, 7))
    assert [d.redelivered for d in deliveries] == [i % 2 == 1 for i in range(6)]
    assert all(BasicProperties.decode(d.header).message_id == "m" for d in deliveries)
    assert [type(e).__name__ for e in events] == ["Deliver", "Ack"] * 6 + ["ConnectionBlocked"]
    # The same stream fed whole, to a fresh client: identical events.
    client2, server2 = handshake({"frame_max": 4096}, {"frame_max": 4096})
    open_channel(client2, server2)
    assert _summary(feed(client2, wire_bytes)) == _summary(events)


@pytest.mark.parametrize("chunk", [1, 5, 33, 10**9])
def test_publishes_split_anywhere_reach_the_server_whole(chunk):
    client, server = handshake()
    n = open_channel(client, server)
    bodies = [b"a" * size for size in (0, 1, 100, 131064, 131065, 300000)]
    for body in bodies:
        client.send_publish(n, "amq.direct", "key", body, EMPTY_PROPERTIES, mandatory=True)
    wire_bytes = client.data_to_send()
    events = []
    for start in range(0, len(wire_bytes), chunk):
        events += feed(server, wire_bytes[start : start + chunk])
    assert [type(e) for e in events] == [pc.Publish] * len(bodies)
    assert [e.body for e in events] == bodies
    assert all(
        (e.exchange, e.routing_key, e.mandatory) == ("amq.direct", "key", True) for e in events
    )


def test_replies_keep_their_order_when_events_are_taken_one_by_one():
    """The core's own replies (close-ok here) are queued as their event is taken,
    after the replies the caller made to earlier events."""
    client, server = handshake()
    n = open_channel(client, server)
    client.send_method(n, cmd.Basic.Qos(prefetch_count=5))
    client.close_channel(n)
    for event in server.receive_data(client.data_to_send()):
        if isinstance(event, pc.MethodReceived):
            server.send_method(n, cmd.Basic.QosOk())
    out = server.data_to_send()
    methods = [p[:4] for t, _, p in pc.FrameReader(131072).feed(out)]
    assert methods == [
        k.BASIC_QOS_OK.to_bytes(4, "big"),
        k.CHANNEL_CLOSE_OK.to_bytes(4, "big"),
    ]


def test_a_client_can_ack_deliveries_while_taking_them_before_a_channel_close():
    client, server = handshake()
    n = open_channel(client, server)
    header = struct.pack(">HHQ", 60, 0, 1) + EMPTY_PROPERTIES
    server.send_content(n, cmd.Basic.Deliver("c", 1, False, "", "q"), header, b"x")
    server.close_channel(n, 406, "PRECONDITION_FAILED - bye")
    kinds = []
    for event in client.receive_data(server.data_to_send()):
        kinds.append(type(event).__name__)
        if isinstance(event, pc.Deliver):
            client.send_ack(n, event.delivery_tag)  # the channel is still open here
    assert kinds == ["Deliver", "ChannelClosed"]
    assert [type(e).__name__ for e in feed(server, client.data_to_send())] == [
        "ChannelCloseOk"
    ]  # the ack was dropped on the closing channel


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">HHH", 60, 40, 0),  # nothing after the reserved short
        struct.pack(">HHH", 60, 40, 0) + b"\x05ab",  # exchange runs past the frame
        struct.pack(">HHH", 60, 40, 0) + b"\x00\x02q",  # routing key runs past the frame
        struct.pack(">HHH", 60, 40, 0) + b"\x00\x01q",  # no bits octet
    ],
)
def test_malformed_publish_with_its_content_is_a_frame_error(payload):
    """A truncated basic.publish arriving with its header and body in one read (the
    fast path) is refused like one arriving alone, and as RabbitMQ refuses it: 501
    FRAME_ERROR "cannot decode", with the method named."""
    client, server = handshake()
    n = open_channel(client, server)
    header = struct.pack(">HHQH", 60, 0, 2, 0)
    data = FRAME_HEAD.pack(1, n, len(payload)) + payload + b"\xce"
    data += FRAME_HEAD.pack(2, n, len(header)) + header + b"\xce"
    data += FRAME_HEAD.pack(3, n, 2) + b"hi" + b"\xce"
    events = feed(server, data)
    assert not any(isinstance(e, pc.Publish) for e in events)
    close = pamqp_frame.unmarshal(server.data_to_send())[2]
    assert isinstance(close, cmd.Connection.Close)
    assert close.reply_code == k.FRAME_ERROR
    assert "cannot decode Basic.Publish frame" in close.reply_text


def test_publish_keeps_the_names_as_they_arrived():
    client, server = handshake()
    n = open_channel(client, server)
    client.send_publish(n, "amq.topic", "ключ.1", b"body", EMPTY_PROPERTIES)
    _, sev = pump(client, server)
    (publish,) = sev
    assert (publish.exchange, publish.routing_key) == ("amq.topic", "ключ.1")
    key = "ключ.1".encode()
    assert publish.names == b"\x09amq.topic" + bytes((len(key),)) + key
