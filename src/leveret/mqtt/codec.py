"""The MQTT wire format, sans-IO: bytes in, packets out; packets in, bytes out.

`Decoder.feed(data)` returns the whole packets the bytes complete and keeps the
rest; it raises `MQTTProtocolError` (with the MQTT 5 reason code the peer should be
told: 0x81 malformed packet, 0x82 protocol error, 0x95 packet too large, 0x84 for
an unknown protocol level) for anything the specification forbids at the wire
level. `encode(packet, version)` is its inverse. Either role works (`role="server"`
decodes what clients send, `role="client"` what servers send), so the tests speak
MQTT through the same code the broker does. The protocol level is learnt from the
CONNECT (server) or set by the caller (client); it decides whether MQTT 5's
properties and reason codes are on the wire.
"""

from __future__ import annotations

import struct
from typing import Any

from leveret.mqtt.packets import (
    ALLOWED_PROPERTIES,
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PINGREQ,
    PINGRESP,
    PROPERTIES,
    PROPERTY_IDS,
    PROTOCOL_NAMES,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    RC_MALFORMED_PACKET,
    RC_PACKET_TOO_LARGE,
    RC_PROTOCOL_ERROR,
    RC_UNSUPPORTED_PROTOCOL_VERSION,
    REPEATABLE,
    REQUIRED_FLAGS,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)

MAX_REMAINING_LENGTH = 268_435_455  # four bytes of variable-length integer
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# What each role may receive.
FROM_CLIENT = frozenset(
    {CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ}
    | {DISCONNECT, AUTH}
)
FROM_SERVER = frozenset(
    {CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP}
    | {DISCONNECT, AUTH}
)


class MQTTProtocolError(Exception):
    """The peer broke the protocol; `reason_code` is what MQTT 5 calls it."""

    def __init__(self, text: str, reason_code: int = RC_MALFORMED_PACKET) -> None:
        super().__init__(text)
        self.text = text
        self.reason_code = reason_code


def malformed(text: str) -> MQTTProtocolError:
    return MQTTProtocolError(text, RC_MALFORMED_PACKET)


def protocol_error(text: str) -> MQTTProtocolError:
    return MQTTProtocolError(text, RC_PROTOCOL_ERROR)


# --- primitive types ----------------------------------------------------------


def encode_varint(value: int) -> bytes:
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _utf8(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError("UTF-8 string longer than 65535 bytes")
    return _U16.pack(len(data)) + data


def _binary(value: bytes) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return _U16.pack(len(value)) + bytes(value)


class _Reader:
    """A cursor over one packet's remaining bytes; every read checks the bounds."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: memoryview | bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    @property
    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise malformed(f"packet ends inside its {what}")
        start = self.pos
        self.pos += n
        return bytes(self.data[start : self.pos])

    def byte(self, what: str) -> int:
        if self.left < 1:
            raise malformed(f"packet ends before its {what}")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self, what: str) -> int:
        return _U16.unpack(self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return _U32.unpack(self.take(4, what))[0]

    def varint(self, what: str) -> int:
        value = 0
        for shift in (0, 7, 14, 21):
            byte = self.byte(what)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise malformed(f"{what}: variable byte integer longer than four bytes")

    def binary(self, what: str) -> bytes:
        return self.take(self.u16(what), what)

    def utf8(self, what: str) -> str:
        raw = self.binary(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise malformed(f"{what} is not valid UTF-8") from None
        if "\x00" in text:
            raise malformed(f"{what} contains U+0000")
        return text

    def rest(self) -> bytes:
        return self.take(self.left, "payload")


# --- properties ----------------------------------------------------------------


def decode_properties(reader: _Reader, kind: str) -> dict[str, Any]:
    """MQTT 5 properties for a packet of `kind` (ALLOWED_PROPERTIES' keys)."""
    length = reader.varint("property length")
    if length > reader.left:
        raise malformed("property length runs past the packet")
    end = reader.pos + length
    props: dict[str, Any] = {}
    allowed = ALLOWED_PROPERTIES[kind]
    sub = _Reader(reader.data, reader.pos, end)
    while sub.left:
        pid = sub.varint("property identifier")
        spec = PROPERTIES.get(pid)
        if spec is None:
            raise malformed(f"unknown property identifier 0x{pid:02X}")
        name, kind_ = spec
        if name not in allowed:
            raise protocol_error(f"property {name} is not allowed in this packet")
        if kind_ == "byte":
            value: Any = sub.byte(name)
        elif kind_ == "u16":
            value = sub.u16(name)
        elif kind_ == "u32":
            value = sub.u32(name)
        elif kind_ == "varint":
            value = sub.varint(name)
        elif kind_ == "utf8":
            value = sub.utf8(name)
        elif kind_ == "binary":
            value = sub.binary(name)
        else:
            value = (sub.utf8(name), sub.utf8(name))
        if name in REPEATABLE:
            props.setdefault(name, []).append(value)
        elif name in props:
            raise protocol_error(f"property {name} given twice")
        else:
            props[name] = value
    _check_property_values(props)
    reader.pos = end
    return props


def _check_property_values(props: dict[str, Any]) -> None:
    for name in (
        "payload_format_indicator",
        "request_problem_information",
        "request_response_information",
        "maximum_qos",
        "retain_available",
        "wildcard_subscription_available",
        "subscription_identifier_available",
        "shared_subscription_available",
    ):
        if name in props and props[name] not in (0, 1):
            raise protocol_error(f"property {name} must be 0 or 1, not {props[name]}")
    if props.get("receive_maximum") == 0:
        raise protocol_error("receive_maximum must not be 0")
    if props.get("maximum_packet_size") == 0:
        raise protocol_error("maximum_packet_size must not be 0")
    if props.get("topic_alias") == 0:
        raise protocol_error("topic alias 0 is not allowed")
    if 0 in props.get("subscription_identifier", ()):
        raise protocol_error("subscription identifier 0 is not allowed")


def encode_properties(props: dict[str, Any] | None) -> bytes:
    out = bytearray()
    for name, value in (props or {}).items():
        if value is None:
            continue
        pid = PROPERTY_IDS[name]
        kind = PROPERTIES[pid][1]
        values = value if name in REPEATABLE and isinstance(value, list) else [value]
        for item in values:
            out += encode_varint(pid)
            if kind == "byte":
                out.append(int(item))
            elif kind == "u16":
                out += _U16.pack(item)
            elif kind == "u32":
                out += _U32.pack(item)
            elif kind == "varint":
                out += encode_varint(item)
            elif kind == "utf8":
                out += _utf8(item)
            elif kind == "binary":
                out += _binary(item)
            else:
                out += _utf8(item[0]) + _utf8(item[1])
    return encode_varint(len(out)) + bytes(out)


# --- decoding ---------------------------------------------------------------------


class Decoder:
    """Reassembles packets from a byte stream.

    `max_packet_size` bounds a whole packet (fixed header included); a larger one
    raises MQTTProtocolError(0x95) as soon as its length is known, before its body
    is buffered.
    """

    def __init__(
        self,
        role: str = "server",
        version: int | None = None,
        max_packet_size: int = MAX_REMAINING_LENGTH + 5,
    ) -> None:
        if role not in ("server", "client"):
            raise ValueError("role is 'server' or 'client'")
        self.role = role
        self.version = version  # None until the CONNECT (server role)
        self.max_packet_size = max_packet_size
        self.connect_seen = False
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        buffer = self._buffer
        buffer += data
        packets: list[Packet] = []
        pos = 0
        size = len(buffer)
        try:
            while size - pos >= 2:
                first = buffer[pos]
                length = 0
                i = pos + 1
                for shift in (0, 7, 14, 21):
                    if i >= size:
                        length = -1
                        break
                    byte = buffer[i]
                    i += 1
                    length |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                else:
                    raise malformed("remaining length longer than four bytes")
                if length < 0:
                    break  # the length itself is not complete yet
                total = i - pos + length
                if total > self.max_packet_size:
                    raise MQTTProtocolError(
                        f"packet of {total} bytes exceeds the maximum of {self.max_packet_size}",
                        RC_PACKET_TOO_LARGE,
                    )
                if size - i < length:
                    break
                body = memoryview(buffer)[i : i + length]
                try:
                    packets.append(self._decode(first >> 4, first & 0x0F, body))
                finally:
                    body.release()
                pos = i + length
        finally:
            if pos:
                del buffer[:pos]
        return packets

    def _decode(self, ptype: int, flags: int, body: memoryview) -> Packet:
        allowed = FROM_CLIENT if self.role == "server" else FROM_SERVER
        if ptype not in allowed:
            if ptype == CONNECT or ptype in FROM_SERVER or ptype in FROM_CLIENT:
                raise protocol_error(f"packet type {ptype} may not be sent by a {_peer(self)}")
            raise malformed(f"reserved packet type {ptype}")
        if ptype != PUBLISH and flags != REQUIRED_FLAGS.get(ptype, 0):
            raise malformed(f"packet type {ptype} with invalid fixed-header flags 0x{flags:X}")
        if ptype == PUBLISH and self.version is not None and self.version != MQTT_5:
            return self._publish_311(flags, body)
        reader = _Reader(body)
        if ptype == CONNECT:
            packet: Packet = self._connect(reader)
        elif self.version is None:
            raise protocol_error("the first packet must be CONNECT")
        elif ptype == PUBLISH:
            packet = self._publish(reader, flags)
        elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            packet = self._ack(reader, ptype)
        elif ptype == SUBSCRIBE:
            packet = self._subscribe(reader)
        elif ptype == UNSUBSCRIBE:
            packet = self._unsubscribe(reader)
        elif ptype in (PINGREQ, PINGRESP):
            packet = PingReq() if ptype == PINGREQ else PingResp()
        elif ptype == DISCONNECT:
            packet = self._disconnect(reader)
        elif ptype == AUTH:
            if self.version != MQTT_5:
                raise malformed("AUTH exists in MQTT 5 only")
            packet = self._auth(reader)
        elif ptype == CONNACK:
            packet = self._connack(reader)
        elif ptype == SUBACK:
            packet = self._suback(reader)
        else:
            packet = self._unsuback(reader)
        if reader.left:
            raise malformed(f"{reader.left} unexpected bytes at the end of packet type {ptype}")
        return packet

    @property
    def _v5(self) -> bool:
        return self.version == MQTT_5

    def _packet_id(self, reader: _Reader) -> int:
        packet_id = reader.u16("packet identifier")
        if packet_id == 0:
            raise malformed("packet identifier 0")
        return packet_id

    def _connect(self, r: _Reader) -> Connect:
        if self.connect_seen:
            raise protocol_error("second CONNECT on a connection")
        self.connect_seen = True
        name = r.utf8("protocol name")
        level = r.byte("protocol level")
        if name not in ("MQTT", "MQIsdp"):
            raise malformed(f"unknown protocol name {name!r}")
        if PROTOCOL_NAMES.get(level) != name:
            raise MQTTProtocolError(
                f"unsupported protocol level {level} for {name!r}",
                RC_UNSUPPORTED_PROTOCOL_VERSION,
            )
        self.version = level
        flags = r.byte("connect flags")
        if flags & 0x01:
            raise malformed("reserved connect flag set")
        will_flag = bool(flags & 0x04)
        will_qos = (flags >> 3) & 0x03
        will_retain = bool(flags & 0x20)
        if will_qos == 3:
            raise malformed("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise malformed("will QoS or retain set without the will flag")
        has_password = bool(flags & 0x40)
        has_username = bool(flags & 0x80)
        # MQTT 3.1.1 forbids a password without a user name (3.1.2-22); it is decoded
        # all the same so that the session refuses it with CONNACK 4 (bad user name or
        # password), as RabbitMQ 3.10 does, rather than closing without a word.
        keepalive = r.u16("keep alive")
        props = decode_properties(r, "connect") if level == MQTT_5 else {}
        client_id = r.utf8("client identifier")
        will = None
        if will_flag:
            will_props = decode_properties(r, "will") if level == MQTT_5 else {}
            topic = r.utf8("will topic")
            payload = r.binary("will message")
            will = Will(topic, payload, will_qos, will_retain, will_props)
        username = r.utf8("user name") if has_username else None
        password = r.binary("password") if has_password else None
        return Connect(
            client_id,
            level,
            bool(flags & 0x02),
            keepalive,
            username,
            password,
            will,
            props,
        )

    def _connack(self, r: _Reader) -> Connack:
        ack_flags = r.byte("acknowledge flags")
        if ack_flags & 0xFE:
            raise malformed("reserved CONNACK flags set")
        code = r.byte("return code")
        props = decode_properties(r, "connack") if self._v5 and r.left else {}
        return Connack(bool(ack_flags & 1), code, props)

    def _publish(self, r: _Reader, flags: int) -> Publish:
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise malformed("PUBLISH with QoS 3")
        dup = bool(flags & 0x08)
        if dup and qos == 0 and self.version != MQTT_3_1:
            raise malformed("DUP set on a QoS 0 PUBLISH")
        topic = r.utf8("topic name")
        packet_id = self._packet_id(r) if qos else None
        props = decode_properties(r, "publish") if self._v5 else {}
        if "subscription_identifier" in props and self.role == "server":
            raise protocol_error("a client may not send a subscription identifier")
        return Publish(topic, r.rest(), qos, bool(flags & 0x01), dup, packet_id, props)

    def _publish_311(self, flags: int, body: memoryview) -> Publish:
        """A 3.1/3.1.1 PUBLISH without the cursor: the one packet that comes per message."""
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise malformed("PUBLISH with QoS 3")
        dup = bool(flags & 0x08)
        if dup and qos == 0 and self.version != MQTT_3_1:
            raise malformed("DUP set on a QoS 0 PUBLISH")
        size = len(body)
        if size < 2:
            raise malformed("packet ends inside its topic name")
        end = 2 + ((body[0] << 8) | body[1])
        if end > size:
            raise malformed("packet ends inside its topic name")
        try:
            topic = str(body[2:end], "utf-8")
        except UnicodeDecodeError:
            raise malformed("topic name is not valid UTF-8") from None
        if "\x00" in topic:
            raise malformed("topic name contains U+0000")
        packet_id = None
        if qos:
            if end + 2 > size:
                raise malformed("packet ends inside its packet identifier")
            packet_id = (body[end] << 8) | body[end + 1]
            if packet_id == 0:
                raise malformed("packet identifier 0")
            end += 2
        return Publish(topic, bytes(body[end:]), qos, bool(flags & 0x01), dup, packet_id)

    def _ack(self, r: _Reader, ptype: int) -> PubAck:
        packet_id = self._packet_id(r)
        code = 0
        props: dict[str, Any] = {}
        if self._v5 and r.left:
            code = r.byte("reason code")
            if r.left:
                props = decode_properties(r, "ack")
        return PubAck(ptype, packet_id, code, props)

    def _subscribe(self, r: _Reader) -> Subscribe:
        packet_id = self._packet_id(r)
        props = decode_properties(r, "subscribe") if self._v5 else {}
        if len(props.get("subscription_identifier", ())) > 1:
            raise protocol_error("more than one subscription identifier")
        subs = []
        while r.left:
            topic_filter = r.utf8("topic filter")
            options = r.byte("subscription options")
            qos = options & 0x03
            if qos == 3:
                raise malformed("subscription with QoS 3")
            if self._v5:
                if options & 0xC0:
                    raise malformed("reserved subscription option bits set")
                retain_handling = (options >> 4) & 0x03
                if retain_handling == 3:
                    raise malformed("retain handling 3")
                subs.append(
                    Subscription(
                        topic_filter,
                        qos,
                        bool(options & 0x04),
                        bool(options & 0x08),
                        retain_handling,
                    )
                )
            else:
                if options & 0xFC:
                    raise malformed("reserved bits set in a requested QoS")
                subs.append(Subscription(topic_filter, qos))
        if not subs:
            raise protocol_error("SUBSCRIBE without a topic filter")
        return Subscribe(packet_id, subs, props)

    def _suback(self, r: _Reader) -> Suback:
        packet_id = self._packet_id(r)
        props = decode_properties(r, "ack") if self._v5 else {}
        return Suback(packet_id, list(r.rest()), props)

    def _unsubscribe(self, r: _Reader) -> Unsubscribe:
        packet_id = self._packet_id(r)
        props = decode_properties(r, "unsubscribe") if self._v5 else {}
        filters = []
        while r.left:
            filters.append(r.utf8("topic filter"))
        if not filters:
            raise protocol_error("UNSUBSCRIBE without a topic filter")
        return Unsubscribe(packet_id, filters, props)

    def _unsuback(self, r: _Reader) -> Unsuback:
        packet_id = self._packet_id(r)
        if not self._v5:
            return Unsuback(packet_id)
        props = decode_properties(r, "ack")
        return Unsuback(packet_id, list(r.rest()), props)

    def _disconnect(self, r: _Reader) -> Disconnect:
        if not self._v5 or not r.left:
            return Disconnect()
        code = r.byte("reason code")
        props = decode_properties(r, "disconnect") if r.left else {}
        return Disconnect(code, props)

    def _auth(self, r: _Reader) -> Auth:
        if not r.left:
            return Auth()
        code = r.byte("reason code")
        props = decode_properties(r, "auth") if r.left else {}
        return Auth(code, props)


def _peer(decoder: Decoder) -> str:
    return "client" if decoder.role == "server" else "server"


# --- encoding ---------------------------------------------------------------------


def _frame(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes(((ptype << 4) | flags,)) + encode_varint(len(body)) + body


def encode(packet: Packet, version: int = MQTT_3_1_1) -> bytes:
    """The bytes of `packet` for a connection at protocol level `version`."""
    v5 = version == MQTT_5
    if isinstance(packet, Publish):
        return encode_publish(packet, version)
    if isinstance(packet, PubAck):
        flags = REQUIRED_FLAGS.get(packet.packet_type, 0)
        body = _U16.pack(packet.packet_id)
        if v5 and (packet.reason_code or packet.properties):
            body += bytes((packet.reason_code,))
            if packet.properties:
                body += encode_properties(packet.properties)
        return _frame(packet.packet_type, flags, body)
    if isinstance(packet, Connack):
        body = bytes((1 if packet.session_present else 0, packet.reason_code))
        if v5:
            body += encode_properties(packet.properties)
        return _frame(CONNACK, 0, body)
    if isinstance(packet, Suback):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties)
        return _frame(SUBACK, 0, body + bytes(packet.reason_codes))
    if isinstance(packet, Unsuback):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties) + bytes(packet.reason_codes)
        return _frame(UNSUBACK, 0, body)
    if isinstance(packet, PingReq):
        return b"\xc0\x00"
    if isinstance(packet, PingResp):
        return b"\xd0\x00"
    if isinstance(packet, Disconnect):
        if not v5 or (not packet.reason_code and not packet.properties):
            return b"\xe0\x00"
        body = bytes((packet.reason_code,))
        if packet.properties:
            body += encode_properties(packet.properties)
        return _frame(DISCONNECT, 0, body)
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, Subscribe):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties)
        for sub in packet.subscriptions:
            options = sub.qos
            if v5:
                options |= (
                    (4 if sub.no_local else 0)
                    | (8 if sub.retain_as_published else 0)
                    | (sub.retain_handling << 4)
                )
            body += _utf8(sub.topic_filter) + bytes((options,))
        return _frame(SUBSCRIBE, 0b0010, body)
    if isinstance(packet, Unsubscribe):
        body = _U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties)
        for topic_filter in packet.topic_filters:
            body += _utf8(topic_filter)
        return _frame(UNSUBSCRIBE, 0b0010, body)
    if isinstance(packet, Auth):
        body = bytes((packet.reason_code,)) + encode_properties(packet.properties)
        return _frame(AUTH, 0, body)
    raise TypeError(f"not an MQTT packet: {packet!r}")


def encode_publish(packet: Publish, version: int = MQTT_3_1_1) -> bytes:
    if packet.qos and not packet.packet_id:
        raise ValueError("a QoS 1 or 2 PUBLISH needs a packet id")
    if version != MQTT_5:
        return encode_publish_311(
            encode_topic(packet.topic),
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
        )
    flags = (8 if packet.dup else 0) | (packet.qos << 1) | (1 if packet.retain else 0)
    parts = [_utf8(packet.topic)]
    if packet.qos:
        parts.append(_U16.pack(packet.packet_id))
    parts.append(encode_properties(packet.properties))
    parts.append(bytes(packet.payload))
    return _frame(PUBLISH, flags, b"".join(parts))


def encode_topic(topic: str) -> bytes:
    """A topic name as a PUBLISH carries it (length, then UTF-8): what
    `encode_publish_311` takes, so that a sender of one topic many times encodes it once."""
    return _utf8(topic)


def encode_publish_311(
    topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None
) -> bytes:
    """An MQTT 3.1/3.1.1 PUBLISH (no properties) from its encoded topic (`encode_topic`):
    the one packet a broker sends per delivery, so built without a Publish object."""
    first = 0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    if qos:
        length = len(topic) + 2 + len(payload)
        head = bytes((first, length)) if length < 128 else bytes((first,)) + encode_varint(length)
        return b"".join((head, topic, packet_id.to_bytes(2, "big"), payload))  # type: ignore[union-attr]
    length = len(topic) + len(payload)
    head = bytes((first, length)) if length < 128 else bytes((first,)) + encode_varint(length)
    return b"".join((head, topic, payload))


def _encode_connect(packet: Connect) -> bytes:
    level = packet.protocol_level
    v5 = level == MQTT_5
    will = packet.will
    flags = 0x02 if packet.clean_start else 0
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if packet.password is not None:
        flags |= 0x40
    if packet.username is not None:
        flags |= 0x80
    body = _utf8(PROTOCOL_NAMES.get(level, "MQTT")) + bytes((level, flags))
    body += _U16.pack(packet.keepalive)
    if v5:
        body += encode_properties(packet.properties)
    body += _utf8(packet.client_id)
    if will is not None:
        if v5:
            body += encode_properties(will.properties)
        body += _utf8(will.topic) + _binary(will.payload)
    if packet.username is not None:
        body += _utf8(packet.username)
    if packet.password is not None:
        body += _binary(packet.password)
    return _frame(CONNECT, 0, body)


__all__ = [
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "Decoder",
    "MQTTProtocolError",
    "decode_properties",
    "encode",
    "encode_properties",
    "encode_publish",
    "encode_publish_311",
    "encode_topic",
    "encode_varint",
]
