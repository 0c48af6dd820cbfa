"""Malformed input on a raw socket: the server must close just that connection.

For each case the server replies connection.close with the spec reply code and a
non-empty reply text, the socket is closed within a few seconds (RabbitMQ waits
up to ~3 s for close-ok after a frame error), and a second connection that was
open at the same time keeps working.

Reply codes pinned against RabbitMQ 3.10.8 (texts shown for reference):

* bad frame-end octet      -> 501 "FRAME_ERROR - type 1, all octets = <<...>>: {invalid_frame_end_marker,0}"
* frame over frame_max     -> 501 "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,5020,4088}"
* unknown frame type       -> 501 "FRAME_ERROR - type 9, all octets = <<"hello">>: unknown_frame"
* content header on ch 0   -> 505 "UNEXPECTED_FRAME - type 2, all octets = <<...>>"
* content body on ch 0     -> 505 "UNEXPECTED_FRAME - type 3, all octets = <<"hello">>"
* heartbeat on channel 1   -> 505 "UNEXPECTED_FRAME - type 8, all octets = <<>>"
* body without header      -> 505 "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
* header without publish   -> 505 (same text)
* method inside content    -> 505 "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
* method on unopened chan. -> 504 "CHANNEL_ERROR - expected 'channel.open'"
* channel.open twice       -> 504 "CHANNEL_ERROR - second 'channel.open' seen"
* queue.declare on ch 0    -> 504 "CHANNEL_ERROR - unexpected method in connection state running"
* garbage field table      -> 501 "FRAME_ERROR - cannot decode <<...>>"  (not 502)
* truncated method payload -> 501 "FRAME_ERROR - cannot decode <<0>>"
* truncated basic.ack      -> 501 "FRAME_ERROR - cannot decode <<0,0,0,7>>"
* method frame shorter than
  its class and method ids  -> 501 (the parser's fast path must not read past it)
* truncated basic.publish,
  header and body behind it -> 501 "FRAME_ERROR - cannot decode <<0,0,0,2,113>>"
* unknown class/method id  -> RabbitMQ drops the socket with no connection.close;
                              Leveret may instead send 503 COMMAND_INVALID / 540.
"""

from __future__ import annotations

import struct

import pytest
from pamqp import body, commands, frame, header

from rawamqp import ConnectionLost, RawClient, method_payload, raw_frame


def _open_client(raw, **handshake) -> RawClient:
    client = raw()
    client.handshake(**handshake)
    client.open_channel(1)
    return client


def _assert_still_works(client: RawClient) -> None:
    ok = client.rpc(
        1,
        commands.Queue.Declare(queue="", exclusive=True, auto_delete=True),
        commands.Queue.DeclareOk,
    )
    assert isinstance(ok, commands.Queue.DeclareOk)
    assert ok.queue.startswith("amq.gen-")


def _expect_close(client: RawClient, codes: set[int], allow_drop: bool = False):
    """connection.close with a code in ``codes``, then the socket closes."""
    try:
        close = client.expect_connection_close(timeout=5)
    except ConnectionLost:
        if allow_drop:
            return None
        raise
    assert close.reply_code in codes, (close.reply_code, close.reply_text)
    assert close.reply_text, "reply text must not be empty"
    assert client.wait_closed(timeout=8), "server did not close the socket"
    return close


CASES = {
    # name: (bytes to send on an open connection with channel 1 open, expected codes)
    "bad_frame_end": (
        lambda: raw_frame(1, 1, method_payload(commands.Basic.Qos(prefetch_count=1)), b"\x00"),
        {501},
    ),
    "unknown_frame_type": (lambda: raw_frame(9, 1, b"hello"), {501}),
    "unknown_frame_type_channel0": (lambda: raw_frame(9, 0, b"hello"), {501}),
    "content_header_on_channel0": (
        lambda: frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties()), 0),
        {505},
    ),
    "content_body_on_channel0": (lambda: frame.marshal(body.ContentBody(b"hello"), 0), {505}),
    "heartbeat_on_channel1": (lambda: raw_frame(8, 1, b""), {505}),
    "body_without_header": (lambda: frame.marshal(body.ContentBody(b"hello"), 1), {505}),
    "header_without_publish": (
        lambda: frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties()), 1),
        {505},
    ),
    "method_inside_content": (
        lambda: (
            frame.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
            + frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties()), 1)
            + frame.marshal(commands.Basic.Qos(prefetch_count=1), 1)
        ),
        {505},
    ),
    "method_on_unopened_channel": (
        lambda: frame.marshal(commands.Queue.Declare(queue="", exclusive=True), 5),
        {504},
    ),
    "channel_opened_twice": (lambda: frame.marshal(commands.Channel.Open(), 1), {504}),
    "channel_method_on_channel0": (
        lambda: frame.marshal(commands.Queue.Declare(queue="", exclusive=True), 0),
        {504},
    ),
    "garbage_field_table": (
        # queue.declare: ticket, queue "", flags, then a table whose only
        # field has the unknown type 'Z'.
        lambda: raw_frame(
            1,
            1,
            struct.pack(">I", commands.Queue.Declare.index)
            + b"\x00\x00"
            + b"\x00"
            + b"\x00"
            + struct.pack(">I", 10)
            + b"\x03abcZ123456",
        ),
        {501},
    ),
    "truncated_method_payload": (
        lambda: raw_frame(1, 1, struct.pack(">I", commands.Queue.Declare.index) + b"\x00"),
        {501},
    ),
    # The hot path's hand-written decoders answer as pamqp's and RabbitMQ do.
    "truncated_basic_ack": (
        lambda: raw_frame(1, 1, struct.pack(">HHI", 60, 80, 7)),
        {501},
    ),
    # A method frame too short for its class and method ids, with more frames behind
    # it: the parser's fast path must not read the ids out of the next frame.
    "method_frame_of_two_octets": (
        lambda: (
            raw_frame(1, 1, b"\x00\x3c") + raw_frame(1, 1, method_payload(commands.Basic.Qos()))
        ),
        {501},
    ),
    "empty_method_frame": (
        lambda: raw_frame(1, 1, b"") + raw_frame(1, 1, method_payload(commands.Basic.Qos())),
        {501},
    ),
    "truncated_basic_publish_with_its_content": (
        lambda: (
            raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x00\x02q")
            + frame.marshal(header.ContentHeader(0, 2, commands.Basic.Properties()), 1)
            + frame.marshal(body.ContentBody(b"hi"), 1)
        ),
        {501},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_closes_only_that_connection(raw, case):
    make_bytes, codes = CASES[case]
    bystander = _open_client(raw)
    victim = _open_client(raw)
    victim.send(make_bytes())
    _expect_close(victim, codes)
    _assert_still_works(bystander)


def test_oversize_frame(raw):
    """A frame bigger than the negotiated frame_max is a FRAME_ERROR."""
    bystander = _open_client(raw)
    victim = _open_client(raw, frame_max=4096)
    big = commands.Queue.Declare(queue="big", arguments={"pad": "x" * 5000})
    victim.send(raw_frame(1, 1, method_payload(big)))
    close = _expect_close(victim, {501})
    assert close.reply_code == 501
    _assert_still_works(bystander)


def test_oversize_frame_default_frame_max(raw):
    bystander = _open_client(raw)
    victim = _open_client(raw)
    assert victim.tune.frame_max > 0
    pad = "x" * (victim.tune.frame_max + 100)
    big = commands.Queue.Declare(queue="big", arguments={"pad": pad})
    victim.send(raw_frame(1, 1, method_payload(big)))
    _expect_close(victim, {501})
    _assert_still_works(bystander)


@pytest.mark.parametrize(
    "payload",
    [struct.pack(">HH", 60, 999), struct.pack(">HH", 999, 10)],
    ids=["unknown_method_id", "unknown_class_id"],
)
def test_unknown_method(raw, payload):
    """RabbitMQ just drops the socket here (no connection.close at all).

    Leveret is allowed to be politer: a connection.close with 503
    COMMAND_INVALID, 540 NOT_IMPLEMENTED or 501/502 is accepted.
    """
    bystander = _open_client(raw)
    victim = _open_client(raw)
    victim.send(raw_frame(1, 1, payload))
    close = _expect_close(victim, {501, 502, 503, 540}, allow_drop=True)
    if close is None:  # RabbitMQ's way: no close frame, just EOF
        assert victim.closed
    _assert_still_works(bystander)


def test_garbage_before_handshake(raw):
    """Bytes that are not a protocol header: the server answers with its own header."""
    client = raw()
    client.send(b"\x01\x00\x00\x00\x00\x00\x05hello\xce")
    assert client.read_bytes(8, timeout=5) == b"AMQP\x00\x00\x09\x01"
    assert client.wait_closed(timeout=5)
