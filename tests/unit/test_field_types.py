"""Decoded field values keep their wire type (RabbitMQ's texts name it) and compare
as RabbitMQ compares them (tests/compat/amqp)."""

from __future__ import annotations

import decimal

from pamqp import decode

import leveret.protocol.methods  # noqa: F401  (installs the typed decoders)
from leveret.broker.queue_args import amqp_type_name, inequivalent_text, same_value, type_class
from leveret.protocol.fieldtable import Long, encode_value, join_table


def _decoded(raw_values: dict[str, bytes]) -> dict:
    return decode.field_table(join_table(raw_values))[1]


def test_integers_keep_the_type_they_were_sent_as():
    table = _decoded(
        {
            "b": b"b\x05",
            "B": b"B\x05",
            "s": b"s\x00\x05",
            "u": b"u\x00\x05",
            "I": b"I\x00\x00\x00\x05",
            "i": b"i\x00\x00\x00\x05",
            "l": b"l" + (5).to_bytes(8, "big"),
            "f": b"f?\xc0\x00\x00",
        }
    )
    names = {key: amqp_type_name(value) for key, value in table.items()}
    assert names == {
        "b": "byte",
        "B": "unsignedbyte",
        "s": "short",
        "u": "unsignedshort",
        "I": "signedint",
        "i": "unsignedint",
        "l": "long",
        "f": "float",
    }
    assert all(value == 5 for key, value in table.items() if key != "f")
    assert table["f"] == 1.5
    # plain Python values name the type an encoder would pick
    assert amqp_type_name(5) == "signedint" and amqp_type_name(2**40) == "long"
    assert amqp_type_name("x") == "longstr" and amqp_type_name(True) == "bool"


def test_a_decoded_long_is_written_back_as_a_long():
    value = _decoded({"n": b"l" + (7).to_bytes(8, "big")})["n"]
    assert isinstance(value, Long)
    assert encode_value(value) == b"l" + (7).to_bytes(8, "big")


def test_values_compare_by_type_class_as_rabbitmq_does():
    byte_five, long_five = _decoded({"a": b"b\x05", "b": b"l" + (5).to_bytes(8, "big")}).values()
    assert same_value(byte_five, long_five)
    assert same_value(5, long_five)
    assert not same_value(5, 5.0)
    assert not same_value(1, True)
    assert not same_value("5", 5)
    assert same_value(None, None) and not same_value(None, 0)
    assert type_class(decimal.Decimal("1.5")) == "int"  # as RabbitMQ's type_class


def test_inequivalent_text_names_the_sent_type():
    current = _decoded({"x": b"b\x05"})["x"]
    text = inequivalent_text("x-max-length", "queue 'q' in vhost '/'", None, current)
    assert text == (
        "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but "
        "current is the value '5' of type 'byte'"
    )


def test_a_decoded_method_is_encoded_back_as_the_client_sent_it():
    """A method handed to another worker with its connection is encoded again: every
    field-table value keeps its wire type and the keys their order, so the other worker
    decodes exactly what the client sent (pamqp's marshal would write 5 as a byte and
    sort the keys)."""
    from pamqp import commands

    from leveret.protocol.methods import decode_method, encode_method_as_received

    values = {
        "z-signedint": b"I\x00\x00\x00\x05",
        "b": b"b\xfb",
        "B": b"B\xfb",
        "s": b"s\xff\xfb",
        "u": b"u\xff\xfb",
        "i": b"i\xff\xff\xff\xfb",
        "l": b"l" + (5).to_bytes(8, "big"),
        "f": b"f?\xc0\x00\x00",
        "d": b"d\x3f\xb9\x99\x99\x99\x99\x99\x9a",
        "D": b"D\x02\x00\x00\x01\x3b",
        "t": b"t\x01",
        "S": b"S\x00\x00\x00\x02hi",
        "S-binary": b"S\x00\x00\x00\x02\xff\xfe",
        "x": b"x\x00\x00\x00\x02\x00\x01",
        "T": b"T" + (1_700_000_000).to_bytes(8, "big"),
        "V": b"V",
        "A": b"A\x00\x00\x00\x07b\x01I\x00\x00\x00\x02",
        "F": b"F" + join_table({"inner": b"u\x00\x07", "a": b"b\x01"}),
    }
    body = b"\x00\x00" + b"\x02qq" + b"\x02" + join_table(values)  # reserved, queue, durable
    payload = (50 << 16 | 10).to_bytes(4, "big") + body
    method = decode_method(payload)
    assert isinstance(method, commands.Queue.Declare) and method.durable
    assert method.arguments["z-signedint"] == 5 and list(method.arguments)[0] == "z-signedint"
    frame = encode_method_as_received(method, 7)
    assert frame == b"\x01\x00\x07" + len(payload).to_bytes(4, "big") + payload + b"\xce"
