"""The MQTT codec (leveret.mqtt.codec): round trips, paho-mqtt's own bytes, and
malformed packets (each raises MQTTProtocolError with the reason code MQTT 5 gives it)."""

from __future__ import annotations

import socket
import threading

import pytest

from leveret.mqtt import packets as p
from leveret.mqtt.codec import Decoder, MQTTProtocolError, encode, encode_varint


def server_decoder(version: int = p.MQTT_3_1_1) -> Decoder:
    return Decoder("server", version)


def roundtrip(packet, version: int, role: str):
    """Encode `packet`, decode it as `role` would receive it, in one byte at a time too."""
    data = encode(packet, version)
    decoded = Decoder(role, version).feed(data)
    assert decoded == [packet]
    dec = Decoder(role, version)
    out = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    assert out == [packet]
    return data


@pytest.mark.parametrize("version", [p.MQTT_3_1_1, p.MQTT_5])
def test_round_trips(version: int) -> None:
    v5 = version == p.MQTT_5
    props = {"user_property": [("a", "1"), ("a", "2")], "content_type": "text/plain"}
    will = p.Will("last/will", b"bye", 1, True, {"will_delay_interval": 5} if v5 else {})
    connect = p.Connect(
        "cid",
        version,
        False,
        30,
        "user",
        b"pw",
        will,
        {"session_expiry_interval": 60} if v5 else {},
    )
    roundtrip(connect, version, "server")
    roundtrip(p.Connack(True, 0, {"maximum_qos": 1} if v5 else {}), version, "client")
    roundtrip(
        p.Publish("a/b", b"x" * 300, 1, True, True, 7, props if v5 else {}), version, "server"
    )
    roundtrip(p.Publish("a/b", b"", 0), version, "client")
    for kind in (p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP):
        roundtrip(p.PubAck(kind, 65535), version, "server")
    subs = [p.Subscription("a/+", 1), p.Subscription("#", 0)]
    if v5:
        subs.append(p.Subscription("x", 2, True, True, 2))
    roundtrip(
        p.Subscribe(3, subs, {"subscription_identifier": [9]} if v5 else {}), version, "server"
    )
    roundtrip(p.Suback(3, [1, 0, 0x80]), version, "client")
    roundtrip(p.Unsubscribe(4, ["a/+", "#"]), version, "server")
    roundtrip(p.Unsuback(4, [0, 0x11] if v5 else []), version, "client")
    roundtrip(p.PingReq(), version, "server")
    roundtrip(p.PingResp(), version, "client")
    roundtrip(p.Disconnect(0x04 if v5 else 0), version, "server")


def test_mqtt5_reason_codes_and_properties_round_trip() -> None:
    ack = p.PubAck(p.PUBACK, 5, 0x10, {"reason_string": "nobody"})
    roundtrip(ack, p.MQTT_5, "client")
    roundtrip(p.Disconnect(0x8E, {"reason_string": "taken over"}), p.MQTT_5, "client")
    roundtrip(p.Auth(0x18, {"authentication_method": "x"}), p.MQTT_5, "server")


def test_several_packets_in_one_read_and_a_split_one() -> None:
    data = encode(p.PingReq(), 4) + encode(p.Publish("t", b"hello", 1, packet_id=1), 4)
    dec = server_decoder()
    assert dec.feed(data[:-3]) == [p.PingReq()]
    assert dec.feed(data[-3:]) == [p.Publish("t", b"hello", 1, packet_id=1)]


def test_varint_boundaries() -> None:
    for value, encoded in [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ]:
        assert encode_varint(value) == encoded
    with pytest.raises(ValueError):
        encode_varint(268_435_456)


# --- the same bytes as paho-mqtt's ----------------------------------------------------


def _paho_bytes(version, actions) -> bytes:
    """What paho-mqtt writes for CONNECT then `actions(client)`, read off a real socket."""
    import paho.mqtt.client as mqtt

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    received = bytearray()
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(2)
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received.extend(chunk)
        except OSError:
            pass
        conn.close()
        done.set()

    threading.Thread(target=serve, daemon=True).start()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-1", protocol=version)
    client.username_pw_set("guest", "guest")
    if version == mqtt.MQTTv5:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 120
        client.connect("127.0.0.1", port, keepalive=45, clean_start=False, properties=props)
    else:
        client.connect("127.0.0.1", port, keepalive=45)
    actions(client)
    for _ in range(5):
        client.loop_write()
    client.socket().close()
    done.wait(5)
    listener.close()
    return bytes(received)


def test_decodes_paho_311_bytes_and_encodes_them_back() -> None:
    import paho.mqtt.client as mqtt

    def actions(client) -> None:
        client.publish("a/b", b"payload", qos=1, retain=True)
        client.subscribe([("x/+", 1), ("y/#", 0)])
        client.unsubscribe("x/+")

    data = _paho_bytes(mqtt.MQTTv311, actions)
    decoded = server_decoder(None).feed(data)  # type: ignore[arg-type]
    kinds = [type(x).__name__ for x in decoded]
    assert kinds == ["Connect", "Publish", "Subscribe", "Unsubscribe"]
    connect = decoded[0]
    assert connect.client_id == "paho-1" and connect.keepalive == 45
    assert connect.username == "guest" and connect.password == b"guest"
    assert decoded[1].retain and decoded[1].qos == 1 and decoded[1].payload == b"payload"
    assert [(s.topic_filter, s.qos) for s in decoded[2].subscriptions] == [("x/+", 1), ("y/#", 0)]
    assert b"".join(encode(x, p.MQTT_3_1_1) for x in decoded) == data


def test_decodes_paho_v5_bytes_and_encodes_them_back() -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    def actions(client) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("k", "v")
        props.ContentType = "text/plain"
        props.MessageExpiryInterval = 30
        props.ResponseTopic = "reply/here"
        props.CorrelationData = b"\x01\x02"
        client.publish("a/b", b"payload", qos=1, properties=props)
        sub_props = Properties(PacketTypes.SUBSCRIBE)
        sub_props.SubscriptionIdentifier = 42
        options = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True, retainHandling=1)
        client.subscribe("x/+", options=options, properties=sub_props)

    data = _paho_bytes(mqtt.MQTTv5, actions)
    decoded = server_decoder(None).feed(data)  # type: ignore[arg-type]
    connect, publish, subscribe = decoded
    assert connect.protocol_level == 5 and not connect.clean_start
    assert connect.properties == {"session_expiry_interval": 120}
    assert publish.properties["user_property"] == [("k", "v")]
    assert publish.properties["correlation_data"] == b"\x01\x02"
    assert publish.properties["message_expiry_interval"] == 30
    sub = subscribe.subscriptions[0]
    assert (sub.qos, sub.no_local, sub.retain_as_published, sub.retain_handling) == (
        1,
        True,
        True,
        1,
    )
    assert subscribe.properties == {"subscription_identifier": [42]}
    # Properties may come in any order: compare by decoding what we encode.
    again = Decoder("server").feed(b"".join(encode(x, p.MQTT_5) for x in decoded))
    assert again == decoded


# --- malformed packets and protocol violations -------------------------------------------


def _error(data: bytes, version: int | None = p.MQTT_3_1_1) -> MQTTProtocolError:
    with pytest.raises(MQTTProtocolError) as info:
        Decoder("server", version).feed(data)
    return info.value


def test_remaining_length_of_five_bytes_is_malformed() -> None:
    err = _error(b"\x30\xff\xff\xff\xff\x01")
    assert err.reason_code == p.RC_MALFORMED_PACKET
    assert "four bytes" in err.text


def test_packet_larger_than_the_limit_is_refused_before_it_is_buffered() -> None:
    dec = Decoder("server", 4, max_packet_size=100)
    with pytest.raises(MQTTProtocolError) as info:
        dec.feed(b"\x30\xe8\x07")  # announces 1000 bytes; none of them sent yet
    assert info.value.reason_code == p.RC_PACKET_TOO_LARGE


def test_bad_fixed_header_flags() -> None:
    # SUBSCRIBE must carry 0b0010
    body = b"\x00\x01" + b"\x00\x01a\x00"
    assert _error(bytes((0x80, len(body))) + body).reason_code == p.RC_MALFORMED_PACKET
    assert _error(b"\xc1\x00").reason_code == p.RC_MALFORMED_PACKET  # PINGREQ with flags


def test_publish_with_qos_3_or_dup_at_qos_0() -> None:
    body = b"\x00\x01t\x00\x01"
    assert "QoS 3" in _error(bytes((0x36, len(body))) + body).text
    assert "DUP" in _error(b"\x38\x03\x00\x01t").text


def test_reserved_packet_type_and_wrong_direction() -> None:
    assert _error(b"\x00\x00").reason_code == p.RC_MALFORMED_PACKET
    assert _error(b"\x20\x02\x00\x00").reason_code == p.RC_PROTOCOL_ERROR  # CONNACK to a server
    assert _error(b"\xf0\x00").reason_code == p.RC_MALFORMED_PACKET  # AUTH in 3.1.1


def test_first_packet_must_be_connect_and_only_once() -> None:
    assert "first packet" in _error(b"\xc0\x00", None).text
    data = encode(p.Connect("c"), 4)
    with pytest.raises(MQTTProtocolError) as info:
        Decoder("server").feed(data + data)
    assert info.value.reason_code == p.RC_PROTOCOL_ERROR


def test_connect_violations() -> None:
    good = bytearray(encode(p.Connect("c"), 4))
    flags_at = 2 + 6 + 1  # fixed header, "MQTT" string, level
    reserved = bytearray(good)
    reserved[flags_at] |= 0x01
    assert "reserved connect flag" in _error(bytes(reserved), None).text
    # a password without a user name decodes: the session answers CONNACK 4
    password_only = encode(p.Connect("c", username=None, password=b"pw"), 4)
    connect = Decoder("server").feed(password_only)[0]
    assert (connect.username, connect.password) == (None, b"pw")
    will_qos = bytearray(good)
    will_qos[flags_at] |= 0x08
    assert "without the will flag" in _error(bytes(will_qos), None).text
    level = bytearray(good)
    level[flags_at - 1] = 9
    assert _error(bytes(level), None).reason_code == p.RC_UNSUPPORTED_PROTOCOL_VERSION
    trailing = bytes((0x10, good[1] + 1)) + bytes(good[2:]) + b"x"
    assert "unexpected bytes" in _error(trailing, None).text


def test_strings_must_be_utf8_without_nul() -> None:
    body = b"\x00\x02\xff\xfe"
    assert "UTF-8" in _error(bytes((0x30, len(body))) + body).text
    body = b"\x00\x02a\x00"
    assert "U+0000" in _error(bytes((0x30, len(body))) + body).text


def test_truncated_fields_and_empty_subscribe() -> None:
    assert "ends" in _error(b"\x30\x01\x00").text
    assert _error(b"\x82\x02\x00\x01").reason_code == p.RC_PROTOCOL_ERROR  # no filters
    assert _error(b"\xa2\x02\x00\x01").reason_code == p.RC_PROTOCOL_ERROR
    assert "packet identifier 0" in _error(b"\x40\x02\x00\x00").text
    body = b"\x00\x01\x00\x01a\x04"  # reserved bits in a 3.1.1 requested QoS
    assert "reserved" in _error(bytes((0x82, len(body))) + body).text


def test_mqtt5_property_errors() -> None:
    def publish_with(props: bytes) -> bytes:
        body = b"\x00\x01t" + encode_varint(len(props)) + props
        return bytes((0x30, len(body))) + body

    assert "unknown property" in _error(publish_with(b"\x7f\x00"), 5).text
    # session expiry is not a PUBLISH property
    assert _error(publish_with(b"\x11\x00\x00\x00\x01"), 5).reason_code == p.RC_PROTOCOL_ERROR
    twice = b"\x03\x00\x01a\x03\x00\x01b"
    assert "twice" in _error(publish_with(twice), 5).text
    assert "topic alias 0" in _error(publish_with(b"\x23\x00\x00"), 5).text
    assert _error(publish_with(b"\x01\x05"), 5).reason_code == p.RC_PROTOCOL_ERROR
    # a property length past the packet's end
    body = b"\x00\x01t\x05\x01"
    assert "runs past" in _error(bytes((0x30, len(body))) + body, 5).text


def test_mqtt5_subscription_option_errors() -> None:
    def subscribe_with(options: int) -> bytes:
        body = b"\x00\x01\x00" + b"\x00\x01a" + bytes((options,))
        return bytes((0x82, len(body))) + body

    assert "retain handling" in _error(subscribe_with(0x30), 5).text
    assert "reserved" in _error(subscribe_with(0x40), 5).text
    assert "QoS 3" in _error(subscribe_with(0x03), 5).text
