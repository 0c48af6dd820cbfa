"""The MQTT scenarios: what a client (and an AMQP peer) can observe, as data.

Each scenario is a function of a `Target` returning a dict of observations: CONNACK
return codes and session-present flags, SUBACK granted QoS, the messages that
arrived with their properties, the packets a broker answered to raw bytes and
whether it closed the connection, the queues an MQTT session left in the
management API. No timing is recorded: a wait is only ever a bound on how long to
wait for something, and "nothing arrived" is checked after a marker message sent
behind it arrived (or a short grace).

Every name made on the broker starts with `mqtt-compat` (the reference is shared);
each scenario removes what it made (sessions, queues, retained messages, users,
vhosts) in its `finally`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika

from . import wire
from .target import PREFIX, Target

Scenario = Callable[[Target], dict[str, Any]]
SCENARIOS: dict[str, Scenario] = {}

PASSWORD = "mqtt-compat-pw"
#: a user made for a scenario, and the vhost some scenarios make
USER = f"{PREFIX}-user"
VHOST = f"{PREFIX}-vhost"


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        assert name not in SCENARIOS, name
        SCENARIOS[name] = fn
        return fn

    return register


def about(name: str) -> str:
    return " ".join((SCENARIOS[name].__doc__ or "").split())


# --- helpers ------------------------------------------------------------------------------


def cid(name: str) -> str:
    return f"{PREFIX}-{name}"


def forget(t: Target, *client_ids: str) -> None:
    """Drop the stored sessions of these client ids (connect with clean session)."""
    for client_id in client_ids:
        client = t.mqtt(client_id, clean=True)
        client.disconnect()


def clear_retained(t: Target, *topics: str) -> None:
    client = t.mqtt(cid("clear-retained"))
    for topic in topics:
        client.publish(topic, b"", qos=1, retain=True)
    client.disconnect()


def raw_connected(t: Target, client_id: str, **kwargs: Any) -> tuple[wire.RawClient, list]:
    """A raw connection after CONNECT as guest (or `username`/`password` given), and
    the packets that answered the CONNECT."""
    kwargs.setdefault("username", "guest")
    kwargs.setdefault("password", "guest")
    raw = t.raw()
    raw.send(wire.connect(client_id, **kwargs))
    return raw, raw.expect(1)


def raw_answers(t: Target, data: bytes, wait: float = 2.0) -> dict[str, Any]:
    """What the broker answers to `data` sent as the first bytes of a connection."""
    with t.raw() as raw:
        raw.send(data)
        return raw.answers(wait)


def raw_after_connect(t: Target, client_id: str, data: bytes, wait: float = 2.0) -> dict:
    """CONNECT as guest, then `data`: the CONNACK and what answers `data`."""
    raw, connack = raw_connected(t, client_id)
    with raw:
        raw.send(data)
        return {"connect": connack, "then": raw.answers(wait), "ping": ping_probe(raw)}


def ping_probe(raw: wire.RawClient) -> dict[str, Any] | None:
    """On a connection the broker left open: what a PINGREQ gets (whether the
    connection still works or the broker still waits for the rest of a packet)."""
    if raw.closed:
        return None
    raw.send(wire.PINGREQ)
    return raw.answers(1.0)


def amqp_properties(props: pika.BasicProperties) -> dict[str, Any]:
    out = {}
    for key, value in sorted(vars(props).items()):
        if value is None:
            continue
        out[key] = "$volatile" if key == "timestamp" else value
    return out


class AmqpWatch:
    """An AMQP queue bound to amq.topic with these binding keys (server-named,
    exclusive), read with basic.get."""

    def __init__(self, t: Target, *keys: str, vhost: str = "/") -> None:
        self.connection = t.amqp(vhost)
        self.channel = self.connection.channel()
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue
        for key in keys:
            self.channel.queue_bind(self.queue, "amq.topic", key)

    def get(self, count: int, wait: float = 5.0, grace: float = 0.5) -> list[dict[str, Any]]:
        """Messages until `count` came (or `wait` passed), then any more within `grace`."""
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + wait
        extra_until = None
        while True:
            method, props, body = self.channel.basic_get(self.queue, auto_ack=True)
            if method is not None:
                out.append(
                    {
                        "exchange": method.exchange,
                        "routing_key": method.routing_key,
                        "redelivered": method.redelivered,
                        "body": body.decode(errors="replace"),
                        "properties": amqp_properties(props),
                    }
                )
                continue
            now = time.monotonic()
            if len(out) >= count and extra_until is None:
                extra_until = now + grace
            if (extra_until is not None and now >= extra_until) or now >= deadline:
                return out
            self.connection.sleep(0.02)

    def publish(self, key: str, body: bytes, **props: Any) -> None:
        self.channel.basic_publish(
            "amq.topic", key, body, pika.BasicProperties(**props) if props else None
        )

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


def by_topic(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages from several subscriptions: their order across queues is not defined."""
    return sorted(messages, key=lambda m: (m["topic"], m["payload"], m["qos"]))


def wait_for(client, topic: str, wait: float = 5.0, grace: float = 0.5) -> list[dict]:
    """The client's messages once one on `topic` (a marker sent last) came, plus any
    within `grace` after it."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if any(m["topic"] == topic for m in client.messages):
            break
        time.sleep(0.01)
    time.sleep(grace)
    return list(client.messages)


# --- MQTT -> AMQP: what an AMQP consumer bound to amq.topic sees -----------------------


@scenario("map-mqtt-publish-qos0")
def map_mqtt_publish_qos0(t: Target) -> dict[str, Any]:
    """An MQTT QoS 0 publish to a/b/c reaches an AMQP queue bound to amq.topic with
    routing key a.b.c; its delivery mode and x-mqtt-* headers."""
    watch = AmqpWatch(t, f"{PREFIX}.map.#")
    client = t.mqtt(cid("pub0"))
    try:
        client.publish(f"{PREFIX}/map/qos0", b"zero", qos=0)
        return {"connack": client.connack, "amqp": watch.get(1)}
    finally:
        client.disconnect()
        watch.close()


@scenario("map-mqtt-publish-qos1")
def map_mqtt_publish_qos1(t: Target) -> dict[str, Any]:
    """An MQTT QoS 1 publish: PUBACK, and the AMQP message's delivery mode and headers."""
    watch = AmqpWatch(t, f"{PREFIX}.map.#")
    client = t.mqtt(cid("pub1"))
    try:
        acked = client.publish(f"{PREFIX}/map/qos1", b"one", qos=1)
        return {"puback": acked, "amqp": watch.get(1)}
    finally:
        client.disconnect()
        watch.close()


@scenario("map-mqtt-publish-retained")
def map_mqtt_publish_retained(t: Target) -> dict[str, Any]:
    """A retained MQTT publish is also routed to AMQP (how it looks there), and so is
    the empty retained publish that clears it."""
    watch = AmqpWatch(t, f"{PREFIX}.map.#")
    client = t.mqtt(cid("pubret"))
    topic = f"{PREFIX}/map/retained"
    try:
        client.publish(topic, b"kept", qos=1, retain=True)
        client.publish(topic, b"", qos=1, retain=True)
        return {"amqp": watch.get(2)}
    finally:
        client.disconnect()
        watch.close()
        clear_retained(t, topic)


@scenario("map-mqtt-publish-dup")
def map_mqtt_publish_dup(t: Target) -> dict[str, Any]:
    """A QoS 1 PUBLISH with the DUP flag set (sent raw): the x-mqtt-dup header."""
    watch = AmqpWatch(t, f"{PREFIX}.map.#")
    raw, connack = raw_connected(t, cid("pubdup"))
    try:
        body = wire.utf8(f"{PREFIX}/map/dup") + (5).to_bytes(2, "big") + b"again"
        raw.send(wire.packet(0x3A, body))
        answer = raw.expect(1)
        return {"connect": connack, "answer": answer, "amqp": watch.get(1)}
    finally:
        raw.send(wire.DISCONNECT)
        raw.close()
        watch.close()


@scenario("map-topic-characters")
def map_topic_characters(t: Target) -> dict[str, Any]:
    """Topic names with a dot, an empty level and a trailing slash: the AMQP routing
    keys they become."""
    watch = AmqpWatch(t, f"{PREFIX}.#", f"{PREFIX}/#")
    client = t.mqtt(cid("chars"))
    topics = [f"{PREFIX}/chars/dot.ted", f"{PREFIX}/chars//empty", f"{PREFIX}/chars/trailing/"]
    try:
        for i, topic in enumerate(topics):
            client.publish(topic, str(i).encode(), qos=1)
        got = watch.get(len(topics))
        return {"amqp": sorted(got, key=lambda m: m["body"])}
    finally:
        client.disconnect()
        watch.close()


# --- AMQP -> MQTT ------------------------------------------------------------------------


@scenario("map-amqp-to-mqtt-wildcards")
def map_amqp_to_mqtt_wildcards(t: Target) -> dict[str, Any]:
    """An MQTT subscriber with + and # filters receives AMQP publishes to amq.topic
    whose routing keys match (a.b.c becomes a/b/c); others it does not."""
    client = t.mqtt(cid("wild"))
    amqp = AmqpWatch(t)
    try:
        granted = client.subscribe((f"{PREFIX}/w/+/x", 0), (f"{PREFIX}/h/#", 1))
        for key in ["w.a.x", "w.a.b.x", "w.x", "h", "h.a.b", "other.a", "w.end.x"]:
            amqp.publish(f"{PREFIX}.{key}", key.encode())
        amqp.publish(f"{PREFIX}.h.end", b"end")
        wait_for(client, f"{PREFIX}/w/end/x")
        return {"granted": granted, "messages": by_topic(wait_for(client, f"{PREFIX}/h/end"))}
    finally:
        client.disconnect()
        amqp.close()


@scenario("dollar-topic-wildcard")
def dollar_topic_wildcard(t: Target) -> dict[str, Any]:
    """Topics starting with $ (MQTT 4.7.2): a filter starting with + and one naming the
    $ level, for MQTT and AMQP publishes to $ topics and to a plain topic."""
    sub = t.mqtt(cid("dollar-sub"))
    pub = t.mqtt(cid("dollar-pub"))
    amqp = AmqpWatch(t)
    try:
        granted = sub.subscribe((f"+/{PREFIX}/+", 0), (f"$D/{PREFIX}/sys/#", 0))
        pub.publish(f"$D/{PREFIX}/mqtt", b"mqtt", qos=1)
        amqp.publish(f"$D.{PREFIX}.amqp", b"amqp")
        pub.publish(f"$D/{PREFIX}/sys/up", b"sys", qos=1)
        pub.publish(f"d/{PREFIX}/end", b"end", qos=1)
        return {"granted": granted, "messages": by_topic(wait_for(sub, f"d/{PREFIX}/end"))}
    finally:
        sub.disconnect()
        pub.disconnect()
        amqp.close()


@scenario("map-amqp-properties-to-qos")
def map_amqp_properties_to_qos(t: Target) -> dict[str, Any]:
    """The QoS an MQTT subscriber (QoS 0 and QoS 1 subscriptions) receives an AMQP
    message with: no properties, delivery mode 2, x-mqtt-publish-qos 0 and 1."""
    client = t.mqtt(cid("props"))
    amqp = AmqpWatch(t)
    variants: dict[str, dict[str, Any]] = {
        "plain": {},
        "persistent": {"delivery_mode": 2},
        "header-qos0": {"headers": {"x-mqtt-publish-qos": 0}, "delivery_mode": 2},
        "header-qos1": {"headers": {"x-mqtt-publish-qos": 1}},
    }
    try:
        granted = client.subscribe((f"{PREFIX}/pq1/+", 1), (f"{PREFIX}/pq0/+", 0))
        for sub in ("pq1", "pq0"):
            for name, props in variants.items():
                amqp.publish(f"{PREFIX}.{sub}.{name}", name.encode(), **props)
            amqp.publish(f"{PREFIX}.{sub}.zz-end", b"end")
        wait_for(client, f"{PREFIX}/pq0/zz-end")
        return {"granted": granted, "messages": by_topic(wait_for(client, f"{PREFIX}/pq1/zz-end"))}
    finally:
        client.disconnect()
        amqp.close()


# --- QoS ----------------------------------------------------------------------------------


@scenario("qos-mqtt-to-mqtt")
def qos_mqtt_to_mqtt(t: Target) -> dict[str, Any]:
    """QoS 0 and 1 publishes to QoS 0 and QoS 1 subscriptions: the QoS each arrives
    with (the lower of the two)."""
    sub = t.mqtt(cid("qsub"))
    pub = t.mqtt(cid("qpub"))
    try:
        granted = sub.subscribe((f"{PREFIX}/qd/s0", 0), (f"{PREFIX}/qd/s1", 1))
        acks = []
        for topic in (f"{PREFIX}/qd/s0", f"{PREFIX}/qd/s1"):
            for qos in (0, 1):
                acks.append(pub.publish(topic, f"q{qos}".encode(), qos=qos))
        return {"granted": granted, "pubacks": acks, "messages": by_topic(sub.wait_messages(4))}
    finally:
        sub.disconnect()
        pub.disconnect()


@scenario("qos2-subscribe")
def qos2_subscribe(t: Target) -> dict[str, Any]:
    """SUBSCRIBE at QoS 2: the QoS granted, and the QoS a QoS 1 publish arrives with."""
    sub = t.mqtt(cid("q2sub"))
    pub = t.mqtt(cid("q2pub"))
    try:
        granted = sub.subscribe((f"{PREFIX}/q2/s", 2))
        pub.publish(f"{PREFIX}/q2/s", b"one", qos=1)
        return {"granted": granted, "messages": sub.wait_messages(1)}
    finally:
        sub.disconnect()
        pub.disconnect()


@scenario("qos2-publish")
def qos2_publish(t: Target) -> dict[str, Any]:
    """A QoS 2 PUBLISH (raw): the packet that answers it (PUBREC or something else),
    what a PUBREL then gets, and the QoS a QoS 1 subscriber receives it with."""
    sub = t.mqtt(cid("q2psub"))
    raw, connack = raw_connected(t, cid("q2praw"))
    try:
        granted = sub.subscribe((f"{PREFIX}/q2p/s", 1))
        raw.send(wire.publish(f"{PREFIX}/q2p/s", b"two", qos=2, packet_id=7))
        answer = raw.expect(1)
        raw.send(wire.packet(0x62, (7).to_bytes(2, "big")))  # PUBREL
        after_pubrel = raw.answers(1.0)
        return {
            "connect": connack,
            "granted": granted,
            "answer": answer,
            "after_pubrel": after_pubrel,
            "messages": sub.wait_messages(1),
        }
    finally:
        raw.close()
        sub.disconnect()


@scenario("unsubscribe")
def unsubscribe(t: Target) -> dict[str, Any]:
    """UNSUBSCRIBE (raw, to see UNSUBACK): later publishes to that filter no longer
    arrive, those to another subscription still do."""
    raw, connack = raw_connected(t, cid("unsub"))
    pub = t.mqtt(cid("unsubpub"))
    try:
        raw.send(wire.subscribe(1, (f"{PREFIX}/un/a", 0), (f"{PREFIX}/un/b", 0)))
        suback = raw.expect(1)
        raw.send(wire.packet(0xA2, (2).to_bytes(2, "big") + wire.utf8(f"{PREFIX}/un/a")))
        unsuback = raw.expect(1)
        pub.publish(f"{PREFIX}/un/a", b"gone", qos=1)
        pub.publish(f"{PREFIX}/un/b", b"kept", qos=1)
        return {"connect": connack, "suback": suback, "unsuback": unsuback,
                "then": raw.answers(1.5)}  # fmt: skip
    finally:
        raw.close()
        pub.disconnect()


@scenario("pingreq")
def pingreq(t: Target) -> dict[str, Any]:
    """PINGREQ after CONNECT gets PINGRESP; the connection stays open."""
    return raw_after_connect(t, cid("ping"), wire.PINGREQ, wait=1.0)


@scenario("unsubscribe-unknown-filter")
def unsubscribe_unknown_filter(t: Target) -> dict[str, Any]:
    """UNSUBSCRIBE of a filter the client never subscribed to."""
    data = wire.packet(0xA2, (3).to_bytes(2, "big") + wire.utf8(f"{PREFIX}/never"))
    return raw_after_connect(t, cid("unsubnone"), data, wait=1.0)


@scenario("keepalive-expiry")
def keepalive_expiry(t: Target) -> dict[str, Any]:
    """A client that sends nothing within its keepalive (1 s): the broker closes the
    connection (and publishes its last will)."""
    watcher = t.mqtt(cid("kaw"))
    try:
        watcher.subscribe((f"{PREFIX}/ka/will", 1))
        with t.raw() as raw:
            raw.send(
                wire.connect(
                    cid("ka"),
                    username="guest",
                    password="guest",
                    keepalive=1,
                    will=(f"{PREFIX}/ka/will", b"expired", 1, False),
                )
            )
            answers = raw.answers(wait=6.0)
        return {"answers": answers, "will": watcher.wait_messages(1)}
    finally:
        watcher.disconnect()


# --- retained messages --------------------------------------------------------------------


@scenario("retained-exact-topic")
def retained_exact_topic(t: Target) -> dict[str, Any]:
    """A retained message (the second of two replaces the first) goes to a later
    subscriber of that exact topic, with the retain flag; a live subscriber gets the
    publish without it; an empty retained publish clears it."""
    topic = f"{PREFIX}/ret/exact"
    live = t.mqtt(cid("retlive"))
    pub = t.mqtt(cid("retpub"))
    try:
        live.subscribe((topic, 1))
        pub.publish(topic, b"first", qos=1, retain=True)
        pub.publish(topic, b"second", qos=1, retain=True)
        live_got = live.wait_messages(2)
        later = t.mqtt(cid("retlater"))
        granted = later.subscribe((topic, 1))
        later_got = later.wait_messages(1)
        later.disconnect()
        pub.publish(topic, b"", qos=1, retain=True)
        after = t.mqtt(cid("retafter"))
        after.subscribe((topic, 1))
        pub.publish(topic, b"marker", qos=1)
        after_got = wait_for(after, topic)
        after.disconnect()
        return {
            "live": live_got,
            "granted": granted,
            "later": later_got,
            "after_clear": after_got,
        }
    finally:
        live.disconnect()
        pub.disconnect()
        clear_retained(t, topic)


@scenario("retained-qos")
def retained_qos(t: Target) -> dict[str, Any]:
    """The QoS a retained message arrives with: published at QoS 1 to a QoS 0
    subscriber, and at QoS 0 to a QoS 1 subscriber."""
    t1, t0 = f"{PREFIX}/retq/one", f"{PREFIX}/retq/zero"
    pub = t.mqtt(cid("retqpub"))
    try:
        pub.publish(t1, b"published at 1", qos=1, retain=True)
        pub.publish(t0, b"published at 0", qos=0, retain=True)
        pub.publish(f"{PREFIX}/retq/sync", b"sync", qos=1)  # the QoS 0 one went before
        sub = t.mqtt(cid("retqsub"))
        granted = sub.subscribe((t1, 0), (t0, 1))
        got = by_topic(sub.wait_messages(2))
        sub.disconnect()
        return {"granted": granted, "messages": got}
    finally:
        pub.disconnect()
        clear_retained(t, t1, t0)


@scenario("retained-wildcard")
def retained_wildcard(t: Target) -> dict[str, Any]:
    """A subscriber with a wildcard filter that matches a retained message's topic:
    whether it gets the retained message."""
    topic = f"{PREFIX}/retw/a"
    pub = t.mqtt(cid("retwpub"))
    try:
        pub.publish(topic, b"kept", qos=1, retain=True)
        sub = t.mqtt(cid("retwsub"))
        granted = sub.subscribe((f"{PREFIX}/retw/+", 1), (f"{PREFIX}/retw/#", 0))
        pub.publish(f"{PREFIX}/retw/marker", b"marker", qos=1)
        got = by_topic(wait_for(sub, f"{PREFIX}/retw/marker"))
        sub.disconnect()
        return {"granted": granted, "messages": got}
    finally:
        pub.disconnect()
        clear_retained(t, topic)


# --- last will ----------------------------------------------------------------------------


@scenario("will-on-abrupt-close")
def will_on_abrupt_close(t: Target) -> dict[str, Any]:
    """A client with a last will whose socket closes without DISCONNECT: subscribers
    of the will topic get the will (topic, payload, QoS)."""
    watcher = t.mqtt(cid("willw"))
    try:
        watcher.subscribe((f"{PREFIX}/will/+", 1))
        client = t.mqtt(cid("willc"), will=(f"{PREFIX}/will/a", b"gone", 1, False))
        client.drop()
        return {"messages": watcher.wait_messages(1)}
    finally:
        watcher.disconnect()


@scenario("will-not-on-disconnect")
def will_not_on_disconnect(t: Target) -> dict[str, Any]:
    """A client with a last will that sends DISCONNECT: no will is published."""
    watcher = t.mqtt(cid("willnw"))
    try:
        watcher.subscribe((f"{PREFIX}/willn/+", 1))
        client = t.mqtt(cid("willnc"), will=(f"{PREFIX}/willn/a", b"gone", 1, False))
        client.disconnect()
        marker = t.mqtt(cid("willnm"))
        marker.publish(f"{PREFIX}/willn/marker", b"marker", qos=1)
        marker.disconnect()
        return {"messages": wait_for(watcher, f"{PREFIX}/willn/marker", grace=1.0)}
    finally:
        watcher.disconnect()


@scenario("will-to-amqp")
def will_to_amqp(t: Target) -> dict[str, Any]:
    """A last will as an AMQP queue bound to amq.topic receives it."""
    watch = AmqpWatch(t, f"{PREFIX}.willa.#")
    try:
        client = t.mqtt(cid("willa"), will=(f"{PREFIX}/willa/a", b"gone", 1, False))
        client.drop()
        return {"amqp": watch.get(1)}
    finally:
        watch.close()


@scenario("will-retained")
def will_retained(t: Target) -> dict[str, Any]:
    """A retained last will, published on an abrupt close: a later subscriber of its
    topic gets it as a retained message."""
    topic = f"{PREFIX}/willr/a"
    watcher = t.mqtt(cid("willrw"))
    try:
        watcher.subscribe((topic, 1))
        client = t.mqtt(cid("willrc"), will=(topic, b"gone", 1, True))
        client.drop()
        live = watcher.wait_messages(1)
        later = t.mqtt(cid("willrl"))
        later.subscribe((topic, 1))
        later_got = later.wait_messages(1)
        later.disconnect()
        return {"live": live, "later": later_got}
    finally:
        watcher.disconnect()
        clear_retained(t, topic)


# --- sessions -----------------------------------------------------------------------------


@scenario("session-resume")
def session_resume(t: Target) -> dict[str, Any]:
    """Clean session false: the session-present flag on first and second connect, the
    queues the session keeps (management API), which QoS 0/1 messages published
    while it was away arrive on reconnect, and what a clean-session connect removes."""
    client_id = cid("sess")
    forget(t, client_id)
    pub = t.mqtt(cid("sesspub"))
    try:
        first = t.mqtt(client_id, clean=False)
        granted = first.subscribe((f"{PREFIX}/sess/q1", 1), (f"{PREFIX}/sess/q0", 0))
        first.disconnect()
        queues_away = t.queues("/", client_id)
        pub.publish(f"{PREFIX}/sess/q1", b"while away 1", qos=1)
        pub.publish(f"{PREFIX}/sess/q0", b"while away 0", qos=1)
        pub.publish(f"{PREFIX}/sess/q0", b"while away 0 at qos 0", qos=0)
        pub.publish(f"{PREFIX}/sess/q1", b"marker", qos=1)
        time.sleep(0.5)  # the AMQP-side routing into the session's queues
        second = t.mqtt(client_id, clean=False)
        got = by_topic(wait_for(second, f"{PREFIX}/sess/q1"))
        second.disconnect()
        third = t.mqtt(client_id, clean=True)
        queues_clean = t.queues("/", client_id)
        third.disconnect()
        return {
            "first_connack": first.connack,
            "granted": granted,
            "queues_while_away": queues_away,
            "second_connack": second.connack,
            "delivered_on_reconnect": got,
            "clean_connack": third.connack,
            "queues_after_clean_connect": queues_clean,
            "queues_after_clean_disconnect": t.queues("/", client_id),
        }
    finally:
        pub.disconnect()
        forget(t, client_id)
        t.delete_queues("/", client_id)


@scenario("session-redelivery-unacked")
def session_redelivery_unacked(t: Target) -> dict[str, Any]:
    """Clean session false, a QoS 1 message received and not acknowledged before the
    connection drops: on reconnect it comes again (its DUP flag, its QoS)."""
    client_id = cid("redeliver")
    forget(t, client_id)
    pub = t.mqtt(cid("redeliverpub"))
    try:
        raw, connack = raw_connected(t, client_id, clean=False)
        with raw:
            raw.send(wire.subscribe(1, (f"{PREFIX}/rd/a", 1)))
            suback = raw.expect(1)
            pub.publish(f"{PREFIX}/rd/a", b"unacked", qos=1)
            first = raw.expect(1)
        raw, reconnack = raw_connected(t, client_id, clean=False)
        with raw:
            again = raw.expect(1)
            for packet in again:
                if packet.get("type") == "publish" and packet.get("packet_id"):
                    raw.send(wire.packet(0x40, packet["packet_id"].to_bytes(2, "big")))
            raw.send(wire.DISCONNECT)
        for packet in first + again:
            packet.pop("packet_id", None)  # a broker's choice, not compared
        return {
            "connack": connack,
            "suback": suback,
            "first": first,
            "reconnack": reconnack,
            "again": again,
        }
    finally:
        pub.disconnect()
        forget(t, client_id)
        t.delete_queues("/", client_id)


@scenario("session-present-after-clean")
def session_present_after_clean(t: Target) -> dict[str, Any]:
    """A clean-session connection, then one with clean session false: no session is
    present (the clean one left none)."""
    client_id = cid("afterclean")
    try:
        first = t.mqtt(client_id, clean=True)
        first.subscribe((f"{PREFIX}/ac/a", 1))
        first.disconnect()
        second = t.mqtt(client_id, clean=False)
        second.disconnect()
        return {"first": first.connack, "second": second.connack}
    finally:
        forget(t, client_id)
        t.delete_queues("/", client_id)


@scenario("session-clean-queues")
def session_clean_queues(t: Target) -> dict[str, Any]:
    """Clean session true: the queues its QoS 0 and QoS 1 subscriptions make while it is
    connected (management API), and that they go when it disconnects."""
    client_id = cid("cleanq")
    client = t.mqtt(client_id)
    try:
        granted = client.subscribe((f"{PREFIX}/cq/q1", 1), (f"{PREFIX}/cq/q0", 0))
        connected = t.queues("/", client_id)
        client.disconnect()
        time.sleep(0.5)
        return {"granted": granted, "queues": connected, "after": t.queues("/", client_id)}
    finally:
        client.disconnect()
        t.delete_queues("/", client_id)


@scenario("client-id-takeover")
def client_id_takeover(t: Target) -> dict[str, Any]:
    """A second connection with a client id already connected: the first is closed
    (and whether its last will is published), the second is accepted and works."""
    client_id = cid("takeover")
    watcher = t.mqtt(cid("takew"))
    try:
        watcher.subscribe((f"{PREFIX}/take/+", 1))
        first = t.mqtt(client_id, will=(f"{PREFIX}/take/will", b"taken over", 1, False))
        second = t.mqtt(client_id)
        first_closed = first.wait_closed(5)
        acked = second.publish(f"{PREFIX}/take/second", b"second works", qos=1)
        got = by_topic(wait_for(watcher, f"{PREFIX}/take/second", grace=1.0))
        second.disconnect()
        first.disconnect()
        return {
            "first_connack": first.connack,
            "second_connack": second.connack,
            "first_closed": first_closed,
            "second_puback": acked,
            "watcher": got,
        }
    finally:
        watcher.disconnect()


# --- connect refusals ---------------------------------------------------------------------


@scenario("connect-ok")
def connect_ok(t: Target) -> dict[str, Any]:
    """CONNECT as guest (raw): the CONNACK."""
    return raw_answers(t, wire.connect(cid("ok"), username="guest", password="guest"), 1.0)


@scenario("connect-bad-password")
def connect_bad_password(t: Target) -> dict[str, Any]:
    """CONNECT with a wrong password: the CONNACK return code, and the close."""
    return raw_answers(t, wire.connect(cid("badpw"), username="guest", password="wrong"))


@scenario("connect-unknown-user")
def connect_unknown_user(t: Target) -> dict[str, Any]:
    """CONNECT as a user that does not exist."""
    return raw_answers(t, wire.connect(cid("nouser"), username=f"{PREFIX}-nobody",
                                       password="x"))  # fmt: skip


@scenario("connect-anonymous")
def connect_anonymous(t: Target) -> dict[str, Any]:
    """CONNECT without user name and password."""
    return raw_answers(t, wire.connect(cid("anon")), 1.0)


@scenario("connect-password-without-username")
def connect_password_without_username(t: Target) -> dict[str, Any]:
    """CONNECT with the password flag but not the user-name flag (a protocol error)."""
    body = wire.utf8("MQTT") + bytes([4, 0x42]) + (60).to_bytes(2, "big")
    body += wire.utf8(cid("pwonly")) + wire.utf8("guest")
    return raw_answers(t, wire.packet(0x10, body))


@scenario("connect-unknown-vhost")
def connect_unknown_vhost(t: Target) -> dict[str, Any]:
    """User name `vhost:user` naming a vhost that does not exist."""
    name = f"{PREFIX}-no-such-vhost:guest"
    return raw_answers(t, wire.connect(cid("novhost"), username=name, password="guest"))


@scenario("connect-vhost-prefix")
def connect_vhost_prefix(t: Target) -> dict[str, Any]:
    """User name `vhost:user`: the connection is in that vhost; its publishes reach an
    AMQP queue bound to that vhost's amq.topic (and not one in /)."""
    t.add_vhost(VHOST)
    try:
        t.permit("guest", VHOST, ".*", ".*", ".*")
        there = AmqpWatch(t, f"{PREFIX}.vh.#", vhost=VHOST)
        here = AmqpWatch(t, f"{PREFIX}.vh.#")
        client = t.mqtt(cid("vh"), username=f"{VHOST}:guest", password="guest")
        acked = client.publish(f"{PREFIX}/vh/a", b"in the vhost", qos=1)
        client.disconnect()
        got_there, got_here = there.get(1), here.get(0)
        there.close()
        here.close()
        return {"connack": client.connack, "puback": acked, "vhost": got_there, "default": got_here}
    finally:
        t.delete_vhost(VHOST)


@scenario("connect-no-permission")
def connect_no_permission(t: Target) -> dict[str, Any]:
    """CONNECT as a user with no permissions in the vhost."""
    t.add_user(USER, PASSWORD)
    try:
        return raw_answers(t, wire.connect(cid("noperm"), username=USER, password=PASSWORD))
    finally:
        t.delete_user(USER)


@scenario("client-id-empty-clean-false")
def client_id_empty_clean_false(t: Target) -> dict[str, Any]:
    """An empty client id with clean session false: refused (identifier rejected)."""
    return raw_answers(t, wire.connect("", clean=False, username="guest", password="guest"))


@scenario("client-id-empty-clean-true")
def client_id_empty_clean_true(t: Target) -> dict[str, Any]:
    """An empty client id with clean session true: accepted."""
    return raw_answers(t, wire.connect("", username="guest", password="guest"), 1.0)


@scenario("connect-mqtt-3.1")
def connect_mqtt_31(t: Target) -> dict[str, Any]:
    """CONNECT with MQTT 3.1's protocol name MQIsdp, level 3."""
    data = wire.connect(cid("v31"), username="guest", password="guest",
                        protocol_name="MQIsdp", level=3)  # fmt: skip
    return raw_answers(t, data, 1.0)


@scenario("connect-mqtt-5")
def connect_mqtt_5(t: Target) -> dict[str, Any]:
    """An MQTT 5.0 CONNECT (level 5, empty properties)."""
    body = wire.utf8("MQTT") + bytes([5, 0x02]) + (60).to_bytes(2, "big") + b"\x00"
    body += wire.utf8(cid("v5"))
    return raw_answers(t, wire.packet(0x10, body))


@scenario("connect-unknown-level")
def connect_unknown_level(t: Target) -> dict[str, Any]:
    """CONNECT with protocol name MQTT and level 9."""
    return raw_answers(t, wire.connect(cid("v9"), username="guest", password="guest", level=9))


@scenario("connect-bad-protocol-name")
def connect_bad_protocol_name(t: Target) -> dict[str, Any]:
    """CONNECT with protocol name MQTX."""
    data = wire.connect(cid("mqtx"), username="guest", password="guest", protocol_name="MQTX")
    return raw_answers(t, data)


@scenario("connect-will-qos3")
def connect_will_qos3(t: Target) -> dict[str, Any]:
    """CONNECT whose will QoS is 3 (malformed)."""
    data = wire.connect(cid("willq3"), username="guest", password="guest",
                        will=(f"{PREFIX}/w3", b"x", 3, False))  # fmt: skip
    return raw_answers(t, data)


# --- permissions --------------------------------------------------------------------------


def _user_with(t: Target, configure: str, write: str, read: str) -> None:
    t.add_user(USER, PASSWORD)
    t.permit(USER, "/", configure, write, read)


@scenario("publish-refused-write")
def publish_refused_write(t: Target) -> dict[str, Any]:
    """A QoS 1 publish by a user without write permission on amq.topic."""
    _user_with(t, ".*", "^mqtt-subscription-.*", ".*")
    try:
        raw, connack = raw_connected(t, cid("nowrite"), username=USER, password=PASSWORD)
        with raw:
            raw.send(wire.publish(f"{PREFIX}/nw/a", b"x", qos=1, packet_id=3))
            return {"connect": connack, "then": raw.answers(), "ping": ping_probe(raw)}
    finally:
        t.delete_user(USER)
        t.delete_queues("/", cid("nowrite"))


@scenario("subscribe-refused-read")
def subscribe_refused_read(t: Target) -> dict[str, Any]:
    """A SUBSCRIBE by a user without read permission on amq.topic."""
    _user_with(t, ".*", ".*", "^mqtt-subscription-.*")
    try:
        raw, connack = raw_connected(t, cid("noread"), username=USER, password=PASSWORD)
        with raw:
            raw.send(wire.subscribe(4, (f"{PREFIX}/nr/a", 1)))
            return {"connect": connack, "then": raw.answers()}
    finally:
        t.delete_user(USER)
        t.delete_queues("/", cid("noread"))


@scenario("subscribe-refused-configure")
def subscribe_refused_configure(t: Target) -> dict[str, Any]:
    """A SUBSCRIBE by a user who may not configure (declare) queues."""
    _user_with(t, "^$", ".*", ".*")
    try:
        raw, connack = raw_connected(t, cid("noconf"), username=USER, password=PASSWORD)
        with raw:
            raw.send(wire.subscribe(4, (f"{PREFIX}/nc/a", 1)))
            return {"connect": connack, "then": raw.answers()}
    finally:
        t.delete_user(USER)
        t.delete_queues("/", cid("noconf"))


@scenario("publish-refused-topic-permission")
def publish_refused_topic_permission(t: Target) -> dict[str, Any]:
    """Topic permissions on amq.topic (write only mqtt-compat.ok.*): a publish to an
    allowed topic is acknowledged, one to another topic refused."""
    _user_with(t, ".*", ".*", ".*")
    t.topic_permit(USER, "/", "amq.topic", rf"^{PREFIX}\.ok\..*", ".*")
    try:
        out = {}
        for name, topic in (("allowed", f"{PREFIX}/ok/a"), ("refused", f"{PREFIX}/no/a")):
            raw, connack = raw_connected(t, cid("tpw"), username=USER, password=PASSWORD)
            with raw:
                raw.send(wire.publish(topic, b"x", qos=1, packet_id=5))
                out[name] = {"connect": connack, "then": raw.answers(1.5)}
        return out
    finally:
        t.delete_user(USER)


@scenario("subscribe-refused-topic-permission")
def subscribe_refused_topic_permission(t: Target) -> dict[str, Any]:
    """Topic permissions on amq.topic (read only mqtt-compat.ok.*): a subscription to an
    allowed filter is granted, one to another filter refused."""
    _user_with(t, ".*", ".*", ".*")
    t.topic_permit(USER, "/", "amq.topic", ".*", rf"^{PREFIX}\.ok\..*")
    try:
        out = {}
        for name, topic in (("allowed", f"{PREFIX}/ok/a"), ("refused", f"{PREFIX}/no/a")):
            raw, connack = raw_connected(t, cid("tpr"), username=USER, password=PASSWORD)
            with raw:
                raw.send(wire.subscribe(6, (topic, 1)))
                out[name] = {"connect": connack, "then": raw.answers(1.5)}
        return out
    finally:
        t.delete_user(USER)
        t.delete_queues("/", cid("tpr"))


# --- malformed packets --------------------------------------------------------------------


@scenario("malformed-first-packet-not-connect")
def malformed_first_packet_not_connect(t: Target) -> dict[str, Any]:
    """A PINGREQ as the first packet (before CONNECT)."""
    return raw_answers(t, wire.PINGREQ)


@scenario("malformed-garbage")
def malformed_garbage(t: Target) -> dict[str, Any]:
    """An HTTP request line on the MQTT port."""
    return raw_answers(t, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


@scenario("malformed-remaining-length")
def malformed_remaining_length(t: Target) -> dict[str, Any]:
    """A PUBLISH whose remaining length has five bytes (at most four are allowed)."""
    return raw_after_connect(t, cid("len5"), b"\x30\xff\xff\xff\xff\x7f")


@scenario("malformed-reserved-type-0")
def malformed_reserved_type_0(t: Target) -> dict[str, Any]:
    """A packet of the reserved type 0 after CONNECT."""
    return raw_after_connect(t, cid("type0"), b"\x00\x00")


@scenario("malformed-reserved-type-15")
def malformed_reserved_type_15(t: Target) -> dict[str, Any]:
    """A packet of the reserved type 15 (AUTH in MQTT 5) after an MQTT 3.1.1 CONNECT."""
    return raw_after_connect(t, cid("type15"), b"\xf0\x00")


@scenario("malformed-second-connect")
def malformed_second_connect(t: Target) -> dict[str, Any]:
    """A second CONNECT on a connected connection."""
    data = wire.connect(cid("second"), username="guest", password="guest")
    return raw_after_connect(t, cid("second"), data)


@scenario("malformed-subscribe-flags")
def malformed_subscribe_flags(t: Target) -> dict[str, Any]:
    """A SUBSCRIBE whose fixed-header flags are 0 (they must be 2)."""
    data = wire.subscribe(8, (f"{PREFIX}/sf/a", 0), first_byte=0x80)
    return raw_after_connect(t, cid("subflags"), data)


@scenario("malformed-subscribe-no-filter")
def malformed_subscribe_no_filter(t: Target) -> dict[str, Any]:
    """A SUBSCRIBE with a packet id and no topic filter."""
    return raw_after_connect(t, cid("subnone"), wire.packet(0x82, (9).to_bytes(2, "big")))


@scenario("malformed-publish-wildcard-topic")
def malformed_publish_wildcard_topic(t: Target) -> dict[str, Any]:
    """A QoS 1 PUBLISH whose topic name has a + wildcard."""
    data = wire.publish(f"{PREFIX}/+/x", b"x", qos=1, packet_id=10)
    return raw_after_connect(t, cid("pubwild"), data)


@scenario("malformed-publish-qos3")
def malformed_publish_qos3(t: Target) -> dict[str, Any]:
    """A PUBLISH with both QoS bits set (QoS 3)."""
    body = wire.utf8(f"{PREFIX}/q3") + (11).to_bytes(2, "big") + b"x"
    return raw_after_connect(t, cid("pubq3"), wire.packet(0x36, body))


@scenario("malformed-truncated-connect")
def malformed_truncated_connect(t: Target) -> dict[str, Any]:
    """A CONNECT whose remaining length is shorter than its variable header."""
    return raw_answers(t, b"\x10\x04\x00\x04MQ")


# --- MQTT over WebSocket ------------------------------------------------------------------


@scenario("web-mqtt-round-trip")
def web_mqtt_round_trip(t: Target) -> dict[str, Any]:
    """MQTT over WebSocket (path /ws): CONNACK, SUBACK, a QoS 1 publish it receives
    itself, and what an AMQP queue bound to amq.topic sees of it."""
    watch = AmqpWatch(t, f"{PREFIX}.ws.#")
    client = t.mqtt(cid("ws"), websocket=True)
    try:
        granted = client.subscribe((f"{PREFIX}/ws/+", 1))
        acked = client.publish(f"{PREFIX}/ws/a", b"over websocket", qos=1)
        return {
            "connack": client.connack,
            "granted": granted,
            "puback": acked,
            "messages": client.wait_messages(1),
            "amqp": watch.get(1),
        }
    finally:
        client.disconnect()
        watch.close()


@scenario("web-mqtt-bad-password")
def web_mqtt_bad_password(t: Target) -> dict[str, Any]:
    """MQTT over WebSocket (raw frames) with a wrong password: the upgrade's answer,
    the MQTT packets, the WebSocket close frame (code and reason), the close."""
    with t.raw_websocket() as ws:
        ws.send(wire.connect(cid("wsbad"), username="guest", password="wrong"))
        answers = ws.answers()
        return {"upgrade": ws.upgrade, "answers": answers, "close_frame": ws.close_frame}


@scenario("web-mqtt-malformed")
def web_mqtt_malformed(t: Target) -> dict[str, Any]:
    """MQTT over WebSocket (raw frames): a PINGREQ before CONNECT."""
    with t.raw_websocket() as ws:
        ws.send(wire.PINGREQ)
        answers = ws.answers()
        return {"upgrade": ws.upgrade, "answers": answers, "close_frame": ws.close_frame}


# Operations scenarios (vhost mappings, connection limits, the overview) register here too.
from . import scenarios_ops  # noqa: E402, F401
