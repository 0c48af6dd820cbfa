"""A web page in Chromium talks MQTT to Leveret over WebSockets with MQTT.js.

The page (served by a local HTTP server on a free port, with MQTT.js's browser bundle
from .cache/mqttjs: tests/mqttjs.py, fetched by scripts/install-test-deps.sh) connects
to the Web MQTT listener at ws://127.0.0.1:PORT/ws with MQTT 3.1.1 or MQTT 5,
subscribes, publishes and lists what it receives. paho-mqtt over TCP and pika over AMQP
are on the other side. Debian's chromium is driven by Playwright as in tests/test_ui.py.
No timing is asserted: every wait is for something to arrive, with a generous bound.
"""

from __future__ import annotations

import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from playwright.sync_api import expect

from browser import chromium
from leveret.testing import embedded_broker
from mqttjs import BUNDLE, VERSION

pytestmark = pytest.mark.leveret_only

WAIT_S = 30.0
WAIT_MS = int(WAIT_S * 1000)
VERSIONS = pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5"])

PAGE = """<!doctype html>
<html>
<head><meta charset="utf-8"><title>Leveret Web MQTT</title>
<script src="/mqtt.min.js"></script></head>
<body>
<h1>MQTT over WebSockets</h1>
<p id="status">idle</p>
<ul id="received"></ul>
<script>
"use strict";
window.received = [];
window.sent = [];  // the PUBLISH packets as MQTT.js wrote them (topic, topic alias)
let client = null;
// the bytes of a payload in one number (tests/test_mqtt_browser.py: checksum)
function checksum(bytes) { return bytes.reduce((sum, b) => (sum * 31 + b) >>> 0, 0); }
function show(text) { document.getElementById("status").textContent = text; }
// Connects; resolves with the CONNACK's fields, rejects with MQTT.js's error message.
window.start = (url, options) => new Promise((resolve, reject) => {
  show("connecting");
  client = mqtt.connect(url, Object.assign({reconnectPeriod: 0, connectTimeout: 30000}, options));
  client.on("connect", (ack) => {
    show("connected");
    resolve({sessionPresent: ack.sessionPresent,
             code: ack.reasonCode === undefined ? ack.returnCode : ack.reasonCode});
  });
  client.on("error", (err) => { show("error: " + err.message); reject(err.message); });
  client.on("packetsend", (packet) => {
    if (packet.cmd === "publish") {
      window.sent.push({topic: packet.topic,
                        alias: packet.properties ? packet.properties.topicAlias : null});
    }
  });
  client.on("message", (topic, payload, packet) => {
    const item = {topic: topic, payload: new TextDecoder().decode(payload), qos: packet.qos,
                  retain: packet.retain, properties: packet.properties || null,
                  size: payload.length, checksum: checksum(payload)};
    window.received.push(item);
    const li = document.createElement("li");
    li.textContent = topic + " " + item.payload;
    document.getElementById("received").appendChild(li);
  });
});
window.subscribe = (filter, qos) => new Promise((resolve, reject) =>
  client.subscribe(filter, {qos: qos}, (err, granted) =>
    err ? reject(err.message) : resolve(granted.map((g) => g.qos))));
window.publish = (topic, text, options) => new Promise((resolve, reject) =>
  client.publish(topic, text, options, (err) => err ? reject(err.message) : resolve(true)));
window.stop = () => new Promise((resolve) => client.end(false, {}, () => resolve(true)));
window.mqttClient = () => client;
</script>
</body>
</html>
"""


@pytest.fixture(scope="module")
def bundle() -> bytes:
    if not BUNDLE.exists():
        pytest.skip(
            f"MQTT.js {VERSION} is not in {BUNDLE.parent}: run scripts/install-test-deps.sh "
            "(or python tests/mqttjs.py --fetch)"
        )
    return BUNDLE.read_bytes()


@pytest.fixture(scope="module")
def site(bundle):
    """The page and MQTT.js over HTTP on a free port; its base URL."""
    files = {
        "/": ("text/html; charset=utf-8", PAGE.encode()),
        "/mqtt.min.js": ("text/javascript", bundle),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            kind, body = files.get(self.path, ("text/plain", b""))
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def broker():
    with embedded_broker(mqtt_port=0, web_mqtt_port=0) as b:
        yield b


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, site):
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(site)
    expect(page.locator("#status")).to_have_text("idle")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


def ws_url(broker) -> str:
    return f"ws://127.0.0.1:{broker.web_mqtt_port}/ws"


def wait_received(page, count: int) -> list[dict]:
    """What the page lists once it has `count` messages (it must not get more)."""
    expect(page.locator("#received li")).to_have_count(count, timeout=WAIT_MS)
    return page.evaluate("window.received")


class Paho:
    """A paho-mqtt client over TCP whose messages land in a queue."""

    def __init__(self, broker, name: str, version: int) -> None:
        protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=protocol
        )
        self.messages: queue.Queue = queue.Queue()
        self.subscribed = threading.Event()
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.connect("127.0.0.1", broker.mqtt_port)
        self.client.loop_start()

    def subscribe(self, topic: str) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic, qos=1)
        assert self.subscribed.wait(WAIT_S), "no SUBACK"

    def publish(self, topic: str, payload: bytes, properties: Properties | None = None) -> None:
        info = self.client.publish(topic, payload, qos=1, properties=properties)
        info.wait_for_publish(WAIT_S)
        assert info.is_published()

    def get(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def checksum(payload: bytes) -> int:
    """The page's checksum of a payload (its `checksum` function)."""
    total = 0
    for b in payload:
        total = (total * 31 + b) & 0xFFFFFFFF
    return total


def amqp_get(ch, q: str):
    """basic.get until a message is there (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(q, auto_ack=True)
        if method is not None:
            return method, props, body
        time.sleep(0.05)
    raise AssertionError(f"nothing arrived in {q}")


@VERSIONS
def test_mqttjs_page_exchanges_messages_with_paho_and_amqp(page, broker, version) -> None:
    tag = f"browser{version}"
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", f"{tag}.from-page.#")
    paho = Paho(broker, f"{tag}-paho", version)
    try:
        paho.subscribe(f"{tag}/from-page/#")
        ack = page.evaluate(
            "([url, options]) => window.start(url, options)",
            [ws_url(broker), {"protocolVersion": version, "clientId": f"{tag}-page",
                              "username": "guest", "password": "guest"}],
        )  # fmt: skip
        assert ack == {"sessionPresent": False, "code": 0}
        expect(page.locator("#status")).to_have_text("connected")
        assert page.evaluate("(f) => window.subscribe(f, 1)", f"{tag}/to-page/+") == [1]

        # page → paho (MQTT over TCP) and an AMQP consumer
        options = {"qos": 1}
        if version == 5:
            options["properties"] = {
                "userProperties": {"origin": "browser"},
                "contentType": "text/plain",
            }
        page.evaluate(
            "([t, p, o]) => window.publish(t, p, o)",
            [f"{tag}/from-page/hello", "hi from MQTT.js", options],
        )
        m = paho.get()
        assert (m.topic, m.payload, m.qos) == (f"{tag}/from-page/hello", b"hi from MQTT.js", 1)
        method, props, body = amqp_get(ch, q)
        assert (method.exchange, method.routing_key, body) == (
            "amq.topic",
            f"{tag}.from-page.hello",
            b"hi from MQTT.js",
        )
        assert props.headers["x-mqtt-publish-qos"] == 1
        if version == 5:
            assert m.properties.UserProperty == [("origin", "browser")]
            assert m.properties.ContentType == "text/plain"
            assert props.headers["origin"] == "browser"
            assert props.content_type == "text/plain"

        # paho → page, then AMQP → page
        sent = None
        if version == 5:
            sent = Properties(PacketTypes.PUBLISH)
            sent.UserProperty = [("from", "paho")]
        paho.publish(f"{tag}/to-page/paho", b"hello page", sent)
        ch.basic_publish(
            "amq.topic",
            f"{tag}.to-page.amqp",
            b"from amqp",
            pika.BasicProperties(headers={"via": "amqp"}, content_type="text/csv"),
        )
        got = wait_received(page, 2)
        assert [(g["topic"], g["payload"], g["qos"]) for g in got] == [
            (f"{tag}/to-page/paho", "hello page", 1),
            (f"{tag}/to-page/amqp", "from amqp", 1),
        ]
        expect(page.locator("#received li").first).to_have_text(f"{tag}/to-page/paho hello page")
        if version == 5:
            assert got[0]["properties"]["userProperties"] == {"from": "paho"}
            assert got[1]["properties"]["userProperties"] == {"via": "amqp"}
            assert got[1]["properties"]["contentType"] == "text/csv"
        else:
            assert got[0]["properties"] is None
        assert page.evaluate("window.stop()") is True
    finally:
        paho.close()
        conn.close()


@VERSIONS
def test_mqttjs_page_retained_message_and_own_echo(page, broker, version) -> None:
    """A retained message from paho greets the page's subscription; the page's own
    publish comes back to it (no no-local)."""
    tag = f"browser-r{version}"
    paho = Paho(broker, f"{tag}-paho", version)
    try:
        paho.client.publish(f"{tag}/state", b"on", qos=1, retain=True).wait_for_publish(WAIT_S)
        page.evaluate(
            "([url, options]) => window.start(url, options)",
            [ws_url(broker), {"protocolVersion": version, "clientId": f"{tag}-page"}],
        )
        assert page.evaluate("(f) => window.subscribe(f, 1)", f"{tag}/#") == [1]
        page.evaluate(
            "([t, p]) => window.publish(t, p, {qos: 1})", [f"{tag}/echo", "from the page"]
        )
        got = wait_received(page, 2)
        assert sorted((g["topic"], g["payload"], g["retain"]) for g in got) == [
            (f"{tag}/echo", "from the page", False),
            (f"{tag}/state", "on", True),
        ]
        page.evaluate("window.stop()")
    finally:
        paho.client.publish(f"{tag}/state", b"", qos=1, retain=True).wait_for_publish(WAIT_S)
        paho.close()


@VERSIONS
def test_mqttjs_page_wrong_password_shows_the_refusal(page, broker, version) -> None:
    error = page.evaluate(
        """([url, options]) => window.start(url, options).then(
               () => "connected", (message) => message)""",
        [ws_url(broker), {"protocolVersion": version, "clientId": f"browser-bad{version}",
                          "username": "guest", "password": "wrong"}],
    )  # fmt: skip
    # MQTT.js names CONNACK return code 4 / reason code 0x86
    expected = "Bad username or password" if version == 4 else "Bad User Name or Password"
    assert error == f"Connection refused: {expected}"
    expect(page.locator("#status")).to_have_text(f"error: Connection refused: {expected}")


def test_mqttjs_v5_topic_aliases_subscription_id_and_a_resumed_session(page, broker) -> None:
    """MQTT 5 as MQTT.js uses it: topic aliases both ways (MQTT.js assigns its own;
    Leveret gives aliases up to the page's Topic Alias Maximum), a subscription
    identifier, and a session (expiry 300 s) resumed with what came while away."""
    tag = "browser-v5"
    paho = Paho(broker, f"{tag}-paho", 5)
    session = {"protocolVersion": 5, "clientId": f"{tag}-page", "clean": False,
               "properties": {"sessionExpiryInterval": 300, "topicAliasMaximum": 4},
               "autoAssignTopicAlias": True}  # fmt: skip
    try:
        paho.subscribe(f"{tag}/up/#")
        ack = page.evaluate("([u, o]) => window.start(u, o)", [ws_url(broker), session])
        assert ack == {"sessionPresent": False, "code": 0}
        page.evaluate(
            """(f) => new Promise((resolve, reject) => window.mqttClient().subscribe(
                 f, {qos: 1, properties: {subscriptionIdentifier: 7}},
                 (err) => err ? reject(err.message) : resolve(true)))""",
            f"{tag}/down/+",
        )
        for i in range(3):  # MQTT.js sends the second and third as the alias, topic empty
            page.evaluate(
                "([t, p]) => window.publish(t, p, {qos: 1})", [f"{tag}/up/long/topic", f"u{i}"]
            )
        assert page.evaluate("window.sent") == [
            {"topic": f"{tag}/up/long/topic", "alias": 1},
            {"topic": "", "alias": 1},
            {"topic": "", "alias": 1},
        ]
        ups = [paho.get() for _ in range(3)]
        assert [(m.topic, m.payload) for m in ups] == [
            (f"{tag}/up/long/topic", b"u0"),
            (f"{tag}/up/long/topic", b"u1"),
            (f"{tag}/up/long/topic", b"u2"),
        ]
        for i in range(3):
            paho.publish(f"{tag}/down/x", f"d{i}".encode())
        got = wait_received(page, 3)
        assert [(g["topic"], g["payload"]) for g in got] == [
            (f"{tag}/down/x", "d0"),
            (f"{tag}/down/x", "d1"),
            (f"{tag}/down/x", "d2"),
        ]
        assert [g["properties"]["topicAlias"] for g in got] == [1, 1, 1]
        assert [g["properties"]["subscriptionIdentifier"] for g in got] == [7, 7, 7]
        assert page.evaluate("window.stop()") is True

        paho.publish(f"{tag}/down/y", b"while away")
        ack = page.evaluate("([u, o]) => window.start(u, o)", [ws_url(broker), session])
        assert ack == {"sessionPresent": True, "code": 0}
        got = wait_received(page, 4)
        assert (got[3]["topic"], got[3]["payload"], got[3]["qos"]) == (
            f"{tag}/down/y",
            "while away",
            1,
        )
        ended = dict(session, clean=True, properties={"sessionExpiryInterval": 0})
        page.evaluate("window.stop()")
        page.evaluate("([u, o]) => window.start(u, o)", [ws_url(broker), ended])
        page.evaluate("window.stop()")
    finally:
        paho.close()


@VERSIONS
def test_mqttjs_large_message_and_will_when_the_tab_closes(browser, site, broker, version) -> None:
    """A 1 MB message crosses Web MQTT both ways (many WebSocket frames); closing the tab
    without DISCONNECT publishes the page's will."""
    tag = f"browser-w{version}"
    big = bytes(range(256)) * 4096
    paho = Paho(broker, f"{tag}-paho", version)
    context = browser.new_context()
    try:
        paho.subscribe(f"{tag}/up")
        paho.subscribe(f"{tag}/will")
        page = context.new_page()
        page.goto(site)
        will = {"topic": f"{tag}/will", "payload": "page gone", "qos": 1}
        page.evaluate(
            "([u, o]) => window.start(u, o)",
            [ws_url(broker), {"protocolVersion": version, "clientId": f"{tag}-page", "will": will}],
        )
        page.evaluate("(f) => window.subscribe(f, 1)", f"{tag}/down")
        page.evaluate(
            """(t) => {
                 const body = new Uint8Array(1048576);
                 for (let i = 0; i < body.length; i++) body[i] = i % 256;
                 return window.publish(t, body, {qos: 1});
               }""",
            f"{tag}/up",
        )
        m = paho.get()
        assert (m.topic, len(m.payload), m.payload == big) == (f"{tag}/up", len(big), True)
        paho.publish(f"{tag}/down", big)
        expect(page.locator("#received li")).to_have_count(1, timeout=WAIT_MS)
        got = page.evaluate("window.received[0]")
        assert (got["topic"], got["size"], got["checksum"]) == (
            f"{tag}/down",
            len(big),
            checksum(big),
        )
        context.close()  # the socket goes without DISCONNECT
        m = paho.get()
        assert (m.topic, m.payload, m.qos) == (f"{tag}/will", b"page gone", 1)
    finally:
        paho.close()
