"""A raw MQTT client for tests: packets out and in through leveret.mqtt's codec,
on a real socket, for what paho-mqtt will not send (bad packets, QoS 2 at a 3.1.1
broker, exact packet order)."""

from __future__ import annotations

import socket
import time

from leveret.mqtt import packets as p
from leveret.mqtt.codec import Decoder, encode


class RawMQTT:
    def __init__(self, port: int, version: int = p.MQTT_3_1_1, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.version = version
        self.decoder = Decoder("client", version)
        self.pending: list = []

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(
        self,
        client_id: str = "",
        username: str | None = "guest",
        password: bytes | None = b"guest",
        clean: bool = True,
        keepalive: int = 60,
        will: p.Will | None = None,
        properties: dict | None = None,
    ) -> p.Connack:
        self.send(
            p.Connect(
                client_id, self.version, clean, keepalive, username, password, will,
                properties or {},
            )
        )  # fmt: skip
        connack = self.recv()
        assert isinstance(connack, p.Connack), connack
        return connack

    def recv(self, timeout: float = 5.0):
        """The next packet; None if the server closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet from the server")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def closed(self, timeout: float = 5.0) -> bool:
        """Whether the server closes the connection (skipping packets it sends first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                packet = self.recv(deadline - time.monotonic())
            except TimeoutError:
                return False
            if packet is None:
                return True
        return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawMQTT:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
