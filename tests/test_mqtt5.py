"""MQTT 5 on Leveret: properties, reason codes, subscription options and session
expiry, with RabbitMQ 3.13's choices (Maximum QoS 1, topic alias maximum 16, no
shared subscriptions)."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from leveret.mqtt import packets as p
from leveret.mqtt.session import queue_names
from leveret.testing import embedded_broker
from mqttraw import RawMQTT

pytestmark = pytest.mark.leveret_only
V5 = p.MQTT_5


@pytest.fixture
def broker():
    with embedded_broker(mqtt_port=0) as b:
        yield b


def v5(broker, client_id: str, **kwargs) -> tuple[RawMQTT, p.Connack]:
    c = RawMQTT(broker.mqtt_port, V5)
    return c, c.connect(client_id, **kwargs)


def test_connack_properties_and_assigned_client_id(broker) -> None:
    c, ack = v5(broker, "", properties={"session_expiry_interval": 0xFFFFFFFF})
    with c:
        assert ack.reason_code == 0
        props = ack.properties
        assert props["maximum_qos"] == 1
        assert props["topic_alias_maximum"] == 16
        assert props["shared_subscription_available"] == 0
        assert props["session_expiry_interval"] == 86400  # capped at the maximum
        assert props["assigned_client_identifier"]


def test_refusals_carry_v5_reason_codes_and_strings(broker) -> None:
    c, ack = v5(broker, "bad-pw", password=b"nope")
    with c:
        assert ack.reason_code == p.RC_BAD_USERNAME_OR_PASSWORD
        assert "authentication failed" in ack.properties["reason_string"]
        assert c.closed()
    c, ack = v5(broker, "auth", properties={"authentication_method": "SCRAM-SHA-1"})
    with c:
        assert ack.reason_code == p.RC_BAD_AUTHENTICATION_METHOD
    with RawMQTT(broker.mqtt_port, V5) as c:
        body = b"\x00\x04MQTT\x06\x02\x00\x3c\x00\x00\x01x"  # level 6
        c.send_bytes(bytes((0x10, len(body))) + body)
        assert c.recv() == p.Connack(False, p.CONNACK_BAD_PROTOCOL)


def test_qos2_publish_is_refused_with_disconnect_0x9b(broker) -> None:
    c, _ = v5(broker, "q2")
    with c:
        c.send(p.Publish("t", b"x", 2, packet_id=1))
        reply = c.recv()
        assert isinstance(reply, p.Disconnect) and reply.reason_code == p.RC_QOS_NOT_SUPPORTED
        assert c.closed()


def test_puback_no_matching_subscribers(broker) -> None:
    c, _ = v5(broker, "nobody")
    with c:
        c.send(p.Publish("no/one/listens", b"x", 1, packet_id=4))
        assert c.recv() == p.PubAck(p.PUBACK, 4, p.RC_NO_MATCHING_SUBSCRIBERS)


def test_shared_subscriptions_refused_and_bad_filters_get_a_code(broker) -> None:
    c, _ = v5(broker, "shared")
    with c:
        c.send(
            p.Subscribe(
                1,
                [
                    p.Subscription("$share/g/t", 1),
                    p.Subscription("a/#/b", 0),
                    p.Subscription("ok", 1),
                ],
            )
        )
        assert c.recv() == p.Suback(
            1, [p.RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, p.RC_TOPIC_FILTER_INVALID, 1]
        )


def test_unsubscribe_reason_codes(broker) -> None:
    c, _ = v5(broker, "unsub")
    with c:
        c.send(p.Subscribe(1, [p.Subscription("x", 0)]))
        c.recv()
        c.send(p.Unsubscribe(2, ["x", "never"]))
        assert c.recv() == p.Unsuback(2, [0, p.RC_NO_SUBSCRIPTION_EXISTED])


def test_message_properties_round_trip_between_v5_clients(broker) -> None:
    sub, _ = v5(broker, "props-sub")
    pub, _ = v5(broker, "props-pub")
    with sub, pub:
        sub.send(p.Subscribe(1, [p.Subscription("p/+", 1)], {"subscription_identifier": [77]}))
        sub.recv()
        props = {
            "content_type": "application/json",
            "response_topic": "reply/to/me",
            "correlation_data": b"\x00\xffbin",
            "user_property": [("region", "eu"), ("tier", "1")],
            "message_expiry_interval": 300,
            "payload_format_indicator": 1,
        }
        pub.send(p.Publish("p/x", b"{}", 1, packet_id=1, properties=props))
        assert pub.recv() == p.PubAck(p.PUBACK, 1)
        m = sub.recv()
        got = m.properties
        assert got["content_type"] == "application/json"
        assert got["response_topic"] == "reply/to/me"
        assert got["correlation_data"] == b"\x00\xffbin"
        assert got["user_property"] == [("region", "eu"), ("tier", "1")]
        assert 0 < got["message_expiry_interval"] <= 300
        assert got["subscription_identifier"] == [77]
        assert got["payload_format_indicator"] == 1


def test_repeated_user_property_names_reach_v5_subscribers_in_order(broker) -> None:
    """MQTT 5 lets a name repeat and asks the server to forward every pair in the
    publisher's order [MQTT-3.3.2-17/18], while an AMQP table holds a name once and
    sorts them: an AMQP consumer gets each name once with its first value (as RabbitMQ
    3.13 dedups them) and, unless the names were unique and sorted, the list as
    published under x-mqtt-user-property."""
    pairs = [("tenant", "t-1"), ("trace", "abc"), ("tenant", "t-2"), ("a", "z")]
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "dup.#")
    sub, _ = v5(broker, "dup-sub")
    pub, _ = v5(broker, "dup-pub")
    with sub, pub:
        sub.send(p.Subscribe(1, [p.Subscription("dup/+", 1)]))
        sub.recv()
        pub.send(p.Publish("dup/x", b"1", 1, packet_id=1, properties={"user_property": pairs}))
        assert pub.recv() == p.PubAck(p.PUBACK, 1)
        assert sub.recv().properties["user_property"] == pairs
        unsorted = [("zeta", "1"), ("alpha", "2")]
        pub.send(p.Publish("dup/y", b"2", 1, packet_id=2, properties={"user_property": unsorted}))
        assert pub.recv() == p.PubAck(p.PUBACK, 2)
        assert sub.recv().properties["user_property"] == unsorted
        plain = [("region", "eu"), ("tier", "1")]  # unique and sorted: no extra header
        pub.send(p.Publish("dup/z", b"3", 1, packet_id=3, properties={"user_property": plain}))
        assert pub.recv() == p.PubAck(p.PUBACK, 3)
        assert sub.recv().properties["user_property"] == plain
    _m, props, _body = ch.basic_get(q, auto_ack=True)
    assert {k: v for k, v in props.headers.items() if not k.startswith("x-mqtt-")} == {
        "tenant": "t-1",
        "trace": "abc",
        "a": "z",
    }
    assert [tuple(pair) for pair in props.headers["x-mqtt-user-property"]] == pairs
    _m, props, _body = ch.basic_get(q, auto_ack=True)
    assert props.headers["zeta"] == "1" and props.headers["alpha"] == "2"
    assert [tuple(pair) for pair in props.headers["x-mqtt-user-property"]] == unsorted
    _m, props, _body = ch.basic_get(q, auto_ack=True)
    assert props.headers["region"] == "eu" and "x-mqtt-user-property" not in props.headers
    conn.close()


def test_user_properties_and_amqp_headers_both_ways(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "h.#")
    c, _ = v5(broker, "headers")
    with c:
        c.send(
            p.Publish(
                "h/in",
                b"x",
                1,
                packet_id=1,
                properties={"user_property": [("k", "v")], "content_type": "text/plain"},
            )
        )
        c.recv()
        _m, props, _body = ch.basic_get(q, auto_ack=True)
        assert props.headers["k"] == "v"
        assert props.content_type == "text/plain"
        c.send(p.Subscribe(2, [p.Subscription("h/out", 1)]))
        c.recv()
        ch.basic_publish(
            "amq.topic",
            "h.out",
            b"y",
            pika.BasicProperties(
                headers={"app": "billing", "n": 3}, content_type="text/csv", correlation_id="c-1",
                reply_to="replies.here",
            ),
        )  # fmt: skip
        m = c.recv()
        assert ("app", "billing") in m.properties["user_property"]
        assert ("n", "3") in m.properties["user_property"]
        assert m.properties["content_type"] == "text/csv"
        assert m.properties["correlation_data"] == b"c-1"
        assert m.properties["response_topic"] == "replies/here"
    conn.close()


def test_inbound_topic_aliases(broker) -> None:
    sub, _ = v5(broker, "alias-sub")
    pub, _ = v5(broker, "alias-pub")
    with sub, pub:
        sub.send(p.Subscribe(1, [p.Subscription("long/topic/name", 0)]))
        sub.recv()
        pub.send(p.Publish("long/topic/name", b"1", 0, properties={"topic_alias": 3}))
        pub.send(p.Publish("", b"2", 0, properties={"topic_alias": 3}))
        assert [sub.recv().payload, sub.recv().payload] == [b"1", b"2"]
        pub.send(p.Publish("", b"3", 0, properties={"topic_alias": 4}))  # never set
        reply = pub.recv()
        assert isinstance(reply, p.Disconnect) and reply.reason_code == p.RC_PROTOCOL_ERROR
    c, _ = v5(broker, "alias-big")
    with c:
        c.send(p.Publish("t", b"x", 0, properties={"topic_alias": 17}))
        reply = c.recv()
        assert reply.reason_code == p.RC_TOPIC_ALIAS_INVALID


def test_no_local_and_retain_as_published_and_retain_handling(broker) -> None:
    c, _ = v5(broker, "opts")
    with c:
        c.send(p.Publish("opt/r", b"retained", 0, retain=True))
        c.send(
            p.Subscribe(
                1,
                [
                    p.Subscription("opt/nl", 0, no_local=True),
                    p.Subscription("opt/r", 0, retain_as_published=True, retain_handling=0),
                ],
            )
        )
        assert c.recv() == p.Suback(1, [0, 0])
        first = c.recv()
        assert (first.topic, first.retain) == ("opt/r", True)
        c.send(p.Publish("opt/nl", b"mine", 0))  # not delivered back (no local)
        c.send(p.Publish("opt/r", b"live", 0, retain=True))
        live = c.recv()
        assert (live.payload, live.retain) == (b"live", True)  # retain as published
        # retain handling 1: retained messages only for a new subscription
        c.send(p.Subscribe(2, [p.Subscription("opt/r", 0, retain_handling=1)]))
        assert c.recv() == p.Suback(2, [0])
        # retain handling 2: never
        c.send(p.Subscribe(3, [p.Subscription("opt/+", 0, retain_handling=2)]))
        assert c.recv() == p.Suback(3, [0])
        c.send(p.PingReq())
        assert c.recv() == p.PingResp()
    other, _ = v5(broker, "opts-2")
    with other:  # a live message without retain_as_published has retain 0
        other.send(p.Subscribe(1, [p.Subscription("opt/r", 0, retain_handling=2)]))
        other.recv()
        other.send(p.Publish("opt/r", b"again", 0, retain=True))
        m = other.recv()
        assert (m.payload, m.retain) == (b"again", False)


def test_retain_header_only_for_retain_as_published(broker) -> None:
    """A retained PUBLISH reaches AMQP as RabbitMQ 3.10 sends it (no x-mqtt-retain)
    unless an MQTT 5 subscription in the vhost asks for retain-as-published; that
    subscriber then sees a 3.1.1 client's live retained message with RETAIN set."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "rap.#")

    def amqp_headers() -> dict:
        for _ in range(50):
            _m, props, _body = ch.basic_get(q, auto_ack=True)
            if _m is not None:
                return props.headers
            time.sleep(0.1)
        raise AssertionError("no message reached the AMQP queue")

    pub = RawMQTT(broker.mqtt_port)
    with pub:
        pub.connect("rap-pub")
        pub.send(p.Publish("rap/a", b"1", 1, retain=True, packet_id=1))
        assert isinstance(pub.recv(), p.PubAck)
        assert "x-mqtt-retain" not in amqp_headers()
        sub, _ = v5(broker, "rap-sub")
        with sub:
            sub.send(p.Subscribe(1, [p.Subscription("rap/a", 0, retain_as_published=True,
                                                    retain_handling=2)]))  # fmt: skip
            assert sub.recv() == p.Suback(1, [0])
            pub.send(p.Publish("rap/a", b"2", 1, retain=True, packet_id=2))
            assert isinstance(pub.recv(), p.PubAck)
            assert amqp_headers()["x-mqtt-retain"] is True
            live = sub.recv()
            assert (live.payload, live.retain) == (b"2", True)
        deadline = time.monotonic() + 5
        while broker.server.mqtt.retain_as_published and time.monotonic() < deadline:
            time.sleep(0.05)  # the subscriber's close reaches the broker
        pub.send(p.Publish("rap/a", b"3", 1, retain=True, packet_id=3))
        assert isinstance(pub.recv(), p.PubAck)
        assert "x-mqtt-retain" not in amqp_headers()
    conn.close()


def test_receive_maximum_limits_unacknowledged_deliveries(broker) -> None:
    c, _ = v5(broker, "recvmax", properties={"receive_maximum": 2})
    with c:
        c.send(p.Subscribe(1, [p.Subscription("rm", 1)]))
        c.recv()
        for i in range(5):
            c.send(p.Publish("rm", b"%d" % i, 1, packet_id=100 + i))
        got = [c.recv() for _ in range(5 + 2)]  # 5 PUBACKs and 2 deliveries
        deliveries = [x for x in got if isinstance(x, p.Publish)]
        assert len(deliveries) == 2
        with pytest.raises(TimeoutError):
            c.recv(0.5)
        c.send(p.PubAck(p.PUBACK, deliveries[0].packet_id))
        assert isinstance(c.recv(), p.Publish)


def test_maximum_packet_size_drops_larger_messages(broker) -> None:
    c, _ = v5(broker, "small", properties={"maximum_packet_size": 100})
    with c:
        c.send(p.Subscribe(1, [p.Subscription("big", 1)]))
        c.recv()
        c.send(p.Publish("big", b"x" * 500, 0))
        c.send(p.Publish("big", b"small", 0))
        assert c.recv().payload == b"small"


def test_session_expiry(broker) -> None:
    name = queue_names("exp")[1]

    def queue():
        return broker.call(lambda: broker.server.broker.vhosts["/"].queues.get(name))

    c, ack = v5(broker, "exp", clean=False, properties={"session_expiry_interval": 60})
    with c:
        assert not ack.session_present
        c.send(p.Subscribe(1, [p.Subscription("exp", 1)]))
        c.recv()
        assert queue().arguments == {"x-expires": 60000}
        c.send(p.Disconnect())
    c, ack = v5(broker, "exp", clean=False, properties={"session_expiry_interval": 60})
    with c:
        assert ack.session_present
        # expiry 0 at DISCONNECT ends the session with the connection
        c.send(p.Disconnect(0, {"session_expiry_interval": 0}))
        assert c.closed()
    deadline = time.monotonic() + 5
    while queue() is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert queue() is None
    c, ack = v5(broker, "exp0")  # clean start, no expiry: nothing outlives the connection
    with c:
        c.send(p.Subscribe(1, [p.Subscription("exp0", 1)]))
        c.recv()
        c.send(p.Disconnect())
        assert c.closed()
    assert (
        broker.call(lambda: queue_names("exp0")[1] in broker.server.broker.vhosts["/"].queues)
        is False
    )


def test_session_expiry_given_again_replaces_the_queues(broker) -> None:
    """A new Session Expiry Interval, at DISCONNECT or at the CONNECT that resumes the
    session, becomes the session queue's x-expires (as RabbitMQ 3.13): the session
    lives as long as the client last asked."""
    name = queue_names("sei")[1]

    def arguments():
        def look():
            queue = broker.server.broker.vhosts["/"].queues.get(name)
            return None if queue is None else dict(queue.arguments)

        return broker.call(look)

    c, _ = v5(broker, "sei", properties={"session_expiry_interval": 1})
    with c:
        c.send(p.Subscribe(1, [p.Subscription("sei", 1)]))
        c.recv()
        assert arguments() == {"x-expires": 1000}
        c.send(p.Disconnect(0, {"session_expiry_interval": 30}))
        assert c.closed()
    assert arguments() == {"x-expires": 30000}
    time.sleep(1.5)  # past the interval the CONNECT gave
    c, ack = v5(broker, "sei", clean=False, properties={"session_expiry_interval": 20})
    with c:
        assert ack.session_present
        assert arguments() == {"x-expires": 20000}
        c.send(p.Disconnect(0, {"session_expiry_interval": 0}))
        assert c.closed()
    assert wait_gone(arguments)


def test_session_expiry_given_at_disconnect_is_stored(tmp_path) -> None:
    data = str(tmp_path / "data")
    with embedded_broker(persistence=True, data_dir=data, mqtt_port=0) as b:
        c = RawMQTT(b.mqtt_port, V5)
        with c:
            c.connect("sei-kept", properties={"session_expiry_interval": 5})
            c.send(p.Subscribe(1, [p.Subscription("sei-kept", 1)]))
            c.recv()
            c.send(p.Disconnect(0, {"session_expiry_interval": 3600}))
            assert c.closed()
    with embedded_broker(persistence=True, data_dir=data, mqtt_port=0) as b:
        queue = b.call(lambda: b.server.broker.vhosts["/"].queues[queue_names("sei-kept")[1]])
        assert queue.arguments == {"x-expires": 3_600_000}


def wait_gone(look, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while look() is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    return look() is None


def test_will_delay_and_its_cancellation(broker) -> None:
    watcher, _ = v5(broker, "wd-watch")
    with watcher:
        watcher.send(p.Subscribe(1, [p.Subscription("wd/#", 0)]))
        watcher.recv()
        will = p.Will("wd/a", b"late", properties={"will_delay_interval": 1})
        props = {"session_expiry_interval": 10}
        gone, _ = v5(broker, "wd-a", will=will, properties=props)
        gone.close()
        with pytest.raises(TimeoutError):
            watcher.recv(0.3)  # held back
        assert watcher.recv(5).payload == b"late"
        will = p.Will("wd/b", b"cancelled", properties={"will_delay_interval": 2})
        back, _ = v5(broker, "wd-b", will=will, properties=props)
        back.close()
        again, _ = v5(broker, "wd-b")  # reconnects within the delay: no will
        with again:
            with pytest.raises(TimeoutError):
                watcher.recv(3)
        # DISCONNECT 0x04 asks for the will
        sender, _ = v5(broker, "wd-c", will=p.Will("wd/c", b"asked"))
        sender.send(p.Disconnect(p.RC_DISCONNECT_WITH_WILL))
        assert watcher.recv(5).payload == b"asked"
        sender.close()


def test_session_taken_over_gets_disconnect_0x8e(broker) -> None:
    first, _ = v5(broker, "twin5")
    with first:
        second, _ = v5(broker, "twin5")
        with second:
            reply = first.recv()
            assert isinstance(reply, p.Disconnect)
            assert reply.reason_code == p.RC_SESSION_TAKEN_OVER


def test_permission_refusals_in_v5(broker) -> None:
    broker.admin.add_user("nc5", "pw")
    broker.admin.set_permissions("nc5", "/", "^$", ".*", ".*")
    c, _ = v5(broker, "nc5", username="nc5", password=b"pw")
    with c:
        c.send(p.Subscribe(1, [p.Subscription("x", 1)]))
        assert c.recv() == p.Suback(1, [p.RC_NOT_AUTHORIZED])


def test_paho_v5_client(broker) -> None:
    got: list = []
    arrived = threading.Event()
    subscribed = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho5", protocol=mqtt.MQTTv5)
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_message = lambda c, u, m: (got.append(m), arrived.set())
    client.connect("127.0.0.1", broker.mqtt_port)
    client.loop_start()
    try:
        client.subscribe("paho5/#", qos=1)
        assert subscribed.wait(5)
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("who", "paho")
        props.ResponseTopic = "paho5/reply"
        info = client.publish("paho5/x", b"v5!", qos=1, properties=props)
        info.wait_for_publish(5)
        assert arrived.wait(5)
        message = got[0]
        assert message.payload == b"v5!"
        assert message.properties.UserProperty == [("who", "paho")]
        assert message.properties.ResponseTopic == "paho5/reply"
    finally:
        client.disconnect()
        client.loop_stop()


def test_v5_will_on_takeover_and_protocol_error(broker) -> None:
    watcher, _ = v5(broker, "w5")
    with watcher:
        watcher.send(p.Subscribe(1, [p.Subscription("w5/#", 0)]))
        watcher.recv()
        first, _ = v5(broker, "w5-twin", will=p.Will("w5/takeover", b"x"))
        second, _ = v5(broker, "w5-twin")
        assert watcher.recv().topic == "w5/takeover"
        bad, _ = v5(broker, "w5-bad", will=p.Will("w5/protocol", b"y"))
        bad.send_bytes(b"\xc1\x00")
        assert watcher.recv().topic == "w5/protocol"
        for c in (first, second, bad):
            c.close()


def test_broker_shutdown_tells_v5_clients() -> None:
    with embedded_broker(mqtt_port=0) as b:
        c, _ = v5(b, "bye")
        b.stop()
        reply = c.recv()
        assert isinstance(reply, p.Disconnect)
        assert reply.reason_code == p.RC_SERVER_SHUTTING_DOWN
        c.close()


def test_expired_session_and_expired_messages_are_gone(broker) -> None:
    props = {"session_expiry_interval": 1}
    c, _ = v5(broker, "short", clean=False, properties=props)
    with c:
        c.send(p.Subscribe(1, [p.Subscription("short", 1)]))
        c.recv()
    time.sleep(2.5)  # past the session expiry: the queue expired (x-expires)
    c, ack = v5(broker, "short", clean=False, properties=props)
    with c:
        assert not ack.session_present
    keep = {"session_expiry_interval": 60}
    c, _ = v5(broker, "msgexp", clean=False, properties=keep)
    with c:
        c.send(p.Subscribe(1, [p.Subscription("msgexp", 1)]))
        c.recv()
    pub, _ = v5(broker, "msgexp-pub")
    with pub:
        pub.send(
            p.Publish("msgexp", b"brief", 1, packet_id=1, properties={"message_expiry_interval": 1})
        )
        pub.send(
            p.Publish(
                "msgexp", b"lasting", 1, packet_id=2, properties={"message_expiry_interval": 60}
            )
        )
        assert [pub.recv().packet_id, pub.recv().packet_id] == [1, 2]
    time.sleep(2.5)
    c, ack = v5(broker, "msgexp", clean=False, properties=keep)
    with c:
        assert ack.session_present
        m = c.recv()
        assert m.payload == b"lasting"
        assert m.properties["message_expiry_interval"] < 60
        c.send(p.PubAck(p.PUBACK, m.packet_id))
        with pytest.raises(TimeoutError):
            c.recv(0.5)


def test_outbound_topic_aliases_up_to_the_client_maximum(broker) -> None:
    c, _ = v5(broker, "aliases-out", properties={"topic_alias_maximum": 1})
    with c:
        c.send(p.Subscribe(1, [p.Subscription("ao/+", 0)]))
        c.recv()
        for topic in ("ao/first", "ao/first", "ao/second", "ao/first"):
            c.send(p.Publish(topic, topic.encode(), 0))
        got = [c.recv() for _ in range(4)]
        assert [(m.topic, m.properties.get("topic_alias")) for m in got] == [
            ("ao/first", 1),
            ("", 1),
            ("ao/second", None),  # past the client's maximum: the full name
            ("", 1),
        ]
        assert [m.payload for m in got] == [b"ao/first", b"ao/first", b"ao/second", b"ao/first"]
    c, _ = v5(broker, "no-aliases")  # a client that takes none gets none
    with c:
        c.send(p.Subscribe(1, [p.Subscription("ao/+", 0)]))
        c.recv()
        c.send(p.Publish("ao/x", b"x", 0))
        m = c.recv()
        assert m.topic == "ao/x" and "topic_alias" not in m.properties
