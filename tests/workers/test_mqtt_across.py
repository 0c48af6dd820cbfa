"""MQTT in a broker of workers: sessions served by any worker behave as on one process.

The in-process workers (tests/workers/inprocess.py) each listen for MQTT on a port of
their own, so a test chooses the worker of each client by its port. What crosses
between them (the subscriptions' queues and bindings as made changes, the deliveries,
worker 0's retained messages) crosses as between processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest
from tests.mqttraw import RawMQTT
from tests.workers.inprocess import InProcessWorkers, in_process_workers
from tests.workers.test_metadata import topology, wait_until

from leveret.mqtt import packets as p
from leveret.mqtt.session import queue_names


@pytest.fixture
def workers() -> Iterator[InProcessWorkers]:
    with in_process_workers(2, mqtt_port=0) as w:
        yield w


def mqtt_port(w: InProcessWorkers, index: int) -> int:
    port = w.nodes[index].mqtt.port
    assert port is not None
    return port


def subscribe(client: RawMQTT, topic_filter: str, qos: int, packet_id: int = 1) -> list:
    """SUBSCRIBE; the SUBACK's codes, then the packets after it (retained messages) are
    left in the client's queue."""
    client.send(p.Subscribe(packet_id, [p.Subscription(topic_filter, qos)]))
    suback = client.recv()
    assert isinstance(suback, p.Suback), suback
    return suback.reason_codes


def publish_qos1(client: RawMQTT, topic: str, payload: bytes, packet_id: int, retain=False):
    client.send(p.Publish(topic, payload, 1, retain, False, packet_id))
    ack = client.recv()
    assert isinstance(ack, p.PubAck) and ack.packet_id == packet_id, ack


@pytest.mark.parametrize(("sub_on", "pub_on"), [(1, 0), (0, 1), (1, 1)])
def test_a_subscription_on_one_worker_gets_publishes_from_any(
    workers: InProcessWorkers, sub_on: int, pub_on: int
) -> None:
    w = workers
    with RawMQTT(mqtt_port(w, sub_on)) as sub, RawMQTT(mqtt_port(w, pub_on)) as pub:
        sub.connect(f"wk-mqtt-sub-{sub_on}{pub_on}", clean=True)
        assert subscribe(sub, "wk/across/+", 1) == [1]
        # SUBACK came once every worker routes to the binding: no wait here
        pub.connect(f"wk-mqtt-pub-{sub_on}{pub_on}", clean=True)
        publish_qos1(pub, "wk/across/a", b"one", 7)
        pub.send(p.Publish("wk/across/b", b"two", 0))
        got = [sub.recv(), sub.recv()]
        assert [(m.topic, m.payload) for m in got] == [
            ("wk/across/a", b"one"),
            ("wk/across/b", b"two"),
        ]
        assert got[0].qos == 1 and got[1].qos == 0
        sub.send(p.PubAck(p.PUBACK, got[0].packet_id))
    # every worker holds the same topology, and the clean sessions' queues went
    assert wait_until(lambda: topology(w, 0) == topology(w, 1))
    names = queue_names(f"wk-mqtt-sub-{sub_on}{pub_on}")
    assert not [q for q in topology(w, 0)["queues"] if q[0] in names]


def test_amqp_publishes_on_another_worker_reach_an_mqtt_subscriber(
    workers: InProcessWorkers,
) -> None:
    w = workers
    with RawMQTT(mqtt_port(w, 1)) as sub:
        sub.connect("wk-mqtt-amqp-sub", clean=True)
        assert subscribe(sub, "wk/amqp", 0) == [0]
        conn = pika.BlockingConnection(pika.URLParameters(w.url(0)))
        try:
            conn.channel().basic_publish("amq.topic", "wk.amqp", b"from amqp")
        finally:
            conn.close()
        message = sub.recv()
        assert (message.topic, message.payload) == ("wk/amqp", b"from amqp")


def test_the_subscription_queue_is_owned_by_the_worker_of_its_client(
    workers: InProcessWorkers,
) -> None:
    w = workers
    with RawMQTT(mqtt_port(w, 1)) as sub:
        sub.connect("wk-mqtt-owner", clean=False)
        assert subscribe(sub, "wk/owner", 1) == [1]
        qos1 = queue_names("wk-mqtt-owner")[1]
        for index in (0, 1):
            assert (qos1, 1, True) in topology(w, index)["queues"]
            assert ("amq.topic", qos1, "wk.owner") in topology(w, index)["bindings"]
    with RawMQTT(mqtt_port(w, 1)) as again:  # the session resumes where it lives
        connack = again.connect("wk-mqtt-owner", clean=False)
        assert connack.session_present
        with RawMQTT(mqtt_port(w, 0)) as pub:
            pub.connect("wk-mqtt-owner-pub", clean=True)
            publish_qos1(pub, "wk/owner", b"kept", 3)
        message = again.recv()
        assert (message.topic, message.payload, message.qos) == ("wk/owner", b"kept", 1)
        again.send(p.PubAck(p.PUBACK, message.packet_id))
        again.send(p.Unsubscribe(5, ["wk/owner"]))
        assert isinstance(again.recv(), p.Unsuback)
        # UNSUBACK came once no worker routes to the binding any more
        for index in (0, 1):
            assert ("amq.topic", qos1, "wk.owner") not in topology(w, index)["bindings"]
    with RawMQTT(mqtt_port(w, 1)) as last:  # a clean session ends the stored one
        last.connect("wk-mqtt-owner", clean=True)
    assert wait_until(lambda: topology(w, 0) == topology(w, 1))
    assert not [q for q in topology(w, 0)["queues"] if q[0] == qos1]


@pytest.mark.parametrize(("retain_on", "sub_on"), [(1, 0), (0, 1), (1, 1)])
def test_retained_messages_are_one_set_for_every_worker(
    workers: InProcessWorkers, retain_on: int, sub_on: int
) -> None:
    w = workers
    topic = f"wk/retained/{retain_on}{sub_on}"
    with RawMQTT(mqtt_port(w, retain_on)) as pub:
        pub.connect(f"wk-mqtt-ret-{retain_on}{sub_on}", clean=True)
        publish_qos1(pub, topic, b"kept", 1, retain=True)
        # the PUBACK came once worker 0 holds it
        assert w.call(lambda: w.nodes[0].mqtt.retained.count("/")) >= 1
        with RawMQTT(mqtt_port(w, sub_on)) as sub:
            sub.connect(f"wk-mqtt-ret-sub-{retain_on}{sub_on}", clean=True)
            assert subscribe(sub, "wk/retained/#", 1) == [1]
            message = sub.recv()
            assert (message.topic, message.payload, message.retain) == (topic, b"kept", True)
            sub.send(p.PubAck(p.PUBACK, message.packet_id))
        publish_qos1(pub, topic, b"", 2, retain=True)  # an empty payload clears it
        with RawMQTT(mqtt_port(w, sub_on)) as sub:
            sub.connect(f"wk-mqtt-ret-sub2-{retain_on}{sub_on}", clean=True)
            assert subscribe(sub, topic, 1) == [1]
            sub.send(p.PingReq())  # nothing retained comes before the PINGRESP
            assert isinstance(sub.recv(), p.PingResp)


def test_a_will_from_one_worker_reaches_a_subscriber_on_another(
    workers: InProcessWorkers,
) -> None:
    w = workers
    with RawMQTT(mqtt_port(w, 0)) as sub:
        sub.connect("wk-mqtt-will-sub", clean=True)
        assert subscribe(sub, "wk/will", 1) == [1]
        gone = RawMQTT(mqtt_port(w, 1))
        gone.connect("wk-mqtt-will", will=p.Will("wk/will", b"bye", 1, True))
        gone.sock.close()  # no DISCONNECT: the will goes out
        message = sub.recv()
        assert (message.topic, message.payload) == ("wk/will", b"bye")
        sub.send(p.PubAck(p.PUBACK, message.packet_id))
    # a retained will is held by worker 0
    assert wait_until(lambda: w.call(lambda: w.nodes[0].mqtt.retained.get("/", "wk/will")))
    with RawMQTT(mqtt_port(w, 1)) as late:
        late.connect("wk-mqtt-will-late", clean=True)
        assert subscribe(late, "wk/will", 0) == [0]
        message = late.recv()
        assert (message.topic, message.payload, message.retain) == ("wk/will", b"bye", True)


def test_a_session_held_by_another_worker_is_refused_not_consumed_silently(
    workers: InProcessWorkers,
) -> None:
    """A client id is served by one worker per listener kind (TCP: its own worker; TLS
    and WebSockets: worker 0). Its stored session, reached from another worker, is
    refused at CONNECT rather than consumed where no delivery reaches it."""
    w = workers
    with RawMQTT(mqtt_port(w, 1)) as first:
        first.connect("wk-mqtt-elsewhere", clean=False)
        assert subscribe(first, "wk/elsewhere", 1) == [1]
        first.send(p.Disconnect())
    with RawMQTT(mqtt_port(w, 0)) as other:
        connack = other.connect("wk-mqtt-elsewhere", clean=False)
        assert connack.reason_code == p.CONNACK_SERVER_UNAVAILABLE
        assert other.closed()
    with RawMQTT(mqtt_port(w, 0)) as clean:  # a clean start ends it wherever it is
        assert clean.connect("wk-mqtt-elsewhere", clean=True).reason_code == 0
    qos1 = queue_names("wk-mqtt-elsewhere")[1]
    assert wait_until(lambda: not [q for q in topology(w, 1)["queues"] if q[0] == qos1])


def test_mqtt5_properties_and_session_expiry_across_workers(workers: InProcessWorkers) -> None:
    """MQTT 5: a retained message's properties come back from worker 0 as published,
    with the subscription identifier of the subscriber on the other worker; a session
    with an expiry resumes on its worker with what was published meanwhile."""
    w = workers
    props = {"content_type": "text/plain", "user_property": [("k", "v")]}
    with RawMQTT(mqtt_port(w, 1), p.MQTT_5) as pub:
        pub.connect("wk-mqtt5-pub", clean=True)
        pub.send(p.Publish("wk/v5/r", b"props", 1, True, False, 1, props))
        assert isinstance(pub.recv(), p.PubAck)
    with RawMQTT(mqtt_port(w, 0), p.MQTT_5) as sub:
        sub.connect("wk-mqtt5-sub", clean=True, properties={"session_expiry_interval": 300})
        sub.send(p.Subscribe(2, [p.Subscription("wk/v5/#", 1)], {"subscription_identifier": [7]}))
        assert isinstance(sub.recv(), p.Suback)
        message = sub.recv()
        assert (message.topic, message.payload, message.retain) == ("wk/v5/r", b"props", True)
        assert message.properties["content_type"] == "text/plain"
        assert message.properties["user_property"] == [("k", "v")]
        assert message.properties["subscription_identifier"] == [7]
        sub.send(p.PubAck(p.PUBACK, message.packet_id))
        sub.send(p.Disconnect())
    with RawMQTT(mqtt_port(w, 1), p.MQTT_5) as pub:
        pub.connect("wk-mqtt5-pub2", clean=True)
        pub.send(p.Publish("wk/v5/live", b"meanwhile", 1, False, False, 1, {}))
        assert isinstance(pub.recv(), p.PubAck)
    with RawMQTT(mqtt_port(w, 0), p.MQTT_5) as back:
        connack = back.connect(
            "wk-mqtt5-sub", clean=False, properties={"session_expiry_interval": 300}
        )
        assert connack.session_present
        message = back.recv()
        assert (message.topic, message.payload) == ("wk/v5/live", b"meanwhile")
        back.send(p.PubAck(p.PUBACK, message.packet_id))
        back.send(p.Disconnect(0, {"session_expiry_interval": 0}))
    qos1 = queue_names("wk-mqtt5-sub")[1]
    assert wait_until(lambda: not [q for q in topology(w, 1)["queues"] if q[0] == qos1])
