"""MQTT 3.1.1 on Leveret (leveret.mqtt): RabbitMQ 3.10's mapping, on real sockets.

Raw packets (tests/mqttraw.py, through the broker's own codec) where the exact
packets matter; paho-mqtt where a real client's view matters; pika for the AMQP
side of the interop tests.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest

from leveret.mqtt import packets as p
from leveret.mqtt.session import queue_names
from leveret.testing import embedded_broker
from mqttraw import RawMQTT
from serverproc import server_argv

pytestmark = pytest.mark.leveret_only


@pytest.fixture
def broker():
    with embedded_broker(mqtt_port=0, web_mqtt_port=0) as b:
        yield b


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def queue_info(b, name: str):
    def look():
        q = b.server.broker.vhosts["/"].queues.get(name)
        if q is None:
            return None
        return {"durable": q.durable, "auto_delete": q.auto_delete, "arguments": dict(q.arguments)}

    return b.call(look)


def drain(client: RawMQTT, n: int, timeout: float = 5.0) -> list:
    out = []
    for _ in range(n):
        out.append(client.recv(timeout))
    return out


# --- the listener ------------------------------------------------------------------------


def test_mqtt_is_off_unless_asked() -> None:
    with embedded_broker() as b:
        assert b.server.mqtt is None


def test_port_taken_is_refused_with_the_clear_message(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*server_argv(), "--port", "0", "--mqtt-port", str(port),
             "--data-dir", str(tmp_path / "d")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr
    assert "pick free ports with" in proc.stderr and "--mqtt-port" in proc.stderr


def test_config_file_keys(tmp_path) -> None:
    from leveret.config_file import load

    path = tmp_path / "leveret.toml"
    path.write_text('mqtt_port = 1999\nweb-mqtt-port = 0\nmqtt_exchange = "mqtt.ex"\n')
    assert load(str(path)) == {"mqtt_port": 1999, "web_mqtt_port": 0, "mqtt_exchange": "mqtt.ex"}
    path.write_text('mqtt_port = "x"\n')
    from leveret.config_file import ConfigFileError

    with pytest.raises(ConfigFileError, match="mqtt_port"):
        load(str(path))


def test_cli_server_takes_the_flags(tmp_path) -> None:
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    amqp, mqtt_port, ws_port = ports
    proc = subprocess.Popen(
        [*server_argv(), "--port", str(amqp), "--mqtt-port", str(mqtt_port),
         "--web-mqtt-port", str(ws_port), "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: _connects(mqtt_port), 30)
        with RawMQTT(mqtt_port) as c:
            assert c.connect("cli-1").reason_code == 0
        assert _connects(ws_port)
    finally:
        proc.terminate()
        proc.wait(30)


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# --- CONNECT ---------------------------------------------------------------------------


def test_login_outcomes(broker) -> None:
    broker.admin.add_user("mq", "secret")
    broker.admin.add_vhost("mqv")
    broker.admin.set_permissions("mq", "mqv", ".*", ".*", ".*")
    port = broker.mqtt_port
    cases = [
        ("guest", b"wrong", p.CONNACK_BAD_CREDENTIALS),
        ("nobody", b"x", p.CONNACK_BAD_CREDENTIALS),
        ("novhost:guest", b"guest", p.CONNACK_BAD_CREDENTIALS),
        ("mq", b"secret", p.CONNACK_NOT_AUTHORIZED),  # no permissions in "/"
        ("mqv:mq", b"secret", p.CONNACK_ACCEPTED),
        ("guest", None, p.CONNACK_BAD_CREDENTIALS),
        (None, b"guest", p.CONNACK_BAD_CREDENTIALS),  # a password without a user name
    ]
    for username, password, code in cases:
        with RawMQTT(port) as c:
            connack = c.connect("c-login", username, password)
            assert connack.reason_code == code, username
            if code:
                assert not connack.session_present
                assert c.closed()
    with RawMQTT(port) as c:  # anonymous: the default user (guest) logs in
        assert c.connect("anon", None, None).reason_code == 0


def test_empty_client_id_needs_a_clean_session(broker) -> None:
    with RawMQTT(broker.mqtt_port) as c:
        assert c.connect("", clean=False).reason_code == p.CONNACK_ID_REJECTED
        assert c.closed()
    with RawMQTT(broker.mqtt_port) as c:
        assert c.connect("", clean=True).reason_code == 0


def test_unsupported_protocol_level(broker) -> None:
    with RawMQTT(broker.mqtt_port) as c:
        body = b"\x00\x04MQTT\x07\x02\x00\x3c\x00\x01x"
        c.send_bytes(bytes((0x10, len(body))) + body)
        assert c.recv() == p.Connack(False, p.CONNACK_BAD_PROTOCOL)
        assert c.closed()


def test_mqtt_3_1_is_accepted(broker) -> None:
    with RawMQTT(broker.mqtt_port, version=p.MQTT_3_1) as c:
        assert c.connect("old-client").reason_code == 0


def test_packet_before_connect_closes(broker) -> None:
    with RawMQTT(broker.mqtt_port) as c:
        c.send(p.PingReq())
        assert c.closed()


# --- publish and subscribe -----------------------------------------------------------------


def test_publish_subscribe_qos0_and_qos1_with_wildcards(broker) -> None:
    with RawMQTT(broker.mqtt_port) as sub, RawMQTT(broker.mqtt_port) as pub:
        sub.connect("sub")
        sub.send(p.Subscribe(1, [p.Subscription("a/+/c", 1), p.Subscription("z/#", 0)]))
        assert sub.recv() == p.Suback(1, [1, 0])
        pub.connect("pub")
        pub.send(p.Publish("a/b/c", b"one", 1, packet_id=7))
        assert pub.recv() == p.PubAck(p.PUBACK, 7)
        pub.send(p.Publish("z/y/x", b"two", 0))
        pub.send(p.Publish("a/b/d", b"nobody", 0))
        first = sub.recv()
        assert (first.topic, first.payload, first.qos, first.retain) == ("a/b/c", b"one", 1, False)
        sub.send(p.PubAck(p.PUBACK, first.packet_id))
        second = sub.recv()
        assert (second.topic, second.payload, second.qos) == ("z/y/x", b"two", 0)


def test_leading_wildcards_do_not_match_dollar_topics(broker) -> None:
    """MQTT 4.7.2: `#` and `+/...` never match a topic that starts with `$`; `$SYS/#`
    does. The exchange's bindings match it all the same (RabbitMQ 3.10 delivers it):
    the subscriber's connection drops what only a leading wildcard matched, from MQTT
    and AMQP publishers alike, and the queues are left empty."""
    with RawMQTT(broker.mqtt_port) as sub, RawMQTT(broker.mqtt_port) as pub:
        sub.connect("dollar-sub")
        subscriptions = [p.Subscription("#", 1), p.Subscription("+/B", 0)]
        sub.send(p.Subscribe(1, [*subscriptions, p.Subscription("$SYS/#", 0)]))
        assert sub.recv() == p.Suback(1, [1, 0, 0])
        pub.connect("dollar-pub")
        pub.send(p.Publish("$TopicA/B", b"", 1, packet_id=1))  # `#` and `+/B` only
        assert pub.recv() == p.PubAck(p.PUBACK, 1)
        pub.send(p.Publish("$SYS/up", b"sys", 0))  # `$SYS/#` (and `#`: not that one)
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().basic_publish("amq.topic", "$TopicA.B", b"from amqp")
        conn.close()
        # Last, on both queues: each queue is in order, so what came before is settled.
        pub.send(p.Publish("end/B", b"end", 0))
        got = drain(sub, 3)
        assert sorted((m.topic, m.payload) for m in got) == [
            ("$SYS/up", b"sys"),
            ("end/B", b"end"),
            ("end/B", b"end"),
        ]
        with pytest.raises(TimeoutError):
            sub.recv(0.3)

        def left() -> list[tuple[int, int]]:
            vhost = broker.server.broker.vhosts["/"]
            queues = [vhost.queues[name] for name in queue_names("dollar-sub")]
            return [(q.message_count, q.unacked) for q in queues]

        assert broker.call(left) == [(0, 0), (0, 0)]


def test_qos2_subscription_is_granted_qos1_and_a_qos2_publish_gets_puback(broker) -> None:
    """RabbitMQ 3.10: QoS 2 subscriptions are downgraded, a QoS 2 PUBLISH is taken as
    QoS 1 and answered with PUBACK (checked on the reference)."""
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("q2")
        c.send(p.Subscribe(1, [p.Subscription("q2/t", 2)]))
        assert c.recv() == p.Suback(1, [1])
        c.send(p.Publish("q2/t", b"x", 2, packet_id=5))
        got = drain(c, 2)
        assert p.PubAck(p.PUBACK, 5) in got
        delivered = next(x for x in got if isinstance(x, p.Publish))
        assert delivered.qos == 1


def test_delivery_qos_is_the_lower_of_publish_and_subscription(broker) -> None:
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("lower")
        c.send(p.Subscribe(1, [p.Subscription("l/1", 1), p.Subscription("l/0", 0)]))
        c.recv()
        c.send(p.Publish("l/1", b"a", 0))
        assert c.recv().qos == 0
        c.send(p.Publish("l/0", b"b", 1, packet_id=3))
        got = drain(c, 2)
        delivered = next(x for x in got if isinstance(x, p.Publish))
        assert delivered.qos == 0


def test_subscription_queues_have_rabbitmq_names_and_flags(broker) -> None:
    q0, q1 = queue_names("names-1")
    assert (q0, q1) == ("mqtt-subscription-names-1qos0", "mqtt-subscription-names-1qos1")
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("names-1", clean=False)
        c.send(p.Subscribe(1, [p.Subscription("n/0", 0), p.Subscription("n/1", 1)]))
        c.recv()
        assert queue_info(broker, q0) == {"durable": False, "auto_delete": True, "arguments": {}}
        assert queue_info(broker, q1) == {
            "durable": True,
            "auto_delete": False,
            "arguments": {"x-expires": 86400000},
        }
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("names-2", clean=True)
        c.send(p.Subscribe(1, [p.Subscription("n/1", 1)]))
        c.recv()
        info = queue_info(broker, queue_names("names-2")[1])
        assert info == {"durable": True, "auto_delete": True, "arguments": {}}


def test_persistent_session_keeps_qos1_messages_and_subscriptions(broker) -> None:
    port = broker.mqtt_port
    with RawMQTT(port) as c:
        assert not c.connect("keep", clean=False).session_present
        c.send(p.Subscribe(1, [p.Subscription("keep/+", 1)]))
        c.recv()
        c.send(p.Disconnect())
    with RawMQTT(port) as pub:
        pub.connect("keep-pub")
        for i in range(3):
            pub.send(p.Publish("keep/x", b"m%d" % i, 1, packet_id=i + 1))
        assert [pub.recv().packet_id for _ in range(3)] == [1, 2, 3]
    with RawMQTT(port) as c:
        assert c.connect("keep", clean=False).session_present
        got = drain(c, 3)
        assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]
        # The resumed subscription can be removed (its binding is known again).
        c.send(p.Unsubscribe(9, ["keep/+"]))
        assert c.recv() == p.Unsuback(9)
        for m in got:
            c.send(p.PubAck(p.PUBACK, m.packet_id))
    with RawMQTT(port) as c:
        assert c.connect("keep", clean=True).session_present is False
    assert wait_for(lambda: queue_info(broker, queue_names("keep")[1]) is None)


def test_unacked_qos1_deliveries_come_back_with_dup(broker) -> None:
    port = broker.mqtt_port
    with RawMQTT(port) as c:
        c.connect("redo", clean=False)
        c.send(p.Subscribe(1, [p.Subscription("redo", 1)]))
        c.recv()
        c.send(p.Publish("redo", b"again", 1, packet_id=1))
        got = drain(c, 2)
        assert any(isinstance(x, p.Publish) and not x.dup for x in got)
    # closed without PUBACK
    with RawMQTT(port) as c:
        assert c.connect("redo", clean=False).session_present
        again = c.recv()
        assert (again.payload, again.dup, again.qos) == (b"again", True, 1)


def test_retained_messages_exact_and_wildcard_and_cleared(broker) -> None:
    port = broker.mqtt_port
    with RawMQTT(port) as pub:
        pub.connect("ret-pub")
        pub.send(p.Publish("ret/a", b"A", 1, retain=True, packet_id=1))
        pub.send(p.Publish("ret/b", b"B", 0, retain=True))
        pub.send(p.Publish("ret/gone", b"G", 0, retain=True))
        pub.send(p.Publish("ret/gone", b"", 0, retain=True))  # clears it
        assert pub.recv() == p.PubAck(p.PUBACK, 1)
        pub.send(p.PingReq())
        assert pub.recv() == p.PingResp()
    with RawMQTT(port) as c:
        c.connect("ret-sub")
        c.send(p.Subscribe(1, [p.Subscription("ret/a", 1)]))
        assert c.recv() == p.Suback(1, [1])
        m = c.recv()
        assert (m.topic, m.payload, m.retain, m.qos) == ("ret/a", b"A", True, 1)
        c.send(p.PubAck(p.PUBACK, m.packet_id))
        c.send(p.Subscribe(2, [p.Subscription("ret/#", 0)]))
        assert c.recv() == p.Suback(2, [0])
        got = sorted((x.topic, x.payload, x.retain) for x in drain(c, 2))
        assert got == [("ret/a", b"A", True), ("ret/b", b"B", True)]
        c.send(p.PingReq())
        assert c.recv() == p.PingResp()  # nothing for the cleared topic


def test_retained_messages_survive_a_restart(tmp_path) -> None:
    data = str(tmp_path / "data")
    with embedded_broker(persistence=True, data_dir=data, mqtt_port=0) as b:
        with RawMQTT(b.mqtt_port) as c:
            c.connect("ret-1")
            c.send(p.Publish("kept/t", b"durable", 1, retain=True, packet_id=1))
            assert c.recv() == p.PubAck(p.PUBACK, 1)
    with embedded_broker(persistence=True, data_dir=data, mqtt_port=0) as b:
        with RawMQTT(b.mqtt_port) as c:
            c.connect("ret-2")
            c.send(p.Subscribe(1, [p.Subscription("kept/+", 1)]))
            c.recv()
            m = c.recv()
            assert (m.topic, m.payload, m.retain) == ("kept/t", b"durable", True)


def test_last_will_on_abrupt_close_not_on_disconnect(broker) -> None:
    port = broker.mqtt_port
    with RawMQTT(port) as watcher:
        watcher.connect("watcher")
        watcher.send(p.Subscribe(1, [p.Subscription("will/#", 1)]))
        watcher.recv()
        polite = RawMQTT(port)
        polite.connect("polite", will=p.Will("will/polite", b"bye", 1))
        polite.send(p.Disconnect())
        polite.close()
        rude = RawMQTT(port)
        rude.connect("rude", will=p.Will("will/rude", b"gone", 1, retain=True))
        rude.close()  # no DISCONNECT
        m = watcher.recv()
        assert (m.topic, m.payload) == ("will/rude", b"gone")
        watcher.send(p.PubAck(p.PUBACK, m.packet_id))
        watcher.send(p.PingReq())
        assert watcher.recv() == p.PingResp()
    # a retained will is retained
    with RawMQTT(port) as c:
        c.connect("late")
        c.send(p.Subscribe(1, [p.Subscription("will/rude", 0)]))
        c.recv()
        assert c.recv().payload == b"gone"


def test_keepalive_closes_a_silent_client_and_sends_its_will(broker) -> None:
    port = broker.mqtt_port
    with RawMQTT(port) as watcher:
        watcher.connect("ka-watcher")
        watcher.send(p.Subscribe(1, [p.Subscription("ka/will", 0)]))
        watcher.recv()
        silent = RawMQTT(port)
        silent.connect("ka-silent", keepalive=1, will=p.Will("ka/will", b"timeout"))
        assert silent.closed(timeout=10)  # 1.5 keepalives after the last packet
        assert watcher.recv(10).payload == b"timeout"
        silent.close()


def test_pings_keep_a_connection_alive(broker) -> None:
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("pinger", keepalive=1)
        for _ in range(4):
            time.sleep(0.5)
            c.send(p.PingReq())
            assert c.recv() == p.PingResp()


def test_second_connection_with_the_same_client_id_ends_the_first(broker) -> None:
    port = broker.mqtt_port
    first = RawMQTT(port)
    first.connect("twin")
    with RawMQTT(port) as second:
        assert second.connect("twin").reason_code == 0
        assert first.closed()
        second.send(p.PingReq())
        assert second.recv() == p.PingResp()
    first.close()


def test_malformed_packet_closes_only_that_connection(broker) -> None:
    port = broker.mqtt_port
    with RawMQTT(port) as good, RawMQTT(port) as bad:
        good.connect("good")
        bad.connect("bad")
        bad.send_bytes(b"\x30\xff\xff\xff\xff\x01")  # remaining length of five bytes
        assert bad.closed()
        good.send(p.PingReq())
        assert good.recv() == p.PingResp()
    for junk in (b"\x82\x02\x00\x01", b"\xc1\x00", b"\x36\x05\x00\x01t\x00\x01", b"\x00\x00"):
        with RawMQTT(port) as c:
            c.connect("junk")
            c.send_bytes(junk)
            assert c.closed(), junk
    with RawMQTT(port) as c:  # a wildcard in a PUBLISH topic
        c.connect("junk2")
        c.send(p.Publish("a/+", b"x", 0))
        assert c.closed()


def test_permissions_as_rabbitmq_checks_them(broker) -> None:
    admin = broker.admin
    admin.add_user("ro", "pw")
    admin.set_permissions("ro", "/", ".*", "^mqtt-subscription-.*", ".*")  # no write on amq.topic
    admin.add_user("noconf", "pw")
    admin.set_permissions("noconf", "/", "^$", ".*", ".*")
    admin.add_user("topics", "pw")
    admin.set_permissions("topics", "/", ".*", ".*", ".*")
    admin.set_topic_permissions("topics", "/", "amq.topic", "^allowed\\.", "^allowed\\.")
    port = broker.mqtt_port
    with RawMQTT(port) as c:  # subscribing works (configure, write on its queue, read)
        c.connect("ro-1", "ro", b"pw")
        c.send(p.Subscribe(1, [p.Subscription("x", 1)]))
        assert c.recv() == p.Suback(1, [1])
        c.send(p.Publish("x", b"no", 0))  # write on amq.topic refused
        assert c.closed()
    with RawMQTT(port) as c:
        c.connect("nc-1", "noconf", b"pw")
        c.send(p.Publish("x", b"yes", 1, packet_id=1))
        assert c.recv() == p.PubAck(p.PUBACK, 1)
        c.send(p.Subscribe(2, [p.Subscription("x", 1)]))  # configure on the queue refused
        assert c.closed()
    with RawMQTT(port) as c:
        c.connect("tp-1", "topics", b"pw")
        c.send(p.Subscribe(1, [p.Subscription("allowed/#", 0)]))
        assert c.recv() == p.Suback(1, [0])
        c.send(p.Publish("allowed/x", b"ok", 0))
        assert c.recv().payload == b"ok"
        c.send(p.Publish("other/x", b"no", 0))
        assert c.closed()


# --- interop with AMQP ---------------------------------------------------------------------


def test_amqp_consumer_receives_mqtt_publishes_with_rabbitmq_headers(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "sensors.*.temp")
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("to-amqp")
        c.send(p.Publish("sensors/k1/temp", b"21.5", 1, packet_id=1))
        assert c.recv() == p.PubAck(p.PUBACK, 1)
        c.send(p.Publish("sensors/k2/temp", b"19", 0))
        c.send(p.PingReq())
        c.recv()
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == ("amq.topic", "sensors.k1.temp", b"21.5")
    assert props.headers == {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}
    assert props.delivery_mode == 2
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert props.headers == {"x-mqtt-publish-qos": 0, "x-mqtt-dup": False}
    assert props.delivery_mode == 1
    conn.close()


def test_mqtt_subscriber_receives_amqp_publishes(broker) -> None:
    got: list = []
    ready = threading.Event()
    arrived = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="from-amqp")
    client.on_subscribe = lambda *a: ready.set()
    client.on_message = lambda c, u, m: (got.append((m.topic, m.payload, m.qos)), arrived.set())
    client.connect("127.0.0.1", broker.mqtt_port)
    client.loop_start()
    try:
        client.subscribe("orders/#", qos=1)
        assert ready.wait(5)
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().basic_publish("amq.topic", "orders.eu.new", b"from amqp")
        conn.close()
        assert arrived.wait(5)
        # Non-MQTT publishes are taken as QoS 1 (RabbitMQ's delivery_qos).
        assert got == [("orders/eu/new", b"from amqp", 1)]
    finally:
        client.disconnect()
        client.loop_stop()


def test_exchange_is_configurable(tmp_path) -> None:
    with embedded_broker(mqtt_port=0, mqtt_exchange="mqtt.x") as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("mqtt.x", "topic")
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "mqtt.x", "#")
        with RawMQTT(b.mqtt_port) as c:
            c.connect("ex")
            c.send(p.Publish("a/b", b"routed", 1, packet_id=1))
            c.recv()
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert (method.exchange, body) == ("mqtt.x", b"routed")
        conn.close()


# --- Web MQTT --------------------------------------------------------------------------------


def test_paho_over_websockets(broker) -> None:
    got: list = []
    arrived = threading.Event()
    subscribed = threading.Event()
    ws = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ws-sub", transport="websockets")
    ws.ws_set_options(path="/ws")
    ws.on_subscribe = lambda *a: subscribed.set()
    ws.on_message = lambda c, u, m: (got.append((m.topic, m.payload)), arrived.set())
    ws.connect("127.0.0.1", broker.web_mqtt_port)
    ws.loop_start()
    try:
        ws.subscribe("web/+", 1)
        assert subscribed.wait(5)
        with RawMQTT(broker.mqtt_port) as tcp:
            tcp.connect("tcp-pub")
            tcp.send(p.Publish("web/in", b"over tcp", 1, packet_id=1))
            tcp.recv()
        assert arrived.wait(5)
        assert got == [("web/in", b"over tcp")]
        info = ws.publish("web/out", b"from ws", qos=1)
        info.wait_for_publish(5)
        assert info.is_published()
    finally:
        ws.disconnect()
        ws.loop_stop()


def test_websocket_offers_the_mqtt_subprotocol(broker) -> None:
    import asyncio

    import aiohttp

    async def probe():
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{broker.web_mqtt_port}/ws"
            async with session.ws_connect(url, protocols=("mqtt",)) as ws:
                return ws.protocol

    assert asyncio.run(probe()) == "mqtt"


def test_websocket_close_frames_name_the_refusal(broker) -> None:
    """As RabbitMQ's Web MQTT: a refused CONNECT and a first packet that is not CONNECT
    end with close code 1002 and the refusal's name (the CONNACK goes out first)."""
    import asyncio

    import aiohttp

    from leveret.mqtt.codec import Decoder, encode

    async def answers(data: bytes) -> tuple[list, int | None, str]:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{broker.web_mqtt_port}/ws"
            async with session.ws_connect(url, protocols=("mqtt",)) as ws:
                await ws.send_bytes(data)
                packets = []
                while True:
                    msg = await ws.receive(timeout=5)
                    if msg.type != aiohttp.WSMsgType.BINARY:
                        break
                    packets += Decoder("client", 4).feed(msg.data)
                assert msg.type == aiohttp.WSMsgType.CLOSE, msg
                return packets, msg.data, msg.extra

    bad = encode(p.Connect("ws-bad", username="guest", password=b"wrong"), 4)
    packets, code, reason = asyncio.run(answers(bad))
    assert packets == [p.Connack(False, p.CONNACK_BAD_CREDENTIALS)]
    assert (code, reason) == (1002, "unauthenticated")
    packets, code, reason = asyncio.run(answers(encode(p.PingReq(), 4)))
    assert (packets, code, reason) == ([], 1002, "connect_expected")


def test_tls_listener(tmp_path) -> None:
    import ssl

    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    with embedded_broker(mqtt_tls_port=0, tls_cert=str(cert_path), tls_key=str(key_path)) as b:
        port = b.server.mqtt.addresses["mqtts"][1]
        context = ssl.create_default_context()
        ca.configure_trust(context)
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
        from leveret.mqtt.codec import Decoder, encode

        tls.sendall(encode(p.Connect("tls-1", username="guest", password=b"guest"), 4))
        assert Decoder("client", 4).feed(tls.recv(100)) == [p.Connack(False, 0)]
        tls.close()


def test_resource_alarm_blocks_mqtt_publishers_until_it_clears(broker) -> None:
    def set_limit(value: int) -> None:
        def apply() -> None:
            broker.server.alarms.memory_limit = value
            broker.server.alarms.check()

        broker.call(apply)

    with RawMQTT(broker.mqtt_port) as c:
        c.connect("alarmed")
        set_limit(1)  # any RSS is over the limit
        c.send(p.Publish("alarm/t", b"first", 1, packet_id=1))
        assert c.recv() == p.PubAck(p.PUBACK, 1)  # the publish that saw the alarm goes in
        c.send(p.Publish("alarm/t", b"held", 1, packet_id=2))
        with pytest.raises(TimeoutError):
            c.recv(1.0)  # not read while the alarm is on
        set_limit(0)
        assert c.recv(10) == p.PubAck(p.PUBACK, 2)  # nothing lost


def test_mqtt_connections_in_the_management_api_and_ctl(tmp_path) -> None:
    import base64
    import json
    import urllib.request

    data = tmp_path / "d"
    with embedded_broker(persistence=True, data_dir=str(data), mqtt_port=0, management_port=0) as b:
        api = f"http://127.0.0.1:{b.server.management.port}/api"
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}

        def get(path: str):
            with urllib.request.urlopen(urllib.request.Request(api + path, headers=auth)) as r:
                return json.load(r)

        with RawMQTT(b.mqtt_port) as c311, RawMQTT(b.mqtt_port, p.MQTT_5) as c5:
            c311.connect("mgmt-311")
            c5.connect("mgmt-5")
            rows = {r["client_properties"]["client_id"]: r for r in get("/connections")}
            assert rows["mgmt-311"]["protocol"] == "MQTT 3.1.1"
            assert rows["mgmt-5"]["protocol"] == "MQTT 5-0"
            one = rows["mgmt-311"]
            assert (one["user"], one["vhost"], one["type"]) == ("guest", "/", "direct")
            assert one["name"].endswith(f"-> 127.0.0.1:{b.mqtt_port}")
            quoted = urllib.request.quote(one["name"], safe="")
            assert get(f"/connections/{quoted}")["protocol"] == "MQTT 3.1.1"
            assert get(f"/connections/{quoted}/channels") == []
            # closed by an operator: the client sees its connection end
            request = urllib.request.Request(
                f"{api}/connections/{quoted}", headers=auth, method="DELETE"
            )
            urllib.request.urlopen(request).close()
            assert c311.closed()
            for where in (["--data-dir", str(data)], ["--url", api.removesuffix("/api")]):
                proc = subprocess.run(
                    [sys.executable, "-m", "leveret", "ctl", *where, "--formatter", "json",
                     "list_mqtt_connections"],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert proc.returncode == 0, proc.stderr
                listed = json.loads(proc.stdout)
                assert [(r["client_id"], r["protocol"]) for r in listed] == [("mgmt-5", "MQTT 5-0")]
            # an MQTT 5 client closed by an operator hears "administrative action"
            five = urllib.request.quote(rows["mgmt-5"]["name"], safe="")
            request = urllib.request.Request(
                f"{api}/connections/{five}", headers=auth, method="DELETE"
            )
            urllib.request.urlopen(request).close()
            closed = c5.recv()
            assert isinstance(closed, p.Disconnect)
            assert closed.reason_code == p.RC_ADMINISTRATIVE_ACTION
            assert closed.properties["reason_string"] == (
                "CONNECTION_FORCED - Closed via management plugin"
            )


def test_vhost_and_user_connection_limits_count_mqtt_connections(broker) -> None:
    broker.admin.add_vhost("limited")
    broker.admin.set_permissions("guest", "limited", ".*", ".*", ".*")
    broker.admin.set_vhost_limits("limited", {"max-connections": 1})
    with RawMQTT(broker.mqtt_port) as first:
        assert first.connect("lim-1", "limited:guest").reason_code == 0
        with RawMQTT(broker.mqtt_port) as second:
            assert second.connect("lim-2", "limited:guest").reason_code == p.CONNACK_NOT_AUTHORIZED
        with RawMQTT(broker.mqtt_port, p.MQTT_5) as third:
            ack = third.connect("lim-3", "limited:guest")
            assert ack.reason_code == p.RC_QUOTA_EXCEEDED
            assert "connection limit (1)" in ack.properties["reason_string"]
    broker.admin.add_user("one", "pw")
    broker.admin.set_permissions("one", "/", ".*", ".*", ".*")
    broker.admin.set_user_limits("one", {"max-connections": 1})
    conn = pika.BlockingConnection(
        pika.URLParameters(f"amqp://one:pw@127.0.0.1:{broker.port}/%2F")
    )  # an AMQP connection counts too
    with RawMQTT(broker.mqtt_port) as c:
        assert c.connect("lim-4", "one", b"pw").reason_code == p.CONNACK_NOT_AUTHORIZED
    conn.close()


def test_will_when_the_broker_ends_the_connection_follows_rabbitmq_310(broker) -> None:
    """RabbitMQ 3.10 publishes a 3.1.1 will only for a lost socket or a keepalive timeout,
    not when it closes the connection itself (takeover, protocol error)."""
    port = broker.mqtt_port
    with RawMQTT(port) as watcher:
        watcher.connect("w310")
        watcher.send(p.Subscribe(1, [p.Subscription("w310/#", 0)]))
        watcher.recv()
        first = RawMQTT(port)
        first.connect("w310-twin", will=p.Will("w310/takeover", b"x"))
        second = RawMQTT(port)
        second.connect("w310-twin")
        assert first.closed()
        bad = RawMQTT(port)
        bad.connect("w310-bad", will=p.Will("w310/protocol", b"y"))
        bad.send_bytes(b"\xc1\x00")
        assert bad.closed()
        with pytest.raises(TimeoutError):
            watcher.recv(1.0)
        for c in (first, second, bad):
            c.close()


def test_invalid_subscribe_filters_get_0x80_and_the_connection_stays(broker) -> None:
    with RawMQTT(broker.mqtt_port) as c:
        c.connect("filters")
        c.send(
            p.Subscribe(
                1, [p.Subscription("a/#/b", 0), p.Subscription("a+", 1), p.Subscription("ok/#", 1)]
            )
        )
        assert c.recv() == p.Suback(1, [0x80, 0x80, 1])
        c.send(p.PingReq())
        assert c.recv() == p.PingResp()


def test_operators_act_on_open_mqtt_connections(broker) -> None:
    admin = broker.admin
    admin.add_user("op", "pw")
    admin.set_permissions("op", "/", ".*", ".*", ".*")
    port = broker.mqtt_port
    with RawMQTT(port) as c:
        c.connect("op-1", "op", b"pw")
        c.send(p.Publish("x", b"1", 1, packet_id=1))
        assert c.recv() == p.PubAck(p.PUBACK, 1)
        admin.set_permissions("op", "/", ".*", "^$", ".*")  # write taken away
        c.send(p.Publish("x", b"2", 1, packet_id=2))
        assert c.closed()
    admin.set_permissions("op", "/", ".*", ".*", ".*")
    with RawMQTT(port) as c:
        c.connect("op-2", "op", b"pw")
        admin.delete_user("op")
        assert c.closed()
    admin.add_vhost("gone")
    admin.set_permissions("guest", "gone", ".*", ".*", ".*")
    with RawMQTT(port) as c:
        c.connect("op-3", "gone:guest")
        admin.delete_vhost("gone")
        assert c.closed()


def test_mqtt_connections_count_for_amqp_connection_limits(broker) -> None:
    broker.admin.add_vhost("lim2")
    broker.admin.set_permissions("guest", "lim2", ".*", ".*", ".*")
    broker.admin.set_vhost_limits("lim2", {"max-connections": 1})
    with RawMQTT(broker.mqtt_port) as c:
        assert c.connect("lim2-mqtt", "lim2:guest").reason_code == 0
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            pika.BlockingConnection(
                pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{broker.port}/lim2")
            )
