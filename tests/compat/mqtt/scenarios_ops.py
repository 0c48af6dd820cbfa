"""Scenarios of MQTT operations: the port-to-vhost mapping, connection limits, and
MQTT connections in the management overview.

They register in scenarios.SCENARIOS (imported at its end). The reference is shared:
a global parameter a scenario sets (the port mapping) is removed in its `finally`,
and is set only for as long as the scenario needs it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions

from . import wire
from .scenarios import PASSWORD, USER, VHOST, AmqpWatch, cid, raw_answers, raw_connected, scenario
from .target import PREFIX, Target

PORT_MAPPING = "mqtt_port_to_vhost_mapping"
MISSING_VHOST = f"{PREFIX}-no-such-vhost"


def _set_global(t: Target, name: str, value: Any) -> dict[str, Any]:
    """PUT the global parameter; the HTTP status (or the error) is an observation."""
    try:
        t.call("PUT", f"/global-parameters/{name}", {"name": name, "value": value})
        return {"accepted": True}
    except RuntimeError as exc:
        return {"accepted": False, "status": str(exc).split(": ")[1].split(" ")[0]}


def _clear_global(t: Target, name: str) -> None:
    t.call("DELETE", f"/global-parameters/{name}", missing_ok=True)


def _amqp_refused(t: Target, user: str, password: str, vhost: str) -> bool | None:
    """Whether an AMQP connection as `user` to `vhost` is refused (None: it opened and was
    closed again)."""
    params = pika.ConnectionParameters(
        t.host, t.amqp_port, vhost, pika.PlainCredentials(user, password)
    )
    try:
        connection = pika.BlockingConnection(params)
    except pika.exceptions.AMQPConnectionError:
        return True
    connection.close()
    return False


@scenario("vhost-port-mapping")
def vhost_port_mapping(t: Target) -> dict[str, Any]:
    """Global parameter mqtt_port_to_vhost_mapping maps the MQTT listener's port to a
    vhost: a plain user name's publish goes to that vhost's amq.topic; a `vhost:user`
    user name still picks its own vhost; a mapping of another port does not apply; a
    mapped vhost that does not exist refuses the CONNECT (return code 4)."""
    t.add_vhost(VHOST)
    there = here = None
    try:
        t.permit("guest", VHOST, ".*", ".*", ".*")
        there = AmqpWatch(t, f"{PREFIX}.pm.#", vhost=VHOST)
        here = AmqpWatch(t, f"{PREFIX}.pm.#")
        connacks = {}
        for name, mapping, username, topic in (
            ("mapped", {str(t.mqtt_port): VHOST}, "guest", "mapped"),
            ("prefixed", {str(t.mqtt_port): VHOST}, "/:guest", "prefixed"),
            ("other_port", {"1": VHOST}, "guest", "other"),
        ):
            _set_global(t, PORT_MAPPING, mapping)
            client = t.mqtt(cid(f"pm-{topic}"), username=username, password="guest")
            _clear_global(t, PORT_MAPPING)
            connacks[name] = {
                "connack": client.connack,
                "puback": client.publish(f"{PREFIX}/pm/{topic}", topic.encode(), qos=1),
            }
            client.disconnect()
        _set_global(t, PORT_MAPPING, {str(t.mqtt_port): MISSING_VHOST})
        try:
            missing = raw_answers(t, wire.connect(cid("pm-missing"), username="guest",
                                                  password="guest"))  # fmt: skip
        finally:
            _clear_global(t, PORT_MAPPING)
        return {
            "connects": connacks,
            "missing_vhost": missing,
            "mapped_vhost": there.get(1),
            "default_vhost": here.get(2),
        }
    finally:
        _clear_global(t, PORT_MAPPING)
        for watch in (there, here):
            if watch is not None:
                watch.close()
        t.delete_vhost(VHOST)


@scenario("vhost-port-mapping-web-mqtt")
def vhost_port_mapping_web_mqtt(t: Target) -> dict[str, Any]:
    """mqtt_port_to_vhost_mapping keyed by the Web MQTT port: a WebSocket client with a
    plain user name publishes into the mapped vhost."""
    t.add_vhost(VHOST)
    there = None
    try:
        t.permit("guest", VHOST, ".*", ".*", ".*")
        there = AmqpWatch(t, f"{PREFIX}.pmws.#", vhost=VHOST)
        _set_global(t, PORT_MAPPING, {str(t.web_mqtt_port): VHOST})
        client = t.mqtt(cid("pmws"), websocket=True)
        _clear_global(t, PORT_MAPPING)
        acked = client.publish(f"{PREFIX}/pmws/a", b"over websocket", qos=1)
        client.disconnect()
        return {"connack": client.connack, "puback": acked, "mapped_vhost": there.get(1)}
    finally:
        _clear_global(t, PORT_MAPPING)
        if there is not None:
            there.close()
        t.delete_vhost(VHOST)


@scenario("vhost-port-mapping-malformed")
def vhost_port_mapping_malformed(t: Target) -> dict[str, Any]:
    """mqtt_port_to_vhost_mapping values that are not an object of port to vhost name:
    whether the API takes them, and what a CONNECT with a plain user name then gets."""
    out = {}
    try:
        for name, value in (
            ("string", "not-a-mapping"),
            ("number_vhost", {str(t.mqtt_port): 7}),
            ("list", [1, 2]),
        ):
            put = _set_global(t, PORT_MAPPING, value)
            connect = raw_answers(t, wire.connect(cid(f"pmbad-{name}"), username="guest",
                                                  password="guest"), 1.0)  # fmt: skip
            _clear_global(t, PORT_MAPPING)
            out[name] = {"put": put, "connect": connect}
        return out
    finally:
        _clear_global(t, PORT_MAPPING)


@scenario("connect-vhost-connection-limit")
def connect_vhost_connection_limit(t: Target) -> dict[str, Any]:
    """A vhost with max-connections 1: the first MQTT connection is accepted, a second
    is refused, and so is an AMQP connection (the MQTT one counts); with the limit 0 a
    new MQTT connection is refused."""
    t.add_vhost(VHOST)
    try:
        t.permit("guest", VHOST, ".*", ".*", ".*")
        path = f"/vhost-limits/{quote(VHOST, safe='')}/max-connections"
        t.call("PUT", path, {"value": 1})
        first, first_connack = raw_connected(t, cid("vl-1"), username=f"{VHOST}:guest")
        with first:
            second = raw_answers(t, wire.connect(cid("vl-2"), username=f"{VHOST}:guest",
                                                 password="guest"))  # fmt: skip
            amqp = _amqp_refused(t, "guest", "guest", VHOST)
        t.call("PUT", path, {"value": 0})
        zero = raw_answers(t, wire.connect(cid("vl-3"), username=f"{VHOST}:guest",
                                           password="guest"))  # fmt: skip
        return {"first": first_connack, "second": second, "amqp_refused": amqp, "zero": zero}
    finally:
        t.delete_vhost(VHOST)


@scenario("connect-user-connection-limit")
def connect_user_connection_limit(t: Target) -> dict[str, Any]:
    """A user with max-connections 1: the first MQTT connection is accepted, a second
    is refused, and so is an AMQP connection of the user; with an AMQP connection of the
    user open, an MQTT CONNECT is refused."""
    t.add_user(USER, PASSWORD)
    try:
        t.permit(USER, "/", ".*", ".*", ".*")
        t.call("PUT", f"/user-limits/{quote(USER, safe='')}/max-connections", {"value": 1})
        first, first_connack = raw_connected(t, cid("ul-1"), username=USER, password=PASSWORD)
        with first:
            second = raw_answers(t, wire.connect(cid("ul-2"), username=USER,
                                                 password=PASSWORD))  # fmt: skip
            amqp = _amqp_refused(t, USER, PASSWORD, "/")
        return {"first": first_connack, "second": second, "amqp_refused": amqp}
    finally:
        t.delete_user(USER)


@scenario("connect-user-connection-limit-amqp-first")
def connect_user_connection_limit_amqp_first(t: Target) -> dict[str, Any]:
    """A user with max-connections 1 and an AMQP connection open: its MQTT CONNECT is
    refused."""
    t.add_user(USER, PASSWORD)
    connection = None
    try:
        t.permit(USER, "/", ".*", ".*", ".*")
        t.call("PUT", f"/user-limits/{quote(USER, safe='')}/max-connections", {"value": 1})
        params = pika.ConnectionParameters(
            t.host, t.amqp_port, "/", pika.PlainCredentials(USER, PASSWORD)
        )
        connection = pika.BlockingConnection(params)
        return {
            "mqtt": raw_answers(t, wire.connect(cid("ula-1"), username=USER, password=PASSWORD))
        }
    finally:
        if connection is not None and connection.is_open:
            connection.close()
        t.delete_user(USER)


def _totals(t: Target, want: int, wait: float = 15.0) -> dict[str, Any]:
    """The overview's connection and channel totals once connections == `want` (RabbitMQ's
    statistics arrive a few seconds late), or the last reading after `wait`."""
    deadline = time.monotonic() + wait
    while True:
        totals = t.call("GET", "/overview")["object_totals"]
        if totals["connections"] == want or time.monotonic() > deadline:
            return {"connections": totals["connections"], "channels": totals["channels"]}
        time.sleep(0.25)


@scenario("overview-counts-mqtt")
def overview_counts_mqtt(t: Target) -> dict[str, Any]:
    """A management user's overview counts its own connections: its MQTT connection is
    in object_totals.connections (and channels) while open, and in /api/connections
    with protocol MQTT 3.1.1; after DISCONNECT it is not."""
    t.call("PUT", f"/users/{quote(USER, safe='')}", {"password": PASSWORD, "tags": "management"})
    try:
        t.permit(USER, "/", ".*", ".*", ".*")
        as_user = dataclasses.replace(t, user=USER, password=PASSWORD)
        before = _totals(as_user, 0)
        client = t.mqtt(cid("ov"), username=USER, password=PASSWORD)
        during = _totals(as_user, 1)
        listed = [
            {"protocol": c["protocol"], "user": c["user"], "vhost": c["vhost"]}
            for c in as_user.call("GET", "/connections")
        ]
        client.disconnect()
        after = _totals(as_user, 0)
        return {
            "connack": client.connack,
            "before": before,
            "during": during,
            "listed": listed,
            "after": after,
        }
    finally:
        t.delete_user(USER)
