"""MQTT publish rates into a queue bound to amq.topic.

    python bench/mqtt_publish.py [--messages 20000] [--size 100] [--window 200]

Starts `leveret server` from this tree on a fresh data dir with an MQTT port, binds a
durable queue to amq.topic over AMQP (pika), then publishes from one MQTT 3.1.1
connection: QoS 0 messages written back to back (the rate counts until a PINGRESP
after the last), then QoS 1 messages (persistent, fsync batch) with at most
`--window` unacknowledged. Prints one JSON line with both rates.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

from leveret.mqtt import packets as p  # noqa: E402
from leveret.mqtt.codec import Decoder, encode  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.decoder = Decoder("client", p.MQTT_3_1_1)
        self.pending: list = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self):
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=200)
    args = parser.parse_args()
    amqp, mqtt = _free_port(), _free_port()
    data_dir = tempfile.mkdtemp(prefix="leveret-bench-mqtt-")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "leveret", "server", "--workers", "1", "--port", str(amqp), "--mqtt-port",
         str(mqtt), "--web-mqtt-port", "0", "--management-port", "0", "--prometheus-port",
         "0", "--data-dir", data_dir],
        env=env, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", mqtt), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{amqp}"))
        channel = conn.channel()
        channel.queue_declare("bench-mqtt", durable=True)
        channel.queue_bind("bench-mqtt", "amq.topic", "bench.#")
        client = Client(mqtt)
        client.send(encode(p.Connect("bench", username="guest", password=b"guest"), 4))
        assert client.recv().reason_code == 0
        payload = b"x" * args.size
        n = args.messages
        one = encode(p.Publish("bench/t", payload, 0), 4)
        started = time.perf_counter()
        for _ in range(0, n, 100):
            client.send(one * 100)
        client.send(encode(p.PingReq(), 4))
        while not isinstance(client.recv(), p.PingResp):
            pass
        qos0 = n / (time.perf_counter() - started)
        started = time.perf_counter()
        sent = acked = 0
        while acked < n:
            while sent < n and sent - acked < args.window:
                sent += 1
                packet = p.Publish("bench/t", payload, 1, packet_id=sent % 65535 or 1)
                client.send(encode(packet, 4))
            client.recv()
            acked += 1
        qos1 = n / (time.perf_counter() - started)
        queued = channel.queue_declare("bench-mqtt", passive=True).method.message_count
        conn.close()
        print(
            json.dumps(
                {
                    "messages": n,
                    "size": args.size,
                    "qos0_per_s": round(qos0),
                    "qos1_per_s": round(qos1),
                    "window": args.window,
                    "queued": queued,
                }
            )
        )
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
