"""MQTT 3.1.1 packets as bytes, for the cases a client library will not send.

A well-behaved client (paho) cannot send a second CONNECT, a reserved packet type or
a remaining length of five bytes, and it hides which packet a broker answered with.
These helpers build such packets and read the broker's answer as data:
`RawClient.answers()` is the list of packets that came, each `{"type": NAME, ...}`
with the fields a test compares, and whether the broker closed the socket.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from typing import Any

TYPES = {
    1: "connect",
    2: "connack",
    3: "publish",
    4: "puback",
    5: "pubrec",
    6: "pubrel",
    7: "pubcomp",
    8: "subscribe",
    9: "suback",
    10: "unsubscribe",
    11: "unsuback",
    12: "pingreq",
    13: "pingresp",
    14: "disconnect",
}


def remaining_length(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n % 128, n // 128
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def packet(first_byte: int, body: bytes) -> bytes:
    """A packet: its first byte (type and flags), the remaining length, the body."""
    return bytes([first_byte]) + remaining_length(len(body)) + body


def utf8(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def connect(
    client_id: str = "",
    *,
    clean: bool = True,
    username: str | None = None,
    password: str | None = None,
    keepalive: int = 60,
    protocol_name: str = "MQTT",
    level: int = 4,
    will: tuple[str, bytes, int, bool] | None = None,
    flags: int | None = None,
) -> bytes:
    """A CONNECT; `flags` overrides the computed connect flags (to send bad ones)."""
    computed = 0x02 if clean else 0
    payload = utf8(client_id)
    if will is not None:
        topic, message, qos, retain = will
        computed |= 0x04 | (qos << 3) | (0x20 if retain else 0)
        payload += utf8(topic) + utf8(message)
    if username is not None:
        computed |= 0x80
        payload += utf8(username)
    if password is not None:
        computed |= 0x40
        payload += utf8(password)
    header = utf8(protocol_name) + bytes([level, computed if flags is None else flags])
    return packet(0x10, header + keepalive.to_bytes(2, "big") + payload)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 1, retain: bool = False):
    first = 0x30 | (qos << 1) | (1 if retain else 0)
    body = utf8(topic) + (packet_id.to_bytes(2, "big") if qos else b"") + payload
    return packet(first, body)


def subscribe(packet_id: int, *filters: tuple[str, int], first_byte: int = 0x82) -> bytes:
    body = packet_id.to_bytes(2, "big") + b"".join(utf8(f) + bytes([q]) for f, q in filters)
    return packet(first_byte, body)


PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


def decode(first: int, body: bytes) -> dict[str, Any]:
    """One received packet as the fields a comparison needs."""
    kind = TYPES.get(first >> 4, f"type-{first >> 4}")
    out: dict[str, Any] = {"type": kind}
    if kind == "connack" and len(body) >= 2:
        out["session_present"] = bool(body[0] & 1)
        out["return_code"] = body[1]
    elif kind == "suback":
        out["granted"] = list(body[2:])
    elif kind in ("puback", "pubrec", "pubrel", "pubcomp", "unsuback"):
        out["packet_id"] = int.from_bytes(body[:2], "big")
    elif kind == "publish":
        qos = (first >> 1) & 3
        n = int.from_bytes(body[:2], "big")
        out["topic"] = body[2 : 2 + n].decode(errors="replace")
        out["qos"] = qos
        out["retain"] = bool(first & 1)
        out["dup"] = bool(first & 8)
        if qos:  # the broker's choice: a scenario that compares publishes drops it
            out["packet_id"] = int.from_bytes(body[2 + n : 4 + n], "big")
        out["payload"] = body[2 + n + (2 if qos else 0) :].decode(errors="replace")
    return out


class RawClient:
    """A TCP connection that sends bytes and reads what the broker answers."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buffer = b""
        self.closed = False

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def _read_packet(self, deadline: float) -> dict[str, Any] | None:
        while True:
            parsed = self._parse()
            if parsed is not None:
                return parsed
            if self.closed:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                data = self._recv(left)
            except TimeoutError:
                return None
            if not data:
                self.closed = True
            self.buffer += data

    def _recv(self, timeout: float) -> bytes:
        """MQTT bytes from the connection; b"" when it closed."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise
        except OSError:
            return b""

    def _parse(self) -> dict[str, Any] | None:
        buf = self.buffer
        if len(buf) < 2:
            return None
        length, multiplier, i = 0, 1, 1
        while True:
            if i >= len(buf):
                return None
            length += (buf[i] & 0x7F) * multiplier
            multiplier *= 128
            i += 1
            if not buf[i - 1] & 0x80:
                break
        if len(buf) < i + length:
            return None
        self.buffer = buf[i + length :]
        return decode(buf[0], buf[i : i + length])

    def expect(self, count: int = 1, wait: float = 3.0) -> list[dict[str, Any]]:
        """Up to `count` packets, waiting at most `wait` seconds for them."""
        deadline = time.monotonic() + wait
        out = []
        while len(out) < count:
            item = self._read_packet(deadline)
            if item is None:
                break
            out.append(item)
        return out

    def answers(self, wait: float = 2.0) -> dict[str, Any]:
        """Every packet that comes until the broker closes the socket or `wait` seconds
        pass, and whether it closed: what a malformed-input case records."""
        deadline = time.monotonic() + wait
        packets = []
        while True:
            item = self._read_packet(deadline)
            if item is None:
                break
            packets.append(item)
        return {"packets": packets, "closed": self.closed}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawWebSocketClient(RawClient):
    """The same over MQTT-over-WebSocket: an HTTP upgrade to the `mqtt` subprotocol,
    then each send in one masked binary frame. `upgrade` is the HTTP answer (status,
    subprotocol); `close_frame` the broker's WebSocket close (code, reason), if any."""

    def __init__(self, host: str, port: int, path: str) -> None:
        super().__init__(host, port)
        self.frames = b""
        self.close_frame: dict[str, Any] | None = None
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            head += chunk
        head, _, self.frames = head.partition(b"\r\n\r\n")
        lines = head.decode(errors="replace").split("\r\n")
        headers = dict(
            (k.strip().lower(), v.strip())
            for k, _, v in (line.partition(":") for line in lines[1:])
        )
        self.upgrade = {
            "status": int(lines[0].split()[1]) if len(lines[0].split()) > 1 else None,
            "protocol": headers.get("sec-websocket-protocol"),
        }

    def send(self, data: bytes) -> None:
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            header = bytes([0x82, 0x80 | n])
        elif n < 65536:
            header = bytes([0x82, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            header = bytes([0x82, 0x80 | 127]) + n.to_bytes(8, "big")
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        super().send(header + mask + masked)

    def _recv(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            payload = self._frame()
            if payload is not None:
                if payload:
                    return payload
                continue
            if self.close_frame is not None:
                return b""
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            data = super()._recv(left)
            if not data:
                return b""
            self.frames += data

    def _frame(self) -> bytes | None:
        """The payload of the next whole binary frame (b"" for a frame that carries no
        MQTT bytes), or None when no whole frame is buffered."""
        buf = self.frames
        if len(buf) < 2:
            return None
        opcode, n, i = buf[0] & 0x0F, buf[1] & 0x7F, 2
        if n == 126:
            n, i = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            n, i = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < i + n:
            return None
        payload, self.frames = buf[i : i + n], buf[i + n :]
        if opcode == 0x8:
            self.close_frame = {
                "code": int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None,
                "reason": payload[2:].decode(errors="replace"),
            }
            return b""
        return payload if opcode in (0x0, 0x2) else b""
