"""The raw MQTT packets the scenarios send are what MQTT 3.1.1 says (checked by paho's
own encoder where it has one), and a broker's answer decodes to the recorded fields."""

from __future__ import annotations

import socket
import threading

import pytest
from paho.mqtt import client as paho

from .wire import RawClient, connect, decode, packet, publish, remaining_length, subscribe


@pytest.mark.parametrize(
    ("n", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (268435455, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length(n, encoded):
    assert remaining_length(n) == encoded


def test_connect_is_what_paho_sends():
    """paho's CONNECT, read from a real socket, is the one wire.connect builds."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id="c1", clean_session=False,
        protocol=paho.MQTTv311,
    )  # fmt: skip
    client.username_pw_set("u", "p")
    client.will_set("w/t", b"bye", 1, True)
    expected = connect("c1", clean=False, username="u", password="p",
                       will=("w/t", b"bye", 1, True))  # fmt: skip
    client.connect("127.0.0.1", server.getsockname()[1], keepalive=60)
    conn, _ = server.accept()
    conn.settimeout(5)
    received = b""
    while len(received) < len(expected):
        chunk = conn.recv(1000)
        if not chunk:
            break
        received += chunk
    conn.close()
    server.close()
    client.socket().close()
    assert received == expected


def test_publish_and_subscribe_bytes():
    assert publish("a/b", b"x", qos=1, packet_id=7, retain=True) == (
        b"\x33\x08\x00\x03a/b\x00\x07x"
    )
    assert subscribe(5, ("a/+", 1), ("#", 0)) == b"\x82\x0c\x00\x05\x00\x03a/+\x01\x00\x01#\x00"


def test_decode():
    assert decode(0x20, b"\x01\x05") == {
        "type": "connack",
        "session_present": True,
        "return_code": 5,
    }
    assert decode(0x90, b"\x00\x01\x01\x80") == {"type": "suback", "granted": [1, 128]}
    assert decode(0x3B, b"\x00\x01t\x00\x09hi") == {
        "type": "publish",
        "topic": "t",
        "qos": 1,
        "retain": True,
        "dup": True,
        "packet_id": 9,
        "payload": "hi",
    }


def test_raw_client_reads_packets_and_close():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        conn.recv(100)
        conn.sendall(packet(0x20, b"\x00\x00") + packet(0xD0, b""))
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    with RawClient("127.0.0.1", server.getsockname()[1]) as raw:
        raw.send(connect("x"))
        answers = raw.answers(5.0)
    thread.join()
    server.close()
    assert answers == {
        "packets": [
            {"type": "connack", "session_present": False, "return_code": 0},
            {"type": "pingresp"},
        ],
        "closed": True,
    }
