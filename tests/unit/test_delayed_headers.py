"""The delayed exchange reads and rewrites x-delay in the raw content header
(broker/exchanges/delayed.py); checked against pamqp's decoding of whole headers."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from pamqp import commands

from leveret.broker.exchanges.delayed import InvalidDelay, _set_delay, _x_delay, delay_of
from leveret.broker.message import Message
from leveret.protocol.properties import encode_header, parse_header

VALUES = [0, 5, -5, 2**31 - 1, 2**31, 2**40, -(2**40), 1.5, Decimal("2.75"), "123", True, None]


def _message(headers, **props) -> Message:
    header = encode_header(3, commands.Basic.Properties(headers=headers, **props))
    _c, _w, _s, flags, mode = parse_header(header)
    return Message("x", "k", header, b"abc", flags, mode == 2)


@pytest.mark.parametrize("seed", range(20))
def test_raw_reading_matches_decoding_the_table(seed):
    rng = random.Random(seed)
    headers = {f"h{k}": rng.choice([1, "s" * k, 2.5, [1, "a"], {"n": k}]) for k in range(5)}
    value = rng.choice(VALUES)
    if value is not None:
        headers["x-delay"] = value
    keys = list(headers)
    rng.shuffle(keys)
    headers = {k: headers[k] for k in keys}
    props = {"content_type": "text/plain"} if rng.random() < 0.5 else {}
    if rng.random() < 0.5:
        props["content_encoding"] = "gzip"
    message = _message(headers, **props)
    assert _x_delay(message) == _message(headers, **props).headers.get("x-delay")
    delay = delay_of(message)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        _set_delay(message, -delay)
        decoded = _message(headers, **props)
        expect = dict(decoded.headers, **{"x-delay": -value})
        assert message.headers == expect
        assert message.properties.content_type == decoded.properties.content_type
        assert message.body == b"abc" and parse_header(message.header)[2] == 3


def test_strings_that_are_not_integers_are_refused():
    for text in ("abc", "1.5", " 5", "", "5 "):
        with pytest.raises(InvalidDelay, match="is not an integer"):
            delay_of(_message({"x-delay": text}))
    assert delay_of(_message({"x-delay": "+7"})) == 7
    assert delay_of(_message({"x-delay": "-7"})) == -7
