"""kill -9 the broker while MQTT clients publish at QoS 1 into a persistent session.

Each round: a subscriber with a persistent session (clean session off) takes some
messages and acknowledges some of them, then goes away; publishers send QoS 1
messages, each remembered once its PUBACK arrives; the broker is SIGKILLed at a
random moment and restarted on the same data dir and ports. The subscriber comes
back: its session is present, and every message whose PUBACK a publisher saw and
the subscriber had not acknowledged arrives (duplicates allowed, as QoS 1 allows).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from durability_support import Brokers, free_port  # noqa: E402

from leveret.mqtt import packets as p  # noqa: E402
from mqttraw import RawMQTT  # noqa: E402

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.leveret_only]

TOPIC = "crash/readings"


class Publisher(threading.Thread):
    """Publishes QoS 1 messages "<name>-<n>" until stopped or the broker dies."""

    def __init__(self, port: int, name: str) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.name = name
        self.acked: set[bytes] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            client = RawMQTT(self.port)
            client.connect(f"crash-pub-{self.name}")
            sent: dict[int, bytes] = {}
            n = 0
            while not self.stop.is_set():
                n += 1
                packet_id = n % 65535 or 1
                body = f"{self.name}-{n}".encode()
                sent[packet_id] = body
                client.send(p.Publish(TOPIC, body, 1, packet_id=packet_id))
                if n % 20 == 0 or len(sent) > 50:
                    while sent:
                        ack = client.recv(10)
                        if ack is None:
                            return
                        self.acked.add(sent.pop(ack.packet_id))
        except (OSError, TimeoutError):
            return  # the broker was killed


def receive_all(client: RawMQTT, idle: float = 1.5) -> list[p.Publish]:
    """Every PUBLISH until `idle` seconds pass without one, each acknowledged."""
    got = []
    while True:
        try:
            packet = client.recv(idle)
        except TimeoutError:
            return got
        if packet is None:
            return got
        if isinstance(packet, p.Publish):
            got.append(packet)
            client.send(p.PubAck(p.PUBACK, packet.packet_id))


def test_puback_means_stored_across_sigkill(tmp_path, soak_rounds: int) -> None:
    mqtt_port = free_port()
    rng = random.Random(42)
    with Brokers(tmp_path) as brokers:
        broker = brokers.new(name="mqtt", extra=("--mqtt-port", str(mqtt_port)))
        broker.start()
        with RawMQTT(mqtt_port) as sub:
            assert not sub.connect("crash-sub", clean=False).session_present
            sub.send(p.Subscribe(1, [p.Subscription(TOPIC, 1)]))
            assert sub.recv() == p.Suback(1, [1])
        for round_no in range(soak_rounds):
            # The subscriber takes a few and acknowledges only some before it leaves.
            sub = RawMQTT(mqtt_port)
            assert sub.connect("crash-sub", clean=False).session_present
            publishers = [Publisher(mqtt_port, f"r{round_no}p{i}") for i in range(2)]
            for publisher in publishers:
                publisher.start()
            acked_by_sub: set[bytes] = set()
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                try:
                    packet = sub.recv(0.5)
                except TimeoutError:
                    break
                if isinstance(packet, p.Publish) and rng.random() < 0.5:
                    sub.send(p.PubAck(p.PUBACK, packet.packet_id))
                    acked_by_sub.add(packet.payload)
            sub.close()
            time.sleep(rng.uniform(0.2, 1.0))
            broker.kill()
            for publisher in publishers:
                publisher.stop.set()
                publisher.join(15)
            acked = set().union(*(pub.acked for pub in publishers))
            assert acked, broker.run_log()
            broker.start()
            with RawMQTT(mqtt_port) as sub:
                assert sub.connect("crash-sub", clean=False).session_present
                received = {m.payload for m in receive_all(sub)}
            missing = acked - received - acked_by_sub
            assert not missing, f"round {round_no}: {len(missing)} PUBACKed messages lost"
        broker.stop()
