"""The stream's per-message `x-stream-offset` header, built from a cached split.

Headers are encoded by pika (an independent encoder), so the split is checked
against property layouts that real clients send.
"""

from __future__ import annotations

import struct

import pika.spec
import pytest

from leveret.broker.queues.stream import _offset_header_parts, with_offset_header

PROPERTIES = [
    pika.spec.BasicProperties(),
    pika.spec.BasicProperties(content_type="text/plain", delivery_mode=2),
    pika.spec.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"k": 1, "x-stream-offset": 5},
        priority=3,
        message_id="m",
        app_id="app",
    ),
    pika.spec.BasicProperties(headers={}, correlation_id="c", reply_to="r"),
]


@pytest.mark.parametrize("props", PROPERTIES)
@pytest.mark.parametrize("offset", [0, 1, 2**40, 2**63 - 1])
def test_cached_split_builds_the_same_header(props, offset):
    header = struct.pack(">HHQ", 60, 0, 123) + b"".join(props.encode())
    prefix, suffix = _offset_header_parts(header)
    built = prefix + struct.pack(">q", offset) + suffix
    assert built == with_offset_header(header, offset)
    decoded = pika.spec.BasicProperties()
    decoded.decode(built[12:])
    assert decoded.headers["x-stream-offset"] == offset  # the last entry wins
    assert decoded.content_type == props.content_type
    assert decoded.correlation_id == props.correlation_id


@pytest.mark.parametrize("props", PROPERTIES)
@pytest.mark.parametrize("offset", [0, 7, 2**40, 2**63 - 1])
def test_client_reads_the_offset_as_pika_does(props, offset):
    """leveret.client's shortcut for the usual stream delivery (the offset is the only
    header) and its general path agree with pika's decoder on every layout."""
    from leveret.client.message import Message
    from leveret.protocol.properties import BasicProperties, stream_offset

    header = with_offset_header(struct.pack(">HHQ", 60, 0, 3) + b"".join(props.encode()), offset)
    expected = pika.spec.BasicProperties()
    expected.decode(header[12:])
    assert stream_offset(header) == offset
    assert Message(b"abc", header=header).offset == offset
    decoded = BasicProperties.decode(header)
    assert decoded.headers == expected.headers
    for name in ("content_type", "content_encoding", "priority", "message_id", "reply_to"):
        assert getattr(decoded, name) == getattr(expected, name)


def test_client_offset_of_a_message_without_one():
    from leveret.client.message import Message
    from leveret.protocol.properties import stream_offset

    header = struct.pack(">HHQ", 60, 0, 3) + b"".join(
        pika.spec.BasicProperties(headers={"a": "b"}).encode()
    )
    assert stream_offset(header) is None
    assert Message(b"abc", header=header).offset is None
    assert Message(b"abc").offset is None
