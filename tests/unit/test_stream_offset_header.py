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
