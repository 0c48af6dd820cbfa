"""aiomqtt, an asyncio MQTT client (on paho-mqtt), against Leveret: MQTT 3.1.1 and 5.

What an application written with aiomqtt sees: its refused logins, wildcard
subscriptions, QoS 0 and 1, retained messages, a persistent session resumed with the
QoS 1 messages published while it was away, MQTT 5 properties and request/response,
messages crossing to and from AMQP clients (leveret.client) on amq.topic, and the
WebSocket and TLS listeners. Every wait is bounded by a generous timeout; no duration
is asserted.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable

import aiomqtt
import pytest
from aiomqtt import ProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from leveret.client import connect as amqp_connect
from leveret.testing import embedded_broker

pytestmark = pytest.mark.leveret_only

V311, V5 = ProtocolVersion.V311, ProtocolVersion.V5
BOTH = pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5"])
#: how long any one wait may take on a loaded machine before the test fails
WAIT = 30.0
_ids = itertools.count()


@pytest.fixture(scope="module")
def broker():
    with embedded_broker(mqtt_port=0, web_mqtt_port=0) as b:
        b.admin.add_user("aio-noperm", "secret")  # a user without permissions on "/"
        yield b


def run(coro: Awaitable) -> object:
    """Runs one test's scenario on a fresh event loop, bounded as a whole."""

    async def bounded():
        async with asyncio.timeout(WAIT * 4):
            return await coro

    return asyncio.run(bounded())


def client(broker, version: ProtocolVersion, name: str | None = None, **kwargs) -> aiomqtt.Client:
    """An aiomqtt client of the broker's MQTT listener, logged in as guest unless told."""
    kwargs.setdefault("username", "guest")
    kwargs.setdefault("password", "guest")
    return aiomqtt.Client(
        "127.0.0.1",
        broker.mqtt_port,
        identifier=name or f"aio-{next(_ids)}",
        protocol=version,
        timeout=WAIT,
        **kwargs,
    )


async def receive(c: aiomqtt.Client) -> aiomqtt.Message:
    async with asyncio.timeout(WAIT):
        return await anext(c.messages)


async def receive_until(c: aiomqtt.Client, last_topics: set[str]) -> dict[str, aiomqtt.Message]:
    """Messages by topic until every topic of `last_topics` has come (sentinels published
    after what a test expects, so that a message that should not come would be seen)."""
    got: dict[str, aiomqtt.Message] = {}
    while not last_topics <= got.keys():
        message = await receive(c)
        assert message.topic.value not in got, f"{message.topic.value} came twice"
        got[message.topic.value] = message
    return got


def props(**values) -> Properties:
    """PUBLISH properties from paho's attribute names (UserProperty, ContentType, ...)."""
    out = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(out, name, value)
    return out


# --- connecting ------------------------------------------------------------------------


@BOTH
def test_login_and_refusals_name_the_reason(broker, version) -> None:
    async def scenario():
        async with client(broker, version) as c:
            await c.publish("aio/login", b"in", qos=1)  # a round trip on the session
        refusals = {}
        for user, password in [
            ("guest", "wrong"),
            ("nobody", "x"),
            ("no-such-vhost:guest", "guest"),
            ("aio-noperm", "secret"),
        ]:
            with pytest.raises(aiomqtt.MqttCodeError) as refused:
                async with client(broker, version, username=user, password=password):
                    pass
            refusals[user] = str(refused.value)
        return refusals

    refusals = run(scenario())
    bad = "Bad user name or password"  # paho's name of return code 4 and reason code 0x86
    assert refusals["guest"] == f"[code:134] {bad}"
    assert refusals["nobody"] == f"[code:134] {bad}"
    assert refusals["no-such-vhost:guest"] == f"[code:134] {bad}"
    assert refusals["aio-noperm"] == "[code:135] Not authorized"


@BOTH
def test_anonymous_login_is_the_default_user(broker, version) -> None:
    async def scenario():
        async with client(broker, version, username=None, password=None) as c:
            await c.subscribe("aio/anon", qos=1)
            await c.publish("aio/anon", b"me", qos=1)
            return (await receive(c)).payload

    assert run(scenario()) == b"me"


# --- publish and subscribe ---------------------------------------------------------------


@BOTH
def test_wildcard_subscriptions_at_qos0_and_qos1(broker, version) -> None:
    tag = f"aw{version.value}"

    async def scenario():
        async with client(broker, version) as sub, client(broker, version) as pub:
            granted = await sub.subscribe([(f"{tag}/+/c", 1), (f"{tag}/z/#", 0)])
            await pub.publish(f"{tag}/b/c", b"one", qos=1)
            await pub.publish(f"{tag}/z", b"two", qos=0)  # '#' matches the parent level
            await pub.publish(f"{tag}/z/y/x", b"three", qos=1)  # delivered at QoS 0
            await pub.publish(f"{tag}/b/d", b"nobody", qos=1)
            await pub.publish(f"{tag}/b/c/d", b"nobody", qos=0)
            await pub.publish(f"{tag}/end/c", b"", qos=1)
            await pub.publish(f"{tag}/z/end", b"", qos=0)
            got = await receive_until(sub, {f"{tag}/end/c", f"{tag}/z/end"})
            return granted, got

    granted, got = run(scenario())
    assert [int(getattr(g, "value", g)) for g in granted] == [1, 0]
    assert {t: (m.payload, m.qos, m.retain) for t, m in got.items()} == {
        f"{tag}/b/c": (b"one", 1, False),
        f"{tag}/z": (b"two", 0, False),
        f"{tag}/z/y/x": (b"three", 0, False),
        f"{tag}/end/c": (b"", 1, False),
        f"{tag}/z/end": (b"", 0, False),
    }


@BOTH
def test_unsubscribe_stops_deliveries(broker, version) -> None:
    tag = f"au{version.value}"

    async def scenario():
        async with client(broker, version) as c:
            await c.subscribe([(f"{tag}/a", 1), (f"{tag}/b", 1)])
            await c.unsubscribe(f"{tag}/a")
            await c.publish(f"{tag}/a", b"gone", qos=1)
            await c.publish(f"{tag}/b", b"kept", qos=1)
            return await receive(c)

    message = run(scenario())
    assert (message.topic.value, message.payload) == (f"{tag}/b", b"kept")


@BOTH
def test_retained_message_set_delivered_and_cleared(broker, version) -> None:
    tag = f"ar{version.value}"

    async def scenario():
        async with client(broker, version) as pub:
            await pub.publish(f"{tag}/one", b"kept", qos=1, retain=True)
            await pub.publish(f"{tag}/two", b"also", qos=0, retain=True)
            await pub.publish(f"{tag}/three", b"not retained", qos=1)
            # a round trip, so that the QoS 0 retain is stored before anyone subscribes
            await pub.subscribe(f"{tag}/sync")
            await pub.publish(f"{tag}/sync", b"", qos=1)
            await receive(pub)
            async with client(broker, version) as late:
                await late.subscribe(f"{tag}/+", qos=1)
                first = await receive_until(late, {f"{tag}/one", f"{tag}/two"})
                await late.publish(f"{tag}/live", b"now", qos=1, retain=False)
                live = await receive(late)
            await pub.publish(f"{tag}/one", b"", qos=1, retain=True)  # clears it
            await pub.publish(f"{tag}/two", b"", qos=1, retain=True)
            async with client(broker, version) as later:
                await later.subscribe(f"{tag}/+", qos=1)
                await later.publish(f"{tag}/after", b"only this", qos=1)
                after = await receive(later)
            return first, live, after

    first, live, after = run(scenario())
    assert {t: (m.payload, m.retain) for t, m in first.items()} == {
        f"{tag}/one": (b"kept", True),
        f"{tag}/two": (b"also", True),
    }
    assert first[f"{tag}/one"].qos == 1 and first[f"{tag}/two"].qos == 0
    assert (live.topic.value, live.payload, live.retain) == (f"{tag}/live", b"now", False)
    assert (after.topic.value, after.payload, after.retain) == (f"{tag}/after", b"only this", False)


@BOTH
def test_persistent_session_is_resumed_with_its_qos1_messages(broker, version) -> None:
    tag = f"ap{version.value}"
    name = f"aio-persist-{version.value}"
    if version == V5:
        session = {"clean_start": True, "properties": _session_expiry(600)}
        resumed = {"clean_start": False, "properties": _session_expiry(600)}
        ended = {"clean_start": True, "properties": _session_expiry(0)}
    else:
        session = resumed = {"clean_session": False}
        ended = {"clean_session": True}

    async def scenario():
        async with client(broker, version, name, **session) as c:
            await c.subscribe(f"{tag}/#", qos=1)
        async with client(broker, version) as pub:
            for i in range(5):
                await pub.publish(f"{tag}/m", str(i).encode(), qos=1)
            await pub.publish(f"{tag}/zero", b"qos0 while away", qos=0)
        async with client(broker, version, name, **resumed) as c:
            # no SUBSCRIBE: the session kept the subscription and the messages
            got = [await receive(c) for _ in range(6)]
            await c.publish(f"{tag}/live", b"after", qos=1)
            got.append(await receive(c))
        async with client(broker, version, name, **ended):
            pass
        async with client(broker, version, name, **resumed) as c:
            async with client(broker, version) as pub:
                await pub.publish(f"{tag}/m", b"nobody subscribed", qos=1)
            await c.subscribe(f"{tag}/probe", qos=1)
            await c.publish(f"{tag}/probe", b"probe", qos=1)
            probe = await receive(c)
        async with client(broker, version, name, **ended):
            pass
        return got, probe

    got, probe = run(scenario())
    m_payloads = [m.payload for m in got if m.topic.value == f"{tag}/m"]
    assert m_payloads == [b"0", b"1", b"2", b"3", b"4"]
    assert all(m.qos == 1 for m in got if m.topic.value == f"{tag}/m")
    # A QoS 0 publish that matched the QoS 1 subscription waited in the session's queue
    # too, and comes at the lower QoS.
    zero = [m for m in got if m.topic.value == f"{tag}/zero"]
    assert [(m.payload, m.qos) for m in zero] == [(b"qos0 while away", 0)]
    assert got[-1].payload == b"after"
    # A clean start dropped the subscription: only the probe comes.
    assert (probe.topic.value, probe.payload) == (f"{tag}/probe", b"probe")


def _session_expiry(seconds: int) -> Properties:
    out = Properties(PacketTypes.CONNECT)
    out.SessionExpiryInterval = seconds
    return out


# --- MQTT 5 properties -----------------------------------------------------------------


def test_v5_properties_reach_the_subscriber(broker) -> None:
    async def scenario():
        async with client(broker, V5) as sub, client(broker, V5) as pub:
            await sub.subscribe("a5p/#", qos=1)
            sent = props(
                UserProperty=[("tenant", "t-1"), ("trace", "abc"), ("tenant", "t-2")],
                ContentType="application/json",
                PayloadFormatIndicator=1,
                MessageExpiryInterval=3600,
            )
            await pub.publish("a5p/x", b'{"n": 1}', qos=1, properties=sent)
            return await receive(sub)

    m = run(scenario())
    assert m.payload == b'{"n": 1}'
    assert m.properties.UserProperty == [("tenant", "t-1"), ("trace", "abc"), ("tenant", "t-2")]
    assert m.properties.ContentType == "application/json"
    assert m.properties.PayloadFormatIndicator == 1
    assert 0 < m.properties.MessageExpiryInterval <= 3600


def test_v5_request_response_with_response_topic_and_correlation_data(broker) -> None:
    async def responder(ready: asyncio.Event):
        async with client(broker, V5, "aio-responder") as service:
            await service.subscribe("a5rr/service", qos=1)
            ready.set()
            request = await receive(service)
            reply = props(
                CorrelationData=request.properties.CorrelationData,
                UserProperty=[("handled-by", "aio-responder")],
            )
            await service.publish(
                request.properties.ResponseTopic,
                request.payload.upper(),
                qos=1,
                properties=reply,
            )

    async def scenario():
        ready = asyncio.Event()
        service = asyncio.create_task(responder(ready))
        async with client(broker, V5, "aio-requester") as requester:
            await requester.subscribe("a5rr/replies/aio-requester", qos=1)
            async with asyncio.timeout(WAIT):
                await ready.wait()
            request = props(ResponseTopic="a5rr/replies/aio-requester", CorrelationData=b"\x00r-1")
            await requester.publish("a5rr/service", b"ping", qos=1, properties=request)
            reply = await receive(requester)
        await service
        return reply

    reply = run(scenario())
    assert (reply.topic.value, reply.payload) == ("a5rr/replies/aio-requester", b"PING")
    assert reply.properties.CorrelationData == b"\x00r-1"
    assert reply.properties.UserProperty == [("handled-by", "aio-responder")]


def test_v5_subscription_options_no_local(broker) -> None:
    async def scenario():
        async with client(broker, V5) as c:
            await c.subscribe("a5nl/t", options=SubscribeOptions(qos=1, noLocal=True))
            await c.subscribe("a5nl/sync", qos=1)
            await c.publish("a5nl/t", b"own", qos=1)  # not sent back: no local
            async with client(broker, V5) as other:
                await other.publish("a5nl/t", b"other's", qos=1)
            first = await receive(c)
            await c.publish("a5nl/sync", b"", qos=1)
            return first, await receive(c)

    first, sync = run(scenario())
    assert (first.topic.value, first.payload) == ("a5nl/t", b"other's")
    assert sync.topic.value == "a5nl/sync"


# --- interop with AMQP on amq.topic ----------------------------------------------------------


@BOTH
def test_aiomqtt_publishes_reach_an_amqp_consumer(broker, version) -> None:
    tag = f"aq{version.value}"

    async def scenario():
        async with await amqp_connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            await ch.bind_queue(q, "amq.topic", f"{tag}.*.temp")
            async with client(broker, version) as c:
                extra = {}
                if version == V5:
                    extra["properties"] = props(
                        UserProperty=[("unit", "C")],
                        ContentType="text/plain",
                        CorrelationData=b"corr-7",
                        ResponseTopic=f"{tag}/replies",
                    )
                await c.publish(f"{tag}/k1/temp", b"21.5", qos=1, **extra)
                await c.publish(f"{tag}/k2/temp", b"19", qos=0)
                await c.publish(f"{tag}/k3/humidity", b"40", qos=1)
                await c.publish(f"{tag}/end/temp", b"", qos=1)
            got = []
            async with asyncio.timeout(WAIT):
                async for message in ch.consume(q, no_ack=True):
                    got.append(message)
                    if message.routing_key == f"{tag}.end.temp":
                        break
            return got

    got = run(scenario())
    assert [(m.exchange, m.routing_key, m.body) for m in got] == [
        ("amq.topic", f"{tag}.k1.temp", b"21.5"),
        ("amq.topic", f"{tag}.k2.temp", b"19"),
        ("amq.topic", f"{tag}.end.temp", b""),
    ]
    first = got[0].properties
    assert first.headers["x-mqtt-publish-qos"] == 1
    assert first.delivery_mode == 2 and got[1].properties.delivery_mode == 1
    if version == V5:
        assert first.headers["unit"] == "C"
        assert first.content_type == "text/plain"
        assert first.correlation_id == "corr-7"
        assert first.headers["x-reply-to-topic"] == f"{tag}.replies"


@BOTH
def test_amqp_publishes_reach_an_aiomqtt_subscriber(broker, version) -> None:
    tag = f"aa{version.value}"

    async def scenario():
        async with client(broker, version) as c:
            await c.subscribe(f"{tag}/#", qos=1)
            async with await amqp_connect(broker.url) as conn:
                ch = await conn.channel()
                await ch.publish(
                    b"from amqp",
                    f"{tag}.orders.eu",
                    "amq.topic",
                    headers={"region": "eu", "n": 3},
                    content_type="text/plain",
                    correlation_id="order-1",
                    reply_to=f"{tag}.answers",
                )
            return await receive(c)

    m = run(scenario())
    # A message from AMQP is taken as published at QoS 1 (RabbitMQ's delivery_qos).
    assert (m.topic.value, m.payload, m.qos) == (f"{tag}/orders/eu", b"from amqp", 1)
    if version == V5:
        assert ("region", "eu") in m.properties.UserProperty
        assert ("n", "3") in m.properties.UserProperty
        assert m.properties.ContentType == "text/plain"
        assert m.properties.CorrelationData == b"order-1"
        assert m.properties.ResponseTopic == f"{tag}/answers"


def test_v5_responder_answers_an_amqp_request(broker) -> None:
    """An AMQP client asks with reply_to and correlation_id; an aiomqtt MQTT 5 service
    answers on the response topic with the correlation data; the AMQP client gets it."""

    async def scenario():
        async with client(broker, V5, "aio-amqp-service") as service:
            await service.subscribe("a5amqp/service", qos=1)
            async with await amqp_connect(broker.url) as conn:
                ch = await conn.channel()
                replies = await ch.declare_queue("", exclusive=True)
                await ch.bind_queue(replies, "amq.topic", "a5amqp.replies.1")
                await ch.publish(
                    b"question",
                    "a5amqp.service",
                    "amq.topic",
                    reply_to="a5amqp.replies.1",
                    correlation_id="q-42",
                )
                request = await receive(service)
                await service.publish(
                    request.properties.ResponseTopic,
                    b"answer",
                    qos=1,
                    properties=props(CorrelationData=request.properties.CorrelationData),
                )
                async with asyncio.timeout(WAIT):
                    async for reply in ch.consume(replies, no_ack=True):
                        return request, reply

    request, reply = run(scenario())
    assert request.properties.ResponseTopic == "a5amqp/replies/1"
    assert request.properties.CorrelationData == b"q-42"
    assert (reply.routing_key, reply.body) == ("a5amqp.replies.1", b"answer")
    assert reply.properties.correlation_id == "q-42"


# --- Web MQTT ----------------------------------------------------------------------------


@BOTH
def test_over_websockets(broker, version) -> None:
    tag = f"aws{version.value}"

    async def scenario():
        ws = aiomqtt.Client(
            "127.0.0.1",
            broker.web_mqtt_port,
            username="guest",
            password="guest",
            protocol=version,
            transport="websockets",
            websocket_path="/ws",
            timeout=WAIT,
        )
        async with ws, client(broker, version) as tcp:
            await ws.subscribe(f"{tag}/+", qos=1)
            await tcp.publish(f"{tag}/in", b"over tcp", qos=1)
            got = await receive(ws)
            await tcp.subscribe(f"{tag}/out", qos=1)
            await ws.publish(f"{tag}/out", b"over ws", qos=1)
            back = await receive(tcp)
        with pytest.raises(aiomqtt.MqttCodeError) as refused:
            async with aiomqtt.Client(
                "127.0.0.1",
                broker.web_mqtt_port,
                username="guest",
                password="wrong",
                protocol=version,
                transport="websockets",
                websocket_path="/ws",
                timeout=WAIT,
            ):
                pass
        return got, back, str(refused.value)

    got, back, refused = run(scenario())
    assert (got.topic.value, got.payload) == (f"{tag}/in", b"over tcp")
    assert (back.topic.value, back.payload) == (f"{tag}/out", b"over ws")
    assert refused == "[code:134] Bad user name or password"


# --- TLS -----------------------------------------------------------------------------------


@BOTH
def test_over_tls(tmp_path, version) -> None:
    """The MQTT TLS listener with a certificate aiomqtt checks (a throwaway CA)."""
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    with embedded_broker(mqtt_tls_port=0, tls_cert=str(cert_path), tls_key=str(key_path)) as b:
        port = b.server.mqtt.addresses["mqtts"][1]

        def tls_client(name: str, context: ssl.SSLContext) -> aiomqtt.Client:
            return aiomqtt.Client(
                "127.0.0.1", port, username="guest", password="guest", identifier=name,
                protocol=version, tls_context=context, timeout=WAIT,
            )  # fmt: skip

        async def scenario():
            async with tls_client("aio-tls", trusted) as c:
                await c.subscribe("tls/+", qos=1)
                await c.publish("tls/x", b"private", qos=1)
                message = await receive(c)
            untrusted = ssl.create_default_context()  # does not know the throwaway CA
            with pytest.raises(aiomqtt.MqttError) as refused:
                async with tls_client("aio-tls-untrusted", untrusted):
                    pass
            return message, str(refused.value)

        message, refused = run(scenario())
    assert (message.topic.value, message.payload, message.qos) == ("tls/x", b"private", 1)
    assert "CERTIFICATE_VERIFY_FAILED" in refused
